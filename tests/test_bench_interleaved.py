"""benchmarks/bench_interleaved_calibration.py: its summary of a protocol's predictions, its
refusals, and the report block that renders its record (the sweep itself:
tests/test_draftcost.py::test_interleaved_sweep_mixes_the_parts_and_changes_no_token)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench_scripts import load_benchmark, render_record_block

bench = load_benchmark("bench_interleaved_calibration")


def _pred() -> pd.DataFrame:
    """Three points: errors +2 %, -6 %, +1 %; the runs' own step times +1 %, +1 %, -7 %."""
    return pd.DataFrame({"rel_error": [0.02, -0.06, 0.01], "rel_error_measured_steps": [0.01, 0.01, -0.07],
                         "inside": [True, False, True], "V0_hat_ms": 26.0, "V0_meas_ms": 25.0,
                         "read_GBps_model": 14.0, "read_GBps_runs": 14.5,
                         "rep0": [1.3, 1.2, 1.1], "rep1": [1.2, 1.2, 1.1]})


def test_summary_counts_by_hand():
    s = bench.summary(_pred(), 120.0)
    assert (s["points"], s["within_5pct"], s["inside_interval"], s["within_5pct_measured_steps"]) == (3, 2, 2, 2)
    assert s["largest_abs_error"] == pytest.approx(0.06) and s["mean_error"] == pytest.approx(-0.01)
    # one point's repetitions 1.3 and 1.2 (relative se 0.04), two agree (0): rms sqrt(0.04^2 / 3)
    assert s["measurement_se"] == pytest.approx(0.04 / 3 ** 0.5)
    assert s["wall_s"] == 120.0 and s["V0_hat_ms"] == 26.0
    one = bench.summary(_pred().drop(columns="rep1"), 1.0)
    assert one["measurement_se"] is None and one["expected_outside_by_noise"] is None


def test_unknown_protocols_are_refused():
    with pytest.raises(SystemExit):
        bench.main(["--protocols", "before,afterwards"])


def test_block_renders_the_record(tmp_path, monkeypatch):
    rec = {"state": "quiet", "profile": "full", "calibration_prompts": 5, "test_prompts": 6, "test_reps": 2,
           "draft_costs": [0.0, 0.4], "ks": [1, 2, 3],
           "protocols": {"before": bench.summary(_pred(), 600.0),
                         "interleaved": {"error": "draft 'x': t_draft(k) must be a finite time", "wall_s": 1.0}},
           "provenance": {"hardware": {"cpu": {"cpu_model": "Test CPU", "logical_cpus": 2}, "gpus": []}}}
    out = render_record_block(tmp_path, monkeypatch, "interleaved-pilot", rec)
    assert ("Real draft, quiet machine, full profile's sizes (5 calibration turns, 6 test turns x 2, draft costs 0, "
            "0.4, k = 1..3), both protocols in one session on Test CPU, 2 logical CPUs, no GPU, the measuring process "
            "pinned to one CPU, torch threads not set") in out
    assert ("before: within 5 % at 2 of 3 points (largest |error| 6.0 %, mean -1.0 %, measured inside the predicted "
            "interval at 2); with the runs' own step times within 5 % at 2; V(0) predicted 26.00 ms, measured 25.00 ms") in out
    assert "10.0 min" in out and "interleaved: no prediction (draft 'x': t_draft(k) must be a finite time)" in out


