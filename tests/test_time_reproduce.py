"""benchmarks/time_reproduce.py's record of a ``make reproduce`` and the report block that states it."""

from __future__ import annotations

import datetime as dt
import json
import subprocess

import pytest

from bench_scripts import load_benchmark, render_record_block
from moespec import paths, report
from moespec.report.run import RunFiles

time_reproduce = load_benchmark("time_reproduce")


def _clone(tmp_path, started_iso: str | None):
    clone = tmp_path / "clone"
    (clone / "figures").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(clone)], check=True)
    subprocess.run(["git", "-C", str(clone), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q",
                    "--allow-empty", "-m", "x"], check=True)
    if started_iso:
        (clone / "figures" / "MANIFEST.json").write_text(json.dumps({
            "started": started_iso, "finished": "2026-12-02T11:00:00",
            "notebooks": [{"name": "00_default_models", "wall_s": 120.0}, {"name": "05_whole_model", "wall_s": 1800.0}]}))
    return clone


def _epoch(iso: str) -> float:
    return dt.datetime.fromisoformat(iso).replace(tzinfo=dt.timezone.utc).timestamp()


def test_record_splits_installation_from_the_notebooks(tmp_path):
    clone = _clone(tmp_path, "2026-12-02T10:05:00")
    rec = time_reproduce.record(clone, _epoch("2026-12-02T10:00:00"), _epoch("2026-12-02T11:00:30"), 0, "test")
    assert rec["total_s"] == 3630.0 and rec["before_notebooks_s"] == 300.0 and rec["rc"] == 0
    assert [nb["wall_s"] for nb in rec["notebooks"]] == [120.0, 1800.0]
    assert len(rec["commit"]) == 40 and rec["started_utc"] == "2026-12-02T10:00:00+00:00"


def test_a_failed_run_keeps_no_manifest_numbers(tmp_path):
    clone = _clone(tmp_path, "2026-12-02T10:05:00")   # a manifest of an earlier run must not be read
    rec = time_reproduce.record(clone, 0.0, 90.0, 2, "test")
    assert rec["rc"] == 2 and rec["notebooks"] == [] and rec["before_notebooks_s"] is None


def test_record_mode_needs_its_times(tmp_path):
    with pytest.raises(SystemExit):
        time_reproduce.main(["--record", str(tmp_path), "--started", "1"])


@pytest.mark.parametrize("minutes, verdict", [(60.5, "met"), (95.0, "**not met**")])
def test_block_states_the_total_and_the_goal(tmp_path, monkeypatch, minutes, verdict):
    clone = _clone(tmp_path, "2026-12-02T10:05:00")
    rec = time_reproduce.record(clone, _epoch("2026-12-02T10:00:00"), _epoch("2026-12-02T10:00:00") + 60 * minutes,
                                0, "test")
    rec["provenance"] = {"hardware": {"cpu": {"cpu_model": "Test CPU", "logical_cpus": 2}, "gpus": []}}
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    (tmp_path / "r.json").write_text(json.dumps(rec))
    figs = tmp_path / "figs"
    figs.mkdir()
    (figs / "MANIFEST.json").write_text(json.dumps({"started": "2026-12-02T10:05:00"}))
    doc = "<!-- moespec-report:reproduce-time file=r.json -->\nold\n<!-- /moespec-report:reproduce-time -->\n"
    out = report.render_text(doc, RunFiles(figs))
    assert f"took **{minutes:.1f} min** end to end on Test CPU, 2 logical CPUs, no GPU (goal ≤ 90 min: {verdict})" in out
    assert "5.0 min creating `.venv`, installing and building before the first notebook" in out
    assert "notebooks (min) 00 2.0, 05 30.0" in out


def test_pytest_summary_is_read_from_the_last_summary_line():
    out = ("....\n== 3 failed, 10 passed in 2.00s ==\nmore\n"
           "== 1137 passed, 196 skipped, 2 warnings in 686.12s (0:11:26) ==\nmake: leaving\n")
    assert time_reproduce.pytest_summary(out) == {"passed": 1137, "skipped": 196, "warning": 2, "seconds": 686.12}
    assert time_reproduce.pytest_summary("1 failed, 1 error in 3.5s") == {"failed": 1, "error": 1, "seconds": 3.5}
    assert time_reproduce.pytest_summary("make: *** [test] Error 2") is None


def test_test_record_and_its_block(tmp_path, monkeypatch):
    clone = _clone(tmp_path, None)
    rec = time_reproduce.record_test(clone, _epoch("2026-12-02T10:00:00"), _epoch("2026-12-02T10:13:30"), 0,
                                     "== 1137 passed, 196 skipped in 686.12s (0:11:26) ==", "test")
    assert rec["target"] == "test" and rec["total_s"] == 810.0 and rec["pytest"]["passed"] == 1137
    rec["provenance"] = {"hardware": {"cpu": {"cpu_model": "Test CPU", "logical_cpus": 2}, "gpus": []}}
    out = render_record_block(tmp_path, monkeypatch, "test-time", rec, "t.json")
    assert "exited with 0 after **13.5 min** end to end on Test CPU, 2 logical CPUs, no GPU (goal ≤ 15 min: met)" in out
    assert "pytest: 1137 passed, 196 skipped in 11.4 min" in out
    rec.update(rc=2, pytest={"passed": 5, "failed": 1, "seconds": 60.0})
    out = render_record_block(tmp_path, monkeypatch, "test-time", rec, "t.json")
    assert "exited with 2" in out and "**not met**" in out and "5 passed, 1 failed in 1.0 min" in out


def test_test_target_needs_a_fresh_clone(tmp_path):
    with pytest.raises(SystemExit):
        time_reproduce.main(["--target", "test"])
    with pytest.raises(SystemExit):
        time_reproduce.main(["--target", "test", "--into", str(tmp_path)])     # exists
