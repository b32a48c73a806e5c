"""advise's answer beside what the run measured (notebook 08): at the run's own measured
acceptance profile, per machine state, the speedup advise predicts at every k (with its band)
against the speedup the real-draft runs of notebook 05 measured with the same draft, whether
advise recommends what the run measured best, and what following it costs: the regret, the
throughput lost by running advise's k instead of the measured best k (:func:`regret`), with its
interval from the repetitions (paired: every k of a resample uses the same repetitions). A
prediction is a claim about a measurement: this table is where they meet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec.predict.speculative import inside_band
from moespec.runstats import regret_interval

from .errors import AdviceInputError
from .inputs import run_file

REGRET_GOAL = 0.02
RESAMPLES = 4000


def measured_acceptance(run, allow_incomplete: bool = False) -> pd.DataFrame:
    """Per machine state, the real draft's measured acceptance ``a`` as the run file holds it: the
    median over prompts of each prompt's accepted / (accepted + rejections) over k >= 1
    (:func:`moespec.predict.speculative.median_prompt_acceptance`; the measured speedups advise is
    set beside are medians over the same prompts)."""
    rf = run_file(run, allow_incomplete)
    acc = rf.acceptance()
    if acc.empty:
        raise AdviceInputError(f"{rf.path}: field acceptance: expected the real-draft runs' acceptance per state "
                               f"(notebook 05); found none", where=str(rf.path), field="acceptance")
    return acc


def decision_rate(row, where) -> float:
    """The acceptance rate a state's measured acceptance ``row`` decides at: its median prompt's ``a``;
    where that is 1 (most prompts accepted every draft: data, not an error), the pooled rate over
    every prompt's verify steps, ``a_pooled``; refused where every draft of every prompt was accepted
    (the geometric rate is 1 and the theory needs a < 1)."""
    a = float(row.a)
    if a < 1:
        return a
    pooled = float(getattr(row, "a_pooled", float("nan")))
    if pooled < 1:
        return pooled
    raise AdviceInputError(f"{where}: run file field acceptance.{row.state}: every draft of every prompt was accepted "
                           f"(a = {a}, pooled {pooled}); the decision needs a < 1: give acceptance rates (-a)",
                           where=str(where), field=f"acceptance.{row.state}", found=a)


def regret(speedup: pd.Series, by_rep: np.ndarray | None, k: int, resamples: int = RESAMPLES,
           seed: int = 0) -> dict:
    """The throughput lost by running draft length ``k`` instead of the measured best:
    1 - S(k) / max_j S(j), S the measured speedup per k >= 1 (``speedup``, indexed by k; plain
    decoding, S(0) = 1, counts as a draft length). Its 95 % interval resamples the repetitions
    (``by_rep``: one row per k in ``speedup``'s order, one column per repetition: each
    repetition's median over prompts) with replacement, the same repetitions for every k, S*(j)
    the median of the resampled repetitions; without two repetitions there is no interval."""
    S = pd.concat([pd.Series({0: 1.0}), speedup.astype(float)])
    best = int(S.idxmax())
    out = {"k": int(k), "best_k": best, "best_speedup": float(S.max()), "speedup_at_k": float(S[k]),
           "regret": float(1 - S[k] / S.max()), "regret_lo": np.nan, "regret_hi": np.nan, "reps": 0}
    if by_rep is None or by_rep.shape[1] < 2:
        return out
    with_plain = np.vstack([np.ones((1, by_rep.shape[1])), by_rep])     # plain decoding: S(0) = 1 in every repetition
    lo, hi = regret_interval(with_plain, list(S.index).index(k), resamples=resamples, seed=seed)
    out.update(regret_lo=lo, regret_hi=hi, reps=by_rep.shape[1])
    return out


def _reps(rows: pd.DataFrame) -> np.ndarray | None:
    """Per k (rows in k order) the repetitions' speedups, where every k has the same number (>= 2)."""
    if "speedup_by_rep" not in rows:
        return None
    lists = [list(x) if isinstance(x, (list, tuple)) else [] for x in rows["speedup_by_rep"]]
    if len({len(x) for x in lists}) != 1 or len(lists[0]) < 2:
        return None
    return np.array(lists, dtype=float)


def _regret_row(state: str, acceptance: str, k: int, meas_rows: pd.DataFrame) -> dict:
    r = regret(meas_rows.set_index("k")["speedup"], _reps(meas_rows), k)
    basis = (f"paired bootstrap over the {r['reps']} repetitions (each a median over prompts; every k resampled "
             "together)" if r["reps"] else "no repetitions: no interval")
    return {"state": state, "acceptance": acceptance, "advise_k": k, "measured_best_k": r["best_k"],
            "measured_best": r["best_speedup"], "measured_at_advise_k": r["speedup_at_k"], "regret": r["regret"],
            "regret_lo": r["regret_lo"], "regret_hi": r["regret_hi"], "interval": basis}


def against_runs(folder: Path, tolerance: float = 0.05, **options) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(table, regret, goals): per state and k, advise's speedup at the run's own measured
    acceptance profile with its band (``moespec.advise(folder, state=state, **options)``) beside the
    measured median speedup of the draft as trained (the run file's ``measured``, draft cost 0);
    per state the regret of advise's k at that profile and, beside it, at the geometric acceptance
    of the run's measured a (:func:`regret`); and per state the goals: the recommendation is the
    measured best, the measured best inside advise's band, within ``tolerance`` at every k, the
    band holds every measured speedup, the regret at most :data:`REGRET_GOAL` (interval included)."""
    from moespec.advice import advise

    allow = bool(options.get("allow_incomplete", False))
    acc = measured_acceptance(folder, allow)
    pred = run_file(folder, allow).measured()
    rows, regrets, goals = [], [], []
    for r in acc.itertuples():
        own = pred[(pred["state"] == r.state) & (pred["draft_cost"] == 0)].sort_values("k")
        meas = own.set_index("k")["speedup"]
        if meas.empty:
            raise AdviceInputError(f"{folder}: run file field measured.{r.state}: expected runs of the draft as "
                                   "trained (draft_cost 0); found none", where=str(folder), field=f"measured.{r.state}")
        item = advise(folder, state=r.state, **options)["acceptance"][0]
        eng = item["engines"]["dedup"]          # the real-draft runs ran the deduplicating kernel from n = 2
        for k in meas.index:
            if k >= len(eng["speedup_by_k"]):
                continue
            sp, lo, hi = eng["speedup_by_k"][k], eng["speedup_lo_by_k"][k], eng["speedup_hi_by_k"][k]
            rows.append({"state": r.state, "a": item["a"], "k": int(k), "tokens_per_step": item["tokens_per_step"][k],
                         "advise_speedup": sp, "advise_lo": lo, "advise_hi": hi, "measured_speedup": float(meas[k]),
                         "rel_error": sp / float(meas[k]) - 1, "inside": bool(inside_band(float(meas[k]), lo, hi))})
        mine = pd.DataFrame([x for x in rows if x["state"] == r.state])
        rec = item["recommended"]
        a_geo = decision_rate(r, folder)          # the median prompt's a; the pooled a where that is 1
        geometric = advise(folder, [a_geo], state=r.state, **options)["acceptance"][0]["recommended"]["k"]
        ours = _regret_row(r.state, "the run's measured profile", rec["k"], own)
        regrets += [ours, _regret_row(r.state, f"geometric at the measured a = {a_geo:.3f}", geometric, own)]
        best_meas = ours["measured_best_k"]
        goals += [{"goal": f"advise at the run's measured acceptance profile recommends the measured best, {r.state}",
                   "value": f"advise k = {rec['k']} ({rec['engine']}); measured best k = {best_meas}"
                            + (f" (median speedup {meas.max():.3f})" if best_meas
                               else " (plain decoding: every k < 1)"),
                   "target": "the same k", "met": rec["k"] == best_meas},
                  _best_in_band(r, rec, meas, best_meas),
                  {"goal": f"advise's speedup within {100 * tolerance:.0f} % of the measured one at every k, {r.state}",
                   "value": f"{int((mine.rel_error.abs() <= tolerance).sum())} of {len(mine)}; largest |error| "
                            f"{100 * mine.rel_error.abs().max():.1f} %", "target": "all k",
                   "met": bool((mine.rel_error.abs() <= tolerance).all())},
                  {"goal": f"advise's per-k band holds the measured speedup, {r.state}",
                   "value": f"{int(mine.inside.sum())} of {len(mine)}", "target": "all k",
                   "met": bool(mine.inside.all())},
                  _regret_goal(ours)]
    return pd.DataFrame(rows), pd.DataFrame(regrets), pd.DataFrame(goals).assign(met=lambda f: f["met"].astype(bool))


def _regret_goal(r: dict) -> dict:
    """The regret goal of one state: at most :data:`REGRET_GOAL`, the interval's upper end included."""
    hi = r["regret_hi"]
    shown = f"[{100 * r['regret_lo']:.1f}, {100 * hi:.1f}] %" if np.isfinite(hi) else "no interval (one repetition)"
    return {"goal": f"regret of advise's k at most {100 * REGRET_GOAL:.0f} % of the measured best (interval "
                    f"included), {r['state']}",
            "value": f"advise k = {r['advise_k']}, measured best k = {r['measured_best_k']}: regret "
                     f"{100 * r['regret']:.1f} % {shown}",
            "target": f"<= {100 * REGRET_GOAL:.0f} %", "met": bool(np.isfinite(hi) and hi <= REGRET_GOAL)}


def _best_in_band(r, rec: dict, meas: pd.Series, best_meas: int) -> dict:
    """The standing rule's second half: the measured best speedup (1 for plain decoding) inside the
    band advise prints for its recommendation."""
    best = float(meas.max()) if best_meas else 1.0
    lo, hi = (float(rec["speedup_lo"]), float(rec["speedup_hi"])) if rec["k"] else (1.0, 1.0)
    return {"goal": f"the measured best speedup inside advise's printed band, {r.state}",
            "value": f"measured best {best:.3f}; advise k = {rec['k']}: {float(rec['speedup']):.3f} "
                     f"[{lo:.3f}, {hi:.3f}]", "target": "inside",
            "met": bool(inside_band(best, lo, hi))}


def state_agreement(goals: pd.DataFrame) -> bool:
    """True when advise recommended each state's measured best (the states' goal rows)."""
    rec = goals[goals["goal"].str.contains("recommends the measured best")]
    return bool(len(rec)) and bool(np.all(rec["met"]))


def regret_sizing(speedup: pd.Series, by_rep: np.ndarray, k: int, reps=(3, 5, 7, 9, 11, 15),
                  prompt_factors=(1, 2, 4), trials: int = 200, goal: float | None = None,
                  resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """How many repetitions (and prompts per repetition) a run needs for :func:`regret`'s interval
    to resolve the regret goal: a simulation of runs like the measured one. Each k's repetitions
    are drawn from a normal distribution centred on its measured median speedup (``speedup``) with
    the spread of the measured repetitions (``by_rep``, one row per k), pooled over k (the root mean
    square of the per-k standard deviations); ``prompt_factor`` f prompts per repetition shrink that
    spread by sqrt(f) (each repetition is a median over prompts). Per (reps, prompt_factor): the
    median and 80th percentile of the simulated runs' upper interval end for draft length ``k``,
    and the share of runs whose upper end is at most ``goal`` (default :data:`REGRET_GOAL`)."""
    goal = REGRET_GOAL if goal is None else float(goal)
    by_rep = np.asarray(by_rep, dtype=float)
    if by_rep.ndim != 2 or by_rep.shape[1] < 2 or by_rep.shape[0] != len(speedup):
        raise ValueError(f"by_rep: expected one row per k of speedup ({len(speedup)}) and at least two "
                         f"repetitions; found shape {by_rep.shape}")
    centre = speedup.astype(float).to_numpy()
    spread = float(np.sqrt(np.mean(np.var(by_rep, axis=1, ddof=1))))
    rng = np.random.default_rng(seed)
    rows = []
    for f in prompt_factors:
        for R in reps:
            his = []
            for t in range(trials):
                sim = centre[:, None] + rng.normal(0.0, spread / np.sqrt(f), (len(centre), int(R)))
                r = regret(pd.Series(np.median(sim, axis=1), index=speedup.index), sim, k, resamples=resamples,
                           seed=t)
                his.append(r["regret_hi"])
            his = np.array(his)
            rows.append({"reps": int(R), "prompt_factor": f, "rep_spread": spread / np.sqrt(f),
                         "regret_hi_median": float(np.median(his)), "regret_hi_p80": float(np.quantile(his, 0.8)),
                         "share_resolved": float(np.mean(his <= goal)), "goal": goal, "trials": trials})
    return pd.DataFrame(rows)


def run_regret_sizing(folder: Path, **options) -> pd.DataFrame:
    """:func:`regret_sizing` per machine state of a run (the run file's measured runs of the draft as
    trained, at the measured best k, where regret is zero by construction and its interval is all
    that is left to resolve)."""
    pred = run_file(folder, bool(options.pop("allow_incomplete", False))).measured()
    out = []
    for state, own in pred[pred["draft_cost"] == 0].groupby("state", sort=False):
        own = own.sort_values("k")
        reps = _reps(own)
        if reps is None:
            continue
        speed = own.set_index("k")["speedup"]
        out.append(regret_sizing(speed, reps, int(speed.idxmax()), **options).assign(
            state=state, measured_reps=reps.shape[1], best_k=int(speed.idxmax())))
    if not out:
        raise AdviceInputError(f"{folder}: run file field measured: expected repetitions (speedup_by_rep) of the "
                               "draft as trained; found none", where=str(folder), field="measured")
    return pd.concat(out, ignore_index=True)
