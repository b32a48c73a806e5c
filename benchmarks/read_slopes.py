"""The machine adjustment's read slope, one per sweep or one per group of runs, on a run's
real-draft sweeps (``moespec.engine.machine_adjust``, ``slope_by``; amendment of 2026-12-07 a).

A run's machine factor moves its time by ``b (log B - median log B)``: how its throughput follows
the same-round read ``B``. A plain step is all weight reads; a drafted round adds the draft's
compute, which the read does not move, so the plain runs and the drafted ones need not share one
``b``. Per machine state this script estimates ``b`` over the state's whole sweep (calibration and
test runs, as measured) per grouping of :data:`moespec.engine.machine_adjust.SLOPE_GROUPS` (one
slope over the sweep, plain and drafted, per k, per kind of run) and reports for each: the groups'
slopes, the noise of one run the whole adjustment leaves in sample (``noise_adjusted``, the measure
amendments d and k chose their settings on; a finer grouping always lowers it), the noise the read
term leaves out of sample (``held_out_noise``: each prompt's runs adjusted with slopes estimated on
the other prompts', :func:`moespec.engine.machine_adjust.held_out_read_noise`), and the real-draft
predictions scored as notebook 05 scores them (:func:`moespec.engine.rescore.rescore`). The row of
the rule a run used reproduces its published predictions.

Writes ``<out>/<stamp>_read_slopes.csv`` (one row per state and grouping) and ``.json`` with the
run it comes from. Measures nothing.

Run: ``.venv/bin/python benchmarks/read_slopes.py --data <clone>/data/engine/full``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec.engine import machine_adjust as MA
from moespec.engine.rescore import rescore
from moespec.engine.results_folder import read_real_draft_folder, reanalysis_main


def run(data: Path, out: Path | None = None, n_boot: int = 200) -> pd.DataFrame:
    folder = read_real_draft_folder(data)
    rows = []
    for state in folder.states:
        sweep = folder.whole_sweep(state)
        for rule in MA.SLOPES:
            got = rescore(sweep, state, n_boot=n_boot, slope_by=rule, draft_form=folder.draft_form)
            slopes = got.factors.group_slopes or {}
            rows.append({**got.summary, "groups": len(slopes),
                         "group_slopes": "; ".join(f"{g} {b:.3f}" for g, b in slopes.items()),
                         "held_out_noise": MA.held_out_read_noise(sweep, slope_by=rule)})
    table = pd.DataFrame(rows)
    folder.write_rows("read_slopes", table, out, n_boot=n_boot)
    print(table.drop(columns="group_slopes").round(4).to_string(index=False))
    for r in table.itertuples():
        if r.groups <= 2:
            print(f"[{r.state}] {r.slope_by}: {r.group_slopes}")
    return table


def main() -> None:
    reanalysis_main(run, __doc__, "read_slopes")


if __name__ == "__main__":
    main()
