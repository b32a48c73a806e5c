"""benchmarks/read_slopes.py on a hand-made sweep whose plain runs follow the read by one power and
whose drafted runs by another (amendment of 2026-12-07 a): the plain-and-drafted grouping takes all
of the machine out, in sample and out of sample, and predicts every point exactly; one slope per
sweep does not; and the record."""

from __future__ import annotations

import json

import pytest

from bench_scripts import load_benchmark
from moespec.engine import machine_adjust as MA
from test_bench_read_bracketing import _sweep, stand_in_folder

rs = load_benchmark("read_slopes")


def test_each_grouping_scored_and_the_true_one_leaves_nothing(tmp_path, monkeypatch):
    rows = _sweep(plain_power=1.0, drafted_power=0.5)

    monkeypatch.setattr(rs, "read_real_draft_folder", lambda data: stand_in_folder(rows))
    table = rs.run(tmp_path / "data", out=tmp_path, n_boot=20).set_index("slope_by")
    assert list(table.index) == list(MA.SLOPES)
    two = table.loc["plain-drafted"]
    assert two["groups"] == 2 and two["group_slopes"] == "drafted 0.500; plain 1.000"
    assert two["noise_adjusted"] == pytest.approx(0, abs=1e-9) and two["held_out_noise"] == pytest.approx(0, abs=1e-9)
    assert two["within"] == two["points"] == 6 and two["largest_abs_error"] == pytest.approx(0, abs=1e-9)
    one = table.loc["sweep"]
    assert 0.5 < one["slope"] < 1.0 and one["groups"] == 1
    assert one["noise_adjusted"] > 0.01 and one["held_out_noise"] > 0.01 and one["largest_abs_error"] > 1e-3
    record = json.loads((tmp_path / "20260101T000000Z_read_slopes.json").read_text())
    assert record["source"] == {"commit": "abc"} and len(record["rows"]) == len(MA.SLOPES) and record["n_boot"] == 20
    assert record["how"] == "benchmarks/read_slopes.py over a notebook-05 results folder"
    assert (tmp_path / "20260101T000000Z_read_slopes.csv").exists()
