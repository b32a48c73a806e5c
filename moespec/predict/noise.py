"""How much error a perfect round model would still show against notebook 05's real-draft runs:
the noise of the prediction beside the noise of the measurement.

The measurement's noise is its repetitions' (:func:`moespec.predict.speculative.measurement_noise`:
``measured_rel_se`` per point). The prediction rests on runs too: the round models are fitted to
the calibration turns (:func:`moespec.predict.calibration.from_draft_runs`), as noisy as the
test's runs and fewer per term. :func:`prediction_se` resamples the calibration's turns with
replacement (every run of a turn together, so the sample of turns counts as well as the machine),
refits, predicts the same test runs and takes the spread of each point's log prediction over the
resamples: ``pred_rel_se``. A perfect model's error at a point is then about
N(0, pred_rel_se^2 + measured_rel_se^2) (``noise_rel_sd``), so it would fall outside the goal's
tolerance with probability ``noise_p_outside``, and a published error more than two of those
standard deviations from 0 (``beyond_2sd``) is error the noise does not explain
(:func:`with_noise`, :func:`noise_summary`; notebook 05 reports both beside the measurement's own
noise row, docs/engine.md "The round model").
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pandas as pd
from moespec.progress import tqdm

from .speculative import p_outside, real_draft_predictions

def resample_calibration(cal: pd.DataFrame, rng: np.random.Generator) -> pd.DataFrame:
    """``cal`` (calibration rows with ``prompt``) drawn again with replacement by whole turns
    (``prompt``; a turn drawn twice enters twice, renumbered so that the two copies are two turns)."""
    turns = cal["prompt"].unique()
    picks = rng.choice(turns, size=len(turns), replace=True)
    return pd.concat([cal[cal["prompt"] == t].assign(prompt=i) for i, t in enumerate(picks)], ignore_index=True)


def prediction_se(cal: pd.DataFrame, test: pd.DataFrame, fit: Callable[[pd.DataFrame], dict], resamples: int = 200,
                  seed: int = 0, desc: str = "prediction noise") -> pd.Series:
    """``pred_rel_se`` per (draft cost, k >= 1) of ``test``: the standard deviation over ``resamples``
    calibrations (:func:`resample_calibration`) of the log of the prediction
    (:func:`moespec.predict.speculative.real_draft_predictions` with the round models ``fit`` makes
    of the resampled rows: {draft cost: RoundModel})."""
    if resamples < 2:
        raise ValueError(f"resamples must be at least 2; found {resamples}")
    rng = np.random.default_rng(seed)
    draws = []
    for _ in tqdm(range(resamples), desc=f"{desc} (calibration turns resampled)", leave=False):
        pred = real_draft_predictions(fit(resample_calibration(cal, rng)), test)
        draws.append(np.log(pred.set_index(["draft_cost", "k"])["predicted"]))
    return pd.concat(draws, axis=1).std(axis=1, ddof=1).rename("pred_rel_se")


def with_noise(pred: pd.DataFrame, pred_rel_se: pd.Series, tolerance: float = 0.05) -> pd.DataFrame:
    """``pred`` (:func:`moespec.predict.speculative.real_draft_predictions` rows) with the prediction's
    noise joined (``pred_rel_se``), both noises together (``noise_rel_sd``: the measurement's
    ``measured_rel_se``, 0 where the runs have one repetition), the chance a perfect prediction falls
    outside ``tolerance`` (``noise_p_outside``) and whether the point's error lies more than two of
    those standard deviations from 0 (``beyond_2sd``, in log terms)."""
    out = pred.join(pred_rel_se, on=["draft_cost", "k"])
    if out["pred_rel_se"].isna().any():
        lost = out.loc[out["pred_rel_se"].isna(), ["draft_cost", "k"]].values.tolist()
        raise ValueError(f"no prediction noise for (draft cost, k) {lost[:4]}")
    meas = out["measured_rel_se"].fillna(0.0) if "measured_rel_se" in out else 0.0
    out["noise_rel_sd"] = np.hypot(out["pred_rel_se"], meas)
    out["noise_p_outside"] = [p_outside(s, tolerance) for s in out["noise_rel_sd"]]
    out["beyond_2sd"] = np.abs(np.log1p(out["rel_error"])) > 2 * out["noise_rel_sd"] + 1e-9   # not rounding error
    return out


def noise_summary(pred: pd.DataFrame, tolerance: float = 0.05) -> dict:
    """One state's :func:`with_noise` rows (k >= 1) counted: points, those outside ``tolerance``, the
    number a perfect prediction would put outside by both noises (``expected_outside``) and by the
    measurement's alone, the median standard errors, and the points beyond two standard deviations."""
    f = pred[pred["k"] >= 1]
    meas = f["measured_rel_se"].fillna(0.0) if "measured_rel_se" in f else pd.Series(0.0, index=f.index)
    return {"points": int(len(f)), "outside": int((f["rel_error"].abs() > tolerance).sum()),
            "expected_outside": float(f["noise_p_outside"].sum()),
            "expected_outside_measurement_only": float(sum(p_outside(s, tolerance) for s in meas)),
            "pred_rel_se_median": float(f["pred_rel_se"].median()), "meas_rel_se_median": float(meas.median()),
            "beyond_2sd": int(f["beyond_2sd"].sum()), "tolerance": tolerance}


def prediction_noise_phrase(n: dict) -> str:
    """:func:`noise_summary`'s counts in words (notebook 05's line and its goal row say it alike)."""
    tol = 100 * n["tolerance"]
    return (f"standard error of a point's prediction {100 * n['pred_rel_se_median']:.1f} % (median; its "
            f"measurement's {100 * n['meas_rel_se_median']:.1f} %), so a perfect prediction would fall outside "
            f"{tol:.0f} % at about {n['expected_outside']:.1f} of {n['points']} points by the two noises "
            f"({n['expected_outside_measurement_only']:.1f} by the measurement's alone); {n['outside']} are "
            f"outside, and {n['beyond_2sd']} errors lie beyond two standard deviations of that noise")
