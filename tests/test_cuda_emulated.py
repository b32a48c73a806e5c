"""The real CUDA kernel source, run on the CPU: ``tests/cuda_emu`` emulates the CUDA features the
kernels use (threads as cooperative fibers with block and warp barriers, shuffles, ballot, dp4a,
shared memory, the launch limits), so the standalone harness checks the kernels' indexing, tile
grouping, staging layouts and reductions against its host reference without a GPU.

It checks logic, not timing or memory-model details a GPU adds (races between real concurrent
threads are invisible to fibers that switch only at sync points). The kernel files are used as
they are, except two mechanical rewrites a host compiler needs (``tests/cuda_emu/emulation.py``).
What a GPU does later the emulator does later (cp.async copies land at their wait; a kernel launched
with programmatic dependent launch runs up to its griddepcontrol.wait before the kernel it depends
on), so code that relies on either too early fails here. ``scripts/cuda_emu_mutants.py`` checks
that deliberate bugs make the harness fail.
"""

from __future__ import annotations

import ctypes
import subprocess
import sys

import pytest

from moespec import paths
from moespec.kernels import cuda_api

sys.path.insert(0, str(paths.ROOT / "tests" / "cuda_emu"))
from emulation import build_emulated, emulated_source  # noqa: E402


@pytest.fixture(scope="module")
def emulated_build(tmp_path_factory):
    """The kernels compiled once for the CPU (position-independent), linked into the standalone
    harness and into a shared library for ctypes. Returns (harness executable, library path)."""
    try:
        return build_emulated(tmp_path_factory.mktemp("cuda_emu"), bench=True)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def emulated_harness(emulated_build):
    return emulated_build[0]


