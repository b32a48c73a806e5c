"""The layer-stack benchmark (moespec.measure.layer_stack) on the CPU: a pass runs every layer on
the same window of replayed routing, the rows count the bytes each kernel requests per layer, and
S(n) = T_slot - T_dedup comes out of the rows. (CUDA-graph replay is GPU-only.)"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moespec.kernels import ExpertWeights, reference_forward
from moespec.measure import layer_stack


def test_stack_pass_runs_each_layer_on_its_routing():
    w = [ExpertWeights.random((6, 32, 32), "f32", seed=s) for s in range(3)]
    x = torch.randn(2, 32)
    ids = [torch.tensor([[0, 1], [2, 3]]), torch.tensor([[4, 5], [0, 2]]), torch.tensor([[1, 3], [5, 4]])]
    gates = [torch.full((2, 2), 0.5)] * 3
    y = layer_stack.stack_pass("dedup", "cpu", x, ids, gates, w)()
    ref = reference_forward(x, ids[2], w[2], gates[2])  # the pass returns the last layer's output
    assert float((y.double() - ref).abs().max()) < 1e-5


def test_run_rows_bytes_and_summary(tmp_path):
    cfg = layer_stack.StackConfig(model="olmoe", fmt="f32", device="cpu", ns=(1, 3), windows=2, reps=2, warmup=0,
                                  membw_bytes=1 << 20, layers=2, hidden=64, intermediate=32, graph=False)
    out = layer_stack.run(cfg, tmp_path / "run", progress=False)
    rows = pd.read_csv(out / "rows.csv")
    assert len(rows) == 2 * 2 * 2 and set(rows["mode"]) == {"eager"} and set(rows["layers"]) == {2}
    b = 4 * 3 * 64 * 32  # bytes of one f32 expert
    slot = rows[rows["kernel"] == "slot"]
    assert (slot["bytes"] == 2 * slot["n"] * 8 * b).all()  # 2 layers x n tokens x m = 8 slots
    dedup = rows[rows["kernel"] == "dedup"]
    assert np.allclose(dedup["bytes"], 2 * dedup["U_mean"] * b)  # per layer U distinct experts
    assert (dedup.loc[dedup["n"] == 1, "U_mean"] == 8).all()
    s = layer_stack.summarize(rows)
    assert len(s) == 2 and np.allclose(s["S_s"], s["t_s_slot"] - s["t_s_dedup"], atol=1e-3)
    text = (out / "report.md").read_text()
    assert "| 3 | eager |" in text and "synthetic" in text
    # resumes: a second run over the same folder measures nothing new
    layer_stack.run(cfg, tmp_path / "run", progress=False)
    assert len(pd.read_csv(out / "rows.csv")) == len(rows)


def test_config_is_checked():
    with pytest.raises(ValueError, match="windows and reps"):
        layer_stack.StackConfig(windows=0)
    with pytest.raises(ValueError, match="pass sizes"):
        layer_stack.StackConfig(ns=(0, 1))
