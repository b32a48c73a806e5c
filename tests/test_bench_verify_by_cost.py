"""benchmarks/verify_by_cost.py on hand-made runs whose verify pass is slower after a costlier draft:
the per-draft forms (own, linear) predict them exactly, the pooled one misses by the slope; and the
record it writes."""

from __future__ import annotations

import json

import pytest

from bench_scripts import load_benchmark
from moespec.engine.results_folder import RealDraftFolder
from test_draftcost import _runs

vbc = load_benchmark("verify_by_cost")


def _sweep():
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3}
    slope = {1: 5e-3, 2: 2e-3, 3: 0.0}                        # seconds per unit of draft cost, per k
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3), 0.4: (4e-3, 0.1e-3)}
    rows = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3))
    spec = rows["k"] >= 1
    extra = rows.loc[spec, "k"].map(slope) * rows.loc[spec, "draft_cost"]
    for col in ("t_verify_mean_s", "t_step_mean_s"):
        rows.loc[spec, col] += extra
    rows.loc[spec, "throughput"] = rows.loc[spec, "tokens_per_step"] / rows.loc[spec, "t_step_mean_s"]
    rows.loc[spec, "speedup"] = rows.loc[spec, "throughput"] * (tv[0] + 0.5e-3)
    return rows


def test_per_draft_forms_recover_a_cost_dependent_verify_pass():
    rows = _sweep()
    test = rows[rows.dedup]
    got = {how: vbc.rescore(rows, test, "quiet", how, n_boot=20) for how in ("pooled", "own", "linear")}
    for how in ("own", "linear"):
        assert got[how]["points"] == 9 and got[how]["within"] == 9
        assert got[how]["largest_abs_error"] == pytest.approx(0, abs=1e-9)
    # pooled: one verify term, at the mean cost 0.2, so at k = 1 (5 ms per unit of cost) the trained
    # draft's pass is predicted 1 ms long and the costliest's 1 ms short: steps 0.5 + 14 + 0.5 = 15 ms
    # measured against 16 predicted, and 4.1 + 16 + 0.5 = 20.6 against 19.6; the rest are within 5 %
    assert got["pooled"]["largest_abs_error"] == pytest.approx(1 - 15 / 16)
    assert got["pooled"]["within"] == 7
    assert vbc.rescore(rows, test, "quiet", "pooled", tolerance=0.07, n_boot=20)["within"] == 9


def test_record(tmp_path, monkeypatch):
    rows = _sweep()

    class Folder:                                              # a stand-in results folder of one state
        states, stamp, draft_form = ["quiet"], "20260101T000000Z", "catch-up"
        write_record, write_rows = RealDraftFolder.write_record, RealDraftFolder.write_rows

        def sweep(self, state, analysed=False):
            return rows, rows[rows.dedup]

        def source(self):
            return {"commit": "abc"}

    monkeypatch.setattr(vbc, "read_real_draft_folder", lambda data: Folder())
    table = vbc.run(tmp_path / "data", out=tmp_path, n_boot=20)
    assert table["verify_by_cost"].tolist() == ["pooled", "own", "linear"] and set(table["draft_form"]) == {"catch-up"}
    record = json.loads((tmp_path / "20260101T000000Z_verify_by_cost.json").read_text())
    assert record["source"] == {"commit": "abc"} and len(record["rows"]) == 3
    assert record["how"] == "benchmarks/verify_by_cost.py over a notebook-05 results folder" and record["n_boot"] == 20
    assert (tmp_path / "20260101T000000Z_verify_by_cost.csv").exists()
    assert [r["within"] for r in record["rows"]] == [7, 9, 9]
