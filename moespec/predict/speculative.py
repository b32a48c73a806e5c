"""The round model's predictions of the speculative runs, beside their measurements (paper 1, eq. (9),
Section 4 and Appendix D): every prediction is a claim about a measurement of the same quantity in
the same machine state, reported with its gap.

* :func:`oracle_predictions`: the oracle-draft grid (Section 4): per (d, k, a) the step time, the
  throughput G_a(k) / V(k) and the speedup G_a(k) V(0) / V(k) of the depth's round model against the
  runs' (the oracle draft's acceptance is geometric by construction, so G_a(k) is the theory's);
* :func:`real_draft_predictions`: the real-draft sweep (Appendix D.3) at every (draft cost, k): the
  measured speedup (a median over prompts) and the prediction with its band, the median over
  prompts of each prompt's E_p(k) V(0) / V_p(k) (a real draft's acceptance is not geometric: its
  accepted tokens come in runs; :func:`prompt_speedups`);
* :func:`real_draft_diagnostics`: where a real-draft prediction's error comes from, beside it: the
  geometric G_a(k) at the measured acceptance instead of the measured tokens per step, the runs'
  own step times instead of the round model's, the calibration's mean routing and catch-up share
  instead of each prompt's;
* :func:`plain_step` : the plain decode step V(0) predicted against the measured one;
* :func:`stop_paying`: the first draft cost from which drafting no longer pays, measured and predicted;
* :func:`measured_by_rep` and :func:`measurement_noise`: the measurement against itself, each
  repetition's speedups over its own plain runs: how far a point's measurement moves between
  repetitions, and how many points a perfect prediction would still miss by that noise alone.

Measured speedups are medians over prompts of the runs' speedups (each run's throughput over the
same prompt's plain runs in the same regime); measured step times are means of the runs' mean time
per round. The round model is calibrated on other prompts than the runs it predicts
(:mod:`moespec.engine.calibration`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from statistics import NormalDist

from moespec.runstats import catch_up_share, speedup_over_plain
from moespec.theory import expected_tokens

from .round_model import RoundModel


def _check(rows: pd.DataFrame, need: set, what: str) -> None:
    if missing := need - set(rows.columns):
        raise ValueError(f"{what} lack column(s) {sorted(missing)}")


def oracle_predictions(models: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (d, k, a) of the oracle grid (``runs``: :func:`moespec.engine.runs.oracle_sweep` rows,
    deduplication on) and ``models`` {d: RoundModel}: measured and predicted step time (ms),
    throughput (tokens/s) and speedup over the same depth's plain runs, the speedup's interval
    from the round model's per-k delta, and the relative errors (predicted / measured - 1). The
    pre-registered prediction is the geometric G_a(k) V(0) / V(k) (``speedup_hat``); beside it,
    with the cell's realized tokens per step in place of G_a(k), the prediction of time alone
    (``speedup_hat_realized``: a run of a few dozen tokens realizes its acceptance with a sampling
    error of its own, which G_a(k) does not know)."""
    _check(runs, {"d", "k", "a", "throughput", "t_step_mean_s"}, "oracle runs")
    realized = {"emitted", "steps"} <= set(runs.columns)
    out = []
    for d, g in runs.groupby("d"):
        if int(d) not in models:
            raise ValueError(f"no round model for depth d = {d} (round models for {sorted(models)})")
        rm: RoundModel = models[int(d)]
        V = rm.step_times("dedup")
        T0 = float(g.loc[g["k"] == 0, "throughput"].median())
        for (k, a), c in g.groupby(["k", "a"]):
            k = int(k)
            if k > rm.kmax:
                raise ValueError(f"oracle runs at k = {k} beyond the round model's kmax = {rm.kmax} (d = {d})")
            sp = rm.speedups(float(min(a, 1 - 1e-12)))
            T_meas = float(c["throughput"].median())
            G = float(expected_tokens(float(min(a, 1 - 1e-12)), k))
            extra = {}
            if realized:   # the cell's realized tokens per step in place of G_a(k): the prediction of time alone
                tps = float(c["emitted"].sum() / c["steps"].sum())
                extra = {"tokens_per_step": tps, "speedup_hat_realized": tps * float(V[0] / V[k]),
                         "speedup_hat_realized_lo": tps / G * float(sp["speedup_lo"][k]),
                         "speedup_hat_realized_hi": tps / G * float(sp["speedup_hi"][k])}
            out.append({"d": int(d), "k": k, "a": float(a), "runs": int(len(c)),
                        "V_meas_ms": 1e3 * float(c["t_step_mean_s"].mean()), "V_hat_ms": 1e3 * float(V[k]),
                        "throughput_meas": T_meas, "throughput_hat": G / float(V[k]),
                        "speedup_meas": T_meas / T0, "speedup_hat": float(sp["speedup"][k]),
                        "speedup_lo": float(sp["speedup_lo"][k]), "speedup_hi": float(sp["speedup_hi"][k]),
                        "state": rm.state, **extra})
    df = pd.DataFrame(out)
    if realized:
        df["speedup_rel_error_realized"] = df["speedup_hat_realized"] / df["speedup_meas"] - 1
    df["V_rel_error"] = df["V_hat_ms"] / df["V_meas_ms"] - 1
    df["throughput_rel_error"] = df["throughput_hat"] / df["throughput_meas"] - 1
    df["speedup_rel_error"] = df["speedup_hat"] / df["speedup_meas"] - 1
    df["speedup_inside"] = inside_band(df["speedup_meas"], df["speedup_lo"], df["speedup_hi"])
    return df


