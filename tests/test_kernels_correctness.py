"""Every backend present x kernel x format against the fp64 reference (paper 1's expert operation):
random shapes, published model shapes at n = 1..9, edge cases, and every CPU ISA path."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from kernel_cases import (BACKENDS, CEILING, FORMATS, KERNELS, ODD_SHAPES, SMALL_SHAPES, check, rel_err,
                          skip_if_absent)

from moespec.kernels import ExpertWeights, expert_forward, reference_forward, torch_dedup
from moespec.measure.ids import random_ids
from moespec.model_shapes import published_shapes


def _case(shape, fmt, n, seed, gates=True):
    N, H, I, m = shape
    w = ExpertWeights.random((N, H, I), fmt, seed=seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, H, generator=g)
    ids = random_ids(n, m, N, np.random.default_rng(seed))
    gt = torch.rand(n, m, generator=g) if gates else None
    return x, ids, w, gt


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", SMALL_SHAPES)
def test_random_shapes(backend, device, fmt, shape):
    skip_if_absent(backend)
    for n, gates in ((1, False), (13, True)):  # 13 > 9: token tiles in the micro-kernel
        x, ids, w, g = _case(shape, fmt, n, seed=n, gates=gates)
        ref = reference_forward(x, ids, w, g)
        for kernel in KERNELS:
            check(x, ids, w, g, backend, device, kernel, ref=ref)


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("fmt", ("f32", "bf16"))
@pytest.mark.parametrize("shape", ODD_SHAPES)
def test_odd_sizes_float_formats(backend, device, fmt, shape):
    skip_if_absent(backend)
    for kernel in KERNELS:
        check(*_case(shape, fmt, 4, seed=3), backend, device, kernel)


@pytest.mark.parametrize("isa", ["avx512", "avx2", "portable"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_isa_paths(isa, fmt, monkeypatch):
    """Each ISA path of the C++ kernels (capped by MOESPEC_CPU_ISA) against the reference; on a CPU
    without the ISA the cap falls back to the next path, which is then what is tested."""
    skip_if_absent("cpp")
    monkeypatch.setenv("MOESPEC_CPU_ISA", isa)
    assert torch.ops.moespec.cpu_isa(fmt) in (isa, "avx2", "portable")
    for shape in (SMALL_SHAPES[1], SMALL_SHAPES[3]):
        for kernel in KERNELS:
            check(*_case(shape, fmt, 10, seed=11), "cpp", "cpu", kernel)


@pytest.mark.parametrize("isa", ["avx512", "portable"])
def test_cpu_int8_activation_quantizer_is_exact(isa, monkeypatch):
    """The C++ int8 activation quantizer (vectorized on the AVX-512 path, scalar otherwise) gives
    exactly moespec's block quantization (quantize_blocks) in the interleaved layout, with the
    offset corrections -128 * sum(q) per block; all-zero, tie-valued and huge blocks included, and
    blocks holding NaN or +-inf (values 0, scale NaN: the non-finite rule)."""
    skip_if_absent("cpp")
    from moespec.kernels.weights import quantize_blocks
    monkeypatch.setenv("MOESPEC_CPU_ISA", isa)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 1024, generator=g) * torch.logspace(-3, 3, 5).unsqueeze(1)
    x[1, :32] = 0.0                                         # an all-zero block: scale 0
    x[2, 32:64] = torch.arange(32) - 15.5                   # max 16.5: many ties at .5 quanta
    x[3, 64:96] = 1e30                                      # huge but finite
    x[4, 5] = float("nan")                                  # non-finite blocks, in both K below
    x[0, 40] = float("inf")
    x[1, 70], x[2, 300] = -float("inf"), float("nan")
    for K in (1024, 96):                                    # 96: 3 blocks, the scalar tail group
        xs = x[:, :K].contiguous()
        q, s, c = torch.ops.moespec.quantize_acts_int8_cpu(xs)
        q_ref, s_ref = quantize_blocks(xs)
        packed = torch.ops.moespec.pack_int8_cpu(q_ref).to(torch.int32) - 128
        assert torch.equal(q.to(torch.int32), packed)
        torch.testing.assert_close(s, s_ref, rtol=0, atol=0, equal_nan=True)
        assert torch.equal(c, -128 * q_ref.to(torch.int32).reshape(5, K // 32, 32).sum(-1))
        bad = ~torch.isfinite(xs.reshape(5, K // 32, 32)).all(-1)
        assert bad.sum() == (4 if K == 1024 else 3) and s_ref[bad].isnan().all() and not s_ref[~bad].isnan().any()
        assert (q_ref.reshape(5, K // 32, 32)[bad] == 0).all()


@pytest.mark.parametrize("isa", ["avx512", "portable"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_large_activations(isa, fmt, monkeypatch):
    """Activations large enough that silu saturates (e^-g overflows or vanishes): the vectorized
    exp of the AVX-512 path and the scalar one both stay finite and match the reference; up to
    1e15, where the AVX-512 exp's range reduction used to break (silu with the wrong sign)."""
    skip_if_absent("cpp")
    monkeypatch.setenv("MOESPEC_CPU_ISA", isa)
    x, ids, w, g = _case(SMALL_SHAPES[1], fmt, 6, seed=21)
    for scale in (30.0, 3000.0, 1e8, 1e15):
        for kernel in KERNELS:
            check(x * scale, ids, w, g, "cpp", "cpu", kernel)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpu_thread_modes_give_identical_results(fmt, monkeypatch):
    """The C++ kernels' helpers (MOESPEC_CPU_THREADS: our own pool or an OpenMP team) and the
    thread count only change who computes a row, never how: every result is bit-identical, and
    matches the reference."""
    skip_if_absent("cpp")
    x, ids, w, g = _case(SMALL_SHAPES[1], fmt, 10, seed=12)
    threads = torch.get_num_threads()
    try:
        for kernel in KERNELS:
            results = []
            for mode in ("pool", "openmp"):
                monkeypatch.setenv("MOESPEC_CPU_THREADS", mode)
                for nt in (1, 2, 3):
                    torch.set_num_threads(nt)
                    results.append(expert_forward(x, ids, w, g, kernel=kernel, backend="cpp"))
            assert all(torch.equal(results[0], r) for r in results[1:])
            check(x, ids, w, g, "cpp", "cpu", kernel)
        monkeypatch.setenv("MOESPEC_CPU_THREADS", "fibers")
        for nt in (1, 2):           # refused whether or not the call has helpers to run
            torch.set_num_threads(nt)
            with pytest.raises(RuntimeError, match="MOESPEC_CPU_THREADS must be openmp, pool or auto; found 'fibers'"):
                expert_forward(x, ids, w, g, kernel="dedup", backend="cpp")
    finally:
        torch.set_num_threads(threads)


