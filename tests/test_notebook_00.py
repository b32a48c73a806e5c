"""Notebook 00 (default models, quality report, routing sources) runs with its quick profile and
writes every figure and table, printing the numbers it reports."""

from __future__ import annotations

import re

import pandas as pd
import pytest


@pytest.mark.notebook
def test_notebook_00_quick(run_notebook):
    _, figures, text = run_notebook("00_default_models", threads=1)
    for name in ("00_training_curves.png", "00_training_history.csv", "00_quality.csv", "00_perplexity.csv",
                 "00_expert_load.png", "00_expert_load.csv", "00_reuse_sources.png",
                 "00_reuse_sources.csv", "00_provenance.json"):
        assert (figures / name).is_file(), name
    ppl = pd.read_csv(figures / "00_perplexity.csv")
    assert list(ppl["model"]) == ["default MoE", "draft", "tiny random Llama"]
    # word-level perplexity: every model scored the same words
    assert ppl["words"].nunique() == 1 and (ppl["ppl_word"] > 1).all()
    for _, r in ppl.iterrows():
        assert f"{r['model']}: validation perplexity {r['ppl_word']:.1f} per word" in text
    # the goals table carries the measured values of the other tables and a verdict per goal
    quality = pd.read_csv(figures / "00_quality.csv").set_index("quantity")
    moe, draft = ppl.set_index("model").loc[["default MoE", "draft"], "ppl_token"]
    assert quality.loc["MoE validation perplexity per token", "value"] == pytest.approx(moe)
    assert quality.loc["MoE / draft validation perplexity per token", "value"] == pytest.approx(moe / draft)
    assert bool(quality.loc["MoE validation perplexity per token", "met"]) == (moe <= 110)
    assert "draft greedy agreement with the MoE" in quality.index
    assert "trained" in text and "tokens/s" in text  # the smoke build is trained, with its speed
    agree = float(re.search(r"greedy agreement with the default MoE .*?: ([0-9.]+)", text).group(1))
    assert 0 <= agree <= 1
    load = pd.read_csv(figures / "00_expert_load.csv")
    assert (load["max_over_mean"] >= 1).all() and (load["min_over_mean"] <= 1).all()
    reuse = pd.read_csv(figures / "00_reuse_sources.csv")
    ours = reuse[reuse["tokens"].notna()]
    rho_row = quality.loc["MoE router rho_hat(2), 32 fit articles", "value"]
    assert rho_row == pytest.approx(ours["rho_hat_2"].iloc[0])
    assert len(ours) == 2 and ours["rho_hat_2"].between(0, 1).all()
    assert "not a trained router" in ours["source"].iloc[1]
    assert reuse["source"].str.contains("paper 1, published").sum() == 3  # OLMoE, Qwen3, gpt-oss
    assert text.count("recorded (not saved)") == 4  # quick profile: nothing written to data/traces
