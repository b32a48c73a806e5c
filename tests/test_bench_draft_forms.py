"""benchmarks/draft_forms.py on a hand-made sweep whose draft takes e longer in each round that
begins with two tokens, the test prompts accepting more of their rounds whole than the calibration
prompts (amendment of 2026-12-07 b): the catch-up form leaves no draft-time error out of sample and
predicts every point exactly; paper 2's line does neither; and the record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench_scripts import load_benchmark
from test_bench_read_bracketing import _sweep, stand_in_folder

df = load_benchmark("draft_forms")


def test_each_form_scored_and_the_true_one_leaves_nothing(tmp_path, monkeypatch):
    rows = _sweep(catch_up=(1.5e-3, 0.3, 0.5))
    monkeypatch.setattr(df, "read_real_draft_folder", lambda data: stand_in_folder(rows))
    table = df.run(tmp_path / "data", out=tmp_path, n_boot=20).set_index("draft_form")
    assert list(table.index) == ["line", "catch-up"]
    fit = table.loc["catch-up"]
    assert fit["held_out_rms"] == pytest.approx(0, abs=1e-9) and fit["largest_abs_error"] == pytest.approx(0, abs=1e-9)
    assert fit["within"] == fit["points"] == 6 and fit["catch_up_ms"] == "0 1.500; 0.2 1.500"
    assert fit["catch_up_test"] - fit["catch_up_calibration"] == pytest.approx(0.2 * (0.8 + 0.64 + 0.512) / 3, abs=2e-3)
    line = table.loc["line"]
    assert line["held_out_rms"] > 0.01 and line["largest_abs_error"] > 1e-3 and line["catch_up_ms"] == "0 0.000; 0.2 0.000"
    assert line["used_by_run"] and not fit["used_by_run"]                 # the stand-in run fitted the line
    record = json.loads((tmp_path / "20260101T000000Z_draft_forms.json").read_text())
    assert record["source"] == {"commit": "abc"} and len(record["rows"]) == 2 and record["n_boot"] == 20
    assert record["how"] == "benchmarks/draft_forms.py over a notebook-05 results folder"
    assert (tmp_path / "20260101T000000Z_draft_forms.csv").exists()


def test_the_reanalysis_command_line(tmp_path):
    from moespec.engine.results_folder import reanalysis_main

    got = []
    reanalysis_main(lambda data, out, n_boot: got.append((data, out, n_boot)), "A re-analysis.\n\nMore.", "x",
                    ["--data", str(tmp_path), "--n-boot", "7"])
    reanalysis_main(lambda *a: got.append(a), "", "x", ["--data", "d", "--out", "o"])
    assert got == [(tmp_path, None, 7), (Path("d"), Path("o"), 200)]
    with pytest.raises(SystemExit):
        reanalysis_main(lambda *a: None, "", "x", [])              # --data is required
