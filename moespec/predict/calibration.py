"""Round models from notebook 05's round calibration (:mod:`moespec.engine.calibration`): the rows of
decode loops timed before the speculative runs, turned into :class:`RoundModel` terms.

* :func:`from_verify_loops`: one round model per cache depth for the oracle draft (context
  ``d=<depth>``): tau_p(n) of both kernels, the saving S(n) paired within each (prompt,
  repetition), h(k) and the oracle draft's own time, from the teacher-forced loops;
* :func:`from_draft_runs`: one round model per real draft (context ``chat``, the calibration
  prompts), every term as that draft runs: t_draft(k) = a_d k + b_d fitted over runs (intercept
  kept; or, in the ``"catch-up"`` form notebook 05 uses, with the one-draft round apart and a time
  per round whose draft began with two tokens, amendment of 2026-12-07 b) and h(k) from its runs at
  each k; tau_dedup(k + 1) from the runs of every draft at k
  (widening a draft changes no token, so every draft of the sweep proposes the same tokens and the
  target runs the same verify pass after it: pooling them times that pass over six times as many
  rounds; amendment of 2026-12-05, ``data/preregistration/amendments_byte_faithful_all.json``;
  on a machine where the target's pass is slower after a costlier draft, the pooled runs moved to
  each draft's cost along each k's slope on the cost, ``verify_by_cost="linear"``, amendment of
  2026-12-06 g, or each draft's own runs, ``"own"``, amendment of 2026-12-06 i, which notebook 05
  uses: :func:`real_draft_models`);
  tau_slot(k + 1) from the per-slot runs of the draft as trained, the one-token pass from the plain
  runs (k = 0); where the runs recorded their verify passes' routing (``distinct_experts``), the
  deduplicating term's dependence on it (:class:`moespec.predict.round_model.RoutingTerm`; amendment
  of 2026-12-05 night).

Each value is the mean over runs of a run's mean time per round (a run's throughput is its tokens
over its total time, so the expected round time is a mean), with a bootstrap interval of that mean
over runs. Runs of the bandwidth regime holding most of them are used (``regime``), as the
pre-registered protocol has it; the model records which.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moespec.engine.speculative import catch_up_share
from moespec.measure.regimes import classify, dominant, split_point

from .round_model import DRAFT_FORMS, DraftTime, RoundModel, RoutingTerm, Term, fit_draft_time

ORACLE_DRAFT = "oracle draft"
#: The form of the real draft's time notebook 05 fits (:func:`real_draft_models`; amendment of
#: 2026-12-07 b; recorded in the run's ``run.json`` as ``draft_form``).
REAL_DRAFT_FORM = "catch-up"


def tag_regimes(rows: pd.DataFrame, threshold: float | None = "auto") -> tuple[pd.DataFrame, str, float | None]:
    """``rows`` with a ``regime`` column from their same-round reads (``ref_GBps``), the dominant
    regime and the threshold used (``"auto"``: :func:`moespec.measure.regimes.split_point` of the rows)."""
    bw = rows["ref_GBps"].to_numpy(float) if "ref_GBps" in rows else np.full(len(rows), np.nan)
    if np.isnan(bw).all():
        return rows.assign(regime="one"), "one", None
    if threshold == "auto":
        threshold = split_point(bw[~np.isnan(bw)])
    tagged = rows.assign(regime=classify(bw, threshold))
    return tagged, dominant(tagged["regime"]), threshold


def _in_regime(rows: pd.DataFrame, regime: str, cells: list) -> pd.DataFrame:
    """The rows of ``regime`` when it holds at least a quarter of them and a run of every cell
    (combination of ``cells`` columns) the rows cover, else every row (its ``regime`` column then
    says which regimes entered)."""
    sel = rows[rows["regime"] == regime]
    keys = lambda f: set(map(tuple, f[cells].astype(str).drop_duplicates().to_numpy()))  # noqa: E731
    if len(sel) >= 0.25 * len(rows) and keys(sel) == keys(rows):
        return sel
    return rows


def _per_run(rows: pd.DataFrame, index: str, col: str, values) -> list[np.ndarray]:
    return [rows.loc[rows[index] == v, col].to_numpy(float) for v in values]


def _verify_term(rows: pd.DataFrame, kmax: int, source: str, n_boot: int, seed: int, at_GBps: float | None) -> Term:
    """tau(k + 1), k = 0..kmax, from ``rows``' verify times: the mean over runs, or at the read
    ``at_GBps`` (:meth:`Term.at_read`)."""
    samples = _per_run(rows, "k", "t_verify_mean_s", range(kmax + 1))
    if at_GBps is None:
        return Term.from_samples(samples, source, "loop", n_boot, seed)
    return Term.at_read(samples, _per_run(rows, "k", "ref_GBps", range(kmax + 1)), at_GBps,
                        f"{source}; at a read of {at_GBps:.2f} GB/s", n_boot, seed)


def _routing_term(rows: pd.DataFrame, source: str) -> RoutingTerm | None:
    """The deduplicating verify term's routing dependence (:meth:`RoutingTerm.fit`) over ``rows``
    (plain and deduplicating runs); None where the rows carry no ``distinct_experts`` (a sweep
    without a routing tap, or one recorded before it existed). Partly recorded rows are refused."""
    if "distinct_experts" not in rows:
        return None
    u = rows["distinct_experts"].to_numpy(float)
    if np.isnan(u).all():
        return None
    if np.isnan(u).any():
        raise ValueError(f"draft calibration rows: distinct_experts missing in {int(np.isnan(u).sum())} of {u.size} runs")
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


def from_verify_loops(rows: pd.DataFrame, subject: str, state: str = "quiet", n_boot: int = 2000, seed: int = 0,
                      threshold="auto", by_regime: bool = True) -> dict:
    """{depth: RoundModel} for the oracle draft from :func:`moespec.engine.calibration.verify_loops`
    rows (module docstring). The per-slot kernel's n = 1 loops and the deduplicating kernel's are
    the same pass (n = 1 runs the per-slot kernel either way); both are kept as measured.

    ``by_regime``: fit each depth on the loops of the dominant read regime alone where they cover
    every cell (:func:`_in_regime`: the rule for loops timed in a stretch of their own, which
    meet the regime their runs will meet more often); ``False``: on every loop, for loops run in one
    shuffled order with the runs they predict (:func:`moespec.engine.calibration.depth_sweep`),
    whose runs meet both regimes in the same proportions (amendment of 2026-12-06 n)."""
    need = {"prompt", "rep", "d", "n", "dedup", "t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"}
    if missing := need - set(rows.columns):
        raise ValueError(f"verify-loop rows lack column(s) {sorted(missing)}")
    tagged, main, _ = tag_regimes(rows, threshold)
    out = {}
    for d, g in tagged.groupby("d"):
        used = _in_regime(g, main, ["n", "dedup"]) if by_regime else g
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
        draft = DraftTime(ORACLE_DRAFT, Term(np.where(np.arange(n_max) > 0, draft.values_s, 0.0),
                                             np.where(np.arange(n_max) > 0, draft.lo_s, 0.0),
                                             np.where(np.arange(n_max) > 0, draft.hi_s, 0.0), draft.runs,
                                             draft.source, "loop"))
        out[int(d)] = RoundModel(subject=subject, context=f"d={int(d)}", state=state, verify=verify, host=host,
                                 draft=draft, saving=_paired_saving(used, verify, f"{src}, saving (paired)", n_boot,
                                                                    seed + 4),
                                 depth=float(d) + float(used["emitted"].mean()) / 2 if "emitted" in used else float(d),
                                 regime=str(used["regime"].iloc[0]) if used["regime"].nunique() == 1 else "all rows",
                                 read_GBps=_read(used),
                                 notes={"runs": int(len(used)), "prompts": int(used["prompt"].nunique())})
    return out


VERIFY_BY_COST = ("pooled", "own", "linear")


def verify_at_cost(runs: pd.DataFrame, cost: float) -> pd.DataFrame:
    """Speculative runs (k >= 1, several draft costs) with each run's verify time moved to draft cost
    ``cost`` along its k's least-squares slope of ``t_verify_mean_s`` on ``draft_cost``:
    t + c_k (cost - r_run). A k whose runs have one draft cost keeps its times."""
    out = runs.copy()
    for k, g in runs.groupby("k"):
        r = g["draft_cost"].to_numpy(float)
        if np.ptp(r) == 0:
            continue
        slope = np.polyfit(r, g["t_verify_mean_s"].to_numpy(float), 1)[0]
        out.loc[g.index, "t_verify_mean_s"] = g["t_verify_mean_s"].to_numpy(float) + slope * (float(cost) - r)
    return out


def draft_name(cost: float) -> str:
    """The name of the real draft widened to draft cost ``cost`` (0: the draft as trained)."""
    return "the run's own draft (as trained)" if float(cost) == 0 else f"the run's draft widened to cost {cost:g}"


def real_draft_models(rows: pd.DataFrame, subject: str, state: str = "quiet", n_boot: int = 2000,
                      seed: int = 0, draft_form: str = REAL_DRAFT_FORM) -> dict:
    """{draft cost: RoundModel} as notebook 05 fits the real draft's round models to its calibration
    runs taken to their sweep's typical machine state (:mod:`moespec.engine.machine_adjust`): on
    every run, both read regimes (amendment of 2026-12-06 f), each draft's deduplicating verify term
    from its own runs, as the round it predicts runs (amendment of 2026-12-06 i; the pooled runs
    moved along each k's slope on the cost before it, amendment g), each draft's time in the
    ``"catch-up"`` form (the one-draft round apart, and the rounds whose draft began with two tokens
    costed; amendment of 2026-12-07 b; ``draft_form="line"`` for the form before it); the other
    choices are :func:`from_draft_runs`' defaults."""
    return from_draft_runs(rows, subject, state, n_boot=n_boot, seed=seed, by_regime=False, verify_by_cost="own",
                           draft_form=draft_form)


def from_draft_runs(rows: pd.DataFrame, subject: str, state: str = "quiet", context: str = "chat",
                    n_boot: int = 2000, seed: int = 0, threshold="auto", at_GBps: float | None = None,
                    by_regime: bool = True, verify_by_cost: str = "pooled", draft_form: str = "line") -> dict:
    """{draft cost: RoundModel} from a calibration sweep (:func:`moespec.engine.draftcost.draft_cost_sweep`
    with ``slot_costs``), every term measured as the draft runs, the deduplicating verify pass
    pooled over the drafts (module docstring; with ``verify_by_cost="pooled"`` every model of the
    sweep holds the same tau_dedup).

    ``at_GBps``: the verify terms (both kernels, the one-token pass included) at that read
    bandwidth instead of averaged over the runs: each fitted over the runs as t = c + d / B on the
    run's same-round read (:meth:`Term.at_read`), e.g. at the read of the runs predicted, measured
    minutes later in another machine state. The draft and host terms (little of them is reads)
    stay averages; the model's ``read_GBps`` is ``at_GBps``.

    ``by_regime``: fit on the runs of the dominant read regime alone where it covers every cell
    (:func:`_in_regime`, the rule for runs as measured); ``False``: on every run, for runs already
    taken to their sweep's typical machine state (:mod:`moespec.engine.machine_adjust`), whose
    measured speedups are over every test run of both regimes (amendment of 2026-12-06 f).

    ``verify_by_cost``: how the deduplicating verify term (and its routing term) of each draft is
    formed. ``"pooled"``: one for every draft, from the runs of every draft cost pooled (widening a
    draft changes no token and no routing); ``"own"``: each draft's from its own runs and the plain
    runs; ``"linear"``: from the pooled runs, each moved to the draft's cost along the within-k
    least-squares slope of the verify time on the draft cost, t + c_k (r - r_run)
    (:func:`verify_at_cost`), for a machine where the target's pass also depends on the draft run
    before it (amendment of 2026-12-06 g).

    ``draft_form``: the form of each draft's time per round (:data:`moespec.predict.round_model.DRAFT_FORMS`):
    ``"line"``, paper 2's a k + b; ``"catch-up"``, with the one-draft round apart and a time per
    round whose draft began with two tokens, at each run's share of them
    (:func:`moespec.engine.speculative.catch_up_share`; amendment of 2026-12-07 b)."""
    need = {"prompt", "rep", "k", "draft_cost", "dedup", "t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"}
    if draft_form not in DRAFT_FORMS:
        raise ValueError(f"draft_form must be one of {list(DRAFT_FORMS)}; found {draft_form!r}")
    if missing := need - set(rows.columns):
        raise ValueError(f"draft calibration rows lack column(s) {sorted(missing)}")
    if verify_by_cost not in VERIFY_BY_COST:
        raise ValueError(f"verify_by_cost must be one of {list(VERIFY_BY_COST)}; found {verify_by_cost!r}")
    tagged, main, _ = tag_regimes(rows, threshold)
    used = _in_regime(tagged, main, ["draft_cost", "k", "dedup"]) if by_regime else tagged
    plain = used[used["k"] == 0]
    slot_runs = used[(used["k"] >= 1) & ~used["dedup"].astype(bool)]
    if plain.empty:
        raise ValueError("draft calibration rows hold no plain runs (k = 0)")
    costs = sorted(used.loc[used["k"] >= 1, "draft_cost"].dropna().unique())
    slot_cost = sorted(slot_runs["draft_cost"].unique())
    src = f"notebook 05, round calibration: speculative runs with the real draft on {context} calibration prompts"
    every_draft = used[used["dedup"].astype(bool) & (used["k"] >= 1)]
    dedup_terms: dict = {}     # (draft cost or None when pooled, kmax) -> (verify term, routing term), deduplicating
    out = {}
    for i, r in enumerate(costs):
        mine = every_draft[every_draft["draft_cost"] == r]
        ks = sorted(int(k) for k in mine["k"].unique())
        kmax = max(ks)
        if ks != list(range(1, kmax + 1)):
            raise ValueError(f"draft cost {r:g}: calibration runs at k = {ks}; every k = 1..{kmax} is needed")
        both = pd.concat([plain, mine])
        key = (None if verify_by_cost == "pooled" else r, kmax)
        if key not in dedup_terms:     # the verify term and its routing term from the same runs
            spec = every_draft[every_draft["k"] <= kmax]
            if verify_by_cost == "own":
                runs, how = both, "this draft's runs"
            elif verify_by_cost == "linear":
                runs = pd.concat([plain, verify_at_cost(spec, r)])
                how = f"runs of every draft cost moved to cost {r:g} along each k's slope on the cost"
            else:
                runs, how = pd.concat([plain, spec]), "runs of every draft cost pooled"
            dedup_terms[key] = (
                _verify_term(runs, kmax, f"{src}: verify passes of k + 1 tokens, deduplicating kernel, {how} "
                             f"(k = 0: plain runs)", n_boot, seed if key[0] is None else seed + 10 * i + 4, at_GBps),
                _routing_term(runs, f"{src}: verify times on each run's mean distinct (expert, layer) pairs per pass, "
                              f"one intercept per k, {how}"))
        ded_tau, routing = dedup_terms[key]
        own_slot = r in slot_cost
        sr = slot_runs[slot_runs["draft_cost"] == (r if own_slot else slot_cost[0])] if slot_cost else slot_runs
        if sr.empty:
            raise ValueError("draft calibration rows hold no per-slot runs (slot_costs of draft_cost_sweep)")
        slot_tau = _verify_term(pd.concat([plain, sr]), kmax, f"{src}: verify passes of k + 1 tokens, per-slot kernel"
                                + ("" if own_slot else f", runs of the draft at cost {slot_cost[0]:g}"),
                                n_boot, seed + 10 * i + 1, at_GBps)
        host = Term.from_samples(_per_run(both, "k", "t_host_mean_s", range(kmax + 1)), f"{src}: host work per round",
                                 "loop", n_boot, seed + 10 * i + 2)
        draft = fit_draft_time(mine["k"], mine["t_draft_mean_s"], draft_name(r), kmax,
                               f"{src}: {DRAFT_FORMS[draft_form]} fitted over runs, k = 1..{kmax}", n_boot,
                               seed + 10 * i + 3, share=catch_up_share(mine) if draft_form == "catch-up" else None)
        per_k = mine.groupby("k")["t_draft_mean_s"].mean()
        out[float(r)] = RoundModel(
            subject=subject, context=context, state=state, verify={"slot": slot_tau, "dedup": ded_tau}, host=host,
            draft=draft, saving=None,
            depth=float(both["prompt_tokens"].mean() + both["emitted"].mean() / 2) if "prompt_tokens" in both else None,
            regime=str(used["regime"].iloc[0]) if used["regime"].nunique() == 1 else "all rows",
            routing=routing,
            read_GBps=_read(both) if at_GBps is None else float(at_GBps),
            notes={"draft_cost": float(r), "runs": int(len(both)), "prompts": int(both["prompt"].nunique()),
                   **({} if at_GBps is None else {"calibration_read_GBps": _read(both)}),
                   "draft_fit_residual_ms": {int(k): float(1e3 * (v - draft.term.values_s[int(k)]))
                                             for k, v in per_k.items()}})
    return out


def held_out_draft_error(rows: pd.DataFrame, draft_form: str) -> pd.DataFrame:
    """The draft fit of ``draft_form`` scored out of sample on a draft calibration (rows of
    :func:`from_draft_runs`): per draft cost, each prompt's runs (deduplicating, k >= 1) predicted
    by the fit to the other prompts' runs, each run at its own catch-up share (the ``"catch-up"``
    form; :meth:`DraftTime.shift_s`). One row per run: draft_cost, k, prompt, the measured and
    predicted draft time (ms) and their relative error (``rel_error``, predicted / measured - 1).
    The measure amendment of 2026-12-07 b chose the form on; a fit with more terms always leaves
    less error in sample."""
    if draft_form not in DRAFT_FORMS:
        raise ValueError(f"draft_form must be one of {list(DRAFT_FORMS)}; found {draft_form!r}")
    drafted = rows[(rows["k"] >= 1) & rows["dedup"].astype(bool)].assign(share=catch_up_share)
    out = []
    for r, runs in drafted.groupby("draft_cost"):
        kmax = int(runs["k"].max())
        if runs["prompt"].nunique() < 2:
            raise ValueError(f"draft cost {r:g}: one calibration prompt; leaving one out leaves none")
        for p, held in runs.groupby("prompt"):
            rest = runs[runs["prompt"] != p]
            fit = fit_draft_time(rest["k"], rest["t_draft_mean_s"], draft_name(r), kmax, "held out", n_boot=1,
                                 share=rest["share"] if draft_form == "catch-up" else None)
            for run in held.itertuples():
                k = int(run.k)
                predicted = float(fit.term.values_s[k]) + fit.shift_s(k, float(run.share))
                out.append({"draft_cost": float(r), "k": k, "prompt": p, "measured_ms": 1e3 * run.t_draft_mean_s,
                            "predicted_ms": 1e3 * predicted, "rel_error": predicted / run.t_draft_mean_s - 1})
    return pd.DataFrame(out)