def inside_band(x, lo, hi, rtol: float = 1e-9):
    """x inside [lo, hi], ends included to a relative ``rtol`` (floating-point equality counts);
    scalars or arrays (every comparison of a measurement with a predicted band uses it)."""
    return (x >= lo * (1 - rtol)) & (x <= hi * (1 + rtol))


def prompt_tokens_per_step(runs: pd.DataFrame) -> pd.Series:
    """Per (k, prompt): the prompt's tokens per step (emitted over steps, pooled over its
    repetitions and draft costs: widening a draft changes no token)."""
    g = runs.groupby(["k", "prompt"])[["emitted", "steps"]].sum()
    return g["emitted"] / g["steps"]


def median_prompt_tokens_per_step(runs: pd.DataFrame) -> pd.Series:
    """Per k: the median over prompts of each prompt's tokens per step (:func:`prompt_tokens_per_step`).
    Where one prompt's draft is rarely accepted it takes many more steps than the others, so a ratio
    pooled over the prompts' runs leans towards it while a median over prompts does not (and the
    measured speedup is a median over prompts)."""
    return prompt_tokens_per_step(runs).groupby(level="k").median()


def prompt_distinct_experts(runs: pd.DataFrame) -> pd.Series:
    """Per (k, prompt): the mean over the prompt's runs (repetitions and draft costs: widening a
    draft changes no token, so every run verifies the same passes) of a run's mean distinct
    (expert, layer) pairs per verify pass (``distinct_experts``, :func:`moespec.engine.draftcost.draft_cost_sweep`)."""
    _check(runs, {"k", "prompt", "distinct_experts"}, "real-draft runs")
    u = runs["distinct_experts"].to_numpy(float)
    if not np.isfinite(u).all():
        raise ValueError(f"real-draft runs: distinct_experts missing in {int((~np.isfinite(u)).sum())} of {u.size} "
                         f"runs (the routing term needs every run's routing)")
    return runs.groupby(["k", "prompt"])["distinct_experts"].mean()


def prompt_catch_up_share(runs: pd.DataFrame) -> pd.Series:
    """Per (k, prompt): the share of the prompt's rounds whose draft began with two tokens
    (:func:`moespec.runstats.catch_up_share`), pooled over its repetitions and draft costs
    (widening a draft changes no token, so every run of a prompt at k accepts alike)."""
    _check(runs, {"k", "prompt", "steps", "rejections"}, "real-draft runs")
    g = runs.assign(_rounds=catch_up_share(runs) * runs["steps"]).groupby(["k", "prompt"])[["_rounds", "steps"]].sum()
    return g["_rounds"] / g["steps"]


