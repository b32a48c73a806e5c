"""Notebook 04 (theory) runs through papermill with its quick profile, writes its figures and
prints the worked examples' numbers; a Table-1 CSV of our own replaces the published one."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from moespec import theory as th
from moespec import paper_reference
from moespec.tables import theory as tables

FIGURES = ["04_staircases.png", "04_thresholds_bytes.png", "04_thresholds_time.png",
           "04_error_bounds.png", "04_step_points.csv"]


def check_step_points(csv, table1):
    steps = pd.read_csv(csv)
    records = tables.table1_step_times(table1, kmax=8, dense_ratio=0.5)
    assert len(steps) == 2 * len(records)
    for rec in records:
        for kind, name in (("slot", "per-slot"), ("dedup", "deduplicating")):
            row = steps[(steps["engine"] == rec["engine"]) & (steps["model"] == rec["model"])
                        & (steps["engine_kind"] == name)].iloc[0]
            a = row[[f"a_{j}" for j in range(1, 9)]].to_numpy(float)
            V = rec[f"V_{kind}"]
            assert np.all(np.diff(a) >= 0)
            assert a[0] <= max(th.first_threshold(V), 0)      # a_1 = min_k alpha_{k,0} <= a0
            for j in range(1, 9):                              # k* >= j just above a_j, not below
                if 0 < a[j - 1] < 1:
                    assert th.best_draft_length(V, a[j - 1] + 1e-9) >= j
                    assert th.best_draft_length(V, a[j - 1] - 1e-9) < j
            assert row["k_at_0"] == th.best_draft_length(V, 0)


@pytest.mark.notebook
def test_theory_notebook_published(run_notebook):
    _, figures, text = run_notebook("04_theory")
    for name in FIGURES:
        assert (figures / name).stat().st_size > 0, name
    assert "k*(1/2) = 0, k*(9/10) = 2" in text
    assert "rho*_1 = 7/20, rho*_2 = 371/800" in text
    assert "pattern 01: rho_bar_1 = 0, rho_bar_2 = 1/2, speedup: yes (k = 2)" in text
    assert "pattern 00012: rho_bar_1 = 2/5, rho_bar_2 = 2/5, speedup: yes (k = 1)" in text
    assert "pattern 00102: rho_bar_1 = 1/5, rho_bar_2 = 2/5, speedup: no" in text
    assert "eps = 1/10: delta = 1/9, speedup factor = 5/4" in text
    assert "built from paper 1's published Table 1 (their hardware)" in text
    check_step_points(figures / "04_step_points.csv", paper_reference.read_table1())
    # Tables 5 and 6 from the source readings, for OLMoE's shape (Q8_0)
    t5 = pd.read_csv(figures / "04_table5_kernel_dispatch.csv")
    t6 = pd.read_csv(figures / "04_table6_dedup_switch.csv")
    assert set(t5["n"]) == set(range(1, 10)) and (t5["model"] == "olmoe").all()
    slot = t5[t5["kind"] == "per-slot"]
    assert (slot["E_bytes"] == slot["n"] * 8 * 16 * 6684672).all()
    assert set(t6["engine"]) >= {"moespec"} and (t6.loc[t6.n == 1, "kind_on"] == "per-slot").all()
    assert re.search(r"Table 5 at n = 2: deduplicating: ggml CPU \(llama.cpp\), vLLM fused_moe; per-slot: ", text)


@pytest.mark.notebook
def test_theory_notebook_own_csv(run_notebook, tmp_path):
    pub = pd.read_csv(paper_reference.published_table1_path())
    ours = pub[pub["model"] == "OLMoE"].head(1).assign(source="ours (test machine)")
    ours["n8_beta_dedup_GBps"] *= 1.5
    path = tmp_path / "table1_ours.csv"
    ours.to_csv(path, index=False)
    pd.DataFrame({"backend": ["cpp"], "eps_engine": [0.0375]}).to_csv(tmp_path / "03_epsilon.csv", index=False)
    _, figures, text = run_notebook("04_theory", bandwidth_csv=str(path))
    assert "built from ours (test machine)" in text and "published Table 1 (their" not in text
    assert "eps for llama.cpp CUDA: 0.0375 (notebook 03's engine eps (03_epsilon.csv))" in text
    check_step_points(figures / "04_step_points.csv", paper_reference.read_table1(path))


def test_bounds_epsilon_comes_from_the_data(tmp_path, monkeypatch):
    """The paper's eps for its published rows, notebook 03's for ours (beside the CSV, given, or in
    this run's figures), an override when given; never an invented value."""
    monkeypatch.setenv("MOESPEC_RUN_DIR", str(tmp_path / "run"))
    pub = paper_reference.read_table1()
    assert tables.bounds_epsilon(pub, "llama.cpp CUDA") == (0.054, "paper 1's published eps of llama.cpp CUDA")
    assert tables.bounds_epsilon(pub, "MLX-LM")[0] == 0.148
    assert tables.bounds_epsilon(pub, "MLX-LM", eps_override=0.2) == (0.2, "eps_override = 0.2")
    with pytest.raises(ValueError, match="not in the Table-1 CSV"):
        tables.bounds_epsilon(pub, "vLLM")
    ours = pub.head(2).assign(source="ours (x)", engine="moespec cpp (f32)")
    csv = tmp_path / "bw" / "02_table1_bandwidth.csv"
    csv.parent.mkdir()
    with pytest.raises(FileNotFoundError, match="03_epsilon.csv.*run notebook 03"):
        tables.bounds_epsilon(ours, "moespec cpp (f32)", bandwidth_csv=csv)
    pd.DataFrame({"backend": ["torch", "cpp"], "eps_engine": [0.2, 0.024]}).to_csv(csv.parent / "03_epsilon.csv",
                                                                                    index=False)
    assert tables.bounds_epsilon(ours, "moespec cpp (f32)", bandwidth_csv=csv)[0] == 0.024
    given = tmp_path / "e.csv"
    pd.DataFrame({"backend": ["cpp"], "eps_engine": [0.05]}).to_csv(given, index=False)
    assert tables.bounds_epsilon(ours, "moespec cpp (f32)", bandwidth_csv=csv, epsilon_csv=given)[0] == 0.05


def test_bound_curves_are_the_theory_functions():
    eps = np.array([0.0, 0.1, 0.25])
    curves = list(tables.bound_curves(eps).values())
    np.testing.assert_allclose(curves[0], [0, 1 / 9, 1 / 3])
    np.testing.assert_allclose(curves[1], [0, 0.2, 0.5])
    np.testing.assert_allclose(curves[2], [0, 0.25, 1.0])


def test_table1_csv_errors(tmp_path):
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"engine": ["x"], "model": ["OLMoE"]}).to_csv(bad, index=False)
    with pytest.raises(ValueError, match="missing column"):
        paper_reference.read_table1(bad)
    pub = pd.read_csv(paper_reference.published_table1_path())
    pub.loc[0, "n2_ubar"] = -1
    pub.to_csv(bad, index=False)
    with pytest.raises(ValueError, match="column .n2_ubar.: expected a finite number > 0"):
        paper_reference.read_table1(bad)
    with pytest.raises(FileNotFoundError):
        paper_reference.read_table1(tmp_path / "none.csv")
