"""The ggml peer (moespec.measure.ggml_peer, built by benchmarks/ggml_peer/build.py: ggml's CPU MUL_MAT_ID expert FFN) computes moespec's expert
operation: against the fp64 reference under the kernel tests' fixed per-format ceilings
(kernel_cases.CEILING), on a small shape and the OLMoE shape at n = 1, 2, 9.

``make test`` builds the peer first and requires it (``MOESPEC_REQUIRE_BUILD`` lists ``ggml``): a
missing peer then fails this module. A plain pytest run without that requirement skips it, naming
how to build it (``.venv/bin/python benchmarks/ggml_peer/build.py``).
"""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest
import torch
from kernel_cases import CEILING, FORMATS, rel_err

from moespec.kernels import ExpertWeights, reference_forward
from moespec.kernels.build import required
from moespec.measure import ggml_peer as peer
from moespec.measure.ids import random_ids
from moespec.model_shapes import published_shapes

if not peer.available() and "ggml" in required():
    pytest.fail(f"the ggml peer is required (MOESPEC_REQUIRE_BUILD) but not built: {peer.library_path()} "
                "missing; make build-ext builds it (benchmarks/ggml_peer/build.py)", pytrace=False)
if not peer.available():
    pytest.skip(f"the ggml peer is not built ({peer.library_path()} missing; "
                "build it with benchmarks/ggml_peer/build.py)", allow_module_level=True)


def _inputs(n, H, m, N, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g)
    ids = random_ids(n, m, N, np.random.default_rng(seed))
    return x, ids, torch.rand(n, m, generator=g)


def _check(p, x, ids, w, gates):
    ref = reference_forward(x, ids, w, gates)
    tol = CEILING[w.fmt]
    y = p(x, ids, gates)
    assert y.shape == x.shape and y.dtype == torch.float32
    err = rel_err(y, ref)
    assert err <= tol, f"ggml {p.fmt} n={x.shape[0]} gates={gates is not None}: error {err:.3g} > {tol:.3g}"
    return err


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(8, 256, 128, 3), (5, 544, 96, 4), (4, 64, 32, 1)])  # m = 1 last
def test_small_shapes(fmt, shape):
    N, H, I, m = shape
    w = ExpertWeights.random((N, H, I), fmt, seed=3)
    with peer.GgmlExperts.from_weights(w, threads=2) as p:
        for n in (1, 4, 13):
            x, ids, g = _inputs(n, H, m, N, seed=n)
            for gates in (None, g):
                _check(p, x, ids, w, gates)


@functools.lru_cache(maxsize=1)
def _olmoe(fmt):
    N, H, I, m = published_shapes()["olmoe"]
    # N = m + 1, the smallest legal layer, keeps memory and time small; H, I as published
    w = ExpertWeights.random((m + 1, H, I), fmt, seed=5)
    return w, m, peer.GgmlExperts.from_weights(w, threads=2)


@pytest.mark.parametrize("fmt", FORMATS)
def test_olmoe_shape(fmt):
    """OLMoE's H = 2048, I = 1024, m = 8 at n = 1, 2, 9, each n twice with new inputs (the graph of
    a token count is cached: a second call must see its own inputs)."""
    w, m, p = _olmoe(fmt)
    for k, n in enumerate((1, 2, 9, 2)):
        x, ids, g = _inputs(n, w.hidden_size, m, w.num_experts, seed=10 + k)
        _check(p, x, ids, w, g)


def test_q8_0_is_the_same_weights_as_int8_b32():
    """Q8_0 from moespec's int8_b32 weights: the peer's error is within a small factor of torch's
    int8 error (activation quantization), i.e. no extra weight error beyond the fp16 scale."""
    N, H, I, m = 9, 512, 256, 4
    w = ExpertWeights.random((N, H, I), "int8_b32", seed=7)
    x, ids, g = _inputs(6, H, m, N, seed=7)
    with peer.GgmlExperts.from_weights(w, threads=1) as p:
        assert p.fmt == "q8_0"
        assert p.bytes_per_expert == 3 * H * I // 32 * 34  # 32 int8 + an fp16 scale per block
        _check(p, x, ids, w, g)