def test_kernels_pass_the_harness_under_emulation(emulated_harness):
    proc = subprocess.run([str(emulated_harness), "--small"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    out = proc.stdout
    assert "ALL PASSED" in out
    # every small case ran both kernels on every path and compared the six outputs bitwise
    assert out.count("slot and dedup outputs bitwise equal on every path") >= 16
    for name in ("scalar path", "same experts n=20", "all distinct m=1", "N=m+1", "invalid id -> NaN",
                 "ragged", "smem opt-in", "NaN in x", "+inf in x", "-inf gate", "NaN gate"):
        assert name in out, f"case {name!r} did not run"
    # the fused path (with and without PDL) ran wherever the shape allows it: all but the two scalar cases
    for label in ("dedup fused+pdl", "slot fused+pdl", "dedup fused ", "dedup legacy"):
        assert out.count(label) >= 14, label


def test_emulated_source_rewrites():
    text = "extern __shared__ int4 smem4[];\nkern<<<grid, kThreads, smem, stream>>>(p);\n" * 2
    out = emulated_source(text)
    assert "emu::launch(kern, grid, kThreads, smem, stream, p);" in out
    assert "emu::dyn_smem()" in out and "<<<" not in out


# --- the emulated CUDA kernels against the C++ CPU kernels (same numerics, docs/kernels.md) -----
#: Fixed error ceilings against the fp64 reference, per format, independent of any backend's own
#: error (measured under emulation: at most 3e-7 f32, 3e-3 bf16, 1e-2 int8 on these shapes).
CEILING = {"f32": 1e-5, "bf16": 1e-2, "int8_b32": 3e-2}


@pytest.fixture(scope="module")
def emulated_lib(emulated_build):
    dll = ctypes.CDLL(str(emulated_build[1]))
    dll.moespec_cuda_status_string.restype = ctypes.c_char_p
    yield dll
    dll.moespec_emu_set_device(9, 0, 2)
    set_tuning(dll)


def set_tuning(dll, path="auto", pdl=-1, **kw) -> int:
    """Set the emulated library's tuning; returns the C status."""
    return dll.moespec_cuda_set_tuning(ctypes.byref(cuda_api.TuningChoice(path, pdl, **kw).struct()))


def emulated_plan(dll, x, ids, w, kernel: str) -> cuda_api.Plan:
    """The plan (path, launch shapes) of a call under the current tuning."""
    return cuda_api.get_plan(dll, x, ids, w, kernel)


def emulated_forward(dll, x, ids, w, gates, kernel: str, path: str = "auto", pdl: int = -1, **tuning):
    """expert_forward through the emulated CUDA kernels (host tensors stand in for device memory),
    on execution path ``path``; the workspace and output start as garbage (0xCD bytes)."""
    import torch

    assert set_tuning(dll, path, pdl, **tuning) == 0
    x, ids = x.float().contiguous(), ids.to(torch.int64).contiguous()
    gates = None if gates is None else gates.float().contiguous()
    y = torch.empty_like(x).view(torch.uint8).fill_(0xCD).view(torch.float32)
    a = cuda_api.expert_args(x, ids, w, gates, y)
    k = {"slot": 0, "dedup": 1}[kernel]
    size = ctypes.c_size_t(0)
    st = dll.moespec_cuda_workspace_bytes(ctypes.byref(a), k, ctypes.byref(size))
    assert st == 0, dll.moespec_cuda_status_string(st)
    work = torch.full((size.value,), 0xCD, dtype=torch.uint8)
    a.workspace, a.workspace_bytes = work.data_ptr(), size.value
    st = dll.moespec_cuda_expert_forward(ctypes.byref(a), k, None)
    assert st == 0, dll.moespec_cuda_status_string(st)
    dll.moespec_emu_synchronize()
    return y


@pytest.mark.parametrize("fmt", ("f32", "bf16", "int8_b32"))
def test_emulated_kernels_match_cpp_kernels_and_reference(emulated_lib, fmt):
    """Both emulated CUDA kernels on both execution paths (fused where the shape allows, legacy)
    against the C++ CPU kernels, which implement the same activation numerics (bf16 rounding, int8
    block quantization) independently: they agree to float32 summation order (measured 1e-7, one
    bf16 case 1.3e-5; a misread precision rule would differ by ~1e-3, as far as bf16 and int8 are
    from fp64); against the fp64 reference within the format's fixed ceiling
    (kernel_cases.CEILING); and the four outputs are bitwise equal."""
    import numpy as np
    import torch
    from kernel_cases import CEILING, ODD_SHAPES, SMALL_SHAPES, rel_err, skip_if_absent

    from moespec.kernels import ExpertWeights, expert_forward, reference_forward
    from moespec.measure.ids import random_ids

    skip_if_absent("cpp")
    shapes = SMALL_SHAPES + (ODD_SHAPES if fmt != "int8_b32" else ())
    fused_seen = 0
    for i, (N, H, I, m) in enumerate(shapes):
        n = (5, 13, 2, 7, 4, 3)[i]  # 13 > 9: an expert's tokens span two tiles
        w = ExpertWeights.random((N, H, I), fmt, seed=i)
        g = torch.Generator().manual_seed(i)
        x = torch.randn(n, H, generator=g)
        ids = random_ids(n, m, N, np.random.default_rng(i))
        gates = torch.rand(n, m, generator=g) if i % 2 == 0 else None
        ref = reference_forward(x, ids, w, gates)
        tol = CEILING[fmt]
        y_cpp = expert_forward(x, ids, w, gates, kernel="dedup", backend="cpp")
        vector = H % (4 if fmt == "f32" else 8) == 0 and I % (4 if fmt == "f32" else 8) == 0
        assert set_tuning(emulated_lib) == 0
        assert emulated_plan(emulated_lib, x, ids, w, "dedup").path == (cuda_api.PATHS["fused"] if vector else cuda_api.PATHS["legacy"])
        fused_seen += vector
        ys = {(k, path): emulated_forward(emulated_lib, x, ids, w, gates, k, path)
              for k in ("slot", "dedup") for path in ("auto", "legacy")}
        y0 = ys["dedup", "auto"]
        for key, y in ys.items():
            assert torch.equal(y, y0), (fmt, (N, H, I, m), key)
        err = rel_err(y0, ref)
        assert err <= tol, (fmt, (N, H, I, m), err, tol)
        agree = rel_err(y0, y_cpp.double())
        print(f"{fmt} {(N, H, I, m)} n={n}: vs C++ {agree:.1e}, vs fp64 {err:.1e} (tol {tol:.1e})")
        # f32: summation order only; bf16/int8 add a rare one-step rounding flip of an h element (~1e-5)
        limit = 1e-5 if fmt == "f32" else 1e-4
        assert agree <= limit, f"{fmt} {(N, H, I, m)}: emulated CUDA vs C++ differ by {agree:.2e}"
    assert fused_seen >= 4


@pytest.mark.parametrize("fmt", ("f32", "bf16", "int8_b32"))
def test_nonfinite_inputs_give_nan_rows(emulated_lib, fmt):
    """A NaN or infinity in x or in the gates makes exactly that token's output row NaN, on every
    path and kernel and in every format (int8's quantization would otherwise turn a NaN into a
    finite row); the other rows are bitwise those of the clean pass."""
    import numpy as np
    import torch

    from moespec.kernels import ExpertWeights
    from moespec.measure.ids import random_ids

    N, H, I, m, n = 8, 256, 128, 3, 6
    w = ExpertWeights.random((N, H, I), fmt, seed=11)
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, H, generator=g)
    gates = torch.rand(n, m, generator=g)
    ids = random_ids(n, m, N, np.random.default_rng(11))
    bad_x, bad_g = x.clone(), gates.clone()
    bad_x[1, 37] = float("nan")
    bad_x[2, 200] = float("inf")
    bad_x[3, 0] = -float("inf")
    bad_g[4, 2] = float("nan")
    bad_g[5, 0] = float("inf")
    for kernel in ("slot", "dedup"):
        for path in ("auto", "legacy"):
            clean = emulated_forward(emulated_lib, x, ids, w, gates, kernel, path)
            y = emulated_forward(emulated_lib, bad_x, ids, w, bad_g, kernel, path)
            assert torch.isfinite(clean).all()
            assert torch.isnan(y[1:]).all(), (fmt, kernel, path, torch.isnan(y).all(1))
            assert torch.equal(y[0], clean[0]), (fmt, kernel, path)


def test_plan_chooses_path_pdl_and_rings(emulated_lib):
    """Where each path applies: fused on sm_80+ for 16-byte-aligned rows and at most 1024 pairs,
    with PDL on sm_90 unless turned off; legacy otherwise or when asked; bad tuning refused."""
    import numpy as np
    import torch

    from moespec.kernels import ExpertWeights
    from moespec.measure.ids import random_ids

    dll = emulated_lib
    w = ExpertWeights.random((16, 256, 128), "bf16", seed=1)
    x, ids = torch.randn(9, 256), random_ids(9, 4, 16, np.random.default_rng(1))
    try:
        assert set_tuning(dll) == 0
        plan = emulated_plan(dll, x, ids, w, "dedup")
        assert (plan.path, plan.launches, plan.pdl, plan.tile) == (cuda_api.PATHS["fused"], 2, 1, 9)
        # default depths: chosen for bytes in flight (at most 6 / 8 stages); 4 warps = 8 down rows per block
        assert 2 <= plan.ring_gu <= 6 and 2 <= plan.ring_dn <= 8
        assert (plan.threads_dn, plan.grid_dn_x) == (128, 256 // 8)
        assert emulated_plan(dll, x, ids, w, "slot").tile == 1
        assert set_tuning(dll, pdl=0) == 0 and emulated_plan(dll, x, ids, w, "dedup").pdl == 0
        assert set_tuning(dll, "legacy") == 0
        plan = emulated_plan(dll, x, ids, w, "dedup")
        assert (plan.path, plan.launches, plan.pdl) == (cuda_api.PATHS["legacy"], 3, 0)
        assert set_tuning(dll, ring_gu=3, ring_dn=8, dn_warps=2) == 0
        plan = emulated_plan(dll, x, ids, w, "slot")
        assert (plan.ring_gu, plan.ring_dn, plan.threads_dn, plan.grid_dn_x) == (3, 8, 64, 256 // 4)
        assert set_tuning(dll) == 0
        dll.moespec_emu_set_device(8, 0, 2)  # sm_80: fused without PDL
        assert (emulated_plan(dll, x, ids, w, "dedup").path, emulated_plan(dll, x, ids, w, "dedup").pdl) == (2, 0)
        dll.moespec_emu_set_device(7, 0, 2)  # no cp.async below sm_80: legacy
        assert emulated_plan(dll, x, ids, w, "dedup").path == cuda_api.PATHS["legacy"]
        dll.moespec_emu_set_device(9, 0, 2)
        big = random_ids(257, 4, 16, np.random.default_rng(2))  # 1028 pairs > 1024
        assert emulated_plan(dll, torch.randn(257, 256), big, w, "slot").path == cuda_api.PATHS["legacy"]
        odd = ExpertWeights.random((16, 260, 128), "bf16", seed=1)  # 260 bf16: rows not 16-byte multiples
        assert emulated_plan(dll, torch.randn(9, 260), ids, odd, "slot").path == cuda_api.PATHS["legacy"]
        for bad in ({"path": 3}, {"pdl": 2}, {"ring_gu": 1}, {"ring_dn": 9}, {"dn_warps": 9}, {"gu_blocks_per_sm": -1}):
            tn = cuda_api.Tuning(**{"pdl": -1, **bad})
            assert dll.moespec_cuda_set_tuning(ctypes.byref(tn)) == cuda_api.ERR_TUNING, bad
    finally:
        dll.moespec_emu_set_device(9, 0, 2)
        set_tuning(dll)


@pytest.mark.parametrize("fmt", ("f32", "bf16", "int8_b32"))
def test_fused_tuning_variants_agree_bitwise(emulated_lib, fmt):
    """Ring depths 2..8, 1..8 warps per down block, long and short gate/up blocks, PDL on and off:
    every variant of the fused path gives the legacy path's bits (the ring's group accounting,
    the stage-to-row mapping and the per-block row ranges change; the arithmetic does not)."""
    import numpy as np
    import torch

    from moespec.kernels import ExpertWeights
    from moespec.measure.ids import random_ids

    N, H, I, m, n = 6, 320, 224, 2, 7  # 320 = 10 chunk groups: ragged last ring stage in every format
    w = ExpertWeights.random((N, H, I), fmt, seed=5)
    g = torch.Generator().manual_seed(5)
    x, gates = torch.randn(n, H, generator=g), torch.rand(n, m, generator=g)
    ids = random_ids(n, m, N, np.random.default_rng(5))
    variants = ({"ring_gu": 2, "ring_dn": 2, "dn_warps": 1}, {"ring_gu": 3, "ring_dn": 5, "dn_warps": 3},
                {"ring_gu": 8, "ring_dn": 8, "dn_warps": 8, "gu_blocks_per_sm": 64},
                {"gu_blocks_per_sm": 1, "pdl": 0})
    for kernel in ("slot", "dedup"):
        ref = emulated_forward(emulated_lib, x, ids, w, gates, kernel, "legacy")
        for v in variants:
            v = dict(v)
            y = emulated_forward(emulated_lib, x, ids, w, gates, kernel, "fused", v.pop("pdl", -1), **v)
            assert torch.equal(y, ref), (fmt, kernel, v)


def _bench(exe_dir, tmp_path, *args):
    csv_path = tmp_path / "b.csv"
    proc = subprocess.run([str(exe_dir / "bench_standalone_emu"), str(csv_path), "--reps", "2", "--warmup", "1",
                           "--flush-mib", "1", "--read-mib", "1", *args], capture_output=True, text=True, timeout=600)
    return proc, csv_path


def test_standalone_benchmark_runs_every_variant_under_emulation(emulated_build, tmp_path):
    """The torch-free benchmark's host logic (variants, tuning switches, rotation over copies, the
    three cache protocols, CUDA-graph capture and replay, the bitwise output check, CSV and table)
    runs end to end on the emulated kernels; its times mean nothing here."""
    import csv

    exe_dir = emulated_build[0].parent
    proc, csv_path = _bench(exe_dir, tmp_path, "--formats", "int8_b32", "--ns", "1,3", "--protocols",
                            "rotate,flush,clean", "--copies", "2", "t:6,64,96,2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == 2 * 3 * 4 * 2  # ns x protocols x variants x kernels
    assert {r["variant"] for r in rows} == {"legacy", "fused", "fused-nopdl", "fused-graph"}
    assert all(r["flags"] == "" for r in rows), {r["flags"] for r in rows}  # every variant bitwise equal
    for r in rows:
        assert r["plan"].startswith("legacy 3 launches" if r["variant"] == "legacy" else "fused 2 launches"), r
        assert ("pdl 1" in r["plan"]) == (r["variant"] in ("fused", "fused-graph")), r
        assert int(r["graph"]) == (r["variant"] == "fused-graph")
        U, n, m, b = int(r["U"]), int(r["n"]), int(r["m"]), float(r["expert_bytes"])
        assert float(r["bytes"]) == (U * b if r["kernel"] == "dedup" else n * m * b)
    assert "| t | int8_b32 | 3 |" in proc.stdout and "fused-graph dedup" in proc.stdout
    proc, csv_path = _bench(exe_dir, tmp_path, "--sweep", "--formats", "bf16", "--ns", "2", "--protocols",
                            "rotate", "t:6,64,96,2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = list(csv.DictReader(csv_path.open()))
    assert len({r["variant"] for r in rows}) == 14 and all(r["flags"] == "" for r in rows)
    plans = {r["variant"]: r["plan"] for r in rows}
    assert "rings 8/" in plans["gu_ring8"] and "/8 " in plans["dn_ring8"] and "warps 8" in plans["dn_warps8"]
    assert "pdl 0" in plans["pdl0"] and plans["legacy"].startswith("legacy")
    for bad, msg in ((["--protocols", "cold"], "unknown protocol"), (["--variants", "fast"], "unknown variant"),
                     (["--copies", "1"], "nothing to measure"), (["x:4,64"], "bad shape")):
        proc, _ = _bench(exe_dir, tmp_path, *bad, *([] if bad[0].startswith("x:") else ["t:6,64,96,2"]))
        assert proc.returncode == 2 and msg in proc.stderr, (bad, proc.stderr)
