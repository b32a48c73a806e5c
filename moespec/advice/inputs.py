"""What ``moespec advise`` decides on: one round model (:class:`moespec.predict.round_model.RoundModel`,
V(k) = t_draft(k) + tau_p(k + 1) + h(k) with every term's source and interval) for both expert
kernels at pass sizes n = 1..9, read from one of three sources (paper 1, Sections 3-4):

* a run folder with notebook 05's round-model file (``05_round_model.json``): every term measured
  inside decode-loop rounds, per machine state, context and draft; the verify term may be
  replaced by a version of notebook 06's chain (22) (``06_curves.csv``), with the interval of
  bound (17) at the engine's eps;
* a run folder with notebook 03's fits (4)/(E.1) of the expert operation (``03_fit_coefficients.csv``,
  ``03_epsilon.csv``, ``03_bandwidth_all_models.csv``), scaled to every MoE layer of the model;
* a bandwidth table (paper 1's Table 1 layout with n = 2 and 8, or one row per n) plus, optionally,
  a routing trace whose byte share ubar(n) replaces the table's.

The draft's time is the run's own draft by default (its fit in the round model); ``draft_fit``
(a, b in ms per drafted token and per round) names another, ``free_draft`` a free one; a source
without a draft of its own needs one of the two. What the files do not hold (the dense bytes of a
pass, the host's time for the fits and tables) is an argument or stated default, listed in
``assumptions``. A run whose files are missing, non-finite or unphysical is refused with an
:class:`AdviceInputError` naming the file and the value.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import theory as th
from moespec import paths, predict
from moespec.fit import COEFS
from moespec.predict.calibration import ORACLE_DRAFT, draft_name
from moespec.predict.round_model import DraftTime, RoundModel, RoundModelError, RoundModels, Term
from moespec.model_shapes import get_spec
from moespec.routing import byte_share, mean_union
from moespec.tables.bandwidth import PAPER_LABEL
from moespec.tables.theory import ENGINE_FORMAT, _preset_name, read_table1
from moespec.validate import InputError

from . import validate

N_MAX = 9
#: Files of notebook 03 that the fits path reads.
EXPERT_OP_FILES = ("03_fit_coefficients.csv", "03_epsilon.csv", "03_bandwidth_all_models.csv")
#: Verify-time versions: "loop", the round model's own (decode loops); the versions of the chain (22)
#: in ``06_curves.csv``; "grid", notebook 05's shuffled grid (the earlier protocol, for comparison).
VERSIONS = ("loop", "prediction", "text", "measured-time", "calibrated", "grid")
CHAIN_VERSIONS = ("prediction", "text", "measured-time", "calibrated")
ROUND_MODEL_FILE = "05_round_model.json"
MANIFESTS = ("manifest.json", "MANIFEST.json")


class AdviceInputError(InputError):
    """An input of ``advise`` is missing, flagged or malformed; the message names it."""


@dataclass
class VerifyCurves:
    """What the decision rests on: ``round_model`` (verify times tau_p(n) of the per-slot ("slot")
    and deduplicating ("dedup") kernel, n = 1..n_max, the saving's interval, the draft's and the
    host's time per round, each with its interval and source), ``interval`` (what the saving's
    interval is), ``eps`` (the bandwidth error where verify times are predicted from bandwidths;
    None where they are measured), ``covers`` (which terms the step-time band covers), ``subject``
    (model, engine, format, where measured, whose numbers), ``inputs`` and ``assumptions``;
    ``ubar``/``r`` for the margin (19) where the source has them; ``other_states``: the same round
    in the run's other machine states (state -> RoundModel)."""

    round_model: RoundModel
    interval: str
    eps: float | None
    subject: dict
    inputs: list = field(default_factory=list)
    assumptions: list = field(default_factory=list)
    covers: list = field(default_factory=list)
    ubar: np.ndarray | None = None
    r: np.ndarray | None = None
    other_states: dict = field(default_factory=dict)
    log_gap_range: np.ndarray | None = None

    def __post_init__(self):
        if self.eps is not None and not (np.isfinite(self.eps) and 0 <= self.eps < 0.5):
            raise AdviceInputError(f"bandwidth error eps = {self.eps} is outside [0, 1/2): the bounds (18)-(21) "
                                   "say nothing there (C.7 needs eps < 1/2); the fits are not usable for a decision")
        if self.round_model.saving is None:
            raise AdviceInputError(f"round model {self.round_model.context!r}: no interval of the saving S(n) "
                                   "(both kernels must be measured or predicted)")
        if self.round_model.n_max < 2:
            raise AdviceInputError("verify times cover n = 1 only; the kernel decision needs n = 1..9")

    @property
    def tau(self) -> dict:
        return {p: self.round_model.tau(p) for p in ("slot", "dedup")}

    @property
    def S_lo(self) -> np.ndarray:
        return self.round_model.saving.lo_s

    @property
    def S_hi(self) -> np.ndarray:
        return self.round_model.saving.hi_s

    @property
    def n_max(self) -> int:
        return self.round_model.n_max

    @property
    def kmax(self) -> int:
        """The longest draft length decided on (every term covers k = 0..kmax)."""
        return self.round_model.kmax

    @property
    def saving(self) -> np.ndarray:
        return self.round_model.saving.values_s