def test_gates_linear_and_threads_agree():
    N, H, I, m = 8, 256, 128, 3
    w = ExpertWeights.random((N, H, I), "f32", seed=2)
    x, ids, g = _inputs(5, H, m, N, seed=2)
    with peer.GgmlExperts.from_weights(w, threads=1) as p1, peer.GgmlExperts.from_weights(w, threads=2) as p2:
        y1 = p1(x, ids, g)
        torch.testing.assert_close(p2(x, ids, g), y1, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(p1(x, ids, 2 * g), 2 * y1, rtol=1e-6, atol=1e-7)
        assert p1(x, ids, torch.zeros_like(g)).abs().max() == 0


def test_bad_input():
    N, H, I, m = 4, 64, 32, 2
    w = ExpertWeights.random((N, H, I), "f32", seed=1)
    p = peer.GgmlExperts.from_weights(w, threads=1)
    x, ids, g = _inputs(3, H, m, N, seed=1)
    with pytest.raises(ValueError, match="out of range"):
        p(x, torch.full_like(ids, N), g)
    with pytest.raises(ValueError, match="x: expected shape"):
        p(x[:, :-1], ids, g)
    with pytest.raises(ValueError, match="gates: expected shape"):
        p(x, ids, g[:, :1])
    with pytest.raises(ValueError, match="integer"):
        p(x, ids.float(), g)
    with pytest.raises(ValueError, match="unsupported ggml peer format"):
        peer.GgmlExperts.from_weights(w, fmt="q4_0")
    with pytest.raises(ValueError, match="multiples of 32"):
        peer.GgmlExperts.from_tensors(torch.randn(2, 8, 40), torch.randn(2, 8, 40), torch.randn(2, 40, 8), "q8_0")
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p(x, ids, g)


@pytest.mark.parametrize("fmt", FORMATS)
def test_per_slot_counterpart_is_one_call_per_token(fmt):
    """GgmlExperts.per_slot (one MUL_MAT_ID call per token: the per-slot counterpart) computes the
    same operation as one call over the whole pass, within the format's ceiling of the reference."""
    N, H, I, m = 8, 256, 128, 3
    w = ExpertWeights.random((N, H, I), fmt, seed=4)
    x, ids, g = _inputs(5, H, m, N, seed=4)
    with peer.GgmlExperts.from_weights(w, threads=1) as p:
        whole, per_token = p(x, ids, g), p.per_slot(x, ids, g)
        assert per_token.shape == whole.shape
        assert rel_err(per_token, reference_forward(x, ids, w, g)) <= CEILING[w.fmt]
        torch.testing.assert_close(per_token[2:3], p(x[2:3], ids[2:3], g[2:3]))
        with pytest.raises(ValueError, match="ids: expected an integer"):
            p.per_slot(x, ids[0], g)


def test_expert_op_benchmark_on_ggml(tmp_path):
    """bench_engine_fits.py's path: the expert-op benchmark with backend ggml times ggml's
    MUL_MAT_ID (dedup) and its per-slot counterpart on the same experts, in ggml's format and byte
    count, and the fits of eq. (4)/(E.1) follow (non-negative, finite)."""
    from moespec import fit
    from moespec.measure import expert_op

    cfg = expert_op.BenchConfig(model="olmoe", fmt="int8_b32", backend="ggml", hidden=64, intermediate=64,
                                layers=(0,), ns=tuple(range(1, 10)), u_count=3, windows_per_n=0, reps=3,
                                warmup=1, flush_bytes=2**20, membw_bytes=2**22)
    run_dir = expert_op.run(cfg, out_dir=tmp_path, progress=False)
    rows = expert_op.load_rows(run_dir)
    assert json.loads((run_dir / "provenance.json").read_text())["ggml_version"] == peer.version()
    timed = rows[rows.kind == "chosen"]
    assert set(timed.backend) == {"ggml"} and set(timed.fmt) == {"q8_0"}
    assert set(timed.expert_bytes) == {peer.expert_bytes("q8_0", 64, 64)}
    slot, dedup = (timed[timed.kernel == k].set_index("pass_id") for k in ("slot", "dedup"))
    assert (slot.requested_bytes == slot.n * slot.m * slot.expert_bytes).all()
    assert (dedup.requested_bytes == dedup.U * dedup.expert_bytes).all()
    fits = fit.fit_layers(rows)
    coefs = fits[["t_op", "c_u", "c_re", "c_g", "c_t"]].to_numpy(dtype=float)
    assert len(fits) == 2 and (np.nan_to_num(coefs, nan=0.0) >= 0).all()
