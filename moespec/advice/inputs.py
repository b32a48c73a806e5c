"""What ``moespec advise RUN`` decides on, read from the run's run file
(:mod:`moespec.predict.run_file`) and nothing else of the run:

* its round models (notebook 05): every term of a round measured inside decode loops, per machine
  state, context and draft; the engine's eps of the state (notebook 06) for bounds (17) and (19);
* or, for a run without notebook 05, notebook 03's fits (4)/(E.1) of the expert operation, scaled
  to every MoE layer of the model, with the byte share of the run's windows or of a routing trace.

The draft's time is the run's own draft by default (its fit in the round model); ``draft``
(:func:`.curves.draft_option`) names another or a free one; the fits have no draft of their own
and need one of the two. What the run file does not hold (the dense bytes of a pass and the host's
time for the fits) is an argument or stated default, listed in ``assumptions``. A run file that is
missing, of another schema version, malformed, or holds flagged fits is refused with an
:class:`~moespec.advice.errors.AdviceInputError` naming the file and the field.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import predict
from moespec import theory as th
from moespec.fit import COEFS
from moespec.predict.round_model import DraftTime, RoundModel, RoundModelError, RoundModels, Term
from moespec.predict.run_file import RunFile, default_round, read_run_file
from moespec.routing import mean_union
from moespec.validate import invariants

from . import validate
from .curves import N_MAX, VerifyCurves, draft_assumption, draft_or_refuse, predicted_round

#: Dense bytes per pass as a multiple of m W for notebook 03's fits unless given (``--dense-ratio``).
DENSE_RATIO = 0.5
from .errors import AdviceInputError


def _sources(rf: RunFile, *parts: str) -> dict:
    """The run file and the parts of it this advice used, each with its notebook and files."""
    names = {"round_models": "round models", "eps": "eps", "expert_op_fits": "expert-operation fits",
             "subject": "subject", "run": "run"}
    return {"run file": str(rf.path), **{names[p]: rf.source_line(p) for p in parts if p in rf.doc["sources"]}}


def _meta(rf: RunFile) -> dict:
    """The run's hardware, start and commit, where the run file names a manifest."""
    if rf.doc["hardware"] is None:
        return {}
    run = rf.doc["run"]
    return {"hardware": rf.doc["hardware"]["text"], "run_started": run.get("started"),
            "git_commit": run.get("git_commit")}


# --- notebook 05: the round models ----------------------------------------------------------------
def _pick_round(models: RoundModels, where: str, state: str | None, context: str | None,
                draft: str | None) -> RoundModel:
    if state is not None and state not in models.states:
        raise AdviceInputError(f"--state {state!r}: expected one of the run's machine states {models.states}; found "
                               f"{state!r} ({where})", where="--state", field="machine_states", found=state)
    chosen_state, chosen_context, _ = default_round(models, state, context)
    contexts = sorted({m.context for m in models.select(chosen_state)})
    if context is not None and context not in contexts:
        raise AdviceInputError(f"--context {context!r}: expected one of the run's contexts in the {chosen_state} "
                               f"machine state {contexts}; found {context!r} ({where})", where="--context",
                               expected=contexts, found=context)
    drafts = sorted({m.draft.name for m in models.select(chosen_state, chosen_context)})
    if draft is not None and draft not in drafts:
        raise AdviceInputError(f"--run-draft {draft!r}: expected one of the run's drafts in the {chosen_state} machine "
                               f"state, context {chosen_context!r}: {drafts}; found {draft!r} ({where})",
                               where="--run-draft", expected=drafts, found=draft)
    try:
        return models.get(*default_round(models, state, context, draft))
    except RoundModelError as err:
        raise AdviceInputError(f"{where}: {err}", where=where, field="round_models") from None


