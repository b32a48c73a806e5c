"""The subjects of the whole-model notebooks: the function-preserving widening (same greedy tokens,
logits within the format's tolerance, on every kernel, backend and format; the published model's
expert bytes), the widened draft, replayed routing (the kernels receive exactly the trace's ids),
local checkpoints of every transformers MoE family, and the device path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moespec import zoo
from moespec.engine import Engine, OracleDraft, speculative_generate
from moespec.engine.replay import ReplayRouting, published_model, replay_engine
from moespec.engine.subject import QUICK_LIKE, load_subject, subject_from_models, widen_draft
from moespec.engine.widen import (dense_mlp_bytes, embed_expert_weights, widen_dense_mlps, widen_expert_weights,
                                  widened_intermediate)
from moespec.kernels import ExpertWeights, expert_forward
from moespec.model_shapes import PRESETS, MoESpec, get_spec
from moespec.routing import synthetic

#: Largest |difference| of outputs allowed between a widened and an unwidened layer, relative to
#: the outputs' scale: only the summation order differs (module docstring of moespec.engine.widen).
TOL = {"f32": 1e-5, "bf16": 1e-5, "int8_b32": 1e-5}
FORMATS = ("f32", "bf16", "int8_b32")


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores


def _layer(fmt, n=6, h=32, i=32, seed=0):
    return ExpertWeights.random((n, h, i), fmt, seed=seed)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", ["torch", "cpp"])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
@pytest.mark.parametrize("layout", ["published", "intermediate"])
def test_widened_layer_computes_the_same_outputs(fmt, backend, kernel, layout):
    w = _layer(fmt)
    wide = embed_expert_weights(w, 96, 64, seed=3) if layout == "published" else widen_expert_weights(w, 128, seed=3)
    assert wide.fmt == fmt and wide.num_experts == w.num_experts
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=g)
    ids = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(5)])
    gates = torch.rand(5, 3, generator=g)
    ref = expert_forward(x, ids, w, gates=gates, kernel=kernel, backend=backend)
    xw = torch.nn.functional.pad(x, (0, wide.hidden_size - 32))
    got = expert_forward(xw, ids, wide, gates=gates, kernel=kernel, backend=backend)[:, :32]
    scale = float(ref.abs().max())
    assert float((got - ref).abs().max()) <= TOL[fmt] * scale
    # the added bytes are real: the widened layer's padding rows are not zero
    assert float(wide.dequantized([0])[0][:, 32:].abs().sum()) > 0


def test_widening_keeps_the_trained_values_and_zeroes_the_added_down_columns():
    w = _layer("int8_b32")
    wide = embed_expert_weights(w, 64, 64, seed=0)
    g, u, d = wide.dequantized()
    g0, u0, d0 = w.dequantized()
    assert torch.equal(g[:, :32, :32], g0) and torch.equal(u[:, :32, :32], u0) and torch.equal(d[:, :32, :32], d0)
    assert float(d[:, :32, 32:].abs().max()) == 0.0           # added neurons meet zero down columns
    assert float(d[:, 32:, :].abs().min()) >= 0 and float(d[:, 32:, :].abs().sum()) > 0
    wi = widen_expert_weights(w, 96)
    assert float(wi.dequantized()[2][:, :, 32:].abs().max()) == 0.0
    with pytest.raises(ValueError, match="smaller"):
        embed_expert_weights(w, 16, 64)
    with pytest.raises(ValueError, match="smaller"):
        widen_expert_weights(w, 16)


@pytest.mark.parametrize("name", sorted(PRESETS))
@pytest.mark.parametrize("fmt", FORMATS)
def test_expert_bytes_equal_the_published_models(name, fmt):
    spec = get_spec(name)
    w = embed_expert_weights(ExpertWeights.random((1, 64, 64), fmt), spec.hidden_size, spec.expert_intermediate)
    assert w.bytes_per_expert == spec.expert_bytes(fmt)
    inter = widened_intermediate(128, spec, fmt)
    assert 3 * 128 * inter == 3 * spec.hidden_size * spec.expert_intermediate


def test_expert_bytes_per_token_equal_olmoes():
    """The default MoE's m = 8 is OLMoE's: per MoE layer a token reads OLMoE's m x b bytes."""
    torch.manual_seed(0)
    cfg = zoo.default_moe_config(vocab_size=64)
    cfg.num_hidden_layers, cfg.num_experts = 1, 9
    target = __import__("transformers").OlmoeForCausalLM(cfg).eval()
    sub = subject_from_models("byte-faithful", target, zoo.tiny_draft(vocab_size=64, hidden_size=32), None,
                              "random", like="olmoe", backend="torch")
    olmoe = get_spec("olmoe")
    assert sub.expert_bytes_per_token() == olmoe.top_k * olmoe.expert_bytes("int8_b32")
    assert sub.description["expert_bytes_per_token_per_layer"] == sub.description[
        "published_expert_bytes_per_token_per_layer"] == 8 * 7_077_888


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_byte_faithful_subject_has_the_unwidened_models_tokens_and_logits(fmt, backend):
    wide = load_subject("byte-faithful", profile="quick", backend=backend, fmt=fmt)
    plain = load_subject("default", profile="quick", backend=backend, fmt=fmt)
    assert wide.description["expert_bytes"] == QUICK_LIKE.expert_bytes(fmt)
    prompt = np.random.default_rng(0).integers(1, 256, size=20)
    for dedup in (False, True):
        wide.engine.dedup = plain.engine.dedup = dedup
        out = []
        for eng in (wide.engine, plain.engine):
            first = eng.prefill(prompt)
            toks = [first] + eng.greedy(first, 15)
            eng.forward(toks[:9])                       # a verify pass of 9 tokens (the switch's kernel)
            out.append((toks, eng.last_logits.clone()))
        assert out[0][0] == out[1][0]
        scale = float(out[1][1].abs().max())
        assert float((out[0][1] - out[1][1]).abs().max()) <= 1e-4 * max(scale, 1.0)


