"""A notebook-05 results folder read back: what the scripts that reread a run's real-draft sweeps
(``benchmarks/verify_by_turn.py``, ``replay_routing.py``, ``sweep_timing.py``, ``step_terms.py``,
``verify_by_cost.py``, ``round_resolution.py``, ``prediction_noise.py``) share, the record they write
from it (:meth:`RealDraftFolder.write_record`), and the name notebook 05 writes a state's test runs
under (:func:`real_draft_file`).

The folder is ``<run data>/engine/<profile>`` of a ``make reproduce`` clone (or a notebook's
``out_dir``): ``run.json`` (sizes, seed, the phases' start times, provenance),
``draft_calibration.csv`` (the round calibration's runs of every machine state, column ``state``)
and ``real_draft.csv`` / ``real_draft_<state>.csv`` (the test runs of the quiet and other states).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moespec import io, paths
from moespec.engine.machine_adjust import as_analysed

STATE_ORDER = ("quiet", "loaded")
NEEDED = ("draft_calibration.csv", "real_draft.csv", "run.json")


def real_draft_file(state: str) -> str:
    """The file of machine state ``state``'s real-draft test runs in a results folder."""
    return "real_draft.csv" if state == "quiet" else f"real_draft_{state}.csv"


@dataclass
class RealDraftFolder:
    """A notebook-05 results folder with a real draft: ``record`` (its run.json) and
    ``calibration`` (every state's calibration rows)."""
    path: Path
    record: dict
    calibration: pd.DataFrame

    @property
    def states(self) -> list[str]:
        """The machine states the calibration ran in, quiet first."""
        found = set(self.calibration["state"])
        return sorted(found, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER else len(STATE_ORDER), s))

    def sweep(self, state: str, analysed: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
        """(calibration rows, test rows) of machine state ``state``: as measured, or with ``analysed``
        as notebook 05 analysed them (:func:`moespec.engine.machine_adjust.as_analysed`: at the sweep's
        typical machine state where the rows carry machine factors)."""
        if state not in self.states:
            raise ValueError(f"{self.path} has no real-draft runs in state {state!r}; it has {self.states}")
        test = self.path / real_draft_file(state)
        if not test.exists():
            raise FileNotFoundError(f"{self.path} holds calibration rows of state {state!r} but no {test.name}")
        cal = self.calibration[self.calibration["state"] == state].reset_index(drop=True)
        test = pd.read_csv(test)
        return (as_analysed(cal), as_analysed(test)) if analysed else (cal, test)

    def whole_sweep(self, state: str) -> pd.DataFrame:
        """Machine state ``state``'s one shuffled sweep as measured: its calibration and test rows
        together, each with its ``part`` ("calibration", "test"), as the machine factors were
        estimated over them (:func:`moespec.engine.machine_adjust.machine_factors`)."""
        cal, test = self.sweep(state)
        return pd.concat([cal.assign(part="calibration"), test.assign(part="test")], ignore_index=True)

    @property
    def slope_by(self) -> str:
        """The read-slope grouping the run's machine adjustment used (``run.json``'s
        ``machine_adjustment``); runs recorded before amendment of 2026-12-07 a used one slope per
        sweep."""
        return self.record.get("machine_adjustment", {}).get("slope_by", "sweep")

    @property
    def draft_form(self) -> str:
        """The form of the real draft's time the run's round models fitted (``run.json``'s
        ``draft_form``, :data:`moespec.predict.round_model.DRAFT_FORMS`); runs recorded before
        amendment of 2026-12-07 b fitted paper 2's line."""
        return self.record.get("draft_form", "line")

    @property
    def started(self) -> str:
        """When the run's first phase started (ISO time)."""
        return min(self.record["started"].values())

    @property
    def stamp(self) -> str:
        """:attr:`started` as ``YYYYmmddTHHMMSSZ``, the name of the records written from the folder."""
        return dt.datetime.fromisoformat(self.started).strftime("%Y%m%dT%H%M%SZ")

    def source(self) -> dict:
        """The run a record written from the folder comes from: commit, start and end, subject,
        where its calibration ran, hardware."""
        prov = self.record.get("provenance", {})
        return {"commit": prov.get("git_commit"), "started": self.started, "finished": self.record.get("finished"),
                "subject": self.record.get("subject"),
                "draft_calibration": self.record.get("sizes", {}).get("draft_calibration"),
                "hardware": prov.get("hardware")}

    def write_record(self, name: str, table: pd.DataFrame, fields: dict, out=None) -> dict:
        """A benchmark's record of this run: ``table`` as ``<out>/<stamp>_<name>.csv`` and ``fields``
        with the run it comes from (:meth:`source`) as ``.json``; ``out`` defaults to
        ``benchmarks/results/<name>``. Returns the JSON record."""
        out = paths.ensure(Path(out) if out else paths.ROOT / "benchmarks" / "results" / name)
        io.write_dataframe(out / f"{self.stamp}_{name}.csv", table)
        record = {"how": f"benchmarks/{name}.py over a notebook-05 results folder", **fields, "source": self.source()}
        io.write_json(out / f"{self.stamp}_{name}.json", record)
        return record

    def write_rows(self, name: str, table: pd.DataFrame, out=None, **fields) -> dict:
        """:meth:`write_record` with the table's rows also in the JSON, after ``fields`` (the
        record of a re-analysis: one row per state and setting)."""
        return self.write_record(name, table, {**fields, "rows": table.to_dict(orient="records")}, out)


def read_real_draft_folder(data) -> RealDraftFolder:
    """The notebook-05 results folder ``data`` (module docstring); a folder without a real draft's
    files is refused by the name of the first one missing."""
    data = Path(data)
    for name in NEEDED:
        if not (data / name).exists():
            raise FileNotFoundError(f"{data} holds no {name}: not a notebook-05 results folder with a real draft")
    return RealDraftFolder(data, json.loads((data / "run.json").read_text()),
                           pd.read_csv(data / "draft_calibration.csv"))


def reanalysis_main(run, doc: str, name: str, argv=None) -> None:
    """The command line of a benchmark that re-analyses a notebook-05 results folder and writes a
    record of it (``benchmarks/read_slopes.py`` and its kind): ``--data`` (the folder), ``--out``
    (default ``benchmarks/results/<name>``) and ``--n-boot`` (bootstrap resamples of each term,
    intervals only), passed to ``run(data, out, n_boot)``; ``doc``'s first paragraph is the help."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder")
    ap.add_argument("--out", type=Path, default=None, help=f"where to write (default benchmarks/results/{name})")
    ap.add_argument("--n-boot", type=int, default=200, help="bootstrap resamples of each term (intervals only)")
    args = ap.parse_args(argv)
    run(args.data, args.out, args.n_boot)
