"""Where a pass's time goes: each step beside its byte limit (moespec.engine.breakdown), the
per-operation profile (moespec.engine.profile), and the llama.cpp peer's GGUF file
(benchmarks/ggml_peer/llamacpp_peer.py) read back."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from bench_scripts import _load
from transformers import OlmoeConfig, OlmoeForCausalLM

from moespec.engine.breakdown import byte_limits, component_limits, pass_bytes
from moespec.engine.profile import PARTS, op_profile, profile_engine
from moespec.engine.subject import load_subject
from moespec.kernels import available

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores


def _row(subject, component, tag, median, q25=None, q75=None, **kw):
    return {"subject": subject, "component": component, "pass": tag, "t_median_s": median,
            "t_q25_s": q25 or median, "t_q75_s": q75 or median, "reps": 3, **kw}


def test_byte_limits_divide_each_paths_bytes_by_the_read():
    bd = pd.DataFrame([
        _row("s", "step", "n=1", 0.010, 0.008, 0.0125),
        _row("s", "step_transformers", "n=1", 0.020),
        _row("s", "step", "n=2 dedup", 0.016),
        _row("s", "step", "n=2 slot", 0.020),
        _row("s", "peer_llamacpp", "n=1", 0.016),
        _row("s", "experts", "n=1", 0.004),
        _row("", "read", "", 0.1, GBps=10.0),
    ])
    per = {("s", 1): {"dense": 30e6, "kv_cache": 0.0, "experts_slot": 50e6, "experts_dedup": 50e6},
           ("s", 2): {"dense": 30e6, "kv_cache": 10e6, "experts_slot": 100e6, "experts_dedup": 80e6},
           ("s", 1, "llamacpp"): {"total": 120e6, "kernel": "grouped"}}
    lim = byte_limits(bd, per).set_index(["path", "pass"])
    assert lim.loc[("lean", "n=1"), "limit_ms"] == pytest.approx(8.0)          # 80 MB at 10 GB/s
    assert lim.loc[("lean", "n=1"), "share_of_limit"] == pytest.approx(0.8)
    assert lim.loc[("lean", "n=1"), "share_q25"] == pytest.approx(8 / 12.5)
    assert lim.loc[("lean", "n=1"), "share_q75"] == pytest.approx(1.0)
    assert lim.loc[("transformers", "n=1"), "share_of_limit"] == pytest.approx(0.4)
    assert lim.loc[("lean", "n=2 dedup"), "bytes_MB"] == pytest.approx(120.0)
    assert lim.loc[("lean", "n=2 dedup"), "share_of_limit"] == pytest.approx(0.75)
    assert lim.loc[("lean", "n=2 slot"), "share_of_limit"] == pytest.approx(0.7)
    assert lim.loc[("llamacpp", "n=1"), "share_of_limit"] == pytest.approx(0.75)
    assert lim.loc[("llamacpp", "n=1"), "kernel"] == "grouped"
    assert len(lim) == 5                                                        # no row for the components
    assert byte_limits(bd, per, gbps=20.0).set_index(["path", "pass"]).loc[("lean", "n=1"), "limit_ms"] == 4.0


def test_component_limits_and_the_remainder():
    bd = pd.DataFrame([_row("s", c, "n=1", t) for c, t in (("step", 0.010), ("attention", 0.002), ("experts", 0.005),
                                                          ("lm_head", 0.001))] + [_row("", "read", "", 0.1, GBps=10.0)])
    table = pd.DataFrame({"component": ["attention", "experts", "lm_head", "kv_cache", "other"],
                          "subject_bytes": [10e6, 50e6, 10e6, 1e6, 1e6]})
    out = component_limits(bd, {"s": table}).set_index("component")
    assert out.loc["attention", "share_of_limit"] == pytest.approx(0.5)
    assert out.loc["experts", "share_of_limit"] == pytest.approx(1.0)
    assert out.loc["lm_head", "limit_ms"] == pytest.approx(1.0)
    assert out.loc["step less the three", "time_ms"] == pytest.approx(2.0)
    assert out.loc["step less the three", "bytes_MB"] == pytest.approx(2.0)


def test_pass_bytes_count_slots_and_distinct_experts():
    sub = load_subject("byte-faithful-all", profile="quick", backend="cpp" if available("cpu") else "torch")
    eng = sub.engine
    eng.prefill(np.arange(1, 20))
    b1, b3 = pass_bytes(eng, [5, 6, 7], 1), pass_bytes(eng, [5, 6, 7], 3)
    assert eng.length == 19
    per_expert = eng.switch and [layer.mlp.experts.weights.bytes_per_expert for layer in eng.model.model.layers]
    m, layers = eng.model.config.num_experts_per_tok, len(per_expert)
    assert b1["experts_slot"] == b1["experts_dedup"] == m * sum(per_expert)
    assert b3["experts_slot"] == 3 * m * sum(per_expert)
    assert m * layers * per_expert[0] <= b3["experts_dedup"] <= 3 * m * sum(per_expert)
    assert b1["dense"] == b3["dense"] > 0


def test_profile_gives_the_kernels_their_own_parts():
    sub = load_subject("byte-faithful-all", profile="quick", backend="cpp" if available("cpu") else "torch")
    eng = sub.engine
    first = eng.prefill(np.arange(1, 20))
    parts, ops = profile_engine(eng, [first, 4, 5], ns=(1, 3), reps=2)
    assert eng.length == 19
    assert set(parts["pass"]) == {"n=1", "n=3"}
    assert set(parts.part) <= set(PARTS) | {"framework"}
    for tag, g in parts.groupby("pass"):
        assert g.share.sum() == pytest.approx(1.0)
        assert {"norms", "attention core (sdpa)"} <= set(g.part)
        if available("cpu"):
            assert {"expert kernel", "dense kernel (attention, LM head)"} <= set(g.part)
    n1 = ops[ops["pass"] == "n=1"].set_index(["operation", "part"])
    if available("cpu"):
        assert n1.loc[("kernel expert_slot", "expert kernel"), "calls_per_pass"] == 2      # one per MoE layer
    calls = []
    parts, _ = op_profile({"a": lambda: calls.append("a") or torch.ones(3).sum(),
                           "b": lambda: calls.append("b") or torch.ones(3).sum()}, reps=3, warmup=1)
    assert calls == ["a", "b"] * 4                       # round-robin, warm-up round first
    assert parts.groupby("key").share.sum().tolist() == pytest.approx([1.0, 1.0])


def test_peer_gguf_holds_the_models_weights_in_q8_0(tmp_path):
    gguf = pytest.importorskip("gguf")
    peer = _load("benchmarks/ggml_peer", "llamacpp_peer")
    torch.manual_seed(0)
    cfg = OlmoeConfig(vocab_size=300, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, num_experts=4, num_experts_per_tok=2,
                      tie_word_embeddings=False, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = OlmoeForCausalLM(cfg).eval()
    nbytes = peer.write_gguf(model, tmp_path / "m.gguf")
    r = gguf.GGUFReader(str(tmp_path / "m.gguf"))
    tensors = {t.name: t for t in r.tensors}
    assert len(tensors) == 3 + 2 * 12            # embedding, output norm, head; 12 per layer
    q8, f32 = gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F32
    assert tensors["blk.1.ffn_down_exps.weight"].tensor_type == q8
    assert tensors["blk.0.attn_k_norm.weight"].tensor_type == f32
    assert [int(v) for v in tensors["blk.0.ffn_gate_exps.weight"].shape] == [64, 32, 4]   # ggml order: H, I, N
    up = gguf.quants.dequantize(tensors["blk.0.ffn_up_exps.weight"].data, q8).reshape(4, 32, 64)
    want = model.model.layers[0].mlp.experts.gate_up_proj[:, 32:].detach().numpy()
    assert np.abs(up - want).max() <= np.abs(want).max() / 127 * 0.51 + 1e-6
    assert nbytes["expert"] == 3 * 32 * 64 // 32 * 34
    assert nbytes["attention"] == 2 * 4 * 64 * 64 // 32 * 34
    assert nbytes["lm_head"] == 300 * 64 // 32 * 34
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "olmoe"
