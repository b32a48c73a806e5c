"""advise's answer beside what the run measured (notebook 08): at the run's own measured acceptance,
per machine state, the speedup advise predicts at every k (with its band) against the speedup the
real-draft runs of notebook 05 measured with the same draft, and whether advise recommends what the
run measured best. A prediction is a claim about a measurement: this table is where they meet."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec.predict.speculative import inside_band

from .errors import AdviceInputError
from .inputs import run_file


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


def against_runs(folder: Path, tolerance: float = 0.05, **options) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(table, goals): per state and k, advise's speedup at the run's measured acceptance with its
    band (``moespec.advise(folder, [a], state=state, **options)``) beside the measured median
    speedup of the draft as trained (the run file's ``measured``, draft cost 0); and per state
    the goals: the recommendation is the measured best, within ``tolerance`` at every k, the band
    holds every measured speedup."""
    from moespec.advice import advise

    allow = bool(options.get("allow_incomplete", False))
    acc = measured_acceptance(folder, allow)
    pred = run_file(folder, allow).measured()
    rows, goals = [], []
    for r in acc.itertuples():
        meas = pred[(pred["state"] == r.state) & (pred["draft_cost"] == 0)].set_index("k")["speedup"]
        if meas.empty:
            raise AdviceInputError(f"{folder}: run file field measured.{r.state}: expected runs of the draft as "
                                   "trained (draft_cost 0); found none", where=str(folder), field=f"measured.{r.state}")
        adv = advise(folder, [decision_rate(r, folder)], state=r.state, **options)
        item = adv["acceptance"][0]
        eng = item["engines"]["dedup"]          # the real-draft runs ran the deduplicating kernel from n = 2
        for k in meas.index:
            if k >= len(eng["speedup_by_k"]):
                continue
            sp, lo, hi = eng["speedup_by_k"][k], eng["speedup_lo_by_k"][k], eng["speedup_hi_by_k"][k]
            rows.append({"state": r.state, "a": float(item["a"]), "k": int(k), "advise_speedup": sp, "advise_lo": lo,
                         "advise_hi": hi, "measured_speedup": float(meas[k]), "rel_error": sp / float(meas[k]) - 1,
                         "inside": bool(inside_band(float(meas[k]), lo, hi))})
        mine = pd.DataFrame([x for x in rows if x["state"] == r.state])
        best_meas = int(meas.idxmax()) if meas.max() > 1 else 0
        rec = item["recommended"]
        goals += [{"goal": f"advise at the measured a = {item['a']:.3f} recommends the measured best, {r.state}",
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
                   "met": bool(mine.inside.all())}]
    return pd.DataFrame(rows), pd.DataFrame(goals).assign(met=lambda f: f["met"].astype(bool))


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