def from_round_models(rf: RunFile, run: str, state: str | None = None, context: str | None = None,
                      draft_of_run: str | None = None, draft: DraftTime | None = None) -> VerifyCurves:
    """The round model of machine ``state`` (default quiet), ``context`` (default ``chat``, the real
    draft's prompts, else the shallowest depth) and the run's draft ``draft_of_run`` (default the
    draft as trained); ``draft`` replaces the draft term."""
    models = rf.round_models
    rm = _pick_round(models, str(rf.path), state, context, draft_of_run)
    own_draft = rm.draft.name          # the run's draft this round model is of (before --draft-fit replaces it)
    eps = rf.eps(rm.state)
    interval = "95% interval of the paired saving measured in decode loops (round calibration, notebook 05)"
    where = f"{rm.context}, {rm.state} machine"
    notes = []
    if eps is not None and not 0 <= eps < 0.5:
        notes.append(f"the engine's eps = {eps:.3g} ({rf.source_line('eps')}) is outside [0, 1/2) and is not used: "
                     "the verify term is measured, its band the measurement's interval")
        eps = None
    if draft is not None:
        rm = rm.with_draft(draft)
    if rm.saving is None:   # a context whose kernels' runs were not paired: the saving's interval from both kernels'
        slot, dedup = rm.verify["slot"], rm.verify["dedup"]
        rm = replace(rm, saving=Term.difference(slot, dedup, f"{slot.source} minus {dedup.source}"))
        interval = "the two kernels' 95% intervals combined (their runs were not paired)"
    others = {}
    for other in models.states:
        found = models.select(other, rm.context, own_draft)
        if other != rm.state and len(found) == 1:
            others[other] = found[0].with_draft(draft) if draft is not None else found[0]
    covers = [f"verify: {rm.verify['dedup'].protocol} ({rm.verify['dedup'].source})",
              f"draft: {rm.draft.term.protocol} ({rm.draft.term.source})",
              f"host: {rm.host.protocol} ({rm.host.source})"]
    assumptions = [f"round model of {where}: V(k) = t_draft(k) + tau(k + 1) + h(k), each term with its 95 % "
                   f"interval; read bandwidth {rm.read_GBps:.2f} GB/s (same-round reads), regime {rm.regime}"
                   if rm.read_GBps is not None else f"round model of {where}",
                   draft_assumption(rm.draft), f"host time h(k): {rm.host.source}", *notes]
    s = rf.doc["subject"]
    subject = {"model": s["model"] or rm.subject, "engine": s["engine"] or "moespec engine",
               "format": s["format"] or "as run by notebook 05", "source": "this run",
               "from": f"notebook 05's round model ({where})", "run": run, "state": rm.state, "context": rm.context,
               "draft": rm.draft.name, "regime": rm.regime, "read_GBps": rm.read_GBps, **_meta(rf)}
    return VerifyCurves(round_model=rm, interval=interval, eps=eps, subject=subject, inputs=[str(rf.path)],
                        assumptions=assumptions, covers=covers, other_states=others,
                        sources=_sources(rf, "round_models", *(["eps"] if eps is not None else []), "subject", "run"))


# --- notebook 03: fits of the expert operation -------------------------------------------------
def _check_fits(fits: pd.DataFrame, where: str) -> None:
    for p in ("slot", "dedup"):
        f = fits[fits["kernel"] == p]
        if f.empty:
            raise AdviceInputError(f"{where}: no {p} fit (kernels present: {sorted(set(fits['kernel']))})",
                                   where=where, field="kernel")
        for _, row in f.iterrows():
            at = f"{where}: layer {row['layer']} {p} fit"
            for c in COEFS[p]:
                if not np.isfinite(row[c]):
                    raise AdviceInputError(f"{at}: coefficient {c} = {row[c]!r} is not finite (flagged)",
                                           where=where, field=c, found=row[c])
            per_byte = "c_u" if p == "slot" else "c_g"
            if row[per_byte] <= 0:
                raise AdviceInputError(f"{at}: time per byte {per_byte} = {row[per_byte]:.3g} <= 0 "
                                       "(flagged: reading bytes cannot take no time)", where=where, field=per_byte)
            if "n_passes" in row and row["n_passes"] < 3:
                raise AdviceInputError(f"{at}: fitted on {row['n_passes']} passes (flagged: fewer than 3)",
                                       where=where, field="n_passes")


