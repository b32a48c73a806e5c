"""Notebook 07 (paper 2) with its quick profile: the files it writes and the numbers it prints."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

FILES = ["07_rounds_summary.csv", "07_tableA4_per_k.csv", "07_eq4_categorical.csv", "07_tableA6_models.csv",
         "07_tableA2_factors.csv", "07_coefficients.csv", "07_fig1_rounds_by_k.png", "07_figA6_draft_time.png",
         "07_oracle_sequences.csv", "07_fig2_lmax_sweep.csv", "07_fig2_lmax_sweep.png", "07_fig3_delta_quadrants.csv",
         "07_fig3_delta_space.png", "07_alpha0_changed_positions.csv", "07_alpha0_summary.json", "07_alpha0_selected.csv",
         "07_online_policy.csv", "07_online_policy_info.json", "07_online_policy.png", "07_kernel_cost_models.csv",
         "07_kernel_policy_differences.csv", "07_paper2_comparison.csv", "07_cf_fig2_lmax_sweep.csv",
         "07_cf_fig2_lmax_sweep.png", "07_cf_fig3_delta_space.png", "07_cf_online_policy.png", "07_cf_online_policy_info.json",
         "07_cf_kernel_cost_models.csv", "07_cf_alpha0_summary.json", "07_regression_by_regime.csv",
         "07_cost_models_overview.csv", "07_fixed_k.csv", "07_measured_fixed_k.csv", "07_oracle_vs_measured.png",
         "07_cf_oracle_vs_measured.png", "07_goals.csv", "07_paper2_map.csv", "07_tableB_status.json", "07_tableB_label_counts.csv",
         "07_tableB3_k_by_context.csv", "07_tableB5_new_experts.csv", "07_tableB4_cases.csv", "07_tableB_gallery.csv",
         "07_figB3_k_by_context.png", "07_figB5_new_experts.png", "07_figB4_alpha0_cases.png", "07_figB_gallery.png"]
#: Section 2b, paper 2's Appendix A (moespec.studies.ssp_oracle.SspOracleStudy).
APPENDIX_A_FILES = ["07_tableA1_dataset.csv", "07_tableA3_factors_by_category.csv", "07_figA1_r2_by_category.png",
                    "07_tableA5_model_by_category.csv", "07_figA3_alpha_by_category.png",
                    "07_figA4_metrics_by_category.png", "07_figA5_pooled_by_k.csv", "07_figA5_pooled_vs_per_k.png",
                    "07_leave_one_k_out.csv", "07_tableA7_robustness.csv", "07_figA7_robustness.png",
                    "07_tableA7_residual_bins.csv", "07_figA7_residual_bins.png", "07_tableA7_diagnostics.csv",
                    "07_tableA9_ladder.csv"]


@pytest.mark.notebook
def test_notebook_07_quick(run_notebook, tmp_path):
    _, figures, text = run_notebook("07_ssp_oracle", out_dir=str(tmp_path / "oracle"))
    for name in FILES + APPENDIX_A_FILES:
        assert (figures / name).is_file(), f"{name} not written"
    a5 = pd.read_csv(figures / "07_tableA5_model_by_category.csv")   # every category listed, reported or with a reason
    ours = a5[a5.source == "ours (this machine)"]
    assert set(ours.category) == set(pd.read_csv(figures / "07_tableA3_factors_by_category.csv").category.dropna()) - \
        {"range over their 14 categories"}
    assert ours[ours.status == "excluded"].reason.notna().all()
    sweeps = pd.read_csv(figures / "07_fig2_lmax_sweep.csv")
    seqs = pd.read_csv(figures / "07_oracle_sequences.csv")     # the quick profile's workload: 2 categories x 2
    assert sorted(set(seqs.category)) == ["coding", "math_reasoning"]
    assert seqs.groupby(["transitions", "analysis"]).seq_id.nunique().eq(4).all()
    item_map = pd.read_csv(figures / "07_paper2_map.csv")     # every paper 2 item has its file in this run
    assert not (item_map.verdict == "missing").any(), item_map[item_map.verdict == "missing"]["paper 2 item"].tolist()
    assert list(dict.fromkeys(sweeps.transitions)) == ["surrogate", "greedy"]
    assert re.search(r"^subject: .*byte-faithful", text, re.M)
    # the junk tails ran on the subject's narrow twin, after it agreed with the target cell for cell
    twin = json.loads((tmp_path / "oracle" / "junk_tails_provenance.json").read_text())["twin_agreement"]
    assert twin["used"] == "twin" and twin["union_cells_equal"] == twin["union_cells"] > 0
    assert f"on its narrow twin; twin against target over {twin['states']} positions" in text
    assert (sweeps.subject == sweeps.subject.iloc[0]).all() and "byte-faithful" in sweeps.subject.iloc[0]
    online = json.loads((figures / "07_online_policy_info.json").read_text())
    cf = json.loads((figures / "07_cf_online_policy_info.json").read_text())
    fixed = pd.read_csv(figures / "07_fixed_k.csv")
    for t in ("surrogate", "greedy"):
        sweep = sweeps[sweeps.transitions == t]
        assert list(sweep.lmax) == [1, 2, 3, 4]
        assert (sweep.speedup.diff().dropna() >= -1e-12).all()
        # the printed oracle speedup of the measured cost model is the sweep's last row
        m = re.search(rf"\[measured cost \([^)]*\), {t}\] oracle speedup \(Lmax=4\): ([0-9.]+)", text)
        assert m and float(m.group(1)) == pytest.approx(sweep.speedup.iloc[-1], abs=1e-3)
        # the oracle is at least every fixed k under its own model
        assert (fixed[fixed.transitions == t].speedup <= sweep.speedup.iloc[-1] + 1e-12).all()
        q = re.search(rf"\[measured cost \([^)]*\), {t}\] quadrant I (\d+), II (\d+), III (\d+), IV (\d+)", text)
        assert q, f"quadrant counts of the {t} transitions not printed"
        o = online[t]
        assert o["oracle"] >= o["online"] - 1e-12 and o["oracle"] >= o["fixed_best_hindsight"] - 1e-12
        m = re.search(rf"\[sensitivity analysis: draft time x0.1, not a measurement, {t}\] held-out \(\d+ sequences\): "
                      r"oracle ([0-9.]+)", text)
        assert m and float(m.group(1)) == pytest.approx(cf[t]["oracle"], abs=1e-3)
        assert cf[t]["oracle"] >= cf[t]["online"] - 1e-12
    b3 = pd.read_csv(figures / "07_tableB3_k_by_context.csv")    # Appendix B: the quick subject has no tokenizer
    assert list(dict.fromkeys(b3.transitions)) == ["surrogate", "greedy"]
    seqs = pd.read_csv(figures / "07_oracle_sequences.csv")
    for t in ("surrogate", "greedy"):
        row = b3[(b3.transitions == t) & (b3.label == "no text (no tokenizer)")].iloc[0]
        mine = seqs[seqs.transitions == t]
        assert row.decisions == mine.N.sum() and row.responses == len(mine) and 0 <= row.share_k1 <= 1
        assert (b3[(b3.transitions == t) & (b3.label != "no text (no tokenizer)")].decisions == 0).all()
    assert "positions per context label:" in text
    measured = pd.read_csv(figures / "07_measured_fixed_k.csv")
    assert list(measured.K) == [0, 1, 2, 3, 4, 5] and measured.speedup.iloc[0] == 1.0 and measured.host_included.all()
    assert ((measured.speedup_lo <= measured.speedup) & (measured.speedup <= measured.speedup_hi)).all()
    goals = pd.read_csv(figures / "07_goals.csv")
    assert goals.goal.iloc[-1] == "greedy oracle >= best measured fixed-K rounds"
    for prefix in ("07_", "07_cf_"):   # each row names its kernel cost model; the analysis it belongs to is beside it
        kernels = pd.read_csv(figures / f"{prefix}kernel_cost_models.csv")
        assert list(kernels.cost_model) == ["one alpha (fitted)", "per-slot kernel", "dedup kernel"] * 2
        assert list(kernels.transitions) == ["surrogate"] * 3 + ["greedy"] * 3 and kernels.analysis.nunique() == 1
    regression = pd.read_csv(figures / "07_regression_by_regime.csv")
    assert "all rows" in set(regression["rows"]) and (regression["eq4_r2_in"] <= 1).all()
    rounds = pd.read_csv(tmp_path / "oracle" / "rounds.csv")
    assert (rounds["ref_GBps"] > 0).all()
    per_k = pd.read_csv(figures / "07_tableA4_per_k.csv")
    assert list(per_k[per_k["rows"] == "all rows"].K) == [1, 2, 3, 4, 5]
    cmp = pd.read_csv(figures / "07_paper2_comparison.csv").set_index("quantity")
    assert "paper 2, published (their hardware)" in cmp.columns
    # like for like: per K beside per K, pooled beside the paper's full pool
    assert cmp.loc["in_sample_R2_per_K", "paper 2, published (their hardware)"] == "0.9669-0.9991"
    assert cmp.loc["pooled_eq4_R2", "paper 2, published (their hardware)"] == "0.999"
    regression_all = regression[regression["rows"] == "all rows"].iloc[0]
    assert float(cmp.loc["pooled_eq4_R2", "ours (this machine)"]) == pytest.approx(regression_all.eq4_r2_in, abs=1e-4)
    assert cmp.loc["oracle_speedup_plateau_greedy", "paper 2, published (their hardware)"] != \
        cmp.loc["oracle_speedup_plateau", "paper 2, published (their hardware)"]
    assert re.search(r"\[all rows\] eq. \(4\) in-sample R2 = [0-9.]+, GroupKFold MAPE = [0-9.]+%; draft \(A4\): "
                     r"T_D = [-0-9.]+ K", text)
    assert re.search(r"autoregressive passes \(K = 0, [^)]*\): measured median T_T [0-9.]+ ms", text)
