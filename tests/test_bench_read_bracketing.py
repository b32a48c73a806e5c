"""benchmarks/read_bracketing.py on a hand-made sweep whose machine, during each run, is the one
between the two reads that bracket it (amendment of 2026-12-06 k): the bracketing read takes all
of it out and predicts every point exactly, the read before alone leaves noise; and the record."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from bench_scripts import load_benchmark
from moespec.engine.rescore import rescore
from moespec.engine.results_folder import RealDraftFolder
from test_draftcost import _runs

rb = load_benchmark("read_bracketing")
TIMES = ("t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s", "t_step_mean_s")


def _sweep(seed: int = 5, plain_power: float = 0.7, drafted_power: float = 0.7,
           catch_up: tuple | None = None) -> pd.DataFrame:
    """Both parts in one shuffled sweep; during each run the machine is the one between its two
    reads, and a run's time follows that read by ``plain_power`` (k = 0) or ``drafted_power``.
    ``catch_up`` = (e seconds, calibration share, test share): each drafted run's draft also takes
    e s longer, s = (the part's share + 0.05 prompt) 0.8^k of its rounds beginning with two tokens
    (its ``catch_up`` count)."""
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3)}
    one = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3))
    parts = [one[one.dedup | (part == "calibration")].assign(part=part, rep=rep)   # per-slot runs calibrate only
             for part in ("calibration", "test") for rep in range(2)]
    rows = pd.concat(parts, ignore_index=True).assign(regime="one")
    if catch_up is not None:
        e, *base = catch_up
        share = np.where(rows["part"] == "calibration", base[0], base[1]) + 0.05 * rows["prompt"]
        rows["catch_up"] = np.where(rows["k"] >= 1, np.round(rows["steps"] * share * 0.8 ** rows["k"]), 0)
        extra = e * rows["catch_up"] / rows["steps"]
        rows["t_draft_mean_s"] += extra
        rows["t_step_mean_s"] += extra
    rng = np.random.default_rng(seed)
    rows["seq"] = rng.permutation(len(rows))                  # one shuffled sweep of both parts
    rows = rows.sort_values("seq").reset_index(drop=True)
    read = rng.uniform(10, 20, len(rows))
    between = np.sqrt(read * np.r_[read[1:], read[-1]])
    power = np.where(rows["k"].to_numpy() == 0, plain_power, drafted_power)
    slower = np.exp(-power * (np.log(between) - np.median(np.log(between))))   # time x this in each run
    rows["ref_GBps"] = read
    for col in TIMES:
        rows[col] = rows[col] * slower
    rows["throughput"] = rows["tokens_per_step"] / rows["t_step_mean_s"]
    return rows


def stand_in_folder(rows: pd.DataFrame):
    """A stand-in results folder of one quiet state whose whole sweep is ``rows`` (a run recorded
    with one read slope per sweep), writing records as a real one does."""
    class Folder:
        states, stamp, slope_by, draft_form = ["quiet"], "20260101T000000Z", "sweep", "line"
        write_record, write_rows = RealDraftFolder.write_record, RealDraftFolder.write_rows

        def whole_sweep(self, state):
            return rows

        def source(self):
            return {"commit": "abc"}

    return Folder()


def test_bracketing_read_takes_the_machine_out_and_the_read_before_does_not():
    rows = _sweep()
    got = {read: rescore(rows, "quiet", n_boot=20, read=read, slope_by="sweep")[0] for read in ("bracketing", "own")}
    b, own = got["bracketing"], got["own"]
    assert b["slope"] == pytest.approx(0.7) and b["noise_adjusted"] == pytest.approx(0, abs=1e-9)
    assert b["points"] == 6 and b["within"] == 6 and b["largest_abs_error"] == pytest.approx(0, abs=1e-9)
    assert own["noise_adjusted"] > 0.02 and own["noise_measured"] == pytest.approx(b["noise_measured"])
    assert own["largest_abs_error"] > 1e-3


def test_record(tmp_path, monkeypatch):
    rows = _sweep()

    monkeypatch.setattr(rb, "read_real_draft_folder", lambda data: stand_in_folder(rows))
    table = rb.run(tmp_path / "data", out=tmp_path, n_boot=20)
    assert table["read"].tolist() == ["bracketing", "own"] and table["slope_by"].tolist() == ["sweep"] * 2
    record = json.loads((tmp_path / "20260101T000000Z_read_bracketing.json").read_text())
    assert record["source"] == {"commit": "abc"} and len(record["rows"]) == 2 and record["n_boot"] == 20
    assert record["how"] == "benchmarks/read_bracketing.py over a notebook-05 results folder"
    assert (tmp_path / "20260101T000000Z_read_bracketing.csv").exists()