def from_expert_op_fits(rf: RunFile, run: str, trace=None, dense_ratio: float = 0.5,
                        draft: DraftTime | None = None) -> VerifyCurves:
    """Verify times from notebook 03's fits (4)/(E.1): per layer, the fit at the mean union of the
    windows (the run's byte share ubar(n), or ``trace``'s mean union per layer), summed over every
    MoE layer of the model (layers without a fit of their own take the fitted layers' mean
    coefficients, :func:`moespec.predict.fitted_layer_times`), plus the dense bytes D =
    ``dense_ratio`` m W read at the run's measured read bandwidth."""
    part = rf.doc["expert_op_fits"]
    where = f"{rf.path}: expert_op_fits"
    fits = pd.DataFrame(part["fits"]).assign(model=part["model"])
    for c in ("t_op", "c_u", "c_g", "c_t", "c_re"):   # null: no such coefficient in that kernel's fit
        fits[c] = pd.to_numeric(fits[c], errors="coerce") if c in fits else np.nan
    main = pd.DataFrame(part["bandwidth"]).sort_values("n")
    model, eps = part["model"], float(part["eps"])
    _check_fits(fits, f"{where}.fits")
    if list(main["n"]) != list(range(1, N_MAX + 1)):
        raise AdviceInputError(f"{where}.bandwidth: the rows of {model} cover n = {list(main['n'])}, not 1..{N_MAX}",
                               where=str(rf.path), field="expert_op_fits.bandwidth")
    invariants.check_byte_share(main["ubar"].to_numpy(float), f"{where}.bandwidth", error=AdviceInputError)
    b = float(main["expert_bytes"].iloc[0])
    spec = validate.routing_shape(part.get("shape"), model)
    if trace is not None:
        validate.check_trace(trace, spec, f"{getattr(spec, 'name', model)} (the model of {rf.path})")
        union = mean_union(trace, N_MAX)
        m, L = trace.top_k, trace.num_layers
        routing = f"routing: mean union per layer of {trace.num_layers} layers of the given trace"
    else:
        if spec is None:
            raise AdviceInputError(f"{where}.model: {model!r} is not a preset and the run file has no shape of it; "
                                   "give a routing trace of it", where=str(rf.path), field="expert_op_fits.model",
                                   found=model)
        m, L = spec.top_k, spec.num_moe_layers
        union = np.tile(main["ubar"].to_numpy(float) * np.arange(1, N_MAX + 1) * m, (L, 1))
        routing = "routing: the byte share ubar(n) of the run's windows, the same in every layer"
    if not eps < 0.5:
        raise AdviceInputError(f"{where}.eps: bandwidth error eps = {eps} is outside [0, 1/2): the bounds (18)-(21) "
                               "say nothing there (C.7 needs eps < 1/2); the fits are not usable for a decision",
                               where=str(rf.path), field="expert_op_fits.eps", found=eps)
    times = predict.fitted_layer_times(fits, union, m, b)
    for p in ("slot", "dedup"):
        bad = np.argwhere(~(times[p] > 0))
        if bad.size:
            layer, i = bad[0]
            raise AdviceInputError(f"{where}.fits: the {p} fit predicts a non-positive operation time "
                                   f"({times[p][layer, i]:.3g} s) for layer {layer} at n = {i + 1} (flagged)",
                                   where=str(rf.path), field="expert_op_fits.fits")
    M = {p: times[p].sum(axis=0) for p in ("slot", "dedup")}
    W = L * b
    E_slot = th.slot_expert_bytes(m, W, N_MAX).astype(float)
    E_dedup = b * union.sum(axis=0)
    reads = main["read_GBps"].to_numpy(float) if "read_GBps" in main else np.full(N_MAX, np.nan)
    if np.isfinite(reads).all():
        beta_D = float(np.median(reads)) * 1e9
        dense_note = f"read at the run's measured read bandwidth {beta_D / 1e9:.2f} GB/s"
    else:
        beta_D = E_slot[0] / M["slot"][0]
        dense_note = "read at the per-slot one-token bandwidth"
    slot, dedup = th.verify_times_from_bandwidths(E_slot / M["slot"], E_dedup / M["dedup"], E_dedup / E_slot,
                                                  m, W, dense_bytes=dense_ratio * m * W, dense_bandwidth=beta_D)
    half = np.asarray(th.saving_bound(eps, slot.expert_time(), dedup.expert_time()), float)
    layers = sorted(int(x) for x in fits["layer"].unique())
    draft = draft_or_refuse(draft, f"notebook 03's fits ({rf.source_line('expert_op_fits')})")
    assumptions = [f"expert operation: fits (4)/(E.1) of layer(s) {layers} at expert bytes b = {b:.0f} B, "
                   f"applied to all {L} MoE layers", routing,
                   f"dense bytes per pass D = {dense_ratio:g} m W (not measured by notebook 03), {dense_note}",
                   draft_assumption(draft), "host time h(k) = 0: notebook 03 does not measure it"]
    subject = {"model": (f"{spec.paper_label or spec.name} ({spec.num_moe_layers} MoE layers, m = {spec.top_k}), "
                         f"benchmark shape {model}") if spec else
               f"{model} (the given trace's {L} MoE layers, m = {m})",
               "engine": f"moespec {part['backend'] or '?'} kernels", "format": part["fmt"] or "?",
               "source": "this run", "from": "notebook 03 (expert-operation fits)", "run": run, **_meta(rf)}
    rm = predicted_round({"slot": slot.tau(), "dedup": dedup.tau()},
                         {"slot": slot.memory_time(), "dedup": dedup.memory_time()}, eps, half, draft,
                         subject["model"], "notebook 03's fits", "fits (4)/(E.1) of notebook 03, bound (17) at eps")
    return VerifyCurves(round_model=rm, interval="band of bound (18) at the fits' eps around the predicted saving",
                        eps=eps, subject=subject, inputs=[str(rf.path)], assumptions=assumptions,
                        covers=["verify: bound (17) at the fits' eps", f"draft: {draft.term.protocol}",
                                "host: not covered (taken as 0)"],
                        ubar=th.byte_share(dedup.expert_bytes, slot.expert_bytes),
                        r=th.bandwidth_ratio(dedup.bandwidth, slot.bandwidth),
                        sources=_sources(rf, "expert_op_fits", "run"))