def test_sweep_timing_reads_a_phase_wall_against_its_timed_steps(tmp_path):
    """benchmarks/sweep_timing.py's phase wall on a hand-made results folder: the quiet phase runs from 10:00:00
    to the loaded calibration's start 10:01:40 (100 s), its 2 calibration and 3 test runs time
    50 s together, so 10 s per run are untimed; the loaded phase ends with the run (60 s, 4 runs
    timing 20 s: 10 s per run). A folder without the sweep's files is refused by name."""
    import json

    overhead = load_benchmark("sweep_timing")
    data = tmp_path / "full"
    data.mkdir()
    cell = {"prompt": 0, "draft_cost": 0.0, "k": 1, "dedup": True, "ref_GBps": 10.0}
    pd.DataFrame({"state": ["quiet"] * 2 + ["loaded"] * 2, "time_s": [9.0, 11.0, 4.0, 6.0], "seq": [0, 1, 0, 1],
                  **cell}).to_csv(data / "draft_calibration.csv", index=False)
    pd.DataFrame({"time_s": [8.0, 10.0, 12.0], "seq": [2, 3, 4], **cell}).to_csv(data / "real_draft.csv", index=False)
    pd.DataFrame({"time_s": [4.0, 6.0], "seq": [2, 3], **cell}).to_csv(data / "real_draft_loaded.csv", index=False)
    (data / "run.json").write_text(json.dumps({
        "started": {"real-draft runs quiet": "2026-12-06T10:00:00+00:00",
                    "calibration loaded": "2026-12-06T10:01:40+00:00",
                    "real-draft runs loaded": "2026-12-06T10:02:00+00:00", "verify_grid": "2026-12-06T09:50:00+00:00"},
        "finished": "2026-12-06T10:03:00+00:00", "provenance": {"git_commit": "abc"}}))
    rows = {r["state"]: r for r in overhead.run([data], tmp_path / "out")["rows"]}
    assert rows["quiet"]["runs"] == 5 and rows["quiet"]["phase_wall_min"] * 60 == pytest.approx(100)
    assert rows["quiet"]["untimed_per_run_ms"] == pytest.approx(10_000)
    assert rows["loaded"]["runs"] == 4 and rows["loaded"]["untimed_per_run_ms"] == pytest.approx(10_000)
    assert len(list((tmp_path / "out").glob("20261206T095000Z_sweep_timing.*"))) == 2
    assert all(np.isnan(r["run_sd_adjusted"]) for r in rows.values())     # recorded before machine factors
    # with machine factors that take every run of a state to one time, no noise is left after them
    for name, typical in (("draft_calibration.csv", None), ("real_draft.csv", 10.0), ("real_draft_loaded.csv", 5.0)):
        df = pd.read_csv(data / name)
        t = df.get("state", pd.Series(["quiet"] * len(df))).map({"quiet": 10.0, "loaded": 5.0}) if typical is None \
            else typical
        df.assign(throughput=32 / df.time_s, machine_factor=t / df.time_s).to_csv(data / name, index=False)
    rows = {r["state"]: r for r in overhead.run([data], tmp_path / "out")["rows"]}
    assert rows["quiet"]["run_sd"] > 0.1 and rows["quiet"]["run_sd_adjusted"] == pytest.approx(0, abs=1e-12)
    assert rows["loaded"]["run_sd_adjusted"] == pytest.approx(0, abs=1e-12)
    (data / "real_draft.csv").unlink()
    with pytest.raises(FileNotFoundError, match="no real_draft.csv"):
        overhead.run([data], tmp_path / "out")


def test_sweep_timing_noise_by_hand():
    """benchmarks/sweep_timing.py's noise measures on four runs of two cells, each cell once at time 1 and
    once at e^0.2: residuals of log time -0.1, +0.1 about each cell's mean, scaled by sqrt(2) for
    cells of two runs; in sweep order they alternate (lag-1 autocorrelation -1); a reference read
    whose log is minus the residual explains all of it. A cell run once does not count; a run
    without a positive time is refused."""
    noise = load_benchmark("sweep_timing").noise
    r = 0.1 * np.sqrt(2)
    runs = pd.DataFrame({"part": "test", "prompt": [0, 0, 1, 1, 2], "draft_cost": [0.0, 0.0, np.nan, np.nan, 0.0],
                         "k": [1, 1, 0, 0, 1], "dedup": True, "seq": [0, 1, 2, 3, 4],
                         "time_s": [1.0, np.exp(0.2), 1.0, np.exp(0.2), 5.0],
                         "ref_GBps": np.exp([r, -r, r, -r, 0.0])})
    got = noise(runs)
    assert got["repeated_runs"] == 4 and got["cells"] == 2
    assert got["run_sd"] == pytest.approx(r) and got["lag1_autocorr"] == pytest.approx(-1)
    assert got["ref_r2"] == pytest.approx(1) and got["run_sd_after_ref"] == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="positive, finite time_s"):
        noise(runs.assign(time_s=[1.0, 0.0, 1.0, 1.0, 1.0]))


def test_sweep_timing_read_regimes_by_hand():
    """benchmarks/sweep_timing.py's regimes: two cells, each run once at a read of 40 GB/s and once at
    25 GB/s (1.6 apart: two regimes), 1.3 times longer at 25 in both: a low-read share of one half,
    medians 25 and 40, a slowdown of 1.3 over two cells; reads of one regime give a share of 0 and
    no slowdown."""
    regimes = load_benchmark("sweep_timing").read_regimes
    runs = pd.DataFrame({"part": "test", "prompt": [0, 0, 1, 1], "draft_cost": 0.0, "k": [1, 1, 2, 2], "dedup": True,
                         "seq": [0, 1, 2, 3], "time_s": [1.0, 1.3, 2.0, 2.6], "ref_GBps": [40.0, 25.0, 40.0, 25.0]})
    got = regimes(runs)
    assert got["low_read_share"] == 0.5 and (got["read_low_GBps"], got["read_high_GBps"]) == (25.0, 40.0)
    assert got["cells_in_both"] == 2 and got["low_over_high_time"] == pytest.approx(1.3)
    one = regimes(runs.assign(ref_GBps=[40.0, 39.0, 40.0, 41.0]))
    assert one["low_read_share"] == 0.0 and one["cells_in_both"] == 0 and np.isnan(one["low_over_high_time"])
