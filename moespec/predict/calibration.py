"""Round models from notebook 05's round calibration (:mod:`moespec.engine.calibration`): the rows of
calibration runs timed in the same shuffled sweeps as the runs they predict, turned into
:class:`RoundModel` terms.

* :func:`from_verify_loops`: one round model per cache depth for the oracle draft (context
  ``d=<depth>``) from the teacher-forced loops of :func:`moespec.engine.calibration.depth_sweep`:
  tau_p(n) of both kernels, the saving S(n) paired within each (prompt, repetition), h(k) and the
  oracle draft's own time;
* :func:`from_draft_runs`: one round model per real draft (context ``chat``, the calibration
  prompts), every term as that draft runs, from its runs taken to the sweep's typical machine state
  (:mod:`moespec.runstats.machine_adjust`): the draft's time t_draft(k) = a k + b + c [k = 1] +
  e s(k) (:func:`moespec.predict.round_model.fit_draft_time`: paper 2's line, eq. (A4), with the
  one-draft round apart and e per round whose draft began with two tokens, s(k) the runs' share of
  them); tau_dedup(k + 1) and h(k) from that draft's own runs at each k and the plain runs (k = 0);
  tau_slot(k + 1) from the per-slot runs of the draft as trained; and where the runs recorded their
  verify passes' routing (``distinct_experts``), the deduplicating term's dependence on it
  (:class:`moespec.predict.round_model.RoutingTerm`).

Each value is the mean over runs of a run's mean time per round (a run's throughput is its tokens
over its total time, so the expected round time is a mean), with a bootstrap interval of that mean
over runs. Every run enters, of both read regimes: the calibration runs meet the machine in the
same proportions as the runs they predict. The model records which regimes entered (``regime``).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moespec.measure.regimes import classify, dominant, split_point
from moespec.runstats import catch_up_share

from .round_model import DRAFT_FORM, DraftTime, RoundModel, RoutingTerm, Term, fit_draft_time

ORACLE_DRAFT = "oracle draft"


def tag_regimes(rows: pd.DataFrame) -> tuple[pd.DataFrame, str, float | None]:
    """``rows`` with a ``regime`` column from their same-round reads (``ref_GBps``), the dominant
    regime and the threshold (:func:`moespec.measure.regimes.split_point` of the rows)."""
    bw = rows["ref_GBps"].to_numpy(float) if "ref_GBps" in rows else np.full(len(rows), np.nan)
    if np.isnan(bw).all():
        return rows.assign(regime="one"), "one", None
    threshold = split_point(bw[~np.isnan(bw)])
    tagged = rows.assign(regime=classify(bw, threshold))
    return tagged, dominant(tagged["regime"]), threshold


def _regime(rows: pd.DataFrame) -> str:
    """The read regime the rows were measured in, or ``"all rows"`` where they span two."""
    return str(rows["regime"].iloc[0]) if rows["regime"].nunique() == 1 else "all rows"


def _per_run(rows: pd.DataFrame, index: str, col: str, values) -> list[np.ndarray]:
    return [rows.loc[rows[index] == v, col].to_numpy(float) for v in values]


def _verify_term(rows: pd.DataFrame, kmax: int, source: str, n_boot: int, seed: int) -> Term:
    """tau(k + 1), k = 0..kmax, from ``rows``' verify times: the mean over runs."""
    return Term.from_samples(_per_run(rows, "k", "t_verify_mean_s", range(kmax + 1)), source, "loop", n_boot, seed)


def _routing_term(rows: pd.DataFrame, source: str) -> RoutingTerm | None:
    """The deduplicating verify term's routing dependence (:meth:`RoutingTerm.fit`) over ``rows``
    (plain and deduplicating runs); None where the rows carry no ``distinct_experts`` (a sweep
    without a routing tap: a target that records no routing). Partly recorded rows are refused."""
    if "distinct_experts" not in rows:
        return None
    u = rows["distinct_experts"].to_numpy(float)
    if np.isnan(u).all():
        return None
    if np.isnan(u).any():
        raise ValueError(f"draft calibration rows: distinct_experts missing in {int(np.isnan(u).sum())} of {u.size} "
                         f"runs")
    return RoutingTerm.fit(rows["k"].to_numpy(int), u, rows["t_verify_mean_s"].to_numpy(float), source)


