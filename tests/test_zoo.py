"""The embedded models: grouped expert operation, build/caching/determinism, strict checkpoint loading."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from moespec import zoo
from moespec.zoo import build, store
from moespec.zoo.experts import IMPLEMENTATION
from moespec.zoo.train import TrainConfig, lr_at


pytestmark = pytest.mark.usefixtures("one_thread")


def test_sorted_experts_equal_reference_loop():
    """The grouped-by-expert operation gives the reference per-expert loop's output and grads."""
    model = zoo.tiny_moe(seed=1)
    block = model.model.layers[0].mlp
    x = torch.randn(37, model.config.hidden_size)
    with torch.no_grad():
        _, w, ids = block.gate(x)
    outs, grads = {}, {}
    for impl in ("eager", IMPLEMENTATION):
        model.config._experts_implementation = impl
        block.experts.zero_grad()
        y = block.experts(x, ids, w)
        y.square().sum().backward()
        outs[impl], grads[impl] = y.detach(), block.experts.down_proj.grad.clone()
    torch.testing.assert_close(outs["eager"], outs[IMPLEMENTATION], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grads["eager"], grads[IMPLEMENTATION], rtol=1e-5, atol=1e-6)


def test_default_configs_have_paper_ratio():
    cfg = zoo.default_moe_config()
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (64, 8)  # OLMoE's N and m
    assert cfg.router_aux_loss_coef > 0 and cfg.output_router_logits
    assert zoo.default_draft_config().vocab_size == cfg.vocab_size
    spec = zoo.default_moe_spec()
    assert spec.expert_bytes("f32") == 4 * 3 * cfg.hidden_size * cfg.intermediate_size


def test_lr_schedule_warmup_and_floor():
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    assert lr_at(0, cfg) == pytest.approx(0.1) and lr_at(9, cfg) == pytest.approx(1.0)
    assert lr_at(100, cfg) == pytest.approx(0.1)


@pytest.fixture(scope="module")
def smoke_models(tmp_path_factory):
    out = tmp_path_factory.mktemp("models")
    first = zoo.build_default_models(profile="smoke", out=out, progress=False)
    return out, first


def test_build_caches_and_is_deterministic(smoke_models, tmp_path):
    out, first = smoke_models
    assert all(v["built"] for v in first.values())
    again = zoo.build_default_models(profile="smoke", out=out, progress=False)
    assert not any(v["built"] for v in again.values())  # cached: same recipe, nothing rebuilt
    other = zoo.build_default_models(profile="smoke", out=tmp_path, progress=False)
    assert all(v["built"] for v in other.values())
    for name in (zoo.MOE_DIR, zoo.DRAFT_DIR):
        a, b = store.load(out / name), store.load(tmp_path / name)
        for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert ka == kb and torch.equal(va, vb), ka
    hist = store.read_meta(out / zoo.MOE_DIR)["history"]
    assert hist[0]["aux_loss"] > 0  # the load-balancing loss was part of training


def test_loaders_give_models_and_tokenizer(smoke_models):
    out, _ = smoke_models
    moe = zoo.load_default_moe(folder=out / zoo.MOE_DIR)
    draft = zoo.load_draft(folder=out / zoo.DRAFT_DIR)
    tok = zoo.load_tokenizer(out / zoo.TOKENIZER_DIR)
    ids = torch.tensor([tok("The game was released in Japan .")["input_ids"]])
    assert moe(input_ids=ids).logits.shape[-1] == draft(input_ids=ids).logits.shape[-1] == len(tok)
    assert tok.decode(ids[0]) == "The game was released in Japan ."


def test_missing_and_corrupt_checkpoints_are_clear(smoke_models, tmp_path):
    out, _ = smoke_models
    with pytest.raises(FileNotFoundError, match="build the default models"):
        zoo.load_default_moe(folder=tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        zoo.load_tokenizer(tmp_path)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in ("config.json", "model.safetensors"):
        (bad / f).write_bytes((out / zoo.MOE_DIR / f).read_bytes())
    raw = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    with pytest.raises(ValueError, match="corrupt or truncated safetensors"):
        store.load(bad)
    (bad / "model.safetensors").write_bytes(raw)
    cfg = json.loads((bad / "config.json").read_text())
    cfg["num_hidden_layers"] += 1  # weights no longer match the config
    (bad / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="do not match"):
        store.load(bad)
    (bad / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="unreadable model config"):
        store.load(bad)


def test_unknown_profile():
    with pytest.raises(ValueError, match="unknown build profile"):
        build.build(profile="huge")


def test_store_saves_models_flagged_quantized(tmp_path):
    """A GGUF-loaded model (dequantized, but flagged quantized, with tied embeddings) is saved as
    plain safetensors + config and loads back strictly with equal weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=1, num_attention_heads=2,
                                         tie_word_embeddings=True))
    model.hf_quantizer = object()  # what a gguf_file= load leaves behind
    store.save(model, tmp_path / "m", {"label": "x"})
    back = store.load(tmp_path / "m")
    for k, v in model.state_dict().items():
        assert torch.equal(v, back.state_dict()[k]), k
    assert back.lm_head.weight.data_ptr() == back.model.embed_tokens.weight.data_ptr()


def test_balance_loss_matches_transformers_for_one_layer_and_is_per_layer():
    from transformers.models.olmoe.modeling_olmoe import load_balancing_loss_func

    from moespec.zoo.train import balance_loss

    torch.manual_seed(0)
    a, b = torch.randn(50, 8), torch.randn(50, 8)
    torch.testing.assert_close(balance_loss((a,), 2), load_balancing_loss_func((a,), 8, 2))
    # two layers, each routing every token to its own two experts: pooled looks balanced-ish,
    # per layer each is maximally unbalanced (N * P_i on two experts with f_i = 1)
    hot = torch.full((50, 8), -30.0)
    h1, h2 = hot.clone(), hot.clone()
    h1[:, :2], h2[:, 2:4] = 0.0, 0.0
    assert float(balance_loss((h1, h2), 2)) == pytest.approx(8.0, rel=1e-4)
    assert float(load_balancing_loss_func((h1, h2), 8, 2)) == pytest.approx(4.0, rel=1e-4)
