"""The CUDA backend against the fp64 reference: every kernel x format on random shapes, on the
published model shapes at n = 1..9, and on the edge cases; bad input rejected with a clear error.

All tests need a GPU (``pytest.mark.cuda``; skipped elsewhere) and build the CUDA extension on
first use. Tolerances come from torch's own error at the same precision: the torch backend
(``backend="torch"``, same activation rounding as the kernels) is compared with the same fp64
reference on the same inputs, and the CUDA kernels may err at most twice as much (plus 1e-6 of
max|y| for float32 summation order). The per-slot and dedup CUDA kernels run every (token, slot)
pair through the same arithmetic, so their outputs must be bitwise equal.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moespec.kernels import KERNELS, ExpertWeights, expert_forward, reference_forward
from moespec.models import PRESETS

pytestmark = pytest.mark.cuda

FORMATS = ("f32", "bf16", "int8_b32")
DEV = "cuda"


@pytest.fixture(scope="module", autouse=True)
def cuda_extension():
    from moespec.kernels import build

    build.load_cuda()  # ExtensionBuildError names what is missing


def relerr(y: torch.Tensor, ref: torch.Tensor) -> float:
    """max |y - ref| / max |ref|."""
    return float((y.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def routed_ids(n: int, m: int, N: int, rng: np.random.Generator, kind: str = "random") -> torch.Tensor:
    """``[n, m]`` ids: ``random`` (each token m distinct experts), ``same`` (every token token 0's
    experts), ``distinct`` (all n*m pairs different experts; needs n*m <= N)."""
    if kind == "same":
        ids = np.tile(rng.choice(N, size=m, replace=False), (n, 1))
    elif kind == "distinct":
        assert n * m <= N
        ids = rng.permutation(N)[: n * m].reshape(n, m)
    else:
        ids = np.stack([rng.choice(N, size=m, replace=False) for _ in range(n)])
    return torch.as_tensor(ids, dtype=torch.int64, device=DEV)


def check_case(x, ids, w, gates):
    """Both CUDA kernels within 2x torch's own error of the fp64 reference, and bitwise equal."""
    ref = reference_forward(x, ids, w, gates)
    err_torch = relerr(expert_forward(x, ids, w, gates, kernel="dedup", backend="torch"), ref)
    tol = 2 * err_torch + 1e-6
    ys = {k: expert_forward(x, ids, w, gates, kernel=k, backend="cuda") for k in KERNELS}
    for k, y in ys.items():
        assert y.shape == x.shape and y.dtype == torch.float32 and y.device.type == "cuda"
        assert torch.isfinite(y).all(), f"{k}: non-finite output"
        err = relerr(y, ref)
        assert err <= tol, f"{w.fmt} {k}: error {err:.3e} > tol {tol:.3e} (torch's own error {err_torch:.3e})"
    assert torch.equal(ys["slot"], ys["dedup"]), "slot and dedup CUDA outputs differ"
    return ys


