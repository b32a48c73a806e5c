"""The goals of the whole-model results (notebooks 05-07), decided from a run's own numbers: each
goal's value, its target, ``met`` (True) or short (False), and ``preregistered``: whether the goal
stands in the pre-registration (``goals_reported`` of ``data/preregistration/scoring_rules_*.json``)
or is reported beside those (False). Goals are reported, never used to tune the subject."""

from __future__ import annotations

import pandas as pd

from moespec.predict.noise import noise_summary, prediction_noise_phrase
from moespec.predict.speculative import measurement_noise, rep_columns


def _row(goal: str, value: str, target: str, met: bool, preregistered: bool = True) -> dict:
    return {"goal": goal, "value": value, "target": target, "met": bool(met), "preregistered": bool(preregistered)}


def chain_goals(metrics: dict) -> pd.DataFrame:
    """From notebook 06's ``{(version, d): predict.evaluate(...)}``: the saving's sign predicted
    right wherever its 95 % interval excludes zero (prediction version, every depth), the
    prediction version's verify time within 10 %, and the measured-time version meeting all six
    rules (decided by the caller's scores: pass ``metrics`` and use :func:`rules_goal`)."""
    depths = sorted({d for _, d in metrics})
    rows = []
    for d in depths:
        p = metrics[("prediction", d)]
        rows.append(_row(f"sign of S(n) predicted right where its interval excludes 0, d = {d}",
                         f"{p['sign_correct']} of {p['sign_total']}", "all", p["sign_correct"] == p["sign_total"]))
        rows.append(_row(f"verify time within 10 %, prediction version, d = {d}", f"{100 * p['tau_err']:.1f} %",
                         "<= 10 %", p["tau_err"] <= 0.10))
    return pd.DataFrame(rows)


def rules_goal(scores: pd.DataFrame, version: str = "measured-time") -> pd.DataFrame:
    """The goal that ``version`` meets all six pre-registered rules at every depth."""
    mine = scores[scores["version"] == version]
    held = int(mine["holds_all"].sum())
    return pd.DataFrame([_row(f"{version} version meets all six rules at every depth", f"{held} of {len(mine)} rules",
                              "6 of 6", held == len(mine) == 6)])


def draft_cost_goals(pred: pd.DataFrame, stop: dict) -> pd.DataFrame:
    """From notebook 05's draft-cost sweep: the prediction within 10 % at every (cost, k), and the
    cost at which drafting stops paying predicted within one grid step."""
    worst = float(pred["rel_error"].abs().max())
    inside = int((pred["rel_error"].abs() <= 0.10).sum())
    return pd.concat([pd.DataFrame([
        _row("real-draft speedup predicted within 10 % at every (draft cost, k)",
             f"{inside} of {len(pred)} points; largest |error| {100 * worst:.1f} %", "all points",
             inside == len(pred))]),
        stop_paying_goal(stop)], ignore_index=True)


def stop_paying_goal(stop: dict) -> pd.DataFrame:
    """The cost at which drafting stops paying predicted within one grid step
    (:func:`moespec.predict.speculative.stop_paying`)."""
    return pd.DataFrame([_row("draft cost at which drafting stops paying, predicted within one grid step",
                              f"measured {stop['stop_cost_measured']}, predicted {stop['stop_cost_predicted']}; "
                              f"{stop['grid_steps_apart']} steps apart", "<= 1 step", stop["grid_steps_apart"] <= 1)])


