"""How much of a published run's real-draft error a perfect round model would still show: the
noise of the prediction (its calibration turns) beside the noise of the measurement (its
repetitions), for a run recorded before notebook 05 reported it itself.

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`) and, per machine state,
resamples the calibration (``--unit turn``: whole turns, the default; ``run``: runs within each
cell), refits the round models as notebook 05 does (:func:`moespec.predict.calibration.real_draft_models`)
and predicts the same test runs (:mod:`moespec.predict.noise`: ``pred_rel_se``, ``noise_rel_sd``,
``noise_p_outside``, ``beyond_2sd`` per point; the counts per state).

Writes ``<out>/<stamp>_prediction_noise.csv`` (one row per state, draft cost and k) and ``.json`` (per
state: the medians, the expected and observed counts; the run it comes from). Measures nothing.

Run: ``.venv/bin/python benchmarks/prediction_noise.py --data <clone>/data/engine/full [--resamples 200]``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from moespec.engine.results_folder import read_real_draft_folder
from moespec.predict import calibration as CAL
from moespec.predict import noise as NOISE
from moespec.predict import speculative as SP


def state_noise(cal: pd.DataFrame, test: pd.DataFrame, state: str, resamples: int = 200, unit: str = "turn",
                seed: int = 0) -> pd.DataFrame:
    """One state's real-draft predictions (round models as notebook 05 fits them) with their noise."""
    def fit(rows):
        return CAL.real_draft_models(rows, "resampled", state, n_boot=20, seed=seed)
    se = NOISE.prediction_se(cal, test, fit, resamples, unit, seed, desc=f"prediction noise ({state})")
    keep = ["draft_cost", "k", "predicted", "measured", "rel_error", "measured_rel_se"]
    pred = SP.real_draft_predictions(fit(cal), test)
    return NOISE.with_noise(pred[[c for c in keep if c in pred]], se).assign(state=state, unit=unit)


def run(data: Path, out: Path | None = None, resamples: int = 200, unit: str = "turn", seed: int = 0) -> dict:
    folder = read_real_draft_folder(data)
    tables, states = [], {}
    for state in folder.states:
        cal, test = folder.sweep(state, analysed=True)
        tables.append(state_noise(cal, test, state, resamples, unit, seed))
        states[state] = NOISE.noise_summary(tables[-1])
    record = folder.write_record("prediction_noise", pd.concat(tables, ignore_index=True),
                                 {"unit": unit, "resamples": resamples, "seed": seed, "states": states}, out)
    print(pd.DataFrame(states).round(4).to_string())
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/prediction_noise)")
    ap.add_argument("--resamples", type=int, default=200)
    ap.add_argument("--unit", choices=NOISE.UNITS, default="turn")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    run(args.data, args.out, args.resamples, args.unit, args.seed)


if __name__ == "__main__":
    main()
