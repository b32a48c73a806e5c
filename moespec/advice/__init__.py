"""``moespec advise``: which expert kernel, from which pass size, and which draft length, for an MoE
model on the hardware a run measured, with the error bands of paper 1's bounds and ready-to-paste
settings for vLLM, SGLang and llama.cpp.

Modules: :mod:`.inputs` (what the decision rests on, read from a run's run file,
:mod:`moespec.predict.run_file`), :mod:`.bandwidth_table` (or from a bandwidth table),
:mod:`.curves` (the round model it decides on), :mod:`.decide` (the decision, by
:mod:`moespec.theory`), :mod:`.settings` (engine options with the versions cited), :mod:`.report`
(text, JSON and its schema), :mod:`.measured` (the answer beside the run's measurements),
:mod:`.verify_times` (or an engine's kernel benchmark), :mod:`.figure` (the answer as a figure),
:mod:`.errors` (the error of bad input).
"""

from __future__ import annotations

import math
from pathlib import Path

from moespec.model_shapes import FORMATS
from moespec.routing import RoutingTrace

from . import measured, profiles
from .batch import batch_schedule, check_batch_sizes
from .bandwidth_table import from_bandwidth_table
from .curves import VerifyCurves, draft_option
from .decide import decide, kernel_switch_of
from .errors import AdviceInputError
from .gguf import with_gguf
from .inputs import DENSE_RATIO, from_run, run_file
from .report import ADVICE_SCHEMA, format_explain, format_text, validate, write_json
from .settings import METHODS, VERSIONS, engine_settings

#: The engine a recommendation names where the verify times hold one kernel path per pass size.
ONE_PATH_ENGINE = "the kernel path each pass size ran in the benchmark"


def check_acceptance_values(acceptance) -> None:
    """Refuse an acceptance rate outside [0, 1) given as ``-a``, naming the option and the value."""
    for a in acceptance or []:
        if not (isinstance(a, (int, float)) and math.isfinite(a) and 0 <= a < 1):
            raise AdviceInputError(f"-a/--acceptance {a!r}: expected an acceptance rate in [0, 1) (the probability "
                                   f"that the target accepts a drafted token); found {a!r}", where="--acceptance",
                                   expected="[0, 1)", found=a)
from .validate import acceptance as acceptance_from_table
from .verify_times import from_verify_times


def advise_curves(curves: VerifyCurves, acceptance, target: str = "<target-model>",
                  draft: str = "<draft-model>", method: str = "draft_model") -> dict:
    """The advice for ready verify curves: :func:`.decide.decide` plus the engine settings of each
    acceptance rate's recommended draft length with draft ``method``, and the kernel crossover."""
    advice = decide(curves, acceptance)
    n_switch = advice["dedup"]["from_n"]
    fmt, paths = curves.subject.get("format"), curves.subject.get("kernel_paths", "both")
    tuned = curves.subject.get("tuned_batch_sizes")
    advice["settings"] = [{"a": item["a"], **engine_settings(item["recommended"]["k"], kernel_switch_of(item, n_switch),
                                                             target, draft, fmt, method, paths, tuned)}
                          for item in advice["acceptance"]]
    for setting in advice["settings"]:   # llama.cpp takes a GGUF file: a checkpoint folder's, and how to convert it
        setting["llama_cpp"] = with_gguf(setting["llama_cpp"], target, draft)
    if paths == "one":   # both engines are the one timed path: name it so
        for item in advice["acceptance"]:
            item["recommended"]["engine_name"] = ONE_PATH_ENGINE
    advice["versions_cited"] = VERSIONS
    return validate(advice)


