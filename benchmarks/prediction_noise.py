"""How much of notebook 05's real-draft error a perfect round model would still show: the noise of
the prediction (its calibration runs) beside the noise of the measurement (its repetitions).

Notebook 05's goal row "real-draft measurement resolves 5 %" counts the test runs' repetitions
only (:func:`moespec.predict.speculative.measurement_noise`). The prediction rests on runs too: the
round models are fitted to the calibration turns (5 in the full profile, every draft cost and k),
and those runs are as noisy as the test's. This resamples the calibration with replacement,
``--unit turn`` (default: whole calibration turns, every run of a turn together, so the sample of
turns counts as well as the machine) or ``--unit run`` (runs within each (draft cost, k, kernel)
cell: the machine alone), refits the round models as notebook 05 does (every run, each draft's
verify term moved to its cost: amendments of 2026-12-06 f and g) and predicts the same test runs;
the spread of a point's log prediction over the resamples is its ``pred_rel_se``. With the
measurement's ``meas_rel_se`` (its repetitions) a perfect model's error at a point is about
N(0, pred_rel_se^2 + meas_rel_se^2), so ``expected_outside`` = sum over points of P(|error| > 5 %),
and ``beyond_2sd`` counts the points whose published error is more than two of those standard
deviations: error the noise does not explain.

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`); writes
``<out>/<stamp>_prediction_noise.csv`` (one row per state, draft cost and k) and ``.json`` (per
state: the medians, the expected and observed counts; the run it comes from). Measures nothing.

Run: ``.venv/bin/python benchmarks/prediction_noise.py --data <clone>/data/engine/full [--resamples 200]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from moespec.engine.results_folder import read_real_draft_folder
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP

UNITS = ("turn", "run")


def _fit_and_predict(cal: pd.DataFrame, test: pd.DataFrame, state: str) -> pd.DataFrame:
    models = CAL.from_draft_runs(cal, "resampled", state, n_boot=20, seed=0, by_regime=False, verify_by_cost="linear")
    return SP.real_draft_predictions(models, test).set_index(["draft_cost", "k"])


def resample(cal: pd.DataFrame, unit: str, rng: np.random.Generator) -> pd.DataFrame:
    """``cal`` drawn again with replacement: whole turns (``prompt``; a turn drawn twice enters twice,
    renumbered) or runs within each (draft cost, k, kernel) cell."""
    if unit == "turn":
        turns = cal["prompt"].unique()
        picks = rng.choice(turns, size=len(turns), replace=True)
        return pd.concat([cal[cal["prompt"] == t].assign(prompt=i) for i, t in enumerate(picks)], ignore_index=True)
    if unit == "run":
        cells = cal.groupby(["draft_cost", "k", "dedup"], dropna=False, sort=False).indices.values()
        return cal.iloc[np.concatenate([rng.choice(ix, size=len(ix), replace=True) for ix in cells])].reset_index(drop=True)
    raise ValueError(f"unit must be one of {list(UNITS)}; found {unit!r}")


def state_noise(cal: pd.DataFrame, test: pd.DataFrame, state: str, resamples: int = 200, unit: str = "turn",
                seed: int = 0, tolerance: float = 0.05) -> pd.DataFrame:
    """Per (draft cost, k >= 1) of one state: the published prediction and error, ``pred_rel_se``,
    ``meas_rel_se``, their combined ``rel_sd`` and ``p_outside`` (module docstring)."""
    if resamples < 2:
        raise ValueError(f"resamples must be at least 2; found {resamples}")
    base = _fit_and_predict(cal, test, state)
    rng = np.random.default_rng(seed)
    draws = [np.log(_fit_and_predict(resample(cal, unit, rng), test, state)["predicted"].reindex(base.index))
             for _ in tqdm(range(resamples), desc=f"prediction noise ({state}, by {unit})", leave=False)]
    rows = base[["predicted", "measured", "rel_error"]].copy()
    rows["pred_rel_se"] = pd.concat(draws, axis=1).std(axis=1, ddof=1)
    reps = SP.rep_columns(base.reset_index())
    rows["meas_rel_se"] = (SP.measurement_noise(base[reps], tolerance)["rel_se"] if len(reps) >= 2 else 0.0)
    rows["rel_sd"] = np.hypot(rows["pred_rel_se"], rows["meas_rel_se"])
    norm = NormalDist()
    rows["p_outside"] = [2 * (1 - norm.cdf(tolerance / s)) if s > 0 else 0.0 for s in rows["rel_sd"]]
    rows["beyond_2sd"] = np.abs(np.log1p(rows["rel_error"])) > 2 * rows["rel_sd"] + 1e-9   # not rounding error
    return rows.reset_index().assign(state=state, unit=unit)


def summary(rows: pd.DataFrame, tolerance: float = 0.05) -> dict:
    """One state's counts: points, observed misses, the noise's expected misses (both noises and the
    measurement's alone), median standard errors, points beyond two standard deviations."""
    norm = NormalDist()
    meas_only = sum(2 * (1 - norm.cdf(tolerance / s)) if s > 0 else 0.0 for s in rows["meas_rel_se"])
    return {"points": int(len(rows)), "outside": int((rows["rel_error"].abs() > tolerance).sum()),
            "expected_outside": float(rows["p_outside"].sum()), "expected_outside_measurement_only": float(meas_only),
            "pred_rel_se_median": float(rows["pred_rel_se"].median()),
            "meas_rel_se_median": float(rows["meas_rel_se"].median()), "beyond_2sd": int(rows["beyond_2sd"].sum())}


def run(data: Path, out: Path | None = None, resamples: int = 200, unit: str = "turn", seed: int = 0) -> dict:
    folder = read_real_draft_folder(data)
    tables, states = [], {}
    for state in folder.states:
        cal, test = folder.sweep(state, analysed=True)
        rows = state_noise(cal, test, state, resamples, unit, seed)
        tables.append(rows)
        states[state] = summary(rows)
    record = folder.write_record("prediction_noise", pd.concat(tables, ignore_index=True),
                                 {"unit": unit, "resamples": resamples, "seed": seed, "states": states}, out)
    print(pd.DataFrame(states).round(4).to_string())
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/prediction_noise)")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--unit", choices=UNITS, default="turn")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run(args.data, args.out, args.resamples, args.unit, args.seed)


if __name__ == "__main__":
    main()
