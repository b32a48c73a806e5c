"""The machine adjustment's read, rescored on a run's real-draft sweeps: each run's ``B`` from its
own same-round read alone (amendment of 2026-12-06 d) or from the two reads that bracket it, its own
(timed just before it) and the next run's (timed just after it), their geometric mean (amendment of
2026-12-06 k; ``moespec.engine.machine_adjust.run_reads``).

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`) and, per machine state and
read, re-estimates the machine factors over the state's whole sweep (calibration and test runs, as
measured) and reports the noise of one run the adjustment leaves (``run_noise`` of the adjusted
runs: the measure amendment d chose its settings on and amendment k chose its read on) and, beside
it, the real-draft predictions scored as notebook 05 scores them (round models fitted to the
adjusted calibration runs, :func:`moespec.predict.calibration.real_draft_models`, against the
adjusted test runs): how many (draft cost, k) points are within 5 %, the largest, mean and
root-mean-square error. The read notebook 05 used, with the run's slope grouping (``RealDraftFolder.slope_by``),
reproduces its published predictions.

Writes ``<out>/<stamp>_read_bracketing.csv`` (one row per state and read) and ``.json`` with the run
it comes from. Measures nothing.

Run: ``.venv/bin/python benchmarks/read_bracketing.py --data <clone>/data/engine/full``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec.engine import machine_adjust as MA
from moespec.engine.rescore import rescore
from moespec.engine.results_folder import read_real_draft_folder, reanalysis_main


def run(data: Path, out: Path | None = None, n_boot: int = 200) -> pd.DataFrame:
    folder = read_real_draft_folder(data)
    rows = pd.DataFrame([rescore(folder.whole_sweep(state), state, n_boot=n_boot, read=read, slope_by=folder.slope_by,
                                  draft_form=folder.draft_form).summary
                         for state in folder.states for read in MA.READS])
    folder.write_rows("read_bracketing", rows, out, n_boot=n_boot)
    print(rows.round(4).to_string(index=False))
    return rows


def main() -> None:
    reanalysis_main(run, __doc__, "read_bracketing")


if __name__ == "__main__":
    main()