def prompt_speedups(model: RoundModel, k: int, tokens: pd.Series, distinct: pd.Series | None = None,
                    catch_up: pd.Series | None = None) -> pd.Series:
    """Each prompt's predicted speedup at draft length ``k``, E_p(k) V(0) / V_p(k), with V_p(k) the
    round model's step with, where given, the verify pass at the prompt's own routing and the
    draft at the prompt's own share of rounds beginning with two tokens
    (:meth:`RoundModel.step_times_routed`): ``tokens``, ``distinct`` and ``catch_up`` per prompt
    (the prompt's tokens per step, distinct (expert, layer) pairs per pass and catch-up share at k).
    Their median over prompts is the prediction of the measured speedup, itself a median over
    prompts of each prompt's speedup."""
    for what, given in (("routing", distinct), ("catch-up shares", catch_up)):
        if given is not None and set(given.index) != set(tokens.index):
            raise ValueError(f"tokens per step for prompts {sorted(tokens.index)}, {what} for {sorted(given.index)}")
    out = {}
    for p, E in tokens.items():
        V0, Vk = model.step_times_routed(k, None if distinct is None else float(distinct[p]),
                                         None if catch_up is None else float(catch_up[p]))
        out[p] = float(E) * V0 / Vk
    return pd.Series(out, dtype=float)


def acceptance_by_k(runs: pd.DataFrame) -> pd.Series:
    """The measured acceptance per k >= 1: accepted / (accepted + rejections), pooled over drafts,
    prompts and repetitions (the geometric estimate of
    :func:`moespec.engine.speculative.summarize_steps`)."""
    g = runs[runs.k >= 1].groupby("k")[["accepted", "rejections"]].sum()
    return g["accepted"] / (g["accepted"] + g["rejections"])


