"""The embedded models: grouped expert operation, build/caching/determinism, strict checkpoint loading."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from moespec import paths, zoo
from moespec.zoo import build, store
from moespec.zoo.experts import IMPLEMENTATION, PADDED_IMPLEMENTATION
from moespec.zoo.train import Trainer, TrainConfig, lr_at, router_z_loss

#: The committed full build of the embedded models.
COMMITTED_MODELS = paths.ROOT / "data" / "models"


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.mark.parametrize("impl", [IMPLEMENTATION, PADDED_IMPLEMENTATION])
def test_grouped_experts_equal_reference_loop(impl):
    """Both grouped-by-expert operations give the reference per-expert loop's output and the
    gradients of the weights and of the input, also with an expert that receives no token and
    one that receives most of them, and under ``.sum()`` (whose gradient is expanded)."""
    model = zoo.tiny_moe(seed=1)
    block = model.model.layers[0].mlp
    x = torch.randn(37, model.config.hidden_size)
    with torch.no_grad():
        _, w, ids = block.gate(x)
    ids[ids == 5] = 3  # expert 5 idle
    ids[:20, 0] = 7    # expert 7 busy
    assert int((ids == 5).sum()) == 0
    results = {}
    for name in ("eager", impl):
        model.config._experts_implementation = name
        block.experts.zero_grad()
        xx = x.clone().requires_grad_()
        y = block.experts(xx, ids, w)
        y.sum().backward()
        results[name] = (y.detach(), block.experts.down_proj.grad.clone(),
                         block.experts.gate_up_proj.grad.clone(), xx.grad.clone())
    for a, b in zip(results["eager"], results[impl]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_default_configs_have_paper_ratio():
    cfg = zoo.default_moe_config()
    assert (cfg.num_experts, cfg.num_experts_per_tok) == (64, 8)  # OLMoE's N and m
    assert cfg.router_aux_loss_coef > 0
    # inference does not compute the balancing loss; training asks for the router logits itself
    assert not cfg.output_router_logits
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
    forced = zoo.build_default_models(profile="smoke", out=tmp_path, progress=False, force=True)
    assert [v["how"] for v in forced.values()] == ["trained"] * 3   # force trains over a cached build
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


def test_router_z_loss_hand_value():
    """Equal logits z over N experts: log-sum-exp = z + log N, so the z-loss is (z + log N)^2."""
    logits = (torch.full((5, 8), 0.5), torch.zeros(3, 8))
    expected = ((0.5 + np.log(8)) ** 2 + np.log(8) ** 2) / 2
    assert float(router_z_loss(logits)) == pytest.approx(expected, rel=1e-6)


def _stream(n=4096, vocab=300, seed=0):
    return np.random.default_rng(seed).integers(1, vocab, n)


def test_distillation_from_an_identical_teacher_has_zero_kl():
    """With the student's own weights as teacher, KL(teacher || student) is 0 at the first step,
    and the loss mixes the next-token loss as (1 - lambda) * CE."""
    student = build.new_model("draft", "smoke")
    teacher = build.new_model("draft", "smoke")
    teacher.load_state_dict(student.state_dict())
    cfg = TrainConfig(steps=2, batch_size=2, seq_len=32, warmup=1, distill=0.5)
    terms = Trainer(student, _stream(), cfg, teacher=teacher).step()
    assert terms["distill_kl"] == pytest.approx(0.0, abs=1e-6)
    assert terms["lm_loss"] > 1.0
    with pytest.raises(ValueError, match="needs a teacher"):
        Trainer(student, _stream(), cfg)
    with pytest.raises(ValueError, match="distill is 0"):
        Trainer(student, _stream(), TrainConfig(steps=1, batch_size=2, seq_len=32), teacher=teacher)


def test_train_config_rejects_bad_values():
    with pytest.raises(ValueError, match="precision"):
        TrainConfig(precision="fp8")
    with pytest.raises(ValueError, match=r"distill must lie in \[0, 1\]"):
        TrainConfig(distill=1.5)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        TrainConfig(batch_size=0)


def test_compiled_bf16_step_matches_eager_f32():
    """The draft's fast path (torch.compile under bf16 autocast) computes the same losses as the
    plain f32 step on the same weights and batch, to bf16's precision; and both train: the
    weights change."""
    a = build.new_model("draft", "smoke")
    b = build.new_model("draft", "smoke")
    b.load_state_dict(a.state_dict())
    base = dict(steps=2, batch_size=2, seq_len=32, warmup=1)
    eager = Trainer(a, _stream(), TrainConfig(**base)).step()
    fast = Trainer(b, _stream(), TrainConfig(**base, precision="bf16-autocast", compile=True)).step()
    assert fast["lm_loss"] == pytest.approx(eager["lm_loss"], rel=2e-2)
    assert not torch.equal(a.lm_head.weight, build.new_model("draft", "smoke").lm_head.weight)


def test_build_records_history_speed_and_fingerprint(smoke_models):
    out, _ = smoke_models
    meta = store.read_meta(out / zoo.DRAFT_DIR)
    assert meta["recipe"]["teacher"] == store.read_meta(out / zoo.MOE_DIR)["recipe"]
    assert meta["history"][0]["distill_kl"] > 0  # the draft was distilled from the MoE
    assert meta["timing"]["tokens_per_s"] > 0
    model = zoo.load_draft(folder=out / zoo.DRAFT_DIR)
    tok = zoo.load_tokenizer(out / zoo.TOKENIZER_DIR)
    from moespec.zoo import evaluate

    again = evaluate.checkpoint_check(model, tok, meta["check"]["articles"], meta["check"]["tokens"])
    assert again["nll_per_token"] == pytest.approx(meta["check"]["nll_per_token"], rel=1e-6)


def test_share_average_is_an_exponential_average_from_the_first_batch():
    from moespec.zoo.train import ShareAverage, balance_loss, selection_shares

    avg = ShareAverage(4)
    a, b = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 2.0]])
    assert torch.equal(avg.update(a), a)
    torch.testing.assert_close(avg.update(b), torch.tensor([[1.5, 0.5]]))  # a + (b - a) / 4
    assert torch.equal(ShareAverage(1).update(b), b)  # window 1: this batch's own shares
    with pytest.raises(ValueError, match="window must be >= 1"):
        ShareAverage(0)
    # the loss with this batch's shares given explicitly is the default loss
    logits = (torch.randn(30, 8),)
    f = selection_shares(logits, 2)
    assert f.sum().item() == pytest.approx(2.0)
    torch.testing.assert_close(balance_loss(logits, 2, f), balance_loss(logits, 2))


@pytest.mark.parametrize("what", ["moe", "draft"])
def test_committed_checkpoints_load_match_their_recipe_and_reproduce_their_loss(what):
    """The committed full build (data/models): loads strictly, its config is the one its
    recipe records, the recipe is today's full recipe (so make reproduce uses it instead of
    training), and it reproduces the next-token loss recorded when it was built."""
    folder = COMMITTED_MODELS / build.folder_name(what)
    meta = store.read_meta(folder)
    assert meta, f"{folder}: no committed checkpoint"
    assert build.same_recipe(meta["recipe"], build.recipe("full", 0, what))
    model = store.load(folder)
    want = build.model_config(what, "full").to_diff_dict()
    got = model.config.to_dict()
    for key in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size", "num_experts",
                "num_experts_per_tok", "norm_topk_prob", "max_position_embeddings"):
        if key in want:
            assert got[key] == want[key], key
    tok = zoo.load_tokenizer(COMMITTED_MODELS / zoo.TOKENIZER_DIR)
    from moespec.zoo import evaluate

    check = meta["check"]
    again = evaluate.checkpoint_check(model, tok, check["articles"], check["tokens"])
    assert again["predicted"] == check["predicted"]
    assert again["nll_per_token"] == pytest.approx(check["nll_per_token"], rel=1e-5)
    assert store.read_meta(COMMITTED_MODELS / zoo.TOKENIZER_DIR)["recipe"] == build.recipe("full", 0, "tokenizer")


def test_same_recipe_ignores_only_the_library_version():
    """A transformers release changes config.transformers_version, not the model: same recipe;
    any model field differing is another recipe."""
    a = build.recipe("full", 0, "draft")
    b = json.loads(json.dumps(a))
    b["config"]["transformers_version"] = "9.99.0"
    b["teacher"]["config"]["transformers_version"] = "9.99.0"
    assert a != b and build.same_recipe(a, b)
    b["config"]["hidden_size"] = a["config"]["hidden_size"] + 1
    assert not build.same_recipe(a, b)
    assert not build.same_recipe(None, a)
