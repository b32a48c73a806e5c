"""Notebooks 05 (whole-model runs) and 06 (prediction chain, Tables 3/4/7/8, Figures 4/5/6),
quick profile: the files they write and the numbers they print."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from moespec import predict

pytestmark = pytest.mark.notebook


def test_whole_model_then_predictions(run_notebook, tmp_path):
    out = tmp_path / "engine"
    _, figs, text = run_notebook("05_whole_model", out_dir=str(out), backend="torch")
    for f in ("05_verify_time.png", "05_oracle_acceptance.png", "05_real_draft.png", "05_agreement.csv",
              "05_verify_summary.csv", "05_real_draft.csv", "05_oracle_cells.csv"):
        assert (figs / f).stat().st_size > 0, f
    # the dedup switch changes no output on the tiny model
    g = re.search(r"greedy tokens equal with dedup off and on: (\d+) of (\d+)", text)
    v = re.search(r"verify argmax equal with dedup off and on: (\d+) of (\d+) rows", text)
    assert g and g.group(1) == g.group(2) == "48"
    assert v and v.group(1) == v.group(2)
    prov = predict.rules_provenance()
    if prov["commit"]:
        assert f"scoring rules: commit {prov['commit']}" in text and "unchanged on disk: True" in text
        assert re.search(r"before the speculative runs started .*: True", text)
    summary = pd.read_csv(out / "verify_summary.csv")
    assert sorted(summary["n"].unique()) == list(range(1, 10)) and sorted(summary["d"].unique()) == [24, 48]
    runs = pd.read_csv(out / "oracle_runs.csv")
    assert len(runs) == 2 * 2 * 4 * 3 and (runs.loc[runs["k"] == 0, "tokens_per_step"] == 1).all()
    real = pd.read_csv(out / "real_draft.csv")
    assert set(real["k"]) == {0, 1, 2}
    assert re.search(r"plain decoding fastest on \d of 2 prompts", text)

    _, figs, text = run_notebook("06_predictions", out_dir=str(out), backend="torch")
    for f in ("06_fig4_saving.png", "06_fig5_kstar_bounds.png", "06_fig6_preregistered.png", "06_fits.csv",
              "06_curves.csv"):
        assert (figs / f).stat().st_size > 0, f
    t3 = pd.read_csv(figs / "06_table3_predictions.csv")
    assert set(t3["source"]) == {"this run", "paper 1, published (their hardware)"}
    assert (t3["source"] == "this run").sum() == 2 and (t3["source"] != "this run").sum() == 12
    t4 = pd.read_csv(figs / "06_table4_preregistered.csv")
    assert set(t4.loc[t4["source"] == "this run", "version"]) == {"measured-time", "calibrated", "prediction"}
    t8 = pd.read_csv(figs / "06_table8_rules.csv")
    ours = t8[t8["source"] == "this run"]
    assert len(ours) == 6 * 3 and ours["d24"].str.match(r".*, (holds|fails)$").all()
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics) == 4 * 2
    for key, m in metrics.items():
        # the proved bounds (20), (21) hold wherever the version predicts positive step times
        assert (m["loss_inside_bound20"] and m["speedup_inside_bound21"]) or not m["valid_step_times"], key
        assert m["kstar_values"] == 3 and 0 <= m["implied_eps"] < 1
    # the printed count matches the metrics on disk
    n20 = sum(m["loss_inside_bound20"] for m in metrics.values())
    assert f"throughput lost inside bound (20): {n20} of 8" in text
    if prov["commit"]:
        assert f"read unchanged; commit {prov['commit']}" in text
    assert re.search(r"engine eps = \d+\.\d{3}", text)