def predicted_round(tau: dict, M: dict, eps: float, half_S, draft: DraftTime, subject: str, context: str,
                    source: str, n_max: int = N_MAX) -> RoundModel:
    """A round model whose verify times are predicted from bandwidths (the fits of notebook 03 or a
    bandwidth table): tau_p(n) with the interval of bound (17), eps/(1 - eps) M_p(n) around it
    (M_p the memory part), the saving with bound (18)'s ``half_S``; the host's time taken as zero
    (these sources do not measure it; stated in the assumptions); ``draft``: the given draft."""
    for p in ("slot", "dedup"):
        t = np.asarray(tau[p], float)
        if t.shape != (n_max,) or not np.all(np.isfinite(t)) or np.any(t <= 0):
            raise AdviceInputError(f"verify times tau_{p}(n) must be positive and finite; found {list(t)}")
    host = Term.exact(np.zeros(n_max), "not measured by this source: taken as 0", "given")
    base = RoundModel(subject=subject, context=context, state="as the source measured", host=host,
                      draft=draft, verify={p: Term.exact(np.asarray(tau[p], float), source, "prediction")
                                           for p in ("slot", "dedup")})
    r = eps / (1 - eps)
    return base.with_verify(tau, source, "prediction", half_width={p: r * np.asarray(M[p], float) for p in M},
                            saving_half_width=half_S)


def draft_option(draft_fit=None, free_draft: bool = False, kmax: int = N_MAX - 1) -> DraftTime | None:
    """The draft the user named: ``draft_fit`` (a, b) in ms per drafted token and per round
    (t_draft(k) = a k + b, paper 2's eq. (A4)), or ``free_draft``; None when neither (the run's own)."""
    if draft_fit is not None and free_draft:
        raise AdviceInputError("give either --draft-fit A,B or --free-draft, not both")
    if free_draft:
        return DraftTime.free(kmax)
    if draft_fit is None:
        return None
    try:
        a, b = (float(x) for x in (draft_fit.split(",") if isinstance(draft_fit, str) else draft_fit))
    except (TypeError, ValueError):
        raise AdviceInputError(f"--draft-fit needs two numbers A,B (ms per drafted token, ms per round); "
                               f"found {draft_fit!r}") from None
    try:
        return DraftTime.from_fit(f"a given draft: t_draft(k) = {a:g} k + {b:g} ms", a * 1e-3, b * 1e-3, kmax,
                                  "given (--draft-fit)", "given")
    except RoundModelError as err:
        raise AdviceInputError(f"--draft-fit {a:g},{b:g}: {err}") from None


def _draft_or_refuse(draft: DraftTime | None, where: str) -> DraftTime:
    if draft is None:
        raise AdviceInputError(f"{where} has no draft of its own: name one with --draft-fit A,B (ms per drafted "
                               "token, ms per round; paper 2's t_draft(k) = a k + b) or ask for --free-draft")
    return draft


def _draft_assumption(draft: DraftTime) -> str:
    if draft.term.protocol == "free":
        return "draft time t_draft(k) = 0: the draft taken as free (asked for by name: --free-draft)"
    if draft.a_s is not None:
        return f"draft time {draft.formula()} for k >= 1 ({draft.name}; {draft.term.source})"
    return f"draft time per round measured ({draft.name}; {draft.term.source})"


# --- helpers ----------------------------------------------------------------------------------
def _read_csv(path: Path, needed, what: str) -> pd.DataFrame:
    return validate.read_table(path, needed, what)   # typed columns and ranges (moespec.advice.validate)


def _finite(values, what: str, positive: bool = True) -> np.ndarray:
    arr = pd.to_numeric(pd.Series(values), errors="coerce").to_numpy(float)
    bad = ~np.isfinite(arr) | ((arr <= 0) if positive else False)
    if bad.any():
        raise AdviceInputError(f"{what}: {'positive ' if positive else ''}finite numbers needed; "
                               f"found {arr[bad][0]!r} at position {int(np.argmax(bad))}")
    return arr


def manifest(folder: Path) -> dict | None:
    """The run's provenance manifest (``manifest.json``, or ``MANIFEST.json`` beside committed figures)."""
    for name in MANIFESTS:
        path = folder / name
        if path.exists():
            return validate.runs.read_manifest(path, AdviceInputError)
    return None


def outputs_folder(run: str | Path) -> Path:
    """The folder that holds a run's tables: the run folder itself, its ``figures/`` sub-folder,
    or the figures folder its manifest names (runs of ``moespec reproduce`` before outputs moved
    into the run folder). Raises :class:`AdviceInputError` listing what was looked for."""
    run = Path(run)
    if not run.is_dir():
        raise AdviceInputError(f"run folder {run} does not exist or is not a folder")
    candidates = [run, run / "figures"]
    man = manifest(run)
    if man and man.get("figures_dir"):
        candidates.append(Path(man["figures_dir"]))
    for folder in candidates:
        if (folder / ROUND_MODEL_FILE).exists() or (folder / EXPERT_OP_FILES[0]).exists():
            return folder
    raise AdviceInputError(
        f"no round model or fits in {run}: expected notebook 05's {ROUND_MODEL_FILE} or notebook 03's "
        f"{', '.join(EXPERT_OP_FILES)} (looked in {', '.join(str(c) for c in dict.fromkeys(candidates))}); "
        "run notebook 03 or 05 first")