# --- the run file --------------------------------------------------------------------------------------
def run_file(run: str | Path, allow_incomplete: bool = False) -> RunFile:
    """The run file of ``run`` (a run folder, its ``figures/``, or the file), checked; the file of
    a run that did not finish is refused unless ``allow_incomplete``."""
    rf = read_run_file(run, AdviceInputError)
    info = rf.doc["run"]
    if not (info["complete"] or allow_incomplete):
        raise AdviceInputError(f"{rf.path}: field run.status: the run did not finish: expected complete or finished; "
                               f"found {info['described']}. Its tables may be partial or missing; moespec advise "
                               "refuses them (--allow-incomplete uses them anyway and says which notebooks' tables "
                               "it used)", where=str(rf.path), field="run.status", found=info["status"])
    return rf


def from_run(run: str | Path, trace=None, dense_ratio: float | None = None, draft: DraftTime | None = None,
             state: str | None = None, context: str | None = None, draft_of_run: str | None = None,
             allow_incomplete: bool = False) -> VerifyCurves:
    """Verify curves of a run: its round models when the run file holds them, else notebook 03's
    fits (:func:`from_round_models`, :func:`from_expert_op_fits`)."""
    rf = run_file(run, allow_incomplete)
    if rf.doc["round_models"] is not None:
        if trace is not None:
            raise AdviceInputError(f"--trace: a routing trace applies to notebook 03's fits; {rf.path} holds round "
                                   "models, measured with the engine's own routing", where="--trace")
        if dense_ratio is not None:
            raise AdviceInputError(f"--dense-ratio {dense_ratio:g}: has no effect on {rf.path}: its round models "
                                   "measured the verify pass with its dense bytes; the option applies to notebook "
                                   "03's fits, a bandwidth table or verify times", where="--dense-ratio",
                                   found=dense_ratio)
        curves = from_round_models(rf, str(run), state=state, context=context, draft_of_run=draft_of_run, draft=draft)
    else:
        for name, value in (("--state", state), ("--context", context), ("--run-draft", draft_of_run)):
            if value is not None:
                raise AdviceInputError(f"{name} {value!r} names a round model; {rf.path} holds notebook 03's fits, "
                                       "which have none", where=name, found=value)
        curves = from_expert_op_fits(rf, str(run), trace=trace,
                                     dense_ratio=DENSE_RATIO if dense_ratio is None else dense_ratio, draft=draft)
    validate.label_incomplete(curves, rf.doc["run"], rf.doc["sources"])
    return curves
