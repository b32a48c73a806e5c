"""A machine state's real-draft sweep rescored under other machine-adjustment settings: the
re-analysis ``benchmarks/read_bracketing.py`` (which read, amendment of 2026-12-06 k) and
``benchmarks/read_slopes.py`` (one read slope per sweep or per group of runs) and
``benchmarks/draft_forms.py`` (the form of the draft's time) run on a published
run's files. Measures nothing: it re-estimates the machine factors
(:func:`moespec.engine.machine_adjust.machine_factors`) over the sweep as measured, refits the round
models on the adjusted calibration runs and scores them on the adjusted test runs, as notebook 05
does (:func:`moespec.predict.calibration.real_draft_models`,
:func:`moespec.predict.speculative.real_draft_predictions`)."""

from __future__ import annotations

from typing import NamedTuple

import pandas as pd

from moespec.engine import machine_adjust as MA
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP


class Rescored(NamedTuple):
    """What :func:`rescore` gives: the score, the predictions, and what they came from."""

    summary: dict               # the settings, the slope, the noise before and after, the score
    predictions: pd.DataFrame   # moespec.predict.speculative.real_draft_predictions' rows
    factors: MA.MachineFactors  # the machine factors estimated over the sweep
    models: dict                # {draft cost: RoundModel} fitted to the adjusted calibration runs
    adjusted: pd.DataFrame      # the sweep's runs at its typical machine state (both parts)


def rescore(sweep: pd.DataFrame, state: str, tolerance: float = 0.05, n_boot: int = 200, seed: int = 0,
            draft_form: str = CAL.REAL_DRAFT_FORM, **settings) -> Rescored:
    """One state's whole sweep (``part`` calibration/test, as measured:
    :meth:`moespec.engine.results_folder.RealDraftFolder.whole_sweep`) rescored with the machine
    factors of ``settings`` (keywords of :func:`~moespec.engine.machine_adjust.machine_factors`) and
    the draft's time in ``draft_form`` (:data:`moespec.predict.round_model.DRAFT_FORMS`): the
    summary holds the adjustment's slope, the noise of one run before and after it
    (:func:`~moespec.engine.machine_adjust.run_noise`, the measure the adjustment's settings are
    chosen on) and the predictions' score (:func:`moespec.predict.speculative.error_score`)."""
    runs, mf = MA.with_machine_factors(sweep.drop(columns=[MA.FACTOR], errors="ignore"), **settings)
    adj = MA.adjusted(runs)
    models = CAL.real_draft_models(adj[adj["part"] == "calibration"], "rescored", state, n_boot=n_boot, seed=seed,
                                   draft_form=draft_form)
    pred = SP.real_draft_predictions(models, adj[adj["part"] == "test"])
    summary = {"state": state, "draft_form": draft_form, **{k: str(v) for k, v in settings.items()},
               "slope": mf.slope, "runs": len(runs),
               "noise_measured": MA.run_noise(runs), "noise_adjusted": MA.run_noise(adj),
               **SP.error_score(pred["rel_error"], tolerance)}
    return Rescored(summary, pred, mf, models, adj)