def _read(rows: pd.DataFrame) -> float | None:
    bw = rows["ref_GBps"].to_numpy(float) if "ref_GBps" in rows else np.array([np.nan])
    return None if np.isnan(bw).all() else float(np.nanmedian(bw))


def _paired_saving(rows: pd.DataFrame, verify: dict, source: str, n_boot: int, seed: int) -> Term:
    """S(n) = slot - dedup per (prompt, rep) at each n, a bootstrap interval of its mean; at an n
    where no (prompt, rep) holds both kernels (rows of another regime left out), the difference of
    the two kernels' terms (:meth:`Term.difference`; the source says at which n)."""
    n_max = len(verify["slot"])
    samples = []
    for n in range(1, n_max + 1):
        g = rows[rows["n"] == n].pivot_table(index=["prompt", "rep"], columns="dedup", values="t_verify_mean_s",
                                             aggfunc="mean")
        samples.append((g[False] - g[True]).dropna().to_numpy(float) if set(g.columns) == {False, True}
                       else np.array([]))
    paired = [i for i, x in enumerate(samples) if x.size]
    unpaired = [i + 1 for i, x in enumerate(samples) if not x.size]
    note = f" (unpaired at n = {unpaired}: the kernels' means and interval ends)" if unpaired else ""
    out = Term.difference(verify["slot"], verify["dedup"], source + note)
    if not paired:
        return out
    t = Term.from_samples([samples[i] for i in paired], source, "loop", n_boot, seed)
    parts = [out.values_s.copy(), out.lo_s.copy(), out.hi_s.copy(), out.runs.copy()]
    for part, new in zip(parts, (t.values_s, t.lo_s, t.hi_s, t.runs)):
        part[paired] = new
    return Term(*parts, out.source, "loop")


def from_verify_loops(rows: pd.DataFrame, subject: str, state: str = "quiet", n_boot: int = 2000,
                      seed: int = 0) -> dict:
    """{depth: RoundModel} for the oracle draft from the verify loops of
    :func:`moespec.engine.calibration.depth_sweep` (module docstring), every loop of each depth. The
    per-slot kernel's n = 1 loops and the deduplicating kernel's are the same pass (n = 1 runs the
    per-slot kernel either way); both are kept as measured."""
    need = {"prompt", "rep", "d", "n", "dedup", "t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"}
    if missing := need - set(rows.columns):
        raise ValueError(f"verify-loop rows lack column(s) {sorted(missing)}")
    out = {}
    for d, used in tag_regimes(rows)[0].groupby("d"):
        n_max = int(used["n"].max())
        ns = range(1, n_max + 1)
        src = f"notebook 05, round calibration: teacher-forced decode loops at d = {d} (verify_loops.csv)"
        verify = {p: Term.from_samples(_per_run(used[used["dedup"] == (p == "dedup")], "n", "t_verify_mean_s", ns),
                                       f"{src}, {'deduplicating' if p == 'dedup' else 'per-slot'} kernel", "loop",
                                       n_boot, seed + i) for i, p in enumerate(("slot", "dedup"))}
        ded = used[used["dedup"]]
        host = Term.from_samples(_per_run(ded, "k", "t_host_mean_s", range(n_max)), f"{src}, host work per round",
                                 "loop", n_boot, seed + 2)
        draft = Term.from_samples(_per_run(ded, "k", "t_draft_mean_s", range(n_max)),
                                  f"{src}, the oracle draft's own time per round", "loop", n_boot, seed + 3)
        drafted = np.arange(n_max) > 0
        draft = DraftTime(ORACLE_DRAFT, Term(np.where(drafted, draft.values_s, 0.0), np.where(drafted, draft.lo_s, 0.0),
                                             np.where(drafted, draft.hi_s, 0.0), draft.runs, draft.source, "loop"))
        out[int(d)] = RoundModel(subject=subject, context=f"d={int(d)}", state=state, verify=verify, host=host,
                                 draft=draft, saving=_paired_saving(used, verify, f"{src}, saving (paired)", n_boot,
                                                                    seed + 4),
                                 depth=float(d) + float(used["emitted"].mean()) / 2 if "emitted" in used else float(d),
                                 regime=_regime(used), read_GBps=_read(used),
                                 notes={"runs": int(len(used)), "prompts": int(used["prompt"].nunique())})
    return out


