"""Issue 16's goals for the whole-model results, decided from a run's own numbers: each goal's
value, its target and ``met`` (True) or short (False). They are pre-registered beside the rules
(``goals_reported`` of ``data/preregistration/scoring_rules_byte_faithful.json``) and are reported,
never used to tune the subject."""

from __future__ import annotations

import pandas as pd


def _row(goal: str, value: str, target: str, met: bool) -> dict:
    return {"goal": goal, "value": value, "target": target, "met": bool(met)}


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
    return pd.DataFrame([
        _row("real-draft speedup predicted within 10 % at every (draft cost, k)",
             f"{inside} of {len(pred)} points; largest |error| {100 * worst:.1f} %", "all points", inside == len(pred)),
        _row("draft cost at which drafting stops paying, predicted within one grid step",
             f"measured {stop['stop_cost_measured']}, predicted {stop['stop_cost_predicted']}; "
             f"{stop['grid_steps_apart']} steps apart", "<= 1 step", stop["grid_steps_apart"] <= 1)])


def paper2_goals(regression: dict, online_info: dict) -> pd.DataFrame:
    """From notebook 07: eq. (4)'s in-sample R2 >= 0.9 and GroupKFold MAPE <= 10 % (one set of
    rows, ``RoundFits.summary()``), and the online policy >= 90 % of the oracle on held-out sequences."""
    share = online_info["online"] / online_info["oracle"]
    rows = regression["rows"]
    return pd.DataFrame([
        _row(f"eq. (4) in-sample R2, {rows}", f"{regression['eq4_r2_in']:.3f}", ">= 0.9", regression["eq4_r2_in"] >= 0.9),
        _row(f"eq. (4) GroupKFold MAPE, {rows}", f"{regression['eq4_cv_mape_pct']:.2f} %", "<= 10 %",
             regression["eq4_cv_mape_pct"] <= 10.0),
        _row("online early exit / oracle on held-out sequences", f"{100 * share:.1f} %", ">= 90 %", share >= 0.9)])


def oracle_bound_goal(oracle_speedup: float, measured: pd.DataFrame, transitions: str = "greedy") -> pd.DataFrame:
    """Issue 24's goal for notebook 07: the ``transitions`` oracle's speedup at least the best measured
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