def round_model_goals(plain: pd.DataFrame, oracle: pd.DataFrame | None, real: pd.DataFrame | None,
                      plain_tolerance: float = 0.03, tolerance: float = 0.05) -> pd.DataFrame:
    """The round model's prediction goals per machine state, from notebook 05's tables: the plain decode
    step V(0) within ``plain_tolerance`` of the measured one in every context (``plain``:
    :func:`moespec.predict.speculative.plain_step` rows), the oracle-draft speedup within
    ``tolerance`` in every (d, k, a) cell and the real-draft speedup within ``tolerance`` at every
    (draft cost, k) (:mod:`moespec.predict.speculative` tables, ``state`` columns), and whether the
    measured speedups lie inside the predictions' intervals."""
    rows = []
    for state in list(dict.fromkeys(plain["state"])):
        p = plain[plain["state"] == state]
        worst = p.loc[p["rel_error"].abs().idxmax()]
        rows.append(_row(f"plain step V(0) predicted within {100 * plain_tolerance:.0f} %, every context, {state}",
                         "; ".join(f"{r.context}: {100 * r.rel_error:+.1f} %" for r in p.itertuples()),
                         f"<= {100 * plain_tolerance:.0f} %", abs(worst["rel_error"]) <= plain_tolerance))
        for name, frame, col, where in (("oracle-draft", oracle, "speedup_rel_error", "(d, k, a) cell"),
                                        ("real-draft", real, "rel_error", "(draft cost, k) point")):
            if frame is None or frame.empty or state not in set(frame["state"]):
                continue
            f = frame[(frame["state"] == state) & (frame["k"] >= 1)]
            inside = int((f[col].abs() <= tolerance).sum())
            rows.append(_row(f"{name} speedup predicted within {100 * tolerance:.0f} % at every {where}, {state}",
                             f"{inside} of {len(f)}; largest |error| {100 * f[col].abs().max():.1f} %",
                             "all", inside == len(f)))
            held = f["speedup_inside" if name == "oracle-draft" else "inside"]
            rows.append(_row(f"{name} measured speedup inside the predicted interval, {state}",
                             f"{int(held.sum())} of {len(f)}", "all (reported)", bool(held.all())))
            if name == "real-draft" and len(reps := rep_columns(f)) >= 2:
                n = measurement_noise(f[reps], tolerance)
                rows.append(_row(f"real-draft measurement resolves {100 * tolerance:.0f} % (its repetitions against "
                                 f"each other), {state}",
                                 f"standard error of a point {100 * n['se']:.1f} %; a perfect prediction outside "
                                 f"{100 * tolerance:.0f} % at about {n['expected_outside']:.1f} of {n['points']} by "
                                 f"noise "
                                 f"alone; {n['reps_needed']} repetitions per prompt needed, {n['reps']} run",
                                 "under half a point (reported)", n["expected_outside"] < 0.5, preregistered=False))
            if name == "real-draft" and "noise_p_outside" in f:
                n = noise_summary(f, tolerance)
                rows.append(_row(f"real-draft prediction and measurement together resolve {100 * tolerance:.0f} % (the "
                                 f"calibration turns resampled, and the repetitions), {state}",
                                 prediction_noise_phrase(n),
                                 "under half a point (reported)", n["expected_outside"] < 0.5, preregistered=False))
            if name == "oracle-draft" and "speedup_rel_error_realized" in f:
                ok = int((f["speedup_rel_error_realized"].abs() <= tolerance).sum())
                rows.append(_row(f"oracle-draft speedup with each cell's realized tokens per step (time alone) within "
                                 f"{100 * tolerance:.0f} %, {state}",
                                 f"{ok} of {len(f)}; largest |error| "
                                 f"{100 * f['speedup_rel_error_realized'].abs().max():.1f} %",
                                 "all (reported)", ok == len(f), preregistered=False))
    return pd.DataFrame(rows)


def paper2_goals(regression: dict, online_info: dict) -> pd.DataFrame:
    """From notebook 07: eq. (4)'s in-sample R2 >= 0.9 and GroupKFold MAPE <= 10 % (one set of
    rows, ``RoundFits.summary()``), and the online policy >= 90 % of the oracle on held-out sequences."""
    share = online_info["online"] / online_info["oracle"]
    rows = regression["rows"]
    return pd.DataFrame([
        _row(f"eq. (4) in-sample R2, {rows}", f"{regression['eq4_r2_in']:.3f}", ">= 0.9",
             regression["eq4_r2_in"] >= 0.9),
        _row(f"eq. (4) GroupKFold MAPE, {rows}", f"{regression['eq4_cv_mape_pct']:.2f} %", "<= 10 %",
             regression["eq4_cv_mape_pct"] <= 10.0),
        _row("online early exit / oracle on held-out sequences", f"{100 * share:.1f} %", ">= 90 %", share >= 0.9)])


def oracle_bound_goal(oracle_speedup: float, measured: pd.DataFrame, transitions: str = "greedy") -> pd.DataFrame:
    """Notebook 07's oracle goal: the ``transitions`` oracle's speedup at least the best measured
    fixed-K rounds' speedup within its interval (``measured``: :func:`moespec.oracle.rounds.fixed_k_speedups`;
    met when the oracle reaches the lower end of the best K's interval). The oracle runs on its
    reference sequences under the fitted cost model, the rounds on theirs under the clock."""
    spec = measured[measured["K"] >= 1]
    if spec.empty:
        raise ValueError("no measured fixed-K rounds with K >= 1 to compare the oracle with")
    best = spec.loc[spec["speedup"].idxmax()]
    return pd.DataFrame([_row(f"{transitions} oracle >= best measured fixed-K rounds",
                              f"oracle {oracle_speedup:.3f}; measured K = {int(best.K)}: {best.speedup:.3f} "
                              f"[{best.speedup_lo:.3f}, {best.speedup_hi:.3f}]",
                              ">= the best K's interval", oracle_speedup >= best.speedup_lo)])
