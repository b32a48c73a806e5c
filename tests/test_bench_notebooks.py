"""Notebooks 02 and 03 with the quick profile: the files they write and the numbers they print."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from moespec import fit
from moespec.measure import expert_op

pytestmark = pytest.mark.notebook


def plain_distinct_share(trace, n):
    """Layer mean of the mean of |union of n consecutive token sets| / (n·m), by plain loops."""
    per_layer = []
    for layer in range(trace.num_layers):
        vals = [len(set(doc[s:s + n, layer].ravel().tolist())) / (n * trace.top_k)
                for doc in trace.docs for s in range(len(doc) - n + 1)]
        per_layer.append(np.mean(vals))
    return float(np.mean(per_layer))


def test_notebooks_02_and_03_quick(run_notebook, tmp_path):
    bench = tmp_path / "bench"
    _, figures, text = run_notebook("02_expert_op_benchmark", backend="torch", out_dir=str(bench))
    for name in ("02_fig2_bandwidth.png", "02_table1_bandwidth.csv", "02_bandwidth_by_n.csv",
                 "02_fig3_distinct_share.png", "02_fig3_distinct_share.csv"):
        assert (figures / name).stat().st_size > 0, name
    t1 = pd.read_csv(figures / "02_table1_bandwidth.csv")
    ours = t1[t1["source"].str.startswith("moespec")].iloc[0]
    assert (t1["source"] == "paper 1, published (their hardware)").sum() == 8
    for n in (2, 8):
        m = re.search(rf"n={n}: beta_slot=([\d.]+) GB/s beta_dedup=([\d.]+) GB/s r=([\d.]+) ubar=([\d.]+)", text)
        assert m, text
        slot, dedup, r, ubar = map(float, m.groups())
        assert r == pytest.approx(ours[f"n{n}_r"], abs=1e-3)
        assert r == pytest.approx(dedup / slot, rel=1e-3)
        assert 1 / n <= ubar <= 1
    assert re.search(r"re-read cost c_re/c_u per layer: layer 0: -?[\d.]+", text)
    m = re.search(r"read ceiling \((\w+), same run\): median ([\d.]+) GB/s", text)
    assert m and m.group(1) in ("halves", "lanes", "whole", "side"), text
    # the shares divide by the read ceiling, the torch.sum read beside it; the check's columns
    bw = pd.read_csv(figures / "02_bandwidth_by_n.csv", keep_default_na=False)
    assert np.allclose(bw["slot_over_read"], bw["beta_slot_GBps"] / bw["read_GBps"])
    assert np.allclose(bw["dedup_over_sum"], bw["beta_dedup_GBps"] / bw["sum_GBps"])
    assert set(bw["read_probe"]) <= {"halves", "lanes", "whole", "side"}
    assert {"above_read", "above_read_cause"} <= set(bw)
    assert float(m.group(2)) == pytest.approx(bw["read_GBps"].median(), abs=0.006)
    # the distinct share of the synthetic windows, checked against a plain loop over the same trace
    trace = expert_op.routing_for("olmoe", num_docs=4, doc_len=64)
    share2 = float(re.search(r"distinct share n=2: ([\d.]+)", text).group(1))
    assert share2 == pytest.approx(plain_distinct_share(trace, 2), abs=1e-3)
    assert "calibrated to paper 1" in text
    # the discard rule: one group (quick: one layer, every n), its read is the run's median (and a
    # 4 MiB read, served by the caches, is not judged); the counts add up to the run's timed rows,
    # and with nothing discarded both ways agree
    groups = pd.read_csv(figures / "02_discard_groups.csv", keep_default_na=False)
    assert len(groups) == 1 and groups["departure"].iloc[0] == 0.0 and groups["discarded"].tolist() == [False]
    assert groups["judged"].tolist() == [False]
    counts = pd.read_csv(figures / "02_discard_rule.csv").iloc[0]
    rows = expert_op.load_rows(next(bench.glob("*/rows.csv")).parent)
    assert counts["rows_kept"] + counts["rows_discarded"] == int((~rows["kind"].isin(["membw", "ceiling"])).sum())
    assert (counts["groups_kept"], counts["groups_discarded"]) == (1, 0)
    effect = pd.read_csv(figures / "02_discard_effect.csv")
    assert len(effect) == 9 and np.allclose(effect["r_all"], effect["r_kept"])
    # Figure 2 / Table 1 at the paper's breadth, from the committed benchmark run
    assert (figures / "02_fig2_breadth.png").stat().st_size > 0
    tb = pd.read_csv(figures / "02_table1_breadth.csv", keep_default_na=False)
    ours_b = tb[tb["source"].str.startswith("moespec")]
    assert len(ours_b) == 2 * 3 * 4 and (tb["source"] == "paper 1, published (their hardware)").sum() == 8

    _, figures, text3 = run_notebook("03_fits", backend="torch", out_dir=str(bench))
    run02 = re.search(r"run (\S+): \d+ rows, backend", text).group(1)
    assert f"run {run02}:" in text3, "notebook 03 must reuse notebook 02's run"
    coefs = pd.read_csv(figures / "03_fit_coefficients.csv")
    assert sorted(coefs["kernel"]) == ["dedup", "slot"]
    eps = pd.read_csv(figures / "03_epsilon.csv").iloc[0]
    m = re.search(r"epsilon \(torch\): slot ([\d.]+), dedup ([\d.]+), engine ([\d.]+)", text3)
    assert m, text3
    e_slot, e_dedup, e_eng = map(float, m.groups())
    assert e_slot == pytest.approx(eps["eps_slot"], abs=1e-4) and e_eng == pytest.approx(max(e_slot, e_dedup), abs=1e-4)
    err = pd.read_csv(figures / "03_window_errors.csv")
    slot_err = err[err["kernel"] == "slot"]
    assert e_slot == pytest.approx(np.median(np.abs(slot_err["rel_err"])), abs=1e-4)
    # both fits beside each other, on every row and on the kept rows; the default is the non-negative one
    variants = pd.read_csv(figures / "03_fit_variants.csv")
    assert sorted(set(zip(variants["rows"], variants["fit"]))) == [
        ("all", "nonnegative"), ("all", "unconstrained"), ("kept", "nonnegative"), ("kept", "unconstrained")]
    nonneg = variants[(variants["fit"] == "nonnegative")]
    assert (nonneg[["t_op", "c_u", "c_re", "c_g", "c_t"]].fillna(0) >= 0).all().all()
    kept = nonneg[nonneg["rows"] == "kept"].set_index(["layer", "kernel"]).sort_index()
    assert np.allclose(kept["t_op"], coefs.set_index(["layer", "kernel"]).sort_index()["t_op"])
    eps_v = pd.read_csv(figures / "03_epsilon_variants.csv")
    assert eps_v.query("rows == 'kept' and fit == 'nonnegative'")["eps_engine"].iloc[0] == pytest.approx(eps["eps_engine"])
    # fits and epsilon per engine: this run's beside the committed ggml run's, each as fit_layers gives it
    from moespec.tables.bandwidth import load_engine_fit_runs
    eng_eps = pd.read_csv(figures / "03_epsilon_engines.csv")
    eng_coefs = pd.read_csv(figures / "03_fit_coefficients_engines.csv")
    assert list(eng_eps["backend"]) == ["torch", "ggml"] and eng_eps["engine"].iloc[1].startswith("llama.cpp CPU")
    assert eng_eps["eps_engine"].iloc[0] == pytest.approx(eps["eps_engine"])
    (label, committed), = load_engine_fit_runs().items()
    ggml_fits = fit.fit_layers(committed.kept)
    mine = eng_coefs[eng_coefs["engine"] == label].set_index(["layer", "kernel"]).sort_index()
    assert np.allclose(mine["c_g"].fillna(0), ggml_fits.set_index(["layer", "kernel"]).sort_index()["c_g"].fillna(0))
    assert (mine[["t_op", "c_u", "c_re", "c_g", "c_t"]].fillna(0) >= 0).all().all()
    counts3 = pd.read_csv(figures / "03_discard_rule.csv").set_index("table")
    assert counts3.loc["Figure 7 transfer", "groups_kept"] + counts3.loc["Figure 7 transfer", "groups_discarded"] == 4
    tr = pd.read_csv(figures / "03_fig7_transfer.csv")
    assert len(tr) == 4 * 4 and set(tr["n"]) == {2, 4, 6, 8}
    assert np.allclose(tr["r_pred"], tr["beta_dedup_pred"] / tr["beta_slot_pred"])
    assert (figures / "03_fig7_transfer.png").stat().st_size > 0
    assert len(re.findall(r"transfer, held out", text3)) == 4
    # Figure 7's consequence: each held-out model's crossover from transferred and from own bandwidths
    cross = pd.read_csv(figures / "03_fig7_crossover.csv")
    assert len(cross) == 4 and set(cross["ns"]) == {"2 4 6 8"}
    bw_all = pd.read_csv(figures / "03_bandwidth_all_models.csv")
    for row in cross.itertuples():
        g = tr[tr["model"] == row.model].sort_values("n")
        ubar = bw_all[bw_all["model"] == row.model].set_index("n").loc[[2, 4, 6, 8], "ubar"].to_numpy()
        positive = (1 - ubar / g["r_meas"].to_numpy()) > 0
        tail = [n for i, n in enumerate((2, 4, 6, 8)) if positive[i:].all()]
        assert (row.crossover_meas if row.crossover_meas == row.crossover_meas else None) == (tail[0] if tail else None)
    m = re.search(r"within one of the own-bandwidth one on (\d+) of 4 held-out models", text3)
    assert m and int(m.group(1)) == int(cross["within_one"].sum())