def advise(run: str | Path | None = None, acceptance=None, *, acceptance_table: str | Path | None = None,
           acceptance_from=None, bandwidth: str | Path | None = None, engine: str | None = None,
           model: str | None = None, trace=None, eps: float | None = None, dense_ratio: float | None = None,
           draft_fit=None, free_draft: bool = False,
           state: str | None = None, context: str | None = None, draft_of_run: str | None = None,
           fmt: str | None = None, target: str = "<target-model>", draft: str = "<draft-model>",
           allow_incomplete: bool = False, source: str | None = None, verify_times=None,
           method: str = "draft_model", with_run_profile: bool = False, batch_sizes=None,
           sglang_config: str = "adaptive_config.json") -> dict:
    """Decide the expert kernel and draft length (JSON-ready dict, schema :data:`ADVICE_SCHEMA`).

    Inputs: a run ``run`` (its run file, :mod:`moespec.predict.run_file`: round models, or
    notebook 03's fits), or a bandwidth table ``bandwidth`` (Table-1 layout or one row per n;
    ``engine``/``model`` pick a row), optionally with a routing ``trace`` (a RoutingTrace or the
    path of one) for the fits or the table. Acceptance: ``acceptance`` (floats in [0, 1)) and/or
    ``acceptance_table`` (:func:`acceptance_from_table`), both geometric (what-if questions, said
    so); ``acceptance_from`` (files of an engine's metrics, logs or responses: a measured
    per-position profile, :mod:`moespec.acceptance`); with none of them, a run's own measured
    profile (:mod:`.profiles`; ``with_run_profile``: that profile first, then the rates given, where
    the run file holds one). The run file of a run that did
    not finish is refused unless ``allow_incomplete``; the advice then says which notebooks'
    tables it holds. ``source``: the label of a bandwidth table's rows (``"published"``: paper 1's
    numbers); by default the rows are recognised by their content. A ``trace`` must have the
    model's L, N and m. ``verify_times``: an engine's kernel benchmark instead (files, each
    optionally ``slot=``/``dedup=``-prefixed; :mod:`.verify_times`); ``method``: the draft method
    of the printed settings (:data:`METHODS`). ``batch_sizes``: also k*(B) at these batch sizes and the
    per-batch schedules of vLLM and SGLang (:func:`.batch.batch_schedule`; B >= 2 needs ``trace``, whose
    union of B sequences it uses; ``sglang_config``: the file name the SGLang command names).
    """
    if sum(x is not None for x in (run, bandwidth, verify_times)) != 1:
        raise AdviceInputError("give one of a run folder, a bandwidth table or verify times (--verify-times)")
    if method not in METHODS:
        raise AdviceInputError(f"--method {method!r}: expected one of {', '.join(METHODS)}", where="--method",
                               found=method)
    if allow_incomplete and run is None:
        raise AdviceInputError("--allow-incomplete reads the run file of a run that did not finish; a bandwidth table "
                               "or verify times have no run status", where="--allow-incomplete")
    check_acceptance_values(acceptance)
    if eps is not None and not (isinstance(eps, (int, float)) and math.isfinite(eps) and 0 <= eps < 1):
        raise AdviceInputError(f"--eps {eps!r}: expected the engine's bandwidth error, a number in [0, 1); found "
                               f"{eps!r}", where="--eps", expected="[0, 1)", found=eps)
    if fmt is not None and fmt not in FORMATS:
        raise AdviceInputError(f"--format {fmt!r}: expected one of the storage formats {sorted(FORMATS)}; found "
                               f"{fmt!r}", where="--format", expected=sorted(FORMATS), found=fmt)
    if dense_ratio is None:
        dense_ratio, dense_given = DENSE_RATIO, False
    else:
        dense_given = True
    if not (isinstance(dense_ratio, (int, float)) and math.isfinite(dense_ratio) and dense_ratio >= 0):
        raise AdviceInputError(f"--dense-ratio (dense_ratio): expected a finite number >= 0 (dense bytes per pass as a "
                               f"multiple of m W); found {dense_ratio}", where="--dense-ratio", found=dense_ratio)
    pairs = profiles.geometric(acceptance or [])
    if acceptance_table is not None:
        pairs += [(a, f"{label}; {profiles.GEOMETRIC}") for a, label in acceptance_from_table(acceptance_table)]
    if not pairs and acceptance_from is None and run is None:
        raise AdviceInputError("no acceptance: give acceptance (e.g. [0.6, 0.8]), an acceptance table or "
                               "--acceptance-from FILE (an engine's metrics, logs or responses)")
    if trace is not None and not hasattr(trace, "docs"):
        if not Path(trace).exists():
            raise AdviceInputError(f"routing trace {trace} does not exist", where=str(trace))
        try:
            trace = RoutingTrace.load(trace)
        except ValueError as exc:
            raise AdviceInputError(str(exc), where=str(trace)) from None
    chosen = draft_option(draft_fit, free_draft)
    batch_trace = trace
    if batch_sizes:
        check_batch_sizes(batch_sizes)
        if run is not None and trace is not None and run_file(run, allow_incomplete).doc["round_models"] is not None:
            trace = None      # round models measured the run's own routing: the trace serves the batch union only
    if run is not None:
        table_only = {"--source": source, "--eps": eps, "--engine": engine, "--model": model, "--format": fmt}
        for name, value in table_only.items():
            if value is not None:
                raise AdviceInputError(f"{name} {value!r}: describes a bandwidth table's rows; a run's run file "
                                       "holds its own", where=name, found=value)
        curves = from_run(run, trace=trace, dense_ratio=dense_ratio if dense_given else None, draft=chosen,
                          state=state, context=context,
                          draft_of_run=draft_of_run, allow_incomplete=allow_incomplete)
    else:
        for name, value in (("--state", state), ("--context", context), ("--run-draft", draft_of_run)):
            if value is not None:
                raise AdviceInputError(f"{name} {value!r} names a round model of a run; a bandwidth table or verify "
                                       "times have none", where=name, found=value)
        if verify_times is not None:
            if source is not None:
                raise AdviceInputError(f"--source {source!r} labels a bandwidth table's rows", where="--source")
            curves = from_verify_times(verify_times, model=model, fmt=fmt, trace=trace, eps=eps,
                                       dense_ratio=dense_ratio, draft=chosen, engine=engine)
        else:
            curves = from_bandwidth_table(bandwidth, engine=engine, model=model, trace=trace, eps=eps,
                                          dense_ratio=dense_ratio, draft=chosen, fmt=fmt, source_label=source)
    kmax = curves.kmax
    if acceptance_from is not None:
        pairs.append(profiles.from_files(acceptance_from, kmax))
    if run is not None and (not pairs or with_run_profile):   # the run's own measured profile
        rf, state = run_file(run, allow_incomplete), curves.subject.get("state") or "quiet"
        if pairs and rf.acceptance_profile(state) is None:
            pass                                                  # rates given, no profile to add
        else:
            pairs.insert(0, profiles.from_run(rf, state, kmax))
    advice = advise_curves(curves, pairs, target=target, draft=draft, method=method)
    if batch_sizes:
        advice["batch_schedule"] = batch_schedule(curves, advice, batch_sizes, batch_trace, method, target, draft,
                                                  sglang_config)
        validate(advice)
    return advice


__all__ = ["advise", "advise_curves", "decide", "VerifyCurves", "AdviceInputError", "from_run", "run_file",
           "draft_option", "from_bandwidth_table", "acceptance_from_table", "engine_settings", "ADVICE_SCHEMA",
           "validate", "write_json", "format_text", "format_explain", "measured", "profiles", "VERSIONS", "METHODS",
           "from_verify_times", "batch_schedule"]