def median_prompt_acceptance(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per state, per prompt) of real-draft ``runs`` at k >= 1 (one draft's rows, with a ``state``
    column): each prompt's acceptance accepted / (accepted + rejections), pooled over its k's and
    repetitions (the geometric estimate of :func:`moespec.engine.speculative.summarize_steps`), and
    per state ``a``, the median of those over prompts, beside the pooled ``a_pooled`` and the
    totals. The measured speedup is a median over prompts; where one prompt's draft is rarely
    accepted it takes many more rounds, so the pooled rate leans to it while the median prompt's
    does not (the acceptance a speedup model is asked at should be the median prompt's)."""
    _check(runs, {"state", "prompt", "k", "accepted", "rejections"}, "real-draft runs")
    own = runs[runs.k >= 1]
    per = own.groupby(["state", "prompt"], sort=False)[["accepted", "rejections"]].sum().reset_index()
    drafted = per["accepted"] + per["rejections"]
    if (drafted == 0).any():
        bad = per.loc[drafted == 0, ["state", "prompt"]].to_dict("records")
        raise ValueError(f"real-draft runs: no drafted token accepted or rejected for {bad}")
    per["a"] = per["accepted"] / drafted
    rows = []
    for state, g in per.groupby("state", sort=False):
        acc, rej = int(g["accepted"].sum()), int(g["rejections"].sum())
        rows.append({"state": state, "a": float(g["a"].median()), "a_pooled": acc / (acc + rej),
                     "prompts": len(g), "accepted_total": acc, "rejections_total": rej,
                     "k_max": int(own.loc[own.state == state, "k"].max())})
    return pd.DataFrame(rows), per


def median_prompt_speedups(runs: pd.DataFrame, column: str = "speedup") -> pd.Series:
    """Each prompt's speedup at one (draft cost, k): the median of its runs' ``column``. The measured
    speedup of a point is the median of these over prompts (paper 1, Appendix D.3: a median over
    prompts), its quartiles the spread between prompts."""
    return runs.groupby("prompt")[column].median()


def measured_by_rep(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (draft cost, k >= 1) of a real-draft sweep, the measured speedup (median over prompts of
    :func:`median_prompt_speedups`) from each repetition alone, every run divided by the plain runs
    of its own repetition (:func:`moespec.runstats.speedup_over_plain`): one column per
    repetition (``rep0``, ``rep1``, ...). The repetitions run the same prompts in fresh shuffled
    orders, so they differ only by the machine's timing noise."""
    _check(runs, {"prompt", "k", "draft_cost", "rep", "regime", "throughput"}, "real-draft runs")
    cols = {}
    for rep, g in runs.groupby("rep"):
        g = g.assign(speedup_rep=speedup_over_plain(g))
        cols[f"rep{int(rep)}"] = (g[g.k >= 1].groupby(["draft_cost", "k"])
                                  .apply(lambda c: float(median_prompt_speedups(c, "speedup_rep").median())))
    return pd.DataFrame(cols)


def p_outside(sd: float, tolerance: float = 0.05) -> float:
    """P(|N(0, sd)| > tolerance): the chance that a perfect prediction, off only by noise of standard
    deviation ``sd`` (relative), misses by more than ``tolerance``; 0 where there is no noise."""
    return 2 * (1 - NormalDist().cdf(tolerance / sd)) if sd > 0 else 0.0


def measurement_noise(by_rep: pd.DataFrame, tolerance: float = 0.05) -> dict:
    """How precisely the runs measure their points (``by_rep``: :func:`measured_by_rep`, R >= 2
    repetitions): per point the relative standard error of the mean of its R repetition
    measurements, sd / (sqrt(R) mean), the stand-in for the pooled point's (pooled over all runs
    it is a median of medians, not a mean, so this is an estimate); ``se`` the root mean square of
    these over the points; ``expected_outside``: the points a perfect prediction would still miss
    by more than ``tolerance`` from that noise alone, sum over points of P(|N(0, se)| > tolerance);
    ``reps_needed``: the repetitions per prompt at which that count falls under one half (standard
    errors shrink as 1 / sqrt(R)); ``apart``: the points whose repetitions differ by more than
    ``tolerance`` (max / min - 1)."""
    R = by_rep.shape[1]
    if R < 2:
        raise ValueError(f"the measurement against itself needs at least 2 repetitions; found {R}")
    vals = by_rep.to_numpy(float)
    if not np.isfinite(vals).all() or (vals <= 0).any():
        raise ValueError("measured speedups per repetition must be finite and positive")
    rel_se = vals.std(axis=1, ddof=1) / (np.sqrt(R) * vals.mean(axis=1))
    se = float(np.sqrt(np.mean(rel_se ** 2)))
    M = len(vals)
    # the standard error at which fewer than half a point falls outside by noise alone
    target = tolerance / NormalDist().inv_cdf(1 - 0.25 / M)
    return {"points": M, "reps": R, "se": se, "rel_se": rel_se, "expected_outside": M * p_outside(se, tolerance),
            "apart": int((vals.max(axis=1) / vals.min(axis=1) - 1 > tolerance).sum()),
            "largest_apart": float((vals.max(axis=1) / vals.min(axis=1) - 1).max()),
            "se_needed": float(target), "reps_needed": int(np.ceil(R * (se / target) ** 2)) if se > 0 else R,
            "tolerance": tolerance}


def rep_columns(pred: pd.DataFrame) -> list[str]:
    """The per-repetition measured speedups of a :func:`real_draft_predictions` table (``rep0``, ...)
    that hold a value: a table of two machine states with 3 and 2 repetitions has a ``rep2`` column
    that is empty in the second state's rows, which are then of 2 repetitions."""
    return [c for c in pred.columns if c.startswith("rep") and c[3:].isdigit() and pred[c].notna().any()]


def noise_phrase(n: dict) -> str:
    """:func:`measurement_noise`'s result in words (notebook 05's line and the report block say it
    alike)."""
    tol = 100 * n["tolerance"]
    return (f"the measurement against itself: its {n['reps']} repetitions differ by more than {tol:.0f} % at "
            f"{n['apart']} of {n['points']} points, standard error of a point about {100 * n['se']:.1f} %, so a "
            f"perfect prediction would fall outside {tol:.0f} % at about {n['expected_outside']:.1f} of {n['points']} "
            f"by that noise alone ({n['reps_needed']} repetitions per prompt would bring that under one half)")


def noise_line(pred: pd.DataFrame, state: str) -> str:
    """:func:`noise_phrase` for one state's :func:`real_draft_predictions` rows, with the largest
    difference between repetitions; empty where the runs had a single repetition."""
    reps = rep_columns(pred)
    if len(reps) < 2:
        return ""
    n = measurement_noise(pred[reps], 0.05)
    return f"[{state}] {noise_phrase(n)}; largest difference between repetitions {100 * n['largest_apart']:.1f} %"


def adjustment_line(adjustment: dict, state: str) -> str:
    """What the machine adjustment did to one state's sweep (``adjustment``:
    :func:`moespec.runstats.machine_adjust.factor_summary`), in one line."""
    a = adjustment
    groups = {k[len("slope_"):]: v for k, v in a.items() if k.startswith("slope_")}
    slopes = f"read slope {a['slope']:.2f} over the sweep" + "".join(f", {g} {b:.2f}" for g, b in groups.items())
    return (f"[{state}] machine adjustment: {slopes}, {a['neighbours']} neighbours a side, factors "
            f"{a['q05']:.3f} to {a['q95']:.3f} (5th to 95th percentile over {a['runs']} runs); the noise of one run "
            f"{100 * a['noise_measured']:.1f} % as measured, {100 * a['noise_adjusted']:.1f} % adjusted")


def routing_line(pred: pd.DataFrame, state: str) -> str:
    """What the routing term did to one state's real-draft points (:func:`real_draft_predictions`
    rows joined to :func:`real_draft_diagnostics`' of routed round models): the cost of one
    distinct (expert, layer) pair, the prompts' and the calibration's distinct pairs per pass at the
    longest k, and the prediction at the calibration's mean routing beside the scored one."""
    last = pred[pred["k"] == pred["k"].max()].iloc[0]
    inside = lambda col: int((pred[col].abs() <= 0.05).sum())   # noqa: E731
    return (f"[{state}] routing: one distinct (expert, layer) pair costs {last['ms_per_distinct_expert']:.3f} ms of a "
            f"verify pass; at k = {int(last['k'])} the test prompts' median pass reads {last['distinct_test']:.1f} "
            f"pairs, the calibration's mean pass {last['distinct_calibration']:.1f}; with every prompt's verify pass "
            f"at its own routing within 5 % at {inside('rel_error')} of {len(pred)}, at the calibration's mean "
            f"routing (unrouted) {inside('rel_error_unrouted')} (largest "
            f"{100 * pred['rel_error_unrouted'].abs().max():.1f} %)")


_REAL_RUNS = {"prompt", "k", "draft_cost", "speedup", "emitted", "steps", "accepted", "rejections", "t_step_mean_s"}


class _PerPrompt:
    """Each test prompt's inputs of a real-draft prediction at every k: its tokens per step and,
    where the round models carry them, its distinct (expert, layer) pairs per verify pass (routing
    term) and its catch-up share (a draft in the catch-up form)."""

    def __init__(self, models: dict, runs: pd.DataFrame):
        _check(runs, _REAL_RUNS, "real-draft runs")
        self.routed = any(m.routing is not None for m in models.values())
        if self.routed and (unrouted := sorted(r for r, m in models.items() if m.routing is None)):
            raise ValueError(f"round models for draft costs {unrouted} have no routing term and others have one")
        self.caught = any(m.draft.catch_up_share is not None for m in models.values())
        self.E = median_prompt_tokens_per_step(runs)
        self.tokens = prompt_tokens_per_step(runs) if self.routed or self.caught else None
        self.distinct = prompt_distinct_experts(runs) if self.routed else None
        self.share = prompt_catch_up_share(runs) if self.caught else None

    @staticmethod
    def model(models: dict, r: float, k: int) -> RoundModel:
        if float(r) not in models:
            raise ValueError(f"no round model for draft cost {r:g} (round models for {sorted(models)})")
        rm = models[float(r)]
        if k > rm.kmax:
            raise ValueError(f"real-draft runs at k = {k} beyond the round model's kmax = {rm.kmax}")
        return rm

    def median_prompt(self, rm: RoundModel) -> dict:
        """:meth:`RoundModel.speedups` with E(k) the median prompt's tokens per step (k's without
        runs take 1: they do not enter another k's row)."""
        tps = np.array([1.0] + [float(self.E.get(j, np.nan)) for j in range(1, rm.kmax + 1)])
        return rm.speedups(np.where(np.isfinite(tps), tps, 1.0))

    def each_prompt(self, rm: RoundModel, k: int) -> float:
        """The median over prompts of :func:`prompt_speedups` at the prompts' own routing and share."""
        return float(prompt_speedups(rm, k, self.tokens[k], None if self.distinct is None else self.distinct[k],
                                     None if self.share is None else self.share[k]).median())


def real_draft_predictions(models: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Per (draft cost, k >= 1) of a real-draft sweep (``runs``: the test part's rows of
    :func:`moespec.engine.draftcost.interleaved_sweep`) and ``models`` {draft cost: RoundModel}: the
    measured speedup (``measured``: median over prompts, quartiles) and the prediction with its band
    (``predicted``, ``predicted_lo``, ``predicted_hi``), their relative error (``rel_error``,
    predicted / measured - 1) and whether the measurement lies in the band (``inside``).

    The prediction is the median over prompts of each prompt's E_p(k) V(0) / V_p(k)
    (:func:`prompt_speedups`), each prompt at its own tokens per step and, where the round model
    carries them, with its verify pass at its own distinct experts (routing term) and its draft at
    its own share of rounds whose draft began with two tokens (catch-up form); the band is the round
    model's per-k interval (from delta_k, :meth:`RoundModel.speedups`) scaled alike. A round model
    with neither predicts E(k) V(0) / V(k), E(k) the median over prompts of each prompt's tokens per
    step. Widening a draft changes no token, so the prompts' inputs are pooled over draft costs
    (``tokens_per_step``: the median prompt's E(k)). With two or more repetitions, the measurement
    against itself: each repetition's measured speedup (``rep0``, ``rep1``, ...:
    :func:`measured_by_rep`) and ``measured_rel_se`` (:func:`measurement_noise`)."""
    each = _PerPrompt(models, runs)
    out = []
    for (r, k), g in runs[runs.k >= 1].groupby(["draft_cost", "k"]):
        k = int(k)
        rm = each.model(models, r, k)
        sp = each.median_prompt(rm)
        point, lo, hi = float(sp["speedup"][k]), float(sp["speedup_lo"][k]), float(sp["speedup_hi"][k])
        if each.routed or each.caught:   # each prompt at its own routing and share; the band's relative width kept
            mine = each.each_prompt(rm, k)
            point, lo, hi = mine, lo * mine / point, hi * mine / point
        per_prompt = median_prompt_speedups(g)
        out.append({"draft_cost": float(r), "k": k, "state": rm.state, "tokens_per_step": float(each.E[k]),
                    "predicted": point, "predicted_lo": lo, "predicted_hi": hi, "measured": float(per_prompt.median()),
                    "measured_q25": float(per_prompt.quantile(0.25)), "measured_q75": float(per_prompt.quantile(0.75))})
    df = pd.DataFrame(out)
    if {"rep", "regime", "throughput"} <= set(runs.columns) and runs["rep"].nunique() >= 2:
        by_rep = measured_by_rep(runs)
        by_rep["measured_rel_se"] = measurement_noise(by_rep)["rel_se"]
        df = df.join(by_rep, on=["draft_cost", "k"])
    df["rel_error"] = df["predicted"] / df["measured"] - 1
    df["inside"] = inside_band(df["measured"], df["predicted_lo"], df["predicted_hi"])
    return df


def real_draft_diagnostics(models: dict, runs: pd.DataFrame) -> pd.DataFrame:
    """Where each real-draft point's prediction error comes from (:func:`real_draft_predictions`'
    points, the same ``models`` and ``runs``), per (draft cost, k >= 1):

    * the step times: predicted ``V_hat_ms`` and ``V0_hat_ms`` against the runs' mean ``V_meas_ms``
      and ``V0_meas_ms``; ``predicted_measured_steps`` = E(k) V_meas(0) / V_meas(k), the prediction
      with the runs' own step times (what is left of its error is the tokens per step and the
      statistic);
    * the acceptance: ``a``, the runs' measured acceptance at k (pooled), ``G`` = G_a(k), and
      ``predicted_geometric`` = G_a(k) V(0) / V(k), the geometric tokens per step in place of the
      measured ones;
    * where the round model carries a routing term: ``predicted_unrouted`` = E(k) V(0) / V(k), every
      prompt at the calibration's mean routing and catch-up share, with the test prompts' median
      and the calibration's mean distinct pairs per pass (``distinct_test``,
      ``distinct_calibration``) and the fitted cost of one pair (``ms_per_distinct_expert``);
    * where its draft is in the catch-up form: the test prompts' median and the calibration's mean
      catch-up share (``catch_up_test``, ``catch_up_calibration``) and the fitted time of one such
      round (``ms_per_catch_up``).

    Each ``predicted_<x>`` has its relative error to the measured speedup, ``rel_error_<x>``."""
    each = _PerPrompt(models, runs)
    a_k = acceptance_by_k(runs)
    plain_step = float(runs.loc[runs.k == 0, "t_step_mean_s"].mean())
    out = []
    for (r, k), g in runs[runs.k >= 1].groupby(["draft_cost", "k"]):
        k = int(k)
        rm = each.model(models, r, k)
        sp = each.median_prompt(rm)
        a = float(min(a_k[k], 1 - 1e-9))
        V_meas = float(g["t_step_mean_s"].mean())
        row = {"draft_cost": float(r), "k": k, "a": a, "G": float(expected_tokens(a, k)),
               "V_hat_ms": 1e3 * float(sp["V_s"][k]), "V_meas_ms": 1e3 * V_meas, "V0_hat_ms": 1e3 * float(sp["V_s"][0]),
               "V0_meas_ms": 1e3 * plain_step, "measured": float(median_prompt_speedups(g).median()),
               "predicted_geometric": float(expected_tokens(a, k)) * sp["V_s"][0] / sp["V_s"][k],
               "predicted_measured_steps": float(each.E[k]) * plain_step / V_meas}
        if each.routed:
            row |= {"predicted_unrouted": float(sp["speedup"][k]), "distinct_test": float(each.distinct[k].median()),
                    "distinct_calibration": float(rm.routing.distinct[k]),
                    "ms_per_distinct_expert": 1e3 * rm.routing.s_per_expert}
        if rm.draft.catch_up_share is not None:
            row |= {"catch_up_test": float(each.share[k].median()),
                    "catch_up_calibration": float(rm.draft.catch_up_share[k]),
                    "ms_per_catch_up": 1e3 * rm.draft.catch_up_s}
        out.append(row)
    df = pd.DataFrame(out)
    for col in [c for c in df.columns if c.startswith("predicted_")]:
        df["rel_error_" + col[len("predicted_"):]] = df[col] / df["measured"] - 1
    return df.drop(columns="measured")


def plain_step(model: RoundModel, runs: pd.DataFrame, label: str) -> dict:
    """The plain decode step: the round model's V(0) against the mean round time of ``runs``' k = 0
    runs, with V(0)'s interval and the relative error."""
    plain = runs[runs["k"] == 0]
    if plain.empty:
        raise ValueError(f"{label}: no plain runs (k = 0) to compare V(0) with")
    V = model.step_times("dedup")
    lo, hi = model.step_interval("dedup")
    meas = float(plain["t_step_mean_s"].mean())
    return {"runs": label, "context": model.context, "state": model.state, "V0_hat_ms": 1e3 * float(V[0]),
            "V0_lo_ms": 1e3 * float(lo[0]), "V0_hi_ms": 1e3 * float(hi[0]), "V0_meas_ms": 1e3 * meas,
            "rel_error": float(V[0] / meas - 1), "plain_runs": int(len(plain))}


