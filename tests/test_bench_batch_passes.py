"""benchmarks/bench_batch_passes.py at tiny shapes (the quick profile's): its files, the columns every
row carries beside its timing, and the fits it writes (the full run is made by hand, docs/kernels.md)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from moespec import fit
from bench_scripts import load_benchmark


def test_quick_run_writes_rows_fits_and_record(tmp_path, monkeypatch):
    bench = load_benchmark("bench_batch_passes")
    bench.main(["--quick", "--backends", "cpp,torch", "--batch-sizes", "1,2,4", "--windows", "1,2,3",
                "--reps", "2", "--out", str(tmp_path)])
    rows = pd.read_csv(next(tmp_path.glob("*_batch.csv")))
    fits = pd.read_csv(next(tmp_path.glob("*_fits.csv")))
    rec = json.loads(next(tmp_path.glob("*Z.json")).read_text())
    assert sorted(set(rows["backend"])) == ["cpp", "torch"] and sorted(set(rows["kernel"])) == ["dedup", "slot"]
    assert len(rows) == 2 * 3 * 3 * 2    # backends x B x (k + 1) x kernels, one pass each
    assert (rows["n"] == rows["B"] * rows["k_plus_1"]).all()
    for col in ("t_median_s", "t_q25_s", "t_q75_s", "read_GBps", "read_probe", "sum_GBps", "other_load",
                "flush_bytes", "cpu_model", "llc_bytes", "torch", "kept"):
        assert rows[col].notna().all(), col
    assert (rows["t_q25_s"] <= rows["t_median_s"]).all() and (rows["t_median_s"] <= rows["t_q75_s"]).all()
    assert rows["beta_GBps"].to_numpy() == pytest.approx(
        (rows["requested_bytes"] / rows["t_median_s"] / 1e9).to_numpy())
    # per backend: the single fit over the range and the regimes, as moespec.fit gives them on the rows
    for backend, g in rows.groupby("backend"):
        mine = fits[fits["backend"] == backend]
        assert set(mine["regime"]) <= {"single fit", fit.BYTES, fit.BEYOND}
        reg = fit.regimes(g[g["kept"]])
        got = mine[mine["regime"] != "single fit"].sort_values(["kernel", "n_from"])
        assert got["regime"].tolist() == reg.sort_values(["kernel", "n_from"])["regime"].tolist()
    assert set(rec["runs"]) == {"cpp", "torch"} and rec["backends"] == ["cpp", "torch"]
    assert rec["runs"]["cpp"]["read_ceiling"]["median_GBps"] > 0 and "hardware" in rec["provenance"]
    assert rec["cold"]["flush_bytes"] == 2**20
    for r in rec["runs"].values():   # each backend's run folder beside the files, not under an ignored runs/
        assert r["run_dir"].startswith("expert_op/") and (tmp_path / r["run_dir"] / "rows.csv").exists()

    # the docs' block, written from these files: the same numbers
    from moespec import paths, report
    from moespec.report.run import RunFiles

    monkeypatch.setattr(paths, "ROOT", tmp_path.parent)
    stamp = next(tmp_path.glob("*Z.json")).stem
    (tmp_path / "figs").mkdir()
    doc = f"<!-- moespec-report:kernel-batch stamp={stamp} folder={tmp_path.name} -->\nold\n" \
          "<!-- /moespec-report:kernel-batch -->\n"
    text = report.render_text(doc, RunFiles(tmp_path / "figs"))
    cpp = rows[(rows["backend"] == "cpp") & (rows["B"] == 4) & (rows["k_plus_1"] == 3)].set_index("kernel")
    ratio = cpp.loc["dedup", "t_median_s"] / cpp.loc["slot", "t_median_s"]
    assert "| cpp | 4 | " in text and f" {ratio:.2f} |\n" in text
    assert f"cpp: ceiling {rec['runs']['cpp']['read_ceiling']['median_GBps']:.1f} GB/s" in text
    assert "noisy" in text and "Regimes found: " in text
