"""``moespec advise``: which expert kernel, from which pass size, and which draft length, for an MoE
model on the hardware a run measured, with the error bands of paper 1's bounds and ready-to-paste
settings for vLLM, SGLang and llama.cpp.

Modules: :mod:`.inputs` (what the decision rests on, read from a run's run file,
:mod:`moespec.predict.run_file`), :mod:`.bandwidth_table` (or from a bandwidth table),
:mod:`.curves` (the round model it decides on), :mod:`.decide` (the decision, by
:mod:`moespec.theory`), :mod:`.settings` (engine options with the versions cited), :mod:`.report`
(text, JSON and its schema), :mod:`.measured` (the answer beside the run's measurements),
:mod:`.figure` (the answer as a figure), :mod:`.errors` (the error of bad input).
"""

from __future__ import annotations

import math
from pathlib import Path

from moespec.routing import RoutingTrace

from . import measured
from .bandwidth_table import from_bandwidth_table
from .curves import VerifyCurves, draft_option
from .decide import decide, kernel_switch_of
from .errors import AdviceInputError
from .gguf import with_gguf
from .inputs import from_run, run_file
from .report import ADVICE_SCHEMA, format_explain, format_text, validate, write_json
from .settings import VERSIONS, engine_settings
from .validate import acceptance as acceptance_from_table


def advise_curves(curves: VerifyCurves, acceptance, target: str = "<target-model>",
                  draft: str = "<draft-model>") -> dict:
    """The advice for ready verify curves: :func:`.decide.decide` plus the engine settings of each
    acceptance rate's recommended draft length and the kernel crossover."""
    advice = decide(curves, acceptance)
    n_switch = advice["dedup"]["from_n"]
    fmt = curves.subject.get("format")
    advice["settings"] = [{"a": item["a"], **engine_settings(item["recommended"]["k"], kernel_switch_of(item, n_switch),
                                                             target, draft, fmt)} for item in advice["acceptance"]]
    for setting in advice["settings"]:   # llama.cpp takes a GGUF file: a checkpoint folder's, and how to convert it
        setting["llama_cpp"] = with_gguf(setting["llama_cpp"], target, draft)
    advice["versions_cited"] = VERSIONS
    return validate(advice)


def advise(run: str | Path | None = None, acceptance=None, *, acceptance_table: str | Path | None = None,
           bandwidth: str | Path | None = None, engine: str | None = None, model: str | None = None,
           trace=None, eps: float | None = None, dense_ratio: float = 0.5, draft_fit=None, free_draft: bool = False,
           state: str | None = None, context: str | None = None, draft_of_run: str | None = None,
           fmt: str | None = None, target: str = "<target-model>", draft: str = "<draft-model>",
           allow_incomplete: bool = False, source: str | None = None) -> dict:
    """Decide the expert kernel and draft length (JSON-ready dict, schema :data:`ADVICE_SCHEMA`).

    Inputs: a run ``run`` (its run file, :mod:`moespec.predict.run_file`: round models, or
    notebook 03's fits), or a bandwidth table ``bandwidth`` (Table-1 layout or one row per n;
    ``engine``/``model`` pick a row), optionally with a routing ``trace`` (a RoutingTrace or the
    path of one) for the fits or the table. Acceptance rates: ``acceptance`` (floats in [0, 1))
    and/or ``acceptance_table`` (:func:`acceptance_from_table`). The run file of a run that did
    not finish is refused unless ``allow_incomplete``; the advice then says which notebooks'
    tables it holds. ``source``: the label of a bandwidth table's rows (``"published"``: paper 1's
    numbers); by default the rows are recognised by their content. A ``trace`` must have the
    model's L, N and m.
    """
    if (run is None) == (bandwidth is None):
        raise AdviceInputError("give either a run folder or a bandwidth table (not both, not neither)")
    if not (math.isfinite(dense_ratio) and dense_ratio >= 0):
        raise AdviceInputError(f"--dense-ratio (dense_ratio): expected a finite number >= 0 (dense bytes per pass as a "
                               f"multiple of m W); found {dense_ratio}", where="--dense-ratio", found=dense_ratio)
    pairs = [(float(a), "given") for a in (acceptance or [])]
    if acceptance_table is not None:
        pairs += acceptance_from_table(acceptance_table)
    if not pairs:
        raise AdviceInputError("no acceptance rate: give acceptance (e.g. [0.6, 0.8]) or an acceptance table")
    if trace is not None and not hasattr(trace, "docs"):
        if not Path(trace).exists():
            raise AdviceInputError(f"routing trace {trace} does not exist", where=str(trace))
        try:
            trace = RoutingTrace.load(trace)
        except ValueError as exc:
            raise AdviceInputError(str(exc), where=str(trace)) from None
    chosen = draft_option(draft_fit, free_draft)
    if run is not None:
        table_only = {"--source": source, "--eps": eps, "--engine": engine, "--model": model, "--format": fmt}
        for name, value in table_only.items():
            if value is not None:
                raise AdviceInputError(f"{name} {value!r}: describes a bandwidth table's rows; a run's run file "
                                       "holds its own", where=name, found=value)
        curves = from_run(run, trace=trace, dense_ratio=dense_ratio, draft=chosen, state=state, context=context,
                          draft_of_run=draft_of_run, allow_incomplete=allow_incomplete)
    else:
        for name, value in (("--state", state), ("--context", context), ("--run-draft", draft_of_run)):
            if value is not None:
                raise AdviceInputError(f"{name} {value!r} names a round model of a run; a bandwidth table has none",
                                       where=name, found=value)
        curves = from_bandwidth_table(bandwidth, engine=engine, model=model, trace=trace, eps=eps,
                                      dense_ratio=dense_ratio, draft=chosen, fmt=fmt, source_label=source)
    return advise_curves(curves, pairs, target=target, draft=draft)


__all__ = ["advise", "advise_curves", "decide", "VerifyCurves", "AdviceInputError", "from_run", "run_file",
           "draft_option", "from_bandwidth_table", "acceptance_from_table", "engine_settings", "ADVICE_SCHEMA",
           "validate", "write_json", "format_text", "format_explain", "measured", "VERSIONS"]