def stop_paying(pred: pd.DataFrame, ratios: pd.DataFrame | None = None) -> dict:
    """The first draft cost of the grid (ascending) from which drafting no longer pays: the best
    speedup over k >= 1 at most 1, measured (median over prompts) and predicted; their distance in
    grid steps (None where one of them never stops paying on the grid: then the distance counts
    the end of the grid as the next step). With ``ratios`` the measured cost ratio c of each knob
    is reported too."""
    grid = sorted(pred.draft_cost.unique())
    best = pred.groupby("draft_cost")[["measured", "predicted"]].max().reindex(grid)

    def first(col):
        below = [i for i, r in enumerate(grid) if best.loc[r, col] <= 1.0]
        return below[0] if below else None

    im, ip = first("measured"), first("predicted")
    none = len(grid)
    out = {"grid": [float(r) for r in grid], "best_measured": best["measured"].tolist(),
           "best_predicted": best["predicted"].tolist(),
           "stop_index_measured": im, "stop_index_predicted": ip,
           "stop_cost_measured": None if im is None else float(grid[im]),
           "stop_cost_predicted": None if ip is None else float(grid[ip]),
           "grid_steps_apart": abs((none if im is None else im) - (none if ip is None else ip))}
    if ratios is not None:
        c = ratios.set_index("draft_cost")["cost_ratio"]
        out["cost_ratio"] = [float(c.get(r, np.nan)) for r in grid]
    return out
