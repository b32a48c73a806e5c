"""The routing recorder on every supported transformers MoE family, built from tiny random configs.

Each recorded id set is checked against the top-k of router logits computed here from the
router's own input and weights; chunked recording with the KV cache must equal one full pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, GptOssConfig, GptOssForCausalLM,
                          LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM,
                          Qwen3MoeConfig, Qwen3MoeForCausalLM)

from moespec import zoo
from moespec.routing import RoutingTrace, record
from moespec.routing.record import find_routers

V, H, CTX = 96, 32, 64
COMMON = dict(vocab_size=V, hidden_size=H, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=CTX, pad_token_id=0, bos_token_id=0, eos_token_id=0)


pytestmark = pytest.mark.usefixtures("one_thread")


def _olmoe():
    return zoo.tiny_moe(seed=3, vocab_size=V, num_experts=8, top_k=2, num_layers=2, hidden_size=H, context=CTX)


def _qwen3():  # layer 1 is a dense MLP (mlp_only_layers)
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**COMMON, intermediate_size=64, moe_intermediate_size=16,
                                              num_hidden_layers=3, num_experts=8, num_experts_per_tok=2,
                                              mlp_only_layers=[1], head_dim=8))


def _mixtral():
    return MixtralForCausalLM(MixtralConfig(**COMMON, intermediate_size=16, num_hidden_layers=2,
                                            num_local_experts=8, num_experts_per_tok=2))


def _deepseek():  # dense first layer, two shared experts
    return DeepseekV2ForCausalLM(DeepseekV2Config(
        **{**COMMON, "num_key_value_heads": 4}, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=3,
        n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2, first_k_dense_replace=1,
        kv_lora_rank=16, q_lora_rank=None, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8,
        head_dim=8))


def _gpt_oss():
    return GptOssForCausalLM(GptOssConfig(**COMMON, intermediate_size=16, num_hidden_layers=2,
                                          num_local_experts=8, num_experts_per_tok=2, head_dim=8,
                                          sliding_window=8,
                                          layer_types=["sliding_attention", "full_attention"]))


FAMILIES = {"olmoe": _olmoe, "qwen3_moe": _qwen3, "mixtral": _mixtral, "deepseek_v2": _deepseek,
            "gpt_oss": _gpt_oss}


def _independent_topk(model, ids: torch.Tensor) -> np.ndarray:
    """[T, L, k] sorted ids: top-k of logits = (router input) @ W^T (+ bias), computed here."""
    _, routers = find_routers(model)
    inputs = []
    handles = [r.register_forward_pre_hook(lambda m, a: inputs.append(a[0].reshape(-1, a[0].shape[-1])))
               for r in routers]
    with torch.no_grad():
        model(input_ids=ids[None])
    for h in handles:
        h.remove()
    out = []
    for r, x in zip(routers, inputs):
        logits = x.float() @ r.weight.float().T + (r.bias.float() if getattr(r, "bias", None) is not None else 0)
        out.append(torch.topk(logits, r.top_k, dim=-1).indices.sort(-1).values.numpy())
    return np.stack(out, axis=1)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_recorded_ids_are_router_topk_and_chunking_is_exact(family):
    torch.manual_seed(0)
    model = FAMILIES[family]().eval()
    docs = [torch.randint(1, V, (40,)), torch.randint(1, V, (23,))]
    full = record(model, docs, progress=False, source=f"tiny {family}")
    chunked = record(model, docs, chunk_size=7, progress=False)
    assert isinstance(full, RoutingTrace) and full.num_docs == 2
    for d, doc in enumerate(docs):
        got = np.sort(full.docs[d], axis=-1)
        np.testing.assert_array_equal(got, _independent_topk(model, doc))
        np.testing.assert_array_equal(got, np.sort(chunked.docs[d], axis=-1))
    assert full.meta["family"] == family and full.source == f"tiny {family}"


def test_deepseek_dense_layer_and_shared_experts_are_in_meta_not_slots():
    trace = record(_deepseek().eval(), [torch.arange(1, 11)], progress=False)
    assert trace.num_layers == 2 and trace.top_k == 2 and trace.num_experts == 8
    assert trace.meta["layer_indices"] == [1, 2] and trace.meta["dense_layers"] == [0]
    assert trace.meta["num_shared_experts"] == 2
    q = record(_qwen3().eval(), [torch.arange(1, 11)], progress=False)
    assert q.meta["layer_indices"] == [0, 2] and q.meta["dense_layers"] == [1]


def test_expert_bytes_default_to_parameter_bytes():
    model = _olmoe()
    trace = record(model, [torch.arange(1, 6)], progress=False)
    e = model.model.layers[0].mlp.experts
    per_expert = (e.gate_up_proj[0].numel() + e.down_proj[0].numel()) * 4
    np.testing.assert_array_equal(trace.expert_bytes, [per_expert] * 2)


def test_bad_inputs_have_clear_errors():
    dense = LlamaForCausalLM(LlamaConfig(**COMMON, intermediate_size=16, num_hidden_layers=1))
    with pytest.raises(ValueError, match="no router hook.*observer"):
        record(dense, [torch.arange(5)], progress=False)
    model = _olmoe()
    with pytest.raises(ValueError, match=f"document 1 has {CTX + 1} tokens, longer than the model's context of {CTX}"):
        record(model, [torch.arange(5), torch.ones(CTX + 1, dtype=torch.long)], progress=False)
    with pytest.raises(ValueError, match=r"document 0: token ids must lie in \[0, 96\)"):
        record(model, [torch.tensor([1, 200])], progress=False)
    with pytest.raises(ValueError, match="non-empty 1-D"):
        record(model, [np.zeros((2, 3), dtype=int)], progress=False)
    with pytest.raises(ValueError, match="no documents"):
        record(model, [], progress=False)
