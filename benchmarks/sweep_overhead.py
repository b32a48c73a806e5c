"""Where the real-draft phase of notebook 05 spends its wall time: the decode steps it times against
everything else (issue 27, the 75-minute goal; amendment ``amendments_2026_12_06``).

Reads one or more notebook-05 results folders (``<run data>/engine/full`` of a ``make reproduce``
clone): ``run.json`` (when each phase started, when the run finished), ``draft_calibration.csv``
and ``real_draft.csv`` / ``real_draft_<state>.csv``. Per folder and machine state: the runs of the
phase's sweep, the sum of their timed steps (``time_s``), the phase's wall time (from its start to
the start of the next phase, or to the run's end) and what is left per run, which is the untimed
work: the prefill when a run moves to another prompt (before the amendment), the draft's prompt,
the reference read, the routing count, and the phase's predictions and figures once. Writes
``<out>/<stamp>_sweep_overhead.csv`` and ``.json`` (the folders' commits and the machine), ``<stamp>``
the latest folder's start. Measures nothing: it reads what the runs measured.

    .venv/bin/python benchmarks/sweep_overhead.py --data /tmp/a/data/engine/full /tmp/b/data/engine/full
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path

import pandas as pd

from moespec import io, paths

PHASE = "real-draft runs {state}"


def phase_wall_s(record: dict, phase: str) -> float:
    """Seconds from ``phase``'s start to the next phase's start (or the run's end), from run.json's
    ``started`` and ``finished``."""
    starts = {k: dt.datetime.fromisoformat(v) for k, v in record["started"].items()}
    if phase not in starts:
        raise KeyError(f"run.json records no phase {phase!r}; it has {sorted(starts)}")
    later = [t for t in starts.values() if t > starts[phase]] + [dt.datetime.fromisoformat(record["finished"])]
    return (min(later) - starts[phase]).total_seconds()


def folder_rows(data: Path) -> list[dict]:
    """One row per machine state of the notebook-05 results folder ``data``."""
    data = Path(data)
    for name in ("draft_calibration.csv", "real_draft.csv", "run.json"):
        if not (data / name).exists():
            raise FileNotFoundError(f"{data} holds no {name}: not a notebook-05 results folder with a real draft")
    record = json.loads((data / "run.json").read_text())
    cal = pd.read_csv(data / "draft_calibration.csv")
    prov = record.get("provenance", {})
    commit, machine = prov.get("git_commit", ""), prov.get("hardware", {}).get("cpu", {}).get("cpu_model", "")
    rows = []
    for state in sorted(set(cal["state"]), key=["quiet", "loaded"].index):
        test = pd.read_csv(data / ("real_draft.csv" if state == "quiet" else f"real_draft_{state}.csv"))
        runs = pd.concat([cal[cal["state"] == state], test], ignore_index=True)
        timed, wall = float(runs["time_s"].sum()), phase_wall_s(record, PHASE.format(state=state))
        rows.append({"commit": commit, "machine": machine, "run_started": min(record["started"].values()), "state": state,
                     "runs": len(runs), "timed_min": timed / 60, "phase_wall_min": wall / 60,
                     "untimed_per_run_ms": 1e3 * (wall - timed) / len(runs)})
    return rows


def run(folders: list, out: Path | None = None) -> dict:
    rows = pd.DataFrame([r for data in folders for r in folder_rows(data)])
    stamp = dt.datetime.fromisoformat(rows["run_started"].max()).strftime("%Y%m%dT%H%M%SZ")
    out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / "sweep_overhead")
    io.write_dataframe(out / f"{stamp}_sweep_overhead.csv", rows)
    record = {"how": "benchmarks/sweep_overhead.py over notebook-05 results folders of make reproduce clones",
              "folders": [str(f) for f in folders], "rows": rows.to_dict("records")}
    io.write_json(out / f"{stamp}_sweep_overhead.json", record)
    return record


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, nargs="+", type=Path, help="notebook-05 results folders")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/sweep_overhead)")
    args = ap.parse_args(argv)
    return run(args.data, args.out)


if __name__ == "__main__":
    main()
