"""notebook 05's real-draft predictions rescored with each way of forming the deduplicating verify
term per draft (``moespec.predict.calibration.from_draft_runs``, ``verify_by_cost``): ``pooled``
(one term from every draft's runs), ``own`` (each draft's runs alone; amendment of 2026-12-06 i,
what notebook 05 uses from the run after c58c3e7 on) and ``linear`` (the pooled runs moved to each
draft's cost along each k's slope; amendment of 2026-12-06 g, what the runs published in 80bc719 and
c58c3e7 used).

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`) and, per machine state,
fits the round models to the calibration runs as notebook 05 analysed them (at the sweep's typical
machine state, every run: amendments of 2026-12-06 d and f) with each option, predicts the test
runs (:func:`moespec.predict.speculative.real_draft_predictions`) and counts the (draft cost, k >= 1)
points within the 5 % goal: how much of the real draft's agreement the verify term's form carries,
on a run that was not used to choose it. The draft's time is fitted in the form the run used
(``RealDraftFolder.draft_form``; amendment of 2026-12-07 b), so the option notebook 05 used
reproduces its published ``05_draft_cost_predictions.csv`` (the point predictions do not depend on
the bootstrap).

Writes ``<out>/<stamp>_verify_by_cost.csv`` (one row per state and option) and ``.json`` with the
run it comes from. Measures nothing.

Run: ``.venv/bin/python benchmarks/verify_by_cost.py --data <clone>/data/engine/full``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec.engine.results_folder import read_real_draft_folder, reanalysis_main
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP


def rescore(cal: pd.DataFrame, test: pd.DataFrame, state: str, how: str, tolerance: float = 0.05,
            n_boot: int = 200, seed: int = 0, draft_form: str = "line") -> dict:
    """One state's real-draft predictions with the verify term formed as ``how`` and the draft's
    time in ``draft_form``: the points (draft cost, k >= 1), how many are within ``tolerance``, the
    largest and root-mean-square error."""
    models = CAL.from_draft_runs(cal, "rescored", state, n_boot=n_boot, seed=seed, by_regime=False,
                                 verify_by_cost=how, draft_form=draft_form)
    pred = SP.real_draft_predictions(models, test)
    return {"state": state, "verify_by_cost": how, "draft_form": draft_form,
            **SP.error_score(pred.loc[pred["k"] >= 1, "rel_error"], tolerance)}


def run(data: Path, out: Path | None = None, n_boot: int = 200) -> pd.DataFrame:
    folder = read_real_draft_folder(data)
    rows = []
    for state in folder.states:
        cal, test = folder.sweep(state, analysed=True)
        rows += [rescore(cal, test, state, how, n_boot=n_boot, draft_form=folder.draft_form)
                 for how in CAL.VERIFY_BY_COST]
    rows = pd.DataFrame(rows)
    folder.write_rows("verify_by_cost", rows, out, n_boot=n_boot)
    print(rows.round(4).to_string(index=False))
    return rows


def main() -> None:
    reanalysis_main(run, __doc__, "verify_by_cost")


if __name__ == "__main__":
    main()
