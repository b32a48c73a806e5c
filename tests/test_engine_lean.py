"""The lean decode path (``moespec.engine.lean``) computes transformers' forward bit for bit.

Every test runs the same sequence of passes (a prefill in chunks, so that later chunks attend to a
cache; greedy decoding past the cache's first capacity; verify passes of 2..9 tokens with the
dedup switch off and on; crops; a held and resumed prompt) on two engines over one model: the
lean path and transformers' ``OlmoeForCausalLM.forward`` with a ``DynamicCache``
(``Engine.variant(lean=False)``, the path the engine ran before the lean one existed), and asserts
the same greedy tokens and ``torch.equal`` logits at every pass.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import OlmoeConfig, OlmoeForCausalLM

from moespec.engine import Engine
from moespec.engine.breakdown import ZeroExperts
from moespec.engine.lean import KVCache, unsupported
from moespec.engine.subject import load_subject
from moespec.engine.switch import moe_layers
from moespec.kernels import available
from moespec.zoo import tiny_moe

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores

CPP = available("cpu")


def _gqa_moe() -> OlmoeForCausalLM:
    """A tiny OLMoE with grouped-query attention (8 query heads, 2 key/value heads)."""
    torch.manual_seed(3)
    cfg = OlmoeConfig(vocab_size=256, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=128,
                      num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, pad_token_id=0)
    return OlmoeForCausalLM(cfg).eval()


def _engines(kind: str):
    """(lean engine, transformers-path engine) over one model."""
    if kind in ("default", "byte-faithful-all"):
        eng = load_subject(kind, profile="quick", backend="cpp" if CPP else "torch").engine
    elif kind == "torch-backend":
        eng = Engine(tiny_moe(seed=1), backend="torch")
    elif kind == "own-experts":
        eng = Engine(tiny_moe(seed=2), install_kernels=False)
    else:
        eng = Engine(_gqa_moe(), backend="torch")
    eng.prefill_chunk = 7
    return eng, eng.variant(lean=False)


def _passes(eng: Engine, prompt) -> tuple[list, list]:
    """Tokens and logits of a fixed sequence of passes (module docstring)."""
    toks, logits = [], []

    def keep(out):
        toks.extend(out if isinstance(out, list) else [out])
        logits.append(eng.last_logits.clone())

    first = eng.prefill(prompt)
    keep(first)
    keep(eng.greedy(first, 40))                       # past the first capacity of the lean cache (64)
    for dedup in ((False, True) if eng.switch is not None else (False,)):
        if eng.switch is not None:
            eng.dedup = dedup
        for n in range(2, 10):
            eng.crop(len(prompt) + 5)
            keep(eng.forward(list(range(3, 3 + n))))
    held = eng.hold(first)
    keep(eng.prefill(prompt[:9]))
    keep(eng.greedy(7, 3))
    first = eng.resume(held)
    keep(eng.forward([first, 11]))
    if eng.switch is not None:
        eng.dedup = False
    return toks, logits


@pytest.mark.parametrize("kind", ["default", "byte-faithful-all", "torch-backend", "own-experts", "gqa"])
def test_lean_path_gives_transformers_tokens_and_logits_bit_for_bit(kind):
    lean, old = _engines(kind)
    assert lean.lean and not old.lean
    prompt = np.random.default_rng(0).integers(1, 200, size=30)
    new_toks, new_logits = _passes(lean, prompt)
    assert isinstance(lean.cache, KVCache) and lean.cache.capacity > 64
    old_toks, old_logits = _passes(old, prompt)
    assert not isinstance(old.cache, KVCache)
    assert new_toks == old_toks
    assert len(new_logits) == len(old_logits) == (21 if lean.switch is not None else 13)
    for a, b in zip(new_logits, old_logits):
        assert torch.equal(a, b)


def test_swapped_modules_and_hooks_run_on_the_lean_path():
    lean, old = _engines("default")
    prompt = np.arange(1, 20)
    for e in (lean, old):
        e.prefill(prompt)
    layers = moe_layers(lean.model)
    kept = [layer.mlp.experts for layer in layers]
    calls = []
    handle = layers[0].self_attn.q_proj.register_forward_hook(lambda m, a, o: calls.append(a[0].shape))
    try:
        for layer in layers:
            layer.mlp.experts = ZeroExperts()
        outs = [(e.forward([4, 5, 6]), e.last_logits.clone()) for e in (lean, old)]
    finally:
        handle.remove()
        for layer, e in zip(layers, kept):
            layer.mlp.experts = e
    assert calls == [torch.Size([1, 3, 32])] * 2           # the hook ran once on each path
    assert outs[0][0] == outs[1][0] and torch.equal(outs[0][1], outs[1][1])
    for e in (lean, old):
        e.crop(len(prompt))
    with_experts = [(e.forward([4, 5, 6]), e.last_logits.clone()) for e in (lean, old)]
    assert torch.equal(with_experts[0][1], with_experts[1][1])
    assert not torch.equal(with_experts[0][1], outs[0][1])  # the plan went back to the kernels


def test_routing_records_agree():
    lean, old = _engines("byte-faithful-all")
    ids = np.arange(1, 40)
    for e in (lean, old):
        e.reset()
    assert np.array_equal(lean.record_routing(ids), old.record_routing(ids))
    with lean.routing_tap() as new_counts:
        lean.prefill(ids[:12])
        lean.forward([3, 4, 5])
    with old.routing_tap() as old_counts:
        old.prefill(ids[:12])
        old.forward([3, 4, 5])
    assert new_counts == old_counts and len(new_counts) == 3


def test_models_the_lean_path_does_not_run_keep_transformers_path():
    bf16 = tiny_moe(seed=1).to(torch.bfloat16)
    assert "bfloat16" in unsupported(bf16)
    assert not Engine(bf16, backend="torch").lean
    eng = Engine(tiny_moe(seed=1), backend="torch")
    handle = eng.model.model.layers[0].register_forward_hook(lambda *a: None)
    try:
        with pytest.raises(ValueError, match="layer 0: layer has forward hooks"):
            eng.prefill([1, 2, 3])
    finally:
        handle.remove()
    assert eng.prefill([1, 2, 3]) == eng.variant(lean=False).prefill([1, 2, 3])


def test_a_forward_set_on_a_module_is_run_or_refused():
    """A forward set on an attention module's instance (which the lean path never calls) is refused by
    name; one set on a norm the lean path would run inline makes it call the norm as a module, so the
    forward runs; removed, the plan of the plain arrangement serves again."""
    eng = Engine(tiny_moe(seed=1), backend="torch")
    attn = eng.model.model.layers[0].self_attn
    attn.forward = attn.forward
    try:
        with pytest.raises(ValueError, match=r"^layer 0: self_attn has forward hooks or a forward set on it"):
            eng.prefill([1, 2, 3])
    finally:
        del attn.forward
    norm = eng.model.model.norm
    own, calls = norm.forward, []
    norm.forward = lambda x: (calls.append(x.shape), own(x))[1]
    try:
        first = eng.prefill([1, 2, 3])
    finally:
        del norm.forward
    assert calls == [(1, 3, norm.weight.shape[0])]
    assert eng.prefill([1, 2, 3]) == first == eng.variant(lean=False).prefill([1, 2, 3])


def test_decoding_past_max_position_embeddings_as_transformers_does():
    """A sequence that grows past the model's max_position_embeddings (128) decodes on the lean path
    as on transformers' (whose DynamicCache has no limit), bit for bit."""
    lean, old = _engines("gqa")
    prompt = np.random.default_rng(1).integers(1, 200, size=120)
    outs = []
    for eng in (lean, old):
        first = eng.prefill(prompt)
        toks = [first] + eng.greedy(first, 16)
        outs.append((toks, eng.last_logits.clone(), eng.length))
    assert outs[0][0] == outs[1][0] and torch.equal(outs[0][1], outs[1][1]) and outs[0][2] == 136


def test_kv_cache_crops_like_dynamic_cache_and_grows_keeping_its_positions():
    c = KVCache(layers=2, batch=1, kv_heads=2, head_dim=4, capacity=4, limit=10)
    c.keys[:, :, :, :3] = torch.arange(3.0).view(1, 1, 1, 3, 1)
    c.length = 3
    c.reserve(5)
    assert c.capacity == 8 and c.length == 3
    assert torch.equal(c.keys[0, 0, 0, :3, 0], torch.tensor([0.0, 1.0, 2.0]))
    c.crop(-1)
    assert c.get_seq_length() == 2
    c.crop(1)
    assert c.length == 1
    with pytest.raises(ValueError, match="cannot crop a cache of 1 positions to 2"):
        c.crop(2)
    with pytest.raises(ValueError, match="at most 10 positions cannot hold 11"):
        c.reserve(11)
