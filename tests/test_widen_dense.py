"""The dense linear (moespec.kernels.dense, csrc/cpu/dense.cpp), the padded attention projections
and LM head (moespec.engine.widen.PaddedLinear), the byte-faithful-all subject's function
preservation, and the step's byte shares (moespec.engine.byte_shares)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moespec.engine.byte_shares import byte_shares, max_share_gap, published_step_bytes, subject_step_bytes
from moespec.engine.subject import load_subject
from moespec.engine.widen import PaddedLinear, attention_and_head_in_format, published_head_rows
from moespec.kernels.dense import DenseWeights, dense_forward, torch_dense
from moespec.model_shapes import format_bytes, get_spec, spec_from_config

FORMATS = ("f32", "bf16", "int8_b32")
TOL = {"f32": 1e-5, "bf16": 1e-2, "int8_b32": 2e-2}


def _weights(n_out, k, fmt, seed=0):
    g = torch.Generator().manual_seed(seed)
    return DenseWeights.from_float(torch.randn(n_out, k, generator=g) / k ** 0.5, fmt)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("n", [1, 5, 12])
def test_cpp_dense_matches_torch_reference(fmt, n):
    w = _weights(70, 96, fmt)                 # 70 rows: not a multiple of the kernels' 64-row calls
    x = torch.randn(n, 96, generator=torch.Generator().manual_seed(1))
    ref = torch_dense(x, w)
    got = dense_forward(x, w, backend="cpp")
    assert got.shape == (n, 70) and got.dtype == torch.float32
    torch.testing.assert_close(got, ref, rtol=TOL[fmt], atol=TOL[fmt])
    # against float64 from the unrounded activations: only the format's rounding apart
    exact = x.double() @ w.dequantized(torch.float64).T
    assert (got.double() - exact).abs().max() < 5 * TOL[fmt] * exact.abs().max()


def test_cpp_dense_same_on_one_and_two_threads():
    # K = 2048 int8: 128 rows per 256 KiB item, 32 items, so two threads each take a lane (with
    # K = 128 there were 2 items and one lane, and a worker reading its own thread_local workspace
    # instead of the caller's went unseen; it crashed the byte-faithful-all subject on 2 threads).
    w = _weights(4096, 2048, "int8_b32")
    x = torch.randn(20, 2048, generator=torch.Generator().manual_seed(3))   # 20 tokens: more than one TMAX block
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = dense_forward(x, w, backend="cpp")
        torch.set_num_threads(2)
        two = dense_forward(x, w, backend="cpp")
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)
    torch.testing.assert_close(one, torch_dense(x, w), rtol=TOL["int8_b32"], atol=TOL["int8_b32"])


def test_dense_nonfinite_rule_and_errors():
    w = _weights(40, 64, "f32")
    x = torch.randn(3, 64)
    x[1, 5] = float("nan")
    y = dense_forward(x, w, backend="cpp")
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
    torch.testing.assert_close(y[[0, 2]], torch_dense(x[[0, 2]], w))
    with pytest.raises(ValueError, match=r"x: expected \[n, K=64\]"):
        dense_forward(torch.randn(2, 63), w)
    with pytest.raises(ValueError, match="need K a multiple of 32 and scales"):
        DenseWeights("int8_b32", torch.zeros(4, 64, dtype=torch.int8), None)
    with pytest.raises(TypeError, match="expected torch.bfloat16 values"):
        DenseWeights("bf16", torch.zeros(4, 64))
    with pytest.raises(ValueError, match="backend must be one of"):
        dense_forward(x, w, backend="cuda")


def test_dense_bytes_are_the_formats():
    assert _weights(64, 128, "int8_b32").nbytes == 64 * 128 // 32 * 36
    assert _weights(64, 128, "bf16").nbytes == 64 * 128 * 2


@pytest.mark.parametrize("fmt", FORMATS)
def test_padded_linear_computes_the_unpadded_layer(fmt):
    """Padding with random entries is exact: the random columns meet zero inputs, the random rows
    are dropped (the same quantized trained block in int8)."""
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(48, 64, generator=g) / 8
    x = torch.randn(2, 7, 64, generator=g)
    plain, padded = PaddedLinear(weight, 64, 48, fmt), PaddedLinear(weight, 256, 160, fmt, seed=5)
    assert padded.weights.shape == (160, 256) and padded.nbytes == format_bytes(160 * 256, fmt)
    a, b = plain(x), padded(x)
    assert b.shape == (2, 7, 48)
    torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
    # the random entries are there (read, not zero) and the trained block is the layer's
    assert padded.weights.values[48:].float().abs().sum() > 0 and padded.weights.values[:48, 64:].float().abs().sum() > 0
    torch.testing.assert_close(padded.weights.dequantized()[:48, :64], plain.weights.dequantized())
    with pytest.raises(ValueError, match="smaller"):
        PaddedLinear(weight, 32, 48, fmt)


def test_published_step_bytes_by_hand():
    """OLMoE at 4 layers in int8_b32 (36 bytes per 32 weights): q, k, v, o are 2048 x 2048 each;
    8 experts of 3 x 2048 x 1024; the head 50304 / 4 = 12576 rows of 2048; KV at depth 10: 4 layers x
    10 positions x 2 x 2048 values x 2 bytes."""
    b = published_step_bytes("olmoe", "int8_b32", layers=4, depth=10)
    assert b["attention"] == 4 * 4 * 2048 * 2048 * 36 // 32 == 75_497_472
    assert b["experts"] == 4 * 8 * 3 * 2048 * 1024 * 36 // 32 == 226_492_416
    assert published_head_rows(get_spec("olmoe"), 4) == 12576
    assert b["lm_head"] == 12576 * 2048 * 36 // 32 == 28_975_104
    assert b["kv_cache"] == 4 * 10 * 2 * 2048 * 2 == 327_680
    # the shares do not depend on the number of layers (the head scales with them; only the final
    # norm and the embedding row, 16 KB in "other", do not)
    s4, s16 = (published_step_bytes("olmoe", "int8_b32", layers=L) for L in (4, 16))
    assert s4["lm_head"] / sum(s4.values()) == pytest.approx(s16["lm_head"] / sum(s16.values()), rel=1e-4)
    assert 4 * s4["attention"] == s16["attention"] and 4 * s4["lm_head"] == s16["lm_head"]


def test_spec_attention_from_config():
    cfg = {"num_experts": 64, "num_experts_per_tok": 8, "num_hidden_layers": 16, "hidden_size": 2048,
           "intermediate_size": 1024, "num_attention_heads": 16, "vocab_size": 50304, "torch_dtype": "bfloat16"}
    spec = spec_from_config(cfg)
    assert spec.attention_shapes() == get_spec("olmoe").attention_shapes()
    mla = spec_from_config({**cfg, "kv_lora_rank": 512})
    with pytest.raises(ValueError, match="attention and vocabulary shape is not recorded"):
        mla.attention_shapes()


@pytest.fixture(scope="module")
def quick_pair():
    wide = load_subject("byte-faithful-all", profile="quick")
    plain = load_subject("default", profile="quick", fmt="int8_b32")
    attention_and_head_in_format(plain.target, "int8_b32")
    return wide, plain


def test_byte_faithful_all_preserves_tokens_and_logits(quick_pair):
    wide, plain = quick_pair
    prompt = [int(t) for t in np.random.default_rng(0).integers(1, wide.vocab_size, size=12)]
    toks = []
    for sub in (wide, plain):
        first = sub.engine.prefill(prompt)
        toks.append([first] + sub.engine.greedy(first, 10))
    assert toks[0] == toks[1]
    wide.engine.prefill(prompt)
    plain.engine.prefill(prompt)
    torch.testing.assert_close(wide.engine.last_logits, plain.engine.last_logits, rtol=1e-5, atol=1e-5)
    assert wide.engine.last_logits.shape == (wide.vocab_size,)


def test_byte_faithful_all_shares(quick_pair):
    wide, plain = quick_pair
    assert wide.kind == "byte-faithful-all" and "attention and LM head" in wide.label
    assert wide.preregistered and wide.rules_file.name == "scoring_rules_byte_faithful_all.json"
    ours = subject_step_bytes(wide.engine)
    spec = get_spec("quick-like")
    assert ours["attention"] == 2 * 4 * format_bytes(256 * 256, "int8_b32")
    assert ours["experts"] == 2 * 4 * spec.expert_bytes("int8_b32")
    assert ours["lm_head"] == format_bytes(512 * 256, "int8_b32")
    shares = byte_shares(wide.engine, spec, "int8_b32", depths=(0, 8))
    assert set(shares.component) == {"attention", "experts", "lm_head", "kv_cache", "other"}
    assert np.allclose(shares.groupby("depth").subject_share.sum(), 1)
    assert max_share_gap(shares) < 0.05
    assert wide.description["byte_share_max_gap"] == pytest.approx(max_share_gap(shares[shares.depth == 0]))
    # the unpadded model's attention is a small share: the padding is what the shares measure
    assert subject_step_bytes(plain.engine)["attention"] < ours["attention"] / 10


def test_byte_faithful_all_rules_are_the_round_model_rules():
    """Registered again for the new subject, unchanged otherwise."""
    from moespec.predict.rules import load_rules
    from moespec import paths

    folder = paths.data_dir() / "preregistration"
    new, old = (load_rules(folder / f) for f in ("scoring_rules_byte_faithful_all.json", "scoring_rules_round_model.json"))
    for key in ("rules", "protocol", "versions", "versions_scored", "n_range", "k_max", "acceptance_values",
                "pass_if", "draft_cost_grid"):
        assert new[key] == old[key], key
    assert set(old["goals_reported"]) < set(new["goals_reported"])
    assert "byte-faithful-all" in new["subject"]


def test_breakdown_captures_every_dense_module(quick_pair):
    """The breakdown's attention and LM-head components replay exactly the modules a pass runs,
    on the inputs it gave them; n = 2 over n = 1 is reported."""
    from moespec.engine.breakdown import capture_dense_inputs, decode_breakdown, shares

    wide, _ = quick_pair
    prompt = np.arange(1, 20)
    wide.engine.prefill(prompt)
    got = capture_dense_inputs(wide.engine, [3, 4, 5])
    assert wide.engine.length == len(prompt)               # the cache is cropped back
    layers = wide.engine.num_layers
    assert len(got["attention"]) == 4 * layers and len(got["lm_head"]) == 1
    assert all(isinstance(m, PaddedLinear) for m, _ in got["attention"] + got["lm_head"])
    head, x = got["lm_head"][0]
    assert x.shape[-2:] == (3, wide.target.config.hidden_size)
    wide.engine.forward([3, 4, 5])
    torch.testing.assert_close(head(x)[0], wide.engine.last_logits)
    sh = shares(decode_breakdown({"all": wide}, {"all": prompt}, n_values=(1, 2), reps=2, warmup=0,
                                 read_bytes=2**20)).iloc[0]
    assert sh.attention_ms > 0 and sh.lm_head_ms > 0 and sh.step_n2_over_n1 > 0


def test_breadth_table_from_a_hand_made_run():
    """Table 1 at breadth from bench_kernels rows: beta per kernel, r per engine (moespec r_n,
    ggml r_n_ggml) and ubar = U / (n m), exactly."""
    from moespec.plots.bandwidth import figure2_grid
    from moespec.tables.bandwidth import BREADTH_ENGINES, breadth_bandwidths, table1_breadth

    rows = []
    for backend in ("cpp", "ggml"):
        for kernel, beta in (("slot", 10.0), ("dedup", 8.0 if backend == "cpp" else 6.0)):
            for n in (1, 2, 8):
                rows.append(dict(model="toy", fmt="f32", kernel=kernel, backend=backend, n=n, m=4, U_mean=3.0 * n,
                                 beta_GBps=beta, beta_over_read=beta / 20, read_GBps=20.0,
                                 r_n=0.8 if (backend, kernel) == ("cpp", "dedup") else np.nan,
                                 r_n_ggml=0.6 if (backend, kernel) == ("cpp", "dedup") else np.nan))
    bw = breadth_bandwidths(pd.DataFrame(rows))
    assert len(bw) == 6 and set(bw.engine) == set(BREADTH_ENGINES.values())
    ggml = bw[bw.engine == BREADTH_ENGINES["ggml"]].set_index("n")
    assert ggml.loc[2, "r"] == 0.6 and ggml.loc[2, "beta_dedup_GBps"] == 6.0 and ggml.loc[8, "ubar"] == 3 / 4
    t = table1_breadth(bw, "ours", paper=False)
    assert list(t.engine) == ["moespec CPU (f32)", f"{BREADTH_ENGINES['ggml']} (f32)"]
    assert t.n2_r.tolist() == [0.8, 0.6] and t.n8_ubar.tolist() == [0.75, 0.75]
    assert len(table1_breadth(bw, "ours")) == 2 + 8            # the paper's eight rows after ours
    figure2_grid(bw)
    with pytest.raises(ValueError, match="no ggml per-slot rows"):
        breadth_bandwidths(pd.DataFrame(rows).query("backend == 'cpp'"))