@functools.lru_cache(maxsize=1)
def _published_weights(model, fmt):
    N, H, I, m = published_shapes()[model]
    # N reduced to m + 1 (the smallest legal layer) keeps memory and time small; H, I as published.
    return ExpertWeights.random((m + 1, H, I), fmt, seed=5), m


@pytest.mark.parametrize("backend,device", BACKENDS[1:])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", sorted(published_shapes()))
def test_published_shapes(model, fmt, backend, device):
    """Published H, I (and m) at n = 1..9; the fp64 reference of all nine passes is computed in one
    call over their concatenated tokens (tokens are independent)."""
    skip_if_absent(backend)
    w, m = _published_weights(model, fmt)
    rng = np.random.default_rng(1)
    ns = list(range(1, 10))
    xs = [torch.randn(n, w.hidden_size, generator=torch.Generator().manual_seed(n)) for n in ns]
    ids = [random_ids(n, m, w.num_experts, rng) for n in ns]
    gates = [torch.rand(n, m, generator=torch.Generator().manual_seed(100 + n)) for n in ns]
    x_all, ids_all, g_all = torch.cat(xs), torch.cat(ids), torch.cat(gates)
    ref_all = reference_forward(x_all, ids_all, w, g_all)
    tol = CEILING[fmt]
    dev = torch.device(device)
    wd = w.to(dev)
    start = 0
    for n, x, i, g in zip(ns, xs, ids, gates):
        ref = ref_all[start:start + n]
        start += n
        for kernel in KERNELS:
            y = expert_forward(x.to(dev), i.to(dev), wd, g.to(dev), kernel=kernel, backend=backend)
            err = rel_err(y, ref)
            assert err <= tol, f"{model} {fmt} n={n} {kernel}: error {err:.3g} > {tol:.3g}"