def make_inputs(N, H, I, m, n, fmt, seed, kind="random", gates=True):
    rng = np.random.default_rng(seed)
    w = ExpertWeights.random((N, H, I), fmt, seed=seed, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn((n, H), generator=g, device=DEV)
    ids = routed_ids(n, m, N, rng, kind)
    gts = torch.rand((n, m), generator=g, device=DEV) + 0.1 if gates else None
    return x, ids, w, gts


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("seed", range(4))
def test_random_shapes(fmt, seed):
    rng = np.random.default_rng(100 + seed)
    mult = 32 if fmt == "int8_b32" else 1  # int8 blocks need multiples of 32; others may be odd (scalar path)
    H = int(rng.integers(1, 24)) * mult + (0 if mult == 32 else int(rng.integers(0, 5)))
    I = int(rng.integers(1, 24)) * mult + (0 if mult == 32 else int(rng.integers(0, 5)))
    N = int(rng.integers(2, 20))
    m = int(rng.integers(1, min(N, 8) + 1))
    n = int(rng.integers(1, 14))
    check_case(*make_inputs(N, H, I, m, n, fmt, seed, gates=bool(seed % 2)))


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", list(PRESETS))
def test_published_shapes_n1_to_9(model, fmt):
    """Published H, I and m; N reduced to 2m + 2 experts so that building the weights stays quick
    (the kernels read one expert at a time: N enters only through the ids)."""
    spec = PRESETS[model]
    m = spec.top_k
    N = min(spec.num_experts, 2 * m + 2)
    w = ExpertWeights.random((N, spec.hidden_size, spec.expert_intermediate), fmt, seed=1, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(2)
    rng = np.random.default_rng(3)
    for n in range(1, 10):
        x = torch.randn((n, spec.hidden_size), generator=g, device=DEV)
        ids = routed_ids(n, m, N, rng)
        check_case(x, ids, w, torch.rand((n, m), generator=g, device=DEV))


EDGE_CASES = {
    "n=1": dict(N=8, m=2, n=1, kind="random", gates=True),
    "same experts n=9": dict(N=16, m=4, n=9, kind="same", gates=True),
    "same experts n=20 (tiles split)": dict(N=16, m=4, n=20, kind="same", gates=False),
    "all distinct": dict(N=24, m=3, n=8, kind="distinct", gates=True),
    "m=1": dict(N=8, m=1, n=7, kind="random", gates=True),
    "N=m+1": dict(N=5, m=4, n=6, kind="random", gates=True),
    "gates absent": dict(N=8, m=2, n=5, kind="random", gates=False),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_edge_cases(case, fmt):
    c = EDGE_CASES[case]
    check_case(*make_inputs(c["N"], 256, 128, c["m"], c["n"], fmt, seed=7, kind=c["kind"], gates=c["gates"]))


def test_gates_absent_equals_unit_gates():
    x, ids, w, _ = make_inputs(8, 256, 128, 2, 5, "bf16", seed=3)
    for k in KERNELS:
        a = expert_forward(x, ids, w, None, kernel=k, backend="cuda")
        b = expert_forward(x, ids, w, torch.ones(ids.shape, device=DEV), kernel=k, backend="cuda")
        assert torch.equal(a, b)


def test_auto_backend_on_gpu_is_cuda():
    from moespec.kernels import resolve_backend

    assert resolve_backend("auto", torch.device(DEV)) == "cuda"


# --- bad input ------------------------------------------------------------------------------
def _op_args(fmt="f32"):
    x, ids, w, gates = make_inputs(8, 64, 64, 2, 3, fmt, seed=5)
    return x, ids, gates, list(w.tensors())


def test_rejects_wrong_dtypes_and_layouts():
    op = torch.ops.moespec.expert_slot
    x, ids, gates, ws = _op_args()
    with pytest.raises(RuntimeError, match="x: expected float32"):
        op(x.double(), ids, gates, *ws)
    with pytest.raises(RuntimeError, match="ids: expected int64"):
        op(x, ids.int(), gates, *ws)
    with pytest.raises(RuntimeError, match="contiguous"):
        op(torch.randn(64, 3, device=DEV).t(), ids, gates, *ws)
    with pytest.raises(RuntimeError, match="gates: expected float32"):
        op(x, ids, gates[:, :1].contiguous(), *ws)
    with pytest.raises(RuntimeError, match="hidden size"):
        op(torch.randn(3, 32, device=DEV), ids, gates, *ws)
    with pytest.raises(RuntimeError, match="share a dtype"):
        op(x, ids, gates, ws[0], ws[1].bfloat16(), *ws[2:])


def test_rejects_mixed_devices():
    x, ids, gates, ws = _op_args()
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        torch.ops.moespec.expert_dedup(x, ids.cpu(), gates, *ws)


def test_rejects_int8_without_scales_and_cpu_packed_layout():
    x, ids, gates, ws = _op_args("int8_b32")
    with pytest.raises(RuntimeError, match="need s_gate"):
        torch.ops.moespec.expert_slot(x, ids, gates, *ws[:3], None, None, None)
    with pytest.raises(RuntimeError, match="packed int8 layout"):
        torch.ops.moespec.expert_slot(x, ids, gates, *(t.view(torch.uint8) for t in ws[:3]), *ws[3:])


def test_out_of_range_ids():
    """expert_forward raises; a direct op call never reads out of bounds: that token's row is NaN."""
    x, ids, gates, ws = _op_args()
    bad = ids.clone()
    bad[1, 0] = 8  # N = 8
    w = ExpertWeights("f32", *ws[:3])
    with pytest.raises(ValueError, match="expert ids must lie in"):
        expert_forward(x, bad, w, gates, backend="cuda")
    for op in (torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup):
        y = op(x, bad, gates, *ws)
        assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()