def _check_manifest(run: Path, man: dict | None) -> dict:
    validate.check_run(run, man)   # refuses an unfinished run unless allowed (--allow-incomplete)
    if man is None:
        return {}
    cpu = (man.get("hardware") or {}).get("cpu") or {}
    gpus = (man.get("hardware") or {}).get("gpus") or []
    hw = ", ".join(filter(None, [cpu.get("cpu_model"), f"{cpu.get('logical_cpus')} CPUs" if cpu.get("logical_cpus") else "",
                                 "; ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g) for g in gpus)]))
    return {"hardware": hw or "unknown", "run_started": man.get("started"), "git_commit": man.get("git_commit")}


# --- notebook 05: the round model (and notebook 06's chain for the verify term) -----------------
def _pick_round(models: RoundModels, path: Path, state: str | None, context: str | None,
                draft: str | None) -> RoundModel:
    states = models.states
    state = state or ("quiet" if "quiet" in states else states[0])
    if state not in states:
        raise AdviceInputError(f"{path}: state={state!r} is not a machine state of this run; it measured {states}")
    contexts = list(dict.fromkeys(m.context for m in models.select(state=state)))
    if context is None:
        context = "chat" if "chat" in contexts else min((c for c in contexts if c.startswith("d=")),
                                                         key=lambda c: int(c[2:]), default=contexts[0])
    if draft is None:
        names = [m.draft.name for m in models.select(state=state, context=context)]
        draft = draft_name(0.0) if draft_name(0.0) in names else (ORACLE_DRAFT if ORACLE_DRAFT in names else names[0])
    try:
        return models.get(state, context, draft)
    except RoundModelError as err:
        raise AdviceInputError(f"{path}: {err}") from None


def _chain_verify(rm: RoundModel, folder: Path, version: str, depth: int | None, eps: float) -> tuple[RoundModel, int, str]:
    """``rm`` with notebook 06's chain (22) version ``version`` as its verify term (its interval
    bound (17) at eps around the predicted expert time; the saving's bound (18))."""
    path = folder / ("06_curves.csv" if rm.state == "quiet" else f"06_curves_{rm.state}.csv")
    curves = _read_csv(path, ["d", "n", "version", "tau_slot_ms", "tau_dedup_ms"], "notebook 06's chain")
    depths = sorted(int(d) for d in curves["d"].unique())
    d = depths[0] if depth is None else int(depth)
    if d not in depths:
        raise AdviceInputError(f"{path}: no context depth d = {d}; depths present: {depths}")
    want = "measured-grid" if version == "grid" else version
    g = curves[(curves["d"] == d) & (curves["version"] == want)].sort_values("n")
    if list(g["n"]) != list(range(1, N_MAX + 1)):
        raise AdviceInputError(f"{path}: version {want!r} at d = {d} covers n = {list(g['n'])}, not 1..{N_MAX}")
    tau = {p: _finite(g[f"tau_{p}_ms"], f"{path}: tau_{p}_ms ({want}, d = {d})") * 1e-3 for p in ("slot", "dedup")}
    if version == "grid":
        lo = _finite(g["S_lo_ms"], f"{path}: S_lo_ms (grid, d = {d})", positive=False) * 1e-3
        hi = _finite(g["S_hi_ms"], f"{path}: S_hi_ms (grid, d = {d})", positive=False) * 1e-3
        S = tau["slot"] - tau["dedup"]
        out = rm.with_verify(tau, f"notebook 05's shuffled grid at d = {d} ({path.name})", "grid",
                             saving_half_width=np.maximum(S - lo, hi - S))
        return out, d, "95% bootstrap interval of the grid's measured saving (notebook 05)"
    for c in ("band_ms", "M_slot_ms", "M_dedup_ms"):
        if c not in g.columns:
            raise AdviceInputError(f"{path}: column {c!r} missing (runs before the round model); use version 'loop'")
    band = _finite(g["band_ms"], f"{path}: band_ms ({version}, d = {d})", positive=False) * 1e-3
    M = {p: _finite(g[f"M_{p}_ms"], f"{path}: M_{p}_ms", positive=False) * 1e-3 for p in ("slot", "dedup")}
    r = eps / (1 - eps)
    out = rm.with_verify(tau, f"chain (22), version {version!r}, d = {d} ({path.name})", "prediction",
                         half_width={p: r * M[p] for p in M}, saving_half_width=band)
    return out, d, "band of bound (18) at the engine's eps around the predicted saving"


def from_round_model_run(folder: Path, run: Path, version: str = "loop", depth: int | None = None,
                         state: str | None = None, context: str | None = None, draft_of_run: str | None = None,
                         draft: DraftTime | None = None) -> VerifyCurves:
    """The round model of notebook 05 (``05_round_model.json``): machine ``state`` (default quiet),
    ``context`` (default ``chat``, the real draft's prompts, else the shallowest depth) and the
    run's draft ``draft_of_run`` (default the draft as trained); ``draft`` (:func:`draft_option`)
    replaces the draft term. ``version`` other than ``loop`` replaces the verify term by that version
    of notebook 06's chain (22) at ``depth`` (or by notebook 05's shuffled grid: ``grid``)."""
    if version not in VERSIONS:
        raise AdviceInputError(f"version must be one of {VERSIONS}; found {version!r}")
    path = folder / ROUND_MODEL_FILE
    try:
        models = RoundModels.load(path)
    except RoundModelError as err:
        raise AdviceInputError(str(err)) from None
    rm = _pick_round(models, path, state, context, draft_of_run)
    own_draft = rm.draft.name          # the run's draft this round model is of (before --draft-fit replaces it)
    inputs = [str(path)]
    eps = None
    eps_path = folder / ("06_epsilon.csv" if rm.state == "quiet" else f"06_epsilon_{rm.state}.csv")
    if eps_path.exists():
        eps = float(_finite(_read_csv(eps_path, ["eps_engine"], "engine eps")["eps_engine"].iloc[:1],
                            f"{eps_path}: eps_engine")[0])
    interval = "95% interval of the paired saving measured in decode loops (round calibration, notebook 05)"
    where = f"{rm.context}, {rm.state} machine"
    notes = []
    if version == "loop" and eps is not None and not 0 <= eps < 0.5:
        notes.append(f"the engine's eps = {eps:.3g} ({eps_path.name}) is outside [0, 1/2) and is not used: the "
                     "verify term is measured, its band the measurement's interval")
        eps = None
    if version != "loop":
        if version != "grid" and eps is None:
            raise AdviceInputError(f"{eps_path} is missing: version {version!r} needs the engine's eps (notebook 06)")
        rm, d, interval = _chain_verify(rm, folder, version, depth, eps or 0.0)
        inputs.append(str(folder / "06_curves.csv"))
        where += f"; verify term: {version} at d = {d}"
    if draft is not None:
        rm = rm.with_draft(draft)
    if rm.saving is None:   # a context whose kernels' runs were not paired: the saving's interval from both kernels'
        slot, dedup = rm.verify["slot"], rm.verify["dedup"]
        rm = replace(rm, saving=Term.difference(slot, dedup, f"{slot.source} minus {dedup.source}"))
        interval = "the two kernels' 95% intervals combined (their runs were not paired)"
    others = {}
    if version == "loop":
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
                   _draft_assumption(rm.draft),
                   f"host time h(k): {rm.host.source}", *notes]
    meta = _check_manifest(run, manifest(run) or manifest(folder))
    t3, fits_path = folder / "06_table3_predictions.csv", folder / "06_fits.csv"
    model = engine = None
    fmt = (str(_read_csv(fits_path, ["fmt"], "notebook 06's fits")["fmt"].iloc[0]) if fits_path.exists()
           else "as run by notebook 05")
    if t3.exists():
        rows = _read_csv(t3, ["model", "engine"], "notebook 06's Table 3")
        ours = rows[rows.get("source", pd.Series(dtype=str)) == "this run"]
        if not ours.empty:
            model, engine = str(ours["model"].iloc[0]), str(ours["engine"].iloc[0])
    subject = {"model": model or rm.subject, "engine": engine or "moespec engine", "format": fmt,
               "source": "this run", "from": f"notebook 05's round model ({where})", "run": str(run),
               "state": rm.state, "context": rm.context, "draft": rm.draft.name, "regime": rm.regime,
               "read_GBps": rm.read_GBps, **meta}
    return VerifyCurves(round_model=rm, interval=interval, eps=eps, subject=subject, inputs=inputs,
                        assumptions=assumptions, covers=covers, other_states=others)


# --- notebook 03: fits of the expert operation -------------------------------------------------
def _check_fits(fits: pd.DataFrame, path: Path) -> None:

    for p in ("slot", "dedup"):
        f = fits[fits["kernel"] == p]
        if f.empty:
            raise AdviceInputError(f"{path}: no {p} fit (kernels present: {sorted(set(fits['kernel']))})")
        for _, row in f.iterrows():
            where = f"{path}: layer {row['layer']} {p} fit"
            for c in COEFS[p]:
                if not np.isfinite(row[c]):
                    raise AdviceInputError(f"{where}: coefficient {c} = {row[c]!r} is not finite (flagged)")
            per_byte = "c_u" if p == "slot" else "c_g"
            if row[per_byte] <= 0:
                raise AdviceInputError(f"{where}: time per byte {per_byte} = {row[per_byte]:.3g} <= 0 "
                                       "(flagged: reading bytes cannot take no time)")
            if "n_passes" in row and row["n_passes"] < 3:
                raise AdviceInputError(f"{where}: fitted on {row['n_passes']} passes (flagged: fewer than 3)")


def from_expert_op_run(folder: Path, run: Path, trace=None, dense_ratio: float = 0.5,
                       draft: DraftTime | None = None) -> VerifyCurves:
    """Verify times from notebook 03's fits (4)/(E.1): per layer, the fit at the mean union of the
    windows (the run's byte share ubar(n), or ``trace``'s mean union per layer), summed over every
    MoE layer of the model (layers without a fit of their own take the fitted layers' mean
    coefficients, :func:`moespec.predict.fitted_layer_times`), plus the dense bytes D =
    ``dense_ratio`` m W read at the run's measured read bandwidth."""

    paths_ = [folder / f for f in EXPERT_OP_FILES]
    fits = _read_csv(paths_[0], ["model", "layer", "kernel", "t_op", "c_u", "c_g", "c_t", "c_re"], "notebook 03's fits")
    eps_tab = _read_csv(paths_[1], ["eps_engine"], "notebook 03's eps")
    bw = _read_csv(paths_[2], ["model", "n", "ubar", "expert_bytes"], "notebook 03's bandwidths")
    model = str(fits["model"].iloc[0])
    _check_fits(fits, paths_[0])
    eps = float(_finite(eps_tab["eps_engine"].iloc[:1], f"{paths_[1]}: eps_engine")[0])
    main = bw[bw["model"] == model].sort_values("n")
    if list(main["n"]) != list(range(1, N_MAX + 1)):
        raise AdviceInputError(f"{paths_[2]}: the rows of {model} cover n = {list(main['n'])}, not 1..{N_MAX}")
    b = float(_finite(main["expert_bytes"].iloc[:1], f"{paths_[2]}: expert_bytes")[0])
    try:  # benchmark shapes shrunk for a quick run keep the preset's N, m and layers (bench.expert_op)
        spec = get_spec(model.removesuffix("-shrunk"))
    except KeyError:
        spec = None
    assumptions = []
    if trace is not None:

        validate.check_trace(trace, spec, model)
        union = mean_union(trace, N_MAX)
        m, L = trace.top_k, trace.num_layers
        routing = f"routing: mean union per layer of {trace.num_layers} layers of the given trace"
    else:
        if spec is None:
            raise AdviceInputError(f"model {model!r} of {paths_[0]} is not a preset; give a routing trace")
        m, L = spec.top_k, spec.num_moe_layers
        ubar = _finite(main["ubar"], f"{paths_[2]}: ubar")
        union = np.tile(ubar * np.arange(1, N_MAX + 1) * m, (L, 1))
        routing = "routing: the byte share ubar(n) of the run's windows, the same in every layer"
    if not eps < 0.5:
        raise AdviceInputError(f"{paths_[1]}: bandwidth error eps = {eps} is outside [0, 1/2): the bounds "
                               "(18)-(21) say nothing there (C.7 needs eps < 1/2); the fits are not usable for a decision")
    times = predict.fitted_layer_times(fits, union, m, b)
    for p in ("slot", "dedup"):
        bad = np.argwhere(~(times[p] > 0))
        if bad.size:
            layer, i = bad[0]
            raise AdviceInputError(f"{paths_[0]}: the {p} fit predicts a non-positive operation time "
                                   f"({times[p][layer, i]:.3g} s) for layer {layer} at n = {i + 1} (flagged)")
    M = {p: times[p].sum(axis=0) for p in ("slot", "dedup")}
    W = L * b
    E_slot = th.slot_expert_bytes(m, W, N_MAX).astype(float)
    E_dedup = b * union.sum(axis=0)
    if "read_GBps" in main.columns and np.isfinite(main["read_GBps"]).all():
        beta_D = float(main["read_GBps"].median()) * 1e9
        dense_note = f"read at the run's measured read bandwidth {beta_D / 1e9:.2f} GB/s"
    else:
        beta_D = E_slot[0] / M["slot"][0]
        dense_note = "read at the per-slot one-token bandwidth"
    slot, dedup = th.verify_times_from_bandwidths(E_slot / M["slot"], E_dedup / M["dedup"], E_dedup / E_slot,
                                                  m, W, dense_bytes=dense_ratio * m * W, dense_bandwidth=beta_D)
    half = np.asarray(th.saving_bound(eps, slot.expert_time(), dedup.expert_time()), float)
    layers = sorted(int(x) for x in fits["layer"].unique())
    assumptions += [f"expert operation: fits (4)/(E.1) of layer(s) {layers} at expert bytes b = {b:.0f} B, "
                    f"applied to all {L} MoE layers", routing,
                    f"dense bytes per pass D = {dense_ratio:g} m W (not measured by notebook 03), {dense_note}",
                    "host time h(k) = 0: notebook 03 does not measure it"]
    backend = fits["backend"].iloc[0] if "backend" in fits else "?"
    fmt = fits["fmt"].iloc[0] if "fmt" in fits else "?"
    meta = _check_manifest(run, manifest(run) or manifest(folder))   # the run's status before the draft
    draft = _draft_or_refuse(draft, f"notebook 03's fits ({paths_[0]})")
    assumptions.insert(len(assumptions) - 1, _draft_assumption(draft))   # before the host-time line
    subject = {"model": (f"{spec.paper_label or spec.name} ({spec.num_moe_layers} MoE layers, m = {spec.top_k}), "
                         f"benchmark shape {model}") if spec else model, "engine": f"moespec {backend} kernels",
               "format": fmt, "source": "this run", "from": "notebook 03 (expert-operation fits)", "run": str(run), **meta}
    rm = predicted_round({"slot": slot.tau(), "dedup": dedup.tau()},
                         {"slot": slot.memory_time(), "dedup": dedup.memory_time()}, eps, half, draft,
                         subject["model"], "notebook 03's fits", "fits (4)/(E.1) of notebook 03, bound (17) at eps")
    return VerifyCurves(round_model=rm, interval="band of bound (18) at the fits' eps around the predicted saving",
                        eps=eps, subject=subject, inputs=[str(p) for p in paths_], assumptions=assumptions,
                        covers=["verify: bound (17) at the fits' eps", f"draft: {draft.term.protocol}",
                                "host: not covered (taken as 0)"],
                        ubar=th.byte_share(dedup.expert_bytes, slot.expert_bytes),
                        r=th.bandwidth_ratio(dedup.bandwidth, slot.bandwidth))


def from_run(run: str | Path, use: str = "auto", version: str = "loop", depth: int | None = None,
             trace=None, dense_ratio: float = 0.5, draft: DraftTime | None = None, state: str | None = None,
             context: str | None = None, draft_of_run: str | None = None) -> VerifyCurves:
    """Verify curves of a run folder: notebook 05's round model when present (``use="auto"`` or
    ``"engine"``; :func:`from_round_model_run`), else notebook 03's expert-operation fits
    (``use="expert-op"``)."""
    run = Path(run)
    folder = outputs_folder(run)
    has_engine = (folder / ROUND_MODEL_FILE).exists()
    has_op = (folder / EXPERT_OP_FILES[0]).exists()
    if use not in ("auto", "engine", "expert-op"):
        raise AdviceInputError(f"use must be 'auto', 'engine' or 'expert-op'; found {use!r}")
    if use == "engine" or (use == "auto" and has_engine):
        if not has_engine:
            raise AdviceInputError(f"{folder}: notebook 05's {ROUND_MODEL_FILE} is missing (use='engine')")
        if trace is not None:
            raise AdviceInputError("a routing trace applies to notebook 03's fits; notebook 05's round model "
                                   "already used the engine's own routing (use='expert-op')")
        return from_round_model_run(folder, run, version=version, depth=depth, state=state, context=context,
                                    draft_of_run=draft_of_run, draft=draft)
    if not has_op:
        raise AdviceInputError(f"{folder}: notebook 03's {EXPERT_OP_FILES[0]} is missing (use='expert-op')")
    for name, value in (("state", state), ("context", context), ("draft_of_run", draft_of_run)):
        if value is not None:
            raise AdviceInputError(f"{name}={value!r} names a round model; notebook 03's fits have none (use='engine')")
    return from_expert_op_run(folder, run, trace=trace, dense_ratio=dense_ratio, draft=draft)


# --- a bandwidth table ------------------------------------------------------------------------
def _published_eps(engine: str) -> float | None:

    scalars = pd.read_csv(paths.reference_dir() / "paper1_scalars.csv")
    row = scalars[(scalars["quantity"] == "epsilon") & (scalars["model_or_engine"] == engine)]
    return float(row["value"].iloc[0]) if len(row) else None


def _pick_row(df: pd.DataFrame, path: Path, engine: str | None, model: str | None) -> pd.Series:
    sel = df
    if engine:
        sel = sel[sel["engine"].astype(str).str.lower() == engine.lower()]
    if model:
        sel = sel[sel["model"].astype(str).str.lower() == model.lower()]
    rows = sorted(set(zip(df["engine"].astype(str), df["model"].astype(str))))
    if len(sel) != 1:
        raise AdviceInputError(f"{path}: engine={engine!r}, model={model!r} select {len(sel)} rows; "
                               f"choose one of (engine, model) = {rows}")
    return sel.iloc[0]


def _half_unit(text) -> float:
    """Half a unit of the last printed digit of a table cell ("0.34" -> 0.005, "114" -> 0.5)."""
    mantissa, _, exponent = str(text).strip().lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return 0.5 * 10.0 ** ((int(exponent) if exponent else 0) - decimals)


def _gap_range(gap_of, values: dict, halves: dict) -> np.ndarray:
    """[n, 2]: the least and greatest of ``gap_of(values)`` (ln r(n) - ln ubar(n)) over every corner
    of the box values +- halves. Each value enters r(n) or ubar(n) monotonically, so the extremes
    over the box lie on its corners."""
    names = [k for k in values if np.any(np.asarray(halves[k]) > 0)]
    gaps = [gap_of({**values, **{k: values[k] + sign * halves[k] for k, sign in zip(names, signs)}})
            for signs in itertools.product((-1.0, 1.0), repeat=len(names))]
    return np.stack([np.min(gaps, axis=0), np.max(gaps, axis=0)], axis=1)


def _table1_ubar(u2, u8) -> np.ndarray:
    """ubar(n), n = 1..N_MAX, of the geometric model through ubar(2), ubar(8) (moespec.theory.table1)."""
    rho = th.reuse_from_byte_share(u2, u8, N_MAX)
    return np.cumsum(1 - rho) / np.arange(1, N_MAX + 1)


def _table1_r(v: dict) -> np.ndarray:
    """r(n) of a Table-1 row: the published n2_r/n8_r where given (linear in n, as the bandwidths),
    else the ratio of the interpolated bandwidths; r(1) = 1 (one token runs the per-slot kernel)."""
    if "r2" in v:
        r = th.interpolate_bandwidth(v["r2"], v["r8"], N_MAX)
    else:
        r = th.interpolate_bandwidth(v["bd2"], v["bd8"], N_MAX) / th.interpolate_bandwidth(v["bs2"], v["bs8"], N_MAX)
    r[0] = 1.0
    return r


def from_bandwidth_table(path: str | Path, engine: str | None = None, model: str | None = None,
                         trace=None, eps: float | None = None, dense_ratio: float = 0.5,
                         draft: DraftTime | None = None, fmt: str | None = None,
                         source_label: str | None = None) -> VerifyCurves:
    """Verify curves from a bandwidth table: paper 1's Table-1 layout (effective bandwidths and ubar
    at n = 2 and 8, interpolated as :mod:`moespec.theory.table1` states; notebook 04's step times)
    or one row per n = 1..9 (``beta_slot_GBps``, ``beta_dedup_GBps``, ``ubar``, as notebook 02's
    ``02_bandwidth_by_n.csv``). ``trace``: a RoutingTrace whose byte share ubar(n) is used instead
    of the table's. m and W come from the model preset (``fmt``: its storage format; default the
    paper's) or the table's ``expert_bytes`` column; D = ``dense_ratio`` m W at the per-slot
    one-token bandwidth. ``eps``: the bandwidth error; for the published rows the paper's eps of
    the engine (labelled as theirs) when not given. ``source_label``: the label of the table's rows
    (``"published"``: paper 1's published numbers), else the rows recognised by their content
    (:mod:`moespec.validate.reference`) or the table's ``source`` column."""

    path = Path(path)
    if not path.exists():
        raise AdviceInputError(f"bandwidth table {path} does not exist")
    head = validate.table_header(path)
    n = np.arange(1, N_MAX + 1)
    assumptions = []
    if "n2_beta_slot_GBps" in head:
        df = read_table1(path, source_label)
        row = _pick_row(df, path, engine, model)
        spec = get_spec(_preset_name(str(row["model"])))
        fmt = fmt or ENGINE_FORMAT.get(str(row["engine"])) or spec.default_format
        m, W = spec.top_k, float(spec.total_expert_bytes(fmt))
        beta_slot = th.interpolate_bandwidth(row["n2_beta_slot_GBps"], row["n8_beta_slot_GBps"], N_MAX) * 1e9
        beta_dedup = th.interpolate_bandwidth(row["n2_beta_dedup_GBps"], row["n8_beta_dedup_GBps"], N_MAX) * 1e9
        ubar = _table1_ubar(row["n2_ubar"], row["n8_ubar"])
        source = str(row["source"])
        eng_name, model_name = str(row["engine"]), str(row["model"])
        assumptions.append("bandwidths linear in n through the table's n = 2 and n = 8 values, new-expert "
                           "share geometric in the token index (moespec.theory.table1)")
        cells = pd.read_csv(path, dtype=str, keep_default_na=False).loc[row.name]
        rounded = {"u2": "n2_ubar", "u8": "n8_ubar"}
        published_r = {"n2_r", "n8_r"} <= set(head) and all(str(cells[c]).strip() for c in ("n2_r", "n8_r"))
        rounded.update({"r2": "n2_r", "r8": "n8_r"} if published_r else
                       {"bs2": "n2_beta_slot_GBps", "bs8": "n8_beta_slot_GBps",
                        "bd2": "n2_beta_dedup_GBps", "bd8": "n8_beta_dedup_GBps"})
        values = {k: float(cells[c]) for k, c in rounded.items()}
        halves = {k: _half_unit(cells[c]) for k, c in rounded.items()}
        bad = [rounded[k] for k in ("r2", "r8") if k in values and not (np.isfinite(values[k]) and values[k] > 0)]
        if bad:
            raise AdviceInputError(f"{path}: row ({eng_name}, {model_name}): column(s) {bad} need positive numbers; "
                                   f"found {[cells[c] for c in bad]}")
        r_table = _table1_r(values)
        assumptions.append("bandwidth ratio r(n) for the margin (19): the table's published n2_r, n8_r (linear in n "
                           "between them, as the bandwidths), not the ratio of its rounded bandwidth columns"
                           if published_r else "bandwidth ratio r(n) for the margin (19): the ratio of the table's "
                                               "interpolated bandwidths (it has no r columns)")
    else:
        need = ["n", "beta_slot_GBps", "beta_dedup_GBps"]
        df = _read_csv(path, need, "bandwidth table")
        if "model" in df.columns and (model or df["model"].nunique() > 1):
            if not model:
                raise AdviceInputError(f"{path}: rows of several models {sorted(df['model'].unique())}; choose one")
            df = df[df["model"].astype(str).str.lower() == model.lower()]
        df = df.sort_values("n")
        if list(df["n"]) != list(n):
            raise AdviceInputError(f"{path}: rows cover n = {list(df['n'])}, need one row per n = 1..{N_MAX}")
        beta_slot = _finite(df["beta_slot_GBps"], f"{path}: beta_slot_GBps") * 1e9
        beta_dedup = _finite(df["beta_dedup_GBps"], f"{path}: beta_dedup_GBps") * 1e9
        cells = pd.read_csv(path, dtype=str, keep_default_na=False).loc[df.index]
        r_table, values, halves, rounded = None, {}, {}, {}
        for key, col in (("bs", "beta_slot_GBps"), ("bd", "beta_dedup_GBps"), ("u", "ubar")):
            if col in cells.columns:
                rounded[key] = col
                values[key] = pd.to_numeric(cells[col], errors="coerce").to_numpy(float)
                halves[key] = np.array([_half_unit(c) for c in cells[col]])
        model_name = model or (str(df["model"].iloc[0]) if "model" in df.columns else None)
        if not model_name:
            raise AdviceInputError(f"{path}: no model column; name the model (a preset) for m and W")
        spec = get_spec(_preset_name(model_name))
        m = spec.top_k
        if "expert_bytes" in df.columns:
            W = float(df["expert_bytes"].iloc[0]) * spec.num_moe_layers
        else:
            W = float(spec.total_expert_bytes(fmt))
        ubar = _finite(df["ubar"], f"{path}: ubar") if "ubar" in df.columns else None
        source = str(df["source"].iloc[0]) if "source" in df.columns else f"ours ({path.name})"
        eng_name = engine or (f"moespec {df['backend'].iloc[0]}" if "backend" in df.columns else "as measured")
        fmt = fmt or (str(df["fmt"].iloc[0]) if "fmt" in df.columns else spec.default_format)
    source = validate.bandwidth_source(source_label, source)
    theirs = source == PAPER_LABEL
    if trace is not None:
        validate.check_trace(trace, spec, model_name)

        ubar = byte_share(trace, N_MAX)
        assumptions.append(f"byte share ubar(n) from the given routing trace ({trace.num_layers} layers, "
                           f"m = {trace.top_k})")
    if ubar is None:
        raise AdviceInputError(f"{path}: no ubar column; give a routing trace")
    if eps is None:
        eps = _published_eps(eng_name) if theirs else None
        if eps is None:
            raise AdviceInputError(f"{path}: no bandwidth error eps for these rows; give eps")
        assumptions.append(f"eps = {eps} of {eng_name}: paper 1's published value (their hardware)")
    slot, dedup = th.verify_times_from_bandwidths(beta_slot, beta_dedup, ubar, m, W,
                                                  dense_bytes=dense_ratio * m * W, dense_bandwidth=beta_slot[0])
    half = np.asarray(th.saving_bound(eps, slot.expert_time(), dedup.expert_time()), float)
    draft = _draft_or_refuse(draft, f"bandwidth table {path}")
    r = th.bandwidth_ratio(dedup.bandwidth, slot.bandwidth) if r_table is None else r_table
    try:
        gap_range = _margin_rounding(values, halves, ubar if trace is not None else None)
    except ValueError as exc:
        raise AdviceInputError(f"{path}: the table's values moved by their rounding leave the model they are read "
                               f"with ({exc})") from None
    assumptions += [f"dense bytes per pass D = {dense_ratio:g} m W (the table has none), read at the per-slot "
                    "one-token bandwidth; t0 = phi = 0", _draft_assumption(draft),
                    "host time h(k) = 0: a bandwidth table does not measure it",
                    "margin (19) judged over the table's rounding (each cell +- half a unit of its last printed "
                    "digit): 'within rounding' where that rounding alone can decide it"]
    subject = {"model": model_name, "engine": eng_name, "format": fmt,
               "source": PAPER_LABEL if theirs else source,
               "from": "paper 1's published Table 1 (their hardware): an illustration, not a measurement of "
                       "this project" if theirs else f"bandwidth table {path.name}"}
    rm = predicted_round({"slot": slot.tau(), "dedup": dedup.tau()},
                         {"slot": slot.memory_time(), "dedup": dedup.memory_time()}, float(eps), half, draft,
                         str(model_name), "bandwidth table", f"bandwidth table {path.name}, bound (17) at eps")
    return VerifyCurves(round_model=rm, interval="band of bound (18) at eps around the saving of these step times",
                        eps=float(eps), subject=subject, inputs=[str(path)], assumptions=assumptions,
                        covers=["verify: bound (17) at eps", f"draft: {draft.term.protocol}",
                                "host: not covered (taken as 0)"],
                        ubar=th.byte_share(dedup.expert_bytes, slot.expert_bytes), r=r, log_gap_range=gap_range)


def _margin_rounding(values: dict, halves: dict, trace_ubar) -> np.ndarray | None:
    """[N_MAX, 2] range of ln r(n) - ln ubar(n) over the rounding of the bandwidth table's cells
    (Table-1 cells: ``u2, u8`` and ``r2, r8`` or the four bandwidths; per-n cells: ``bs, bd, u``);
    a routing trace's ubar has no rounding."""
    def gap_of(v: dict) -> np.ndarray:
        if "u2" in v or "r2" in v or "bs2" in v:  # Table-1 layout
            r = _table1_r(v)
            u = trace_ubar if trace_ubar is not None else _table1_ubar(v["u2"], v["u8"])
        else:
            r = v["bd"] / v["bs"]
            r[0] = 1.0
            u = trace_ubar if trace_ubar is not None else v["u"]
        return np.log(r) - np.log(u)

    values, halves = dict(values), dict(halves)
    if trace_ubar is not None:
        for k in ("u", "u2", "u8"):
            values.pop(k, None), halves.pop(k, None)
    if not values:
        return None
    return _gap_range(gap_of, values, halves)


# --- acceptance rates -------------------------------------------------------------------------
def acceptance_from_table(path: str | Path) -> list[tuple[float, str]]:
    """Acceptance rates from a measured table: columns ``accepted`` and ``rejections`` (counts of
    drafted tokens accepted and of steps ended by a rejection; pooled geometric maximum-likelihood
    estimate accepted / (accepted + rejections), one per ``label`` if that column is present), or
    a column ``a`` (one rate per row, ``label`` optional). Returns [(a, label)]. Counts must be
    non-negative integers, rates in [0, 1) (:func:`moespec.advice.validate.acceptance`)."""
    return validate.acceptance(path)   # counts: non-negative integers, used and labelled as they are