def draft_name(cost: float) -> str:
    """The name of the real draft widened to draft cost ``cost`` (0: the draft as trained)."""
    return "the run's own draft (as trained)" if float(cost) == 0 else f"the run's draft widened to cost {cost:g}"


def from_draft_runs(rows: pd.DataFrame, subject: str, state: str = "quiet", context: str = "chat",
                    n_boot: int = 2000, seed: int = 0) -> dict:
    """{draft cost: RoundModel} from a real draft's calibration runs
    (:func:`moespec.engine.draftcost.interleaved_sweep` rows of the calibration part, with
    ``slot_costs``; notebook 05 passes them at the sweep's typical machine state), every term
    measured as the draft runs (module docstring): each draft's deduplicating verify term and its
    routing term from its own runs and the plain runs, its time per round in the form of
    :data:`moespec.predict.round_model.DRAFT_FORM` at each run's catch-up share
    (:func:`moespec.runstats.catch_up_share`)."""
    need = {"prompt", "rep", "k", "draft_cost", "dedup", "t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"}
    if missing := need - set(rows.columns):
        raise ValueError(f"draft calibration rows lack column(s) {sorted(missing)}")
    used = tag_regimes(rows)[0]
    plain = used[used["k"] == 0]
    slot_runs = used[(used["k"] >= 1) & ~used["dedup"].astype(bool)]
    if plain.empty:
        raise ValueError("draft calibration rows hold no plain runs (k = 0)")
    costs = sorted(used.loc[used["k"] >= 1, "draft_cost"].dropna().unique())
    slot_cost = sorted(slot_runs["draft_cost"].unique())
    src = f"notebook 05, round calibration: speculative runs with the real draft on {context} calibration prompts"
    every_draft = used[used["dedup"].astype(bool) & (used["k"] >= 1)]
    out = {}
    for i, r in enumerate(costs):
        mine = every_draft[every_draft["draft_cost"] == r]
        ks = sorted(int(k) for k in mine["k"].unique())
        kmax = max(ks)
        if ks != list(range(1, kmax + 1)):
            raise ValueError(f"draft cost {r:g}: calibration runs at k = {ks}; every k = 1..{kmax} is needed")
        both = pd.concat([plain, mine])
        ded_tau = _verify_term(both, kmax, f"{src}: verify passes of k + 1 tokens, deduplicating kernel, this "
                               f"draft's runs (k = 0: plain runs)", n_boot, seed + 10 * i + 4)
        routing = _routing_term(both, f"{src}: verify times on each run's mean distinct (expert, layer) pairs per "
                                f"pass, one intercept per k, this draft's runs")
        own_slot = r in slot_cost
        sr = slot_runs[slot_runs["draft_cost"] == (r if own_slot else slot_cost[0])] if slot_cost else slot_runs
        if sr.empty:
            raise ValueError("draft calibration rows hold no per-slot runs (slot_costs of the calibration part)")
        slot_tau = _verify_term(pd.concat([plain, sr]), kmax, f"{src}: verify passes of k + 1 tokens, per-slot kernel"
                                + ("" if own_slot else f", runs of the draft at cost {slot_cost[0]:g}"),
                                n_boot, seed + 10 * i + 1)
        host = Term.from_samples(_per_run(both, "k", "t_host_mean_s", range(kmax + 1)), f"{src}: host work per round",
                                 "loop", n_boot, seed + 10 * i + 2)
        draft = fit_draft_time(mine["k"], mine["t_draft_mean_s"], draft_name(r), kmax,
                               f"{src}: {DRAFT_FORM} fitted over runs, k = 1..{kmax}", n_boot,
                               seed + 10 * i + 3, share=catch_up_share(mine))
        per_k = mine.groupby("k")["t_draft_mean_s"].mean()
        out[float(r)] = RoundModel(
            subject=subject, context=context, state=state, verify={"slot": slot_tau, "dedup": ded_tau}, host=host,
            draft=draft, saving=None,
            depth=float(both["prompt_tokens"].mean() + both["emitted"].mean() / 2) if "prompt_tokens" in both else None,
            regime=_regime(used), routing=routing, read_GBps=_read(both),
            notes={"draft_cost": float(r), "runs": int(len(both)), "prompts": int(both["prompt"].nunique()),
                   "draft_fit_residual_ms": {int(k): float(1e3 * (v - draft.term.values_s[int(k)]))
                                             for k, v in per_k.items()}})
    return out
