"""How a run's real-draft sweeps of notebook 05 spent their time and how steady it was (issue 27: the
75-minute goal, and the 5 % goal, testable only where the measurement resolves 5 %).

Reads one or more notebook-05 results folders (:mod:`moespec.engine.results_folder`). Per folder
and machine state, one row with:

Where the phase's wall time goes (amendment ``amendments_2026_12_06``):

* ``runs``, ``timed_min``: the sweep's runs and the sum of their timed decode steps (``time_s``);
* ``phase_wall_min``: the phase's wall time, from its start to the next phase's (or the run's
  end), in run.json's ``started`` / ``finished``;
* ``untimed_per_run_ms``: what is left per run, the untimed work: the prefill when a run moves to
  another prompt (before the amendment), the draft's prompt, the reference read, the routing count,
  and the phase's predictions and figures once.

How noisy its time was, and of what kind. Every cell of a sweep (part, prompt, draft cost, k,
kernel) runs the same tokens at each repetition (the loop is deterministic), so the spread of a
cell's times is the machine's alone; over the runs of cells that ran more than once:

* ``run_sd``: the standard deviation of a run's log time about its cell's mean (each residual
  scaled by sqrt(n / (n - 1)) for a cell of n runs), about the relative noise of one run;
* ``lag1_autocorr``: the correlation of consecutive runs' residuals in the sweep's order (``seq``):
  near 0 for noise that changes from run to run, larger for a machine that drifts over many runs;
* ``ref_r2``: the share of the residuals' variance that the log of the reference read timed just
  before each run (``ref_GBps``) explains linearly, and ``run_sd_after_ref`` what is left: how much a
  correction by that read could take out;
* ``run_sd_adjusted``: for a run with machine factors (amendment of 2026-12-06 d), the noise of one
  run left after notebook 05's machine adjustment (:func:`moespec.engine.machine_adjust.run_noise`
  over the adjusted runs; NaN for a run recorded before it).

Where the load bites only part of the time (the same-round read in two regimes,
:mod:`moespec.measure.regimes`): ``low_read_share``, the share of runs in the low-read regime;
``read_low_GBps`` and ``read_high_GBps``, each regime's median read; ``low_over_high_time``, how much
longer a run takes in the low regime than in the high one, the median over the cells with runs in
both of exp(mean log time low - mean log time high), over ``cells_in_both`` cells (NaN, and a share
of 0, where the reads form one regime).

Writes ``<out>/<stamp>_sweep_timing.csv`` and ``.json`` (each folder's source run), ``<stamp>`` the
latest folder's start. Measures nothing: it reads what the runs measured.

    .venv/bin/python benchmarks/sweep_timing.py --data /tmp/a/data/engine/full /tmp/b/data/engine/full
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io, paths
from moespec.engine import machine_adjust as MA
from moespec.engine.results_folder import RealDraftFolder, read_real_draft_folder
from moespec.measure.regimes import HIGH, LOW, classify, regime_summary

PHASE = "real-draft runs {state}"


def phase_wall_s(record: dict, phase: str) -> float:
    """Seconds from ``phase``'s start to the next phase's start (or the run's end), from run.json's
    ``started`` and ``finished``."""
    starts = {k: dt.datetime.fromisoformat(v) for k, v in record["started"].items()}
    if phase not in starts:
        raise KeyError(f"run.json records no phase {phase!r}; it has {sorted(starts)}")
    later = [t for t in starts.values() if t > starts[phase]] + [dt.datetime.fromisoformat(record["finished"])]
    return (min(later) - starts[phase]).total_seconds()


def noise(runs: pd.DataFrame) -> dict:
    """The module docstring's noise measures over ``runs`` (rows with ``part``, ``prompt``,
    ``draft_cost``, ``k``, ``dedup``, ``seq``, ``time_s``, ``ref_GBps``)."""
    t = runs["time_s"].astype(float).to_numpy()
    if not (np.isfinite(t) & (t > 0)).all():
        raise ValueError("every run needs a positive, finite time_s")
    runs = runs.sort_values("seq")
    resid = MA.repeated_residuals(np.log(runs["time_s"].astype(float).to_numpy()), runs)
    if len(resid) < 3:
        raise ValueError(f"need at least 3 runs of repeated cells; found {len(resid)}")
    runs, r = runs.loc[resid.index], resid.to_numpy()
    ref = np.log(runs["ref_GBps"].astype(float).to_numpy())
    ref_r2, after = float("nan"), float("nan")
    if np.isfinite(ref).all() and np.std(ref) > 0:
        slope, icpt = np.polyfit(ref, r, 1)
        rest = r - (slope * ref + icpt)
        ref_r2 = float(1 - np.var(rest) / np.var(r))
        after = float(np.sqrt(np.mean(rest ** 2)))
    return {"repeated_runs": int(len(r)), "cells": int(MA.cell_keys(runs).nunique()),
            "run_sd": float(np.sqrt(np.mean(r ** 2))), "lag1_autocorr": float(np.corrcoef(r[:-1], r[1:])[0, 1]),
            "ref_r2": ref_r2, "run_sd_after_ref": after}


def read_regimes(runs: pd.DataFrame) -> dict:
    """The module docstring's regime measures over ``runs`` (rows with the cell columns, ``time_s``
    and ``ref_GBps``)."""
    bw = runs["ref_GBps"].to_numpy(float)
    labels = classify(bw)
    medians = {r["regime"]: r["ref_GBps_median"] for r in regime_summary(bw, labels)}
    frame = pd.DataFrame({"cell": MA.cell_keys(runs).to_numpy(), "regime": labels,
                          "log_t": np.log(runs["time_s"].to_numpy(float))})
    by_cell = frame[frame["regime"].isin([LOW, HIGH])].groupby(["cell", "regime"])["log_t"].mean().unstack()
    both = by_cell.dropna() if {LOW, HIGH} <= set(by_cell.columns) else pd.DataFrame()
    return {"low_read_share": float(np.mean(labels == LOW)), "read_low_GBps": medians.get(LOW, float("nan")),
            "read_high_GBps": medians.get(HIGH, float("nan")), "cells_in_both": int(len(both)),
            "low_over_high_time": float(np.exp(np.median(both[LOW] - both[HIGH]))) if len(both) else float("nan")}


def folder_rows(folder: RealDraftFolder) -> list[dict]:
    """One row per machine state of the notebook-05 results folder ``folder``."""
    source = folder.source()
    machine = (source["hardware"] or {}).get("cpu", {}).get("cpu_model", "")
    rows = []
    for state in folder.states:
        runs = folder.whole_sweep(state)
        timed, wall = float(runs["time_s"].sum()), phase_wall_s(folder.record, PHASE.format(state=state))
        rows.append({"commit": source["commit"], "machine": machine, "run_started": folder.started, "state": state,
                     "runs": len(runs), "timed_min": timed / 60, "phase_wall_min": wall / 60,
                     "untimed_per_run_ms": 1e3 * (wall - timed) / len(runs), **noise(runs), **read_regimes(runs),
                     "run_sd_adjusted": (MA.run_noise(MA.adjusted(runs)) if MA.FACTOR in runs else float("nan"))})
    return rows


def run(data: list, out: Path | None = None) -> dict:
    folders = [read_real_draft_folder(d) for d in data]
    rows = pd.DataFrame([r for folder in folders for r in folder_rows(folder)])
    stamp = max(folder.stamp for folder in folders)
    out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / "sweep_timing")
    io.write_dataframe(out / f"{stamp}_sweep_timing.csv", rows)
    record = {"how": "benchmarks/sweep_timing.py over notebook-05 results folders of make reproduce clones",
              "sources": [folder.source() for folder in folders], "rows": rows.to_dict("records")}
    io.write_json(out / f"{stamp}_sweep_timing.json", record)
    print(rows.drop(columns=["commit", "machine"]).round(3).to_string(index=False))
    return record


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, nargs="+", type=Path, help="notebook-05 results folders")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/sweep_timing)")
    args = ap.parse_args(argv)
    return run(args.data, args.out)


if __name__ == "__main__":
    main()