def test_widened_draft_proposes_the_same_tokens_at_the_asked_cost():
    draft = zoo.tiny_draft(seed=2, vocab_size=256)
    ids = torch.arange(3, 30).view(1, -1)
    with torch.no_grad():
        ref = draft(input_ids=ids).logits
    before = dense_mlp_bytes(draft)
    widen_dense_mlps(draft, 512, seed=1)
    with torch.no_grad():
        got = draft(input_ids=ids).logits
    assert dense_mlp_bytes(draft) == before * 512 // 64
    assert torch.allclose(got, ref, atol=1e-5) and torch.equal(got.argmax(-1), ref.argmax(-1))
    info = widen_draft(zoo.tiny_draft(seed=2, vocab_size=256), 10 * before, 0.5)
    assert info["draft_mlp_share_of_target_expert_bytes"] == pytest.approx(0.5, rel=0.05)
    with pytest.raises(ValueError, match="draft_cost"):
        widen_draft(zoo.tiny_draft(), 1.0, -0.1)


def _tiny_spec():
    return MoESpec(name="tiny-replay", num_experts=16, top_k=4, num_layers=2, num_moe_layers=2, hidden_size=64,
                   expert_intermediate=32, default_format="int8_b32")


def test_replayed_routing_routes_exactly_the_traces_ids():
    trace = synthetic.sticky(3, 60, 2, 16, 4, keep=0.4, seed=5)
    model, routing = published_model(_tiny_spec(), trace, fmt="int8_b32")
    eng = replay_engine(model, routing, backend="torch")
    prompt = routing.prompt(1, 20, 256)
    eng.switch.record = []
    first = eng.prefill(prompt)                              # selects document 1
    eng.forward([first, 7, 8, 9])                            # a verify pass of 4 tokens
    eng.crop(22)                                             # two of its positions kept
    eng.forward([5, 6, 7])                                   # positions 22..24 again
    calls, eng.switch.record = eng.switch.record, None
    doc = trace.docs[1]
    for layer in (0, 1):
        got = np.concatenate([ids for l, ids in calls if l == layer])
        want = np.concatenate([doc[0:20, layer], doc[20:24, layer], doc[22:25, layer]])
        np.testing.assert_array_equal(got, want)
    # speculative decoding with the oracle draft on it, and the end of the document refused
    out, steps = speculative_generate(eng, OracleDraft(eng, 0.7, 256, seed=0, horizon=8), prompt, 3, 12)
    assert len(out) >= 12 and routing.doc == 1
    with pytest.raises(ValueError, match="has 60"):
        eng.prefill(routing.prompt(0, 20, 256))
        eng.greedy(1, 45)


def test_replay_refuses_mismatched_traces_and_oversized_models():
    spec = _tiny_spec()
    with pytest.raises(ValueError, match="N=8"):
        published_model(spec, synthetic.sticky(1, 30, 2, 8, 4, keep=0.4))
    with pytest.raises(ValueError, match="1 MoE layers"):
        published_model(spec, synthetic.sticky(1, 30, 1, 16, 4, keep=0.4))
    with pytest.raises(MemoryError, match="GiB"):
        published_model("olmoe", synthetic.sticky(1, 30, 16, 64, 8, keep=0.4), memory_limit=2**30)
    with pytest.raises(ValueError, match="trace_file"):
        load_subject("replay", profile="full")


def _families():
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=128, eos_token_id=0, pad_token_id=0, bos_token_id=0)
    return {
        "olmoe": lambda: tf.OlmoeForCausalLM(tf.OlmoeConfig(intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                                                            **common)),
        "qwen3_moe": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
            intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, head_dim=16, **common)),
        "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=32, num_local_experts=8,
                                                                  num_experts_per_tok=2, **common)),
        "deepseek_v2": lambda: tf.DeepseekV2ForCausalLM(tf.DeepseekV2Config(
            intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, **common)),
        "gpt_oss": lambda: tf.GptOssForCausalLM(tf.GptOssConfig(intermediate_size=32, num_local_experts=8,
                                                                num_experts_per_tok=2, head_dim=16, **common)),
    }


