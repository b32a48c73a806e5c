"""CUDA-specific checks of the CUDA backend. The accuracy of every backend, CUDA included, against
the fp64 reference on random, odd, published and edge shapes is in ``test_kernels_correctness.py``
(its BACKENDS include cuda); here, on top of that accuracy check (same helper and ceilings):

* the per-slot and dedup CUDA kernels run every (token, slot) pair through the same arithmetic, so
  their outputs are bitwise equal: on the small and odd shapes, with every token on the same experts
  (n = 20 splits an expert's tokens over several 9-token tiles), all pairs distinct, and at the
  published shapes for n = 1..9;
* the execution paths (legacy, fused, fused without PDL): bitwise equal at the published shapes,
  NaN rows for non-finite inputs, CUDA-graph capture on each, the default plan on this GPU;
* gates absent equal unit gates; ``auto`` picks cuda on a GPU;
* the op's own input checks (dtype, layout, device, shape, int8 scales, the CPU-packed int8 layout)
  and ids out of range (expert_forward raises; the op gives NaN rows, never an out-of-bounds read).

All need a GPU (``pytest.mark.cuda``) and build the CUDA extension on first use.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from kernel_cases import FORMATS, KERNELS, ODD_SHAPES, SMALL_SHAPES, check

from moespec.kernels import ExpertWeights, expert_forward
from moespec.measure.ids import random_ids
from moespec.model_shapes import published_shapes

pytestmark = pytest.mark.cuda
DEV = "cuda"


@pytest.fixture(scope="module", autouse=True)
def cuda_extension():
    from moespec.kernels import build

    build.load_cuda()  # ExtensionBuildError names what is missing


def both_kernels(x, ids, w, gates):
    """Each CUDA kernel within the format's fixed ceiling of the fp64 reference; the two bitwise equal."""
    ys = {k: check(x, ids, w, gates, "cuda", DEV, k)[0] for k in KERNELS}
    assert torch.equal(ys["slot"], ys["dedup"]), f"{w.fmt}: slot and dedup CUDA outputs differ"