EDGE = {
    "n=1": lambda N, m, n, rng: random_ids(1, m, N, rng),
    "same experts for every token": lambda N, m, n, rng: random_ids(1, m, N, rng).repeat(n, 1),
    "all experts distinct": lambda N, m, n, rng: torch.randperm(N, generator=torch.Generator().manual_seed(0))[
        : (N // m) * m].reshape(N // m, m),
    "reversed duplicate rows": lambda N, m, n, rng: torch.cat([random_ids(1, m, N, rng)] * 2).flip(1),
}


@pytest.mark.parametrize("backend,device", BACKENDS)
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("edge", sorted(EDGE))
@pytest.mark.parametrize("shape", [(9, 64, 96, 4), (3, 96, 64, 2), (6, 64, 64, 1)])  # N = m+1 in the 2nd
def test_edge_cases(backend, device, fmt, edge, shape):
    skip_if_absent(backend)
    N, H, I, m = shape
    rng = np.random.default_rng(2)
    ids = EDGE[edge](N, m, 6, rng)
    n = ids.shape[0]
    w = ExpertWeights.random((N, H, I), fmt, seed=4)
    x = torch.randn(n, H, generator=torch.Generator().manual_seed(9))
    for gates in (None, torch.rand(n, m, generator=torch.Generator().manual_seed(8))):
        for kernel in KERNELS:
            check(x, ids, w, gates, backend, device, kernel)


@pytest.mark.parametrize("fmt", FORMATS)
def test_cpp_slot_and_dedup_agree_with_torch_at_same_precision(fmt):
    """int8: the C++ kernels quantize activations exactly like the torch kernel, so they agree to
    fp32 rounding (a layout or scale bug would show here far above that); slot == dedup in C++."""
    skip_if_absent("cpp")
    x, ids, w, g = _case(SMALL_SHAPES[3], fmt, 9, seed=21)
    ys = expert_forward(x, ids, w, g, kernel="slot", backend="cpp")
    yd = expert_forward(x, ids, w, g, kernel="dedup", backend="cpp")
    assert rel_err(ys, yd.double()) < 1e-5
    if fmt == "int8_b32":
        assert rel_err(ys, torch_dedup(x, ids, w, g).double()) < 2e-3


def test_gates_scale_linearly():
    """y is linear in the gates: doubling all gates doubles y, zero gates give zero."""
    skip_if_absent("cpp")
    x, ids, w, g = _case(SMALL_SHAPES[0], "f32", 5, seed=1)
    for kernel in KERNELS:
        y1 = expert_forward(x, ids, w, g, kernel=kernel, backend="cpp")
        y2 = expert_forward(x, ids, w, 2 * g, kernel=kernel, backend="cpp")
        torch.testing.assert_close(y2, 2 * y1, rtol=1e-6, atol=1e-7)
        assert expert_forward(x, ids, w, torch.zeros_like(g), kernel=kernel, backend="cpp").abs().max() == 0


@pytest.mark.parametrize("n", [4, 9, 13])
def test_cpp_f32_row_chunks(n):
    """f32 rows with 6+ tokens go through the micro-kernel in chunks of 512 values (dot_avx512.cpp,
    KCHUNK): K = 1100 and 600 end in partial chunks of 76 and 88 values (not multiples of the vector
    width); N = m + 1 puts ~3 (n = 4, whole rows), ~7 and ~10 (a tile of 9 and one of 1) tokens on
    each expert."""
    skip_if_absent("cpp")
    x, ids, w, g = _case((5, 1100, 600, 4), "f32", n, seed=n)
    ref = reference_forward(x, ids, w, g)
    _, err_dedup, tol = check(x, ids, w, g, "cpp", "cpu", "dedup", ref=ref)
    _, err_slot, _ = check(x, ids, w, g, "cpp", "cpu", "slot", ref=ref)  # one token per row: whole rows
    assert err_dedup <= tol and err_slot <= tol