@pytest.mark.parametrize("family", ["olmoe", "qwen3_moe", "mixtral", "deepseek_v2", "gpt_oss"])
def test_local_checkpoint_of_each_family(family, tmp_path):
    from moespec.engine.operation import engine_spec

    torch.manual_seed(0)
    model = _families()[family]().eval()
    model.save_pretrained(tmp_path / "target")
    if family == "gpt_oss":
        with pytest.raises(ValueError, match="gpt-oss.*not supported"):
            load_subject(str(tmp_path / "target"), profile="quick", backend="torch")
        return
    draft = zoo.tiny_draft(seed=1, vocab_size=128)
    draft.save_pretrained(tmp_path / "draft")
    sub = load_subject(str(tmp_path / "target"), profile="quick", backend="torch", draft=str(tmp_path / "draft"))
    assert sub.kind == "checkpoint" and sub.draft is not None
    ids = np.arange(3, 20)
    with torch.no_grad():
        ref = model(input_ids=torch.as_tensor(ids).view(1, -1)).logits[0, -1]
    sub.engine.prefill(ids)
    assert torch.allclose(sub.engine.last_logits, ref, atol=1e-5)
    spec = engine_spec(sub.engine, f"test-{family}")
    assert spec.expert_intermediate == 32            # the routed expert's size, not a dense FFN's (96)
    if family == "deepseek_v2":
        assert (spec.num_moe_layers, spec.num_shared_experts, spec.dense_intermediate) == (1, 1, 96)
    bf = load_subject(str(tmp_path / "target"), profile="quick", backend="torch", dtype="bf16")
    assert bf.target.dtype == torch.bfloat16 and bf.description["fmt"] == "bf16"
    out, _ = speculative_generate(bf.engine, OracleDraft(bf.engine, 0.5, 128, seed=0), ids, 2, 6)
    assert len(out) >= 6


def test_checkpoint_refusals(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a checkpoint folder"):
        load_subject(str(tmp_path / "nothing"), profile="quick")
    torch.manual_seed(0)
    _families()["olmoe"]().save_pretrained(tmp_path / "t")
    zoo.tiny_draft(vocab_size=256).save_pretrained(tmp_path / "d")
    with pytest.raises(ValueError, match="share the target's tokenizer"):
        load_subject(str(tmp_path / "t"), profile="quick", draft=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="applies to a checkpoint path"):
        load_subject("byte-faithful", profile="quick", draft=str(tmp_path / "d"))
    with pytest.raises(ValueError, match="dtype"):
        load_subject("default", profile="quick", dtype="int4")


@pytest.mark.cuda
def test_byte_faithful_subject_on_cuda_matches_the_cpu():
    cpu = load_subject("byte-faithful", profile="quick", backend="torch")
    gpu = load_subject("byte-faithful", profile="quick", device="cuda", backend="auto")
    assert gpu.engine.device.type == "cuda" and gpu.draft.get_input_embeddings().weight.device.type == "cuda"
    prompt = np.random.default_rng(0).integers(1, 256, size=20)
    toks = []
    for sub in (cpu, gpu):
        first = sub.engine.prefill(prompt)
        toks.append([first] + sub.engine.greedy(first, 10))
    assert toks[0] == toks[1]
    out, _ = speculative_generate(gpu.engine, __import__("moespec.engine", fromlist=["ModelDraft"]).ModelDraft(gpu.draft),
                                  prompt, 3, 12)
    assert out[:11] == toks[1]


@pytest.mark.cuda
def test_replay_on_cuda_routes_the_traces_ids():
    trace = synthetic.sticky(2, 40, 2, 16, 4, keep=0.4, seed=5)
    model, routing = published_model(_tiny_spec(), trace, fmt="bf16", device="cuda")
    eng = replay_engine(model, routing)
    eng.switch.record = []
    eng.prefill(routing.prompt(0, 12, 256))
    calls, eng.switch.record = eng.switch.record, None
    np.testing.assert_array_equal(calls[0][1], trace.docs[0][:12, 0])


def test_engine_builds_ids_on_the_models_device():
    eng = Engine(zoo.tiny_moe(seed=1), backend="torch")
    assert eng.device == torch.device("cpu")
    assert eng._ids([1, 2, 3]).device == eng.device and eng._ids(torch.tensor([4])).dtype == torch.long
    routing = ReplayRouting(synthetic.sticky(2, 30, 2, 16, 4, keep=0.4))
    with pytest.raises(ValueError, match="documents 0..1"):
        routing.select(2)