ROUTINGS = {
    "random n=9": lambda N, m, rng: random_ids(9, m, N, rng),
    "same experts n=20": lambda N, m, rng: random_ids(1, m, N, rng).repeat(20, 1),
    "all distinct": lambda N, m, rng: torch.randperm(N, generator=torch.Generator().manual_seed(1))[
        : (N // m) * m].reshape(N // m, m),
    "n=1": lambda N, m, rng: random_ids(1, m, N, rng),
}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("routing", sorted(ROUTINGS))
@pytest.mark.parametrize("shape", SMALL_SHAPES + ODD_SHAPES)
def test_slot_equals_dedup(shape, routing, fmt):
    N, H, I, m = shape
    if fmt == "int8_b32" and (H % 32 or I % 32):
        pytest.skip("int8 blocks need H and I multiples of 32")
    ids = ROUTINGS[routing](N, m, np.random.default_rng(3))
    n = ids.shape[0]
    w = ExpertWeights.random((N, H, I), fmt, seed=2)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(n, H, generator=g)
    both_kernels(x, ids, w, torch.rand(n, m, generator=g) if n % 2 else None)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", sorted(published_shapes()))
def test_published_shapes_slot_equals_dedup(model, fmt):
    """Published H, I and m at n = 1..9; N = 2m + 2 experts, so passes have both repeats and first reads."""
    _, H, I, m = published_shapes()[model]
    w = ExpertWeights.random((2 * m + 2, H, I), fmt, seed=6)
    rng = np.random.default_rng(7)
    for n in range(1, 10):
        g = torch.Generator().manual_seed(n)
        both_kernels(torch.randn(n, H, generator=g), random_ids(n, m, w.num_experts, rng), w,
                     torch.rand(n, m, generator=g))


def _inputs(fmt="f32", N=8, H=64, I=64, m=2, n=3, seed=5):
    w = ExpertWeights.random((N, H, I), fmt, seed=seed, device=DEV)
    g = torch.Generator(device=DEV).manual_seed(seed)
    x = torch.randn((n, H), generator=g, device=DEV)
    ids = random_ids(n, m, N, np.random.default_rng(seed)).to(DEV)
    return x, ids, torch.rand((n, m), generator=g, device=DEV), w


def test_gates_absent_equal_unit_gates():
    x, ids, _, w = _inputs("bf16")
    for k in KERNELS:
        a = expert_forward(x, ids, w, None, kernel=k, backend="cuda")
        b = expert_forward(x, ids, w, torch.ones(ids.shape, device=DEV), kernel=k, backend="cuda")
        assert torch.equal(a, b)


def test_auto_backend_on_gpu_is_cuda():
    from moespec.kernels import resolve_backend

    assert resolve_backend("auto", torch.device(DEV)) == "cuda"


def test_op_rejects_wrong_dtypes_layouts_and_shapes():
    op = torch.ops.moespec.expert_slot
    x, ids, gates, w = _inputs()
    ws = list(w.tensors())
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
    with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
        torch.ops.moespec.expert_dedup(x, ids.cpu(), gates, *ws)


def test_op_rejects_int8_without_scales_and_cpu_packed_layout():
    x, ids, gates, w = _inputs("int8_b32")
    ws = list(w.tensors())
    with pytest.raises(RuntimeError, match="need s_gate"):
        torch.ops.moespec.expert_slot(x, ids, gates, *ws[:3], None, None, None)
    with pytest.raises(RuntimeError, match="packed int8 layout"):
        torch.ops.moespec.expert_slot(x, ids, gates, *(t.view(torch.uint8) for t in ws[:3]), *ws[3:])


def test_out_of_range_ids():
    """expert_forward raises; a direct op call never reads out of bounds: that token's row is NaN."""
    x, ids, gates, w = _inputs()
    bad = ids.clone()
    bad[1, 0] = w.num_experts
    with pytest.raises(ValueError, match="expert ids must lie in"):
        expert_forward(x, bad, w, gates, backend="cuda")
    for op in (torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup):
        y = op(x, bad, gates, *w.tensors())
        assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


# --- the execution paths (moespec.kernels.cuda_api): legacy three launches, fused two launches ----
@pytest.fixture
def tuning():
    """Set the CUDA library's tuning for one test (``tuning(path, pdl)``); restored afterwards."""
    from moespec.kernels import cuda_api

    lib = cuda_api.loaded_library()
    saved = cuda_api.get_tuning(lib)

    def use(path="auto", pdl=-1, **kw):
        cuda_api.set_tuning(lib, cuda_api.TuningChoice(path, pdl, **kw))
        return lib

    yield use
    lib.moespec_cuda_set_tuning(__import__("ctypes").byref(saved))


PATH_CHOICES = {"legacy": ("legacy", 0), "fused": ("fused", -1), "fused-nopdl": ("fused", 0)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("model", sorted(published_shapes()))
def test_paths_agree_bitwise_at_published_shapes(model, fmt, tuning):
    """Legacy, fused and fused without PDL, per-slot and dedup: six bitwise-equal outputs at the
    published H, I, m for n = 1, 4, 9, and the fused path really ran (its plan)."""
    from moespec.kernels import cuda_api

    _, H, I, m = published_shapes()[model]
    w = ExpertWeights.random((2 * m + 2, H, I), fmt, seed=8, device=DEV)
    rng = np.random.default_rng(9)
    for n in (1, 4, 9):
        g = torch.Generator(device=DEV).manual_seed(n)
        x = torch.randn((n, H), generator=g, device=DEV)
        ids = random_ids(n, m, w.num_experts, rng).to(DEV)
        gates = torch.rand((n, m), generator=g, device=DEV)
        outs = {}
        for name, (path, pdl) in PATH_CHOICES.items():
            lib = tuning(path, pdl)
            plan = cuda_api.get_plan(lib, x, ids, w, "dedup")
            assert plan.as_dict()["path"] == path, (name, plan.as_dict())
            for k, op in (("slot", torch.ops.moespec.expert_slot), ("dedup", torch.ops.moespec.expert_dedup)):
                outs[name, k] = op(x, ids, gates, *w.tensors())
        ref = outs["legacy", "slot"]
        for key, y in outs.items():
            assert torch.equal(y, ref), (model, fmt, n, key)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", sorted(PATH_CHOICES))
def test_nonfinite_inputs_give_nan_rows_on_gpu(fmt, path, tuning):
    """NaN / inf in x or the gates: exactly those tokens' rows NaN on every path and kernel (int8
    too); the other rows are bitwise those of the clean pass."""
    tuning(*PATH_CHOICES[path])
    x, ids, gates, w = _inputs(fmt, N=8, H=256, I=128, m=3, n=6)
    bad_x, bad_g = x.clone(), gates.clone()
    bad_x[1, 37], bad_x[2, 200], bad_x[3, 0] = float("nan"), float("inf"), -float("inf")
    bad_g[4, 2], bad_g[5, 0] = float("nan"), float("inf")
    for op in (torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup):
        clean = op(x, ids, gates, *w.tensors())
        y = op(bad_x, ids, bad_g, *w.tensors())
        assert torch.isfinite(clean).all() and torch.isnan(y[1:]).all()
        assert torch.equal(y[0], clean[0])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("path", sorted(PATH_CHOICES))
def test_ops_capture_in_a_cuda_graph(path, fmt, tuning):
    """Both ops capture on every path (the fused path's programmatic dependent launch included;
    no host sync, no attribute calls once warmed up) and a replay gives the eager result,
    including the dedup kernel's 72 KB shared-memory opt-in."""
    tuning(*PATH_CHOICES[path])
    x, ids, gates, w = _inputs(fmt, N=16, H=2048, I=256, m=4, n=9)
    for op in (torch.ops.moespec.expert_slot, torch.ops.moespec.expert_dedup):
        eager = op(x, ids, gates, *w.tensors())  # warm-up: opt-ins happen here, outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op(x, ids, gates, *w.tensors())
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)


def test_default_plan_on_this_gpu(tuning):
    """By default the fused path runs wherever it applies, with PDL on sm_90 and newer."""
    from moespec.kernels import cuda_api

    lib = tuning()
    x, ids, _, w = _inputs("bf16", N=16, H=2048, I=1024, m=4, n=2)
    plan = cuda_api.get_plan(lib, x, ids, w, "slot").as_dict()
    major = torch.cuda.get_device_capability()[0]
    assert plan["path"] == ("fused" if major >= 8 else "legacy")
    assert plan["pdl"] == int(major >= 9) and plan["launches"] == (2 if major >= 8 else 3)
