"""Model specs: expert bytes by format from the block layouts, the Q4_K_M layer rule, bad input."""

from __future__ import annotations

import pytest

from moespec.model_shapes import FORMATS, PRESETS, MoESpec, format_bytes, get_spec, llama_cpp_use_more_bits


def test_block_formats_by_hand():
    # Q8_0: 32 int8 + one fp16 scale = 34 bytes per 32 weights; MXFP4: 16 B of nibbles + 1 B scale
    assert format_bytes(64, "q8_0") == 68
    assert format_bytes(64, "mxfp4") == 34
    assert format_bytes(256, "q4_k") == 144 and format_bytes(256, "q6_k") == 210
    assert format_bytes(10, "f32") == 40 and format_bytes(10, "bf16") == 20
    with pytest.raises(ValueError, match="not a whole number"):
        format_bytes(33, "q8_0")
    with pytest.raises(ValueError, match="unknown storage format"):
        format_bytes(32, "q3_x")


def test_expert_bytes_of_the_presets():
    olmoe = PRESETS["olmoe"]
    assert olmoe.weights_per_expert == 3 * 2048 * 1024
    assert olmoe.expert_bytes() == 3 * 2048 * 1024 // 32 * 34          # Q8_0 default
    assert olmoe.expert_bytes("f32") == 4 * 3 * 2048 * 1024
    assert olmoe.total_expert_bytes("bf16") == 16 * 2 * 3 * 2048 * 1024
    gpt = PRESETS["gpt-oss"]
    assert gpt.expert_bytes() == 3 * 2880 * 2880 // 32 * 17             # MXFP4 default
    assert abs(olmoe.q - 7 / 8) < 1e-15 and abs(PRESETS["qwen3"].q - 15 / 16) < 1e-15


def test_q4_k_m_uses_q6_k_for_down_on_llama_cpp_layers():
    qwen = PRESETS["qwen3"]                   # 48 layers: first and last 6, every third between
    more = [llama_cpp_use_more_bits(i, 48) for i in range(48)]
    assert more[:6] == [True] * 6 and more[42:] == [True] * 6
    assert [i for i in range(6, 42) if more[i]] == list(range(8, 42, 3))
    third = 2048 * 768
    q4 = 2 * third // 256 * 144
    per_layer = qwen.layer_expert_bytes()
    assert per_layer[0] == q4 + third // 256 * 210
    assert per_layer[6] == q4 + third // 256 * 144
    assert sum(per_layer) == qwen.total_expert_bytes()


def test_spec_validation_and_lookup():
    with pytest.raises(ValueError, match="1 <= m < N"):
        MoESpec(name="bad", num_experts=8, top_k=8, num_layers=2, num_moe_layers=2,
                hidden_size=64, expert_intermediate=32)
    with pytest.raises(ValueError, match="num_moe_layers"):
        MoESpec(name="bad", num_experts=8, top_k=2, num_layers=2, num_moe_layers=3,
                hidden_size=64, expert_intermediate=32)
    assert get_spec("OLMoE") is PRESETS["olmoe"]
    with pytest.raises(KeyError, match="unknown model"):
        get_spec("no-such-model")
    assert all(spec.source for spec in PRESETS.values())
    assert set(FORMATS) >= {"q8_0", "q4_k", "q6_k", "mxfp4", "bf16", "f32", "int8_b32"}
