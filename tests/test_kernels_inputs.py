"""Bad input is rejected with a clear message (never a crash or a silent wrong result); weights
formats and byte counts; a missing build toolchain gives a clear error; import compiles nothing."""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from kernel_cases import cpp_present, skip_if_absent

from moespec.kernels import (ExpertWeights, ExtensionBuildError, build, dequantize_blocks, dispatch,
                             expert_forward, quantize_blocks)
from moespec.model_shapes import PRESETS

BACKENDS = ["torch", "cpp"]


@pytest.fixture(scope="module")
def case():
    w = ExpertWeights.random((6, 64, 32), "f32", seed=0)
    x = torch.randn(3, 64)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5]])
    return x, ids, w


def _skip(backend):
    skip_if_absent(backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad,match", [
    (lambda x, ids: (x, ids + 4), r"must lie in \[0, 6\)"),
    (lambda x, ids: (x, ids - 1), r"must lie in \[0, 6\)"),
    (lambda x, ids: (x, torch.tensor([[0, 0], [2, 3], [4, 5]])), "selects an expert twice"),
    (lambda x, ids: (x, ids.float()), "integer dtype"),
    (lambda x, ids: (x.long(), ids), "floating dtype"),
    (lambda x, ids: (x[:, :32], ids), r"expected \[n, H=64\]"),
    (lambda x, ids: (x, ids[:2]), r"expected \[n=3, m\]"),
    (lambda x, ids: (x, torch.zeros(3, 7, dtype=torch.long)), "m=7 experts per token"),
    (lambda x, ids: (x[None], ids), r"expected \[n, H=64\]"),
    (lambda x, ids: (x[:0], ids[:0]), "n >= 1"),
])
def test_bad_inputs_rejected(case, backend, bad, match):
    _skip(backend)
    x, ids, w = case
    bx, bids = bad(x, ids)
    with pytest.raises((ValueError, TypeError), match=match):
        expert_forward(bx, bids, w, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_gates_kernel_backend(case, backend):
    _skip(backend)
    x, ids, w = case
    with pytest.raises(ValueError, match=r"gates: expected \[n=3, m=2\]"):
        expert_forward(x, ids, w, gates=torch.ones(3, 3), backend=backend)
    with pytest.raises(TypeError, match="gates: expected a floating dtype"):
        expert_forward(x, ids, w, gates=torch.ones(3, 2, dtype=torch.long), backend=backend)
    with pytest.raises(ValueError, match="kernel must be one of"):
        expert_forward(x, ids, w, kernel="fast", backend=backend)
    with pytest.raises(ValueError, match="backend must be one of"):
        expert_forward(x, ids, w, backend="metal")
    with pytest.raises(ValueError, match="backend 'cuda' runs on CUDA tensors"):
        expert_forward(x, ids, w, backend="cuda")
    with pytest.raises(TypeError, match="weights must be an ExpertWeights"):
        expert_forward(x, ids, w.gate, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_contiguous_and_other_dtypes_are_handled(case, backend):
    """Non-contiguous x/ids/gates, int32 ids and float64/bf16 x give the contiguous result."""
    _skip(backend)
    x, ids, w = case
    gates = torch.rand(2, 3).T  # non-contiguous [3, 2]
    y = expert_forward(x, ids, w, gates=gates.contiguous(), backend=backend)
    xt = x.T.contiguous().T  # same values, column-major
    assert not xt.is_contiguous() and not gates.is_contiguous()
    torch.testing.assert_close(expert_forward(xt, ids.T.contiguous().T, w, gates=gates, backend=backend), y)
    torch.testing.assert_close(expert_forward(x.double(), ids.int(), w, gates=gates, backend=backend), y)


def test_cpp_fast_path_still_checks_and_converts(case):
    """Once a first call has kept the C++ function on the weights (expert_forward's fast path), the
    arguments go straight to it; what it refuses still gets the checked path's conversion or
    message."""
    skip_if_absent("cpp")
    x, ids, _ = case
    w = ExpertWeights.random((6, 64, 32), "f32", seed=0)
    for kernel in ("slot", "dedup"):
        y = expert_forward(x, ids, w, kernel=kernel, backend="cpp")
        assert ("cpp", kernel, "cpp") in w._cache
        torch.testing.assert_close(expert_forward(x.T.contiguous().T, ids.int(), w, kernel=kernel, backend="cpp"), y)
        torch.testing.assert_close(expert_forward(x.double(), ids, w, kernel=kernel, backend="cpp"), y)
        with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 6\)"):
            expert_forward(x, ids + 5, w, kernel=kernel, backend="cpp")
        with pytest.raises(ValueError, match="selects an expert twice"):
            expert_forward(x, torch.tensor([[1, 1], [2, 3], [4, 5]]), w, kernel=kernel, backend="cpp")
        with pytest.raises(ValueError, match=r"expected \[n, H=64\]"):
            expert_forward(x[:, :32], ids, w, kernel=kernel, backend="cpp")
        with pytest.raises(ValueError, match=r"x: expected \[n, H=64\] with n >= 1, found list"):
            expert_forward(x.tolist(), ids, w, kernel=kernel, backend="cpp")
        with pytest.raises(ValueError, match=r"gates: expected \[n=3, m=2\]"):
            expert_forward(x, ids, w, gates=torch.ones(3, 3), kernel=kernel, backend="cpp")
        assert torch.equal(expert_forward(x, ids, w, kernel=kernel, backend="cpp"), y)


@pytest.mark.cuda
def test_device_mismatch(case):
    x, ids, w = case
    with pytest.raises(ValueError, match="is on cuda"):
        expert_forward(x.cuda(), ids, w, backend="torch")


def test_device_mismatch_meta(case):
    x, ids, w = case
    with pytest.raises(ValueError, match="x is on meta"):
        expert_forward(x.to("meta"), ids, w, backend="torch")


@pytest.mark.parametrize("entry", ["torch.ops", "module"])
def test_direct_op_calls_check_their_inputs(case, entry):
    """The compiled op (called without expert_forward) rejects bad ids and layouts with a message,
    through the dispatcher (torch.ops.moespec) and through the extension module's direct entry
    points alike."""
    skip_if_absent("cpp")
    x, ids, w = case
    op = torch.ops.moespec.expert_dedup if entry == "torch.ops" else build.load_cpu().expert_dedup
    args = (w.gate, w.up, w.down, None, None, None)
    with pytest.raises(RuntimeError, match="outside"):
        op(x, ids + 5, None, *args)
    with pytest.raises(RuntimeError, match="twice"):
        op(x, torch.tensor([[1, 1], [2, 3], [4, 5]]), None, *args)
    with pytest.raises(RuntimeError, match="contiguous float32"):
        op(x.T.contiguous().T, ids, None, *args)
    with pytest.raises(RuntimeError, match="int64"):
        op(x, ids.int(), None, *args)
    with pytest.raises(RuntimeError, match="scales are only taken"):
        op(x, ids, None, w.gate, w.up, w.down, w.gate[..., :2], None, None)
    q = ExpertWeights.random((6, 64, 32), "int8", seed=0)
    with pytest.raises(RuntimeError, match="need s_gate"):
        op(x, ids, None, q.gate, q.up, q.down, None, None, None)
    # plain int8 (not packed) is accepted and gives the packed path's result
    plain = op(x, ids, None, *q.tensors())
    torch.testing.assert_close(plain, expert_forward(x, ids, q, kernel="dedup", backend="cpp"))


def test_module_entry_points_equal_the_registered_ops(case):
    """expert_forward's cpp backend calls the extension module's functions; they run the same code
    as torch.ops.moespec.* (results bit-identical, gates present and absent, both kernels)."""
    skip_if_absent("cpp")
    x, ids, _ = case
    module = build.load_cpu()
    for fmt in ("f32", "bf16", "int8_b32"):
        w = ExpertWeights.random((6, 64, 32), fmt, seed=3)
        ws = dispatch._op_weights(w)
        for kernel in ("slot", "dedup"):
            for gates in (None, torch.rand(3, 2)):
                via_ops = getattr(torch.ops.moespec, f"expert_{kernel}")(x, ids, gates, *ws)
                direct = getattr(module, f"expert_{kernel}")(x, ids, gates, *ws)
                assert torch.equal(via_ops, direct)
                assert torch.equal(direct, expert_forward(x, ids, w, gates, kernel=kernel, backend="cpp"))


def test_weights_formats_and_bytes():
    for name, spec in PRESETS.items():
        for fmt in ("f32", "bf16", "int8_b32"):
            w = ExpertWeights.random((spec.top_k + 1, 64, 32), fmt, seed=0)
            assert w.bytes_per_expert == {"f32": 4, "bf16": 2, "int8_b32": 36 / 32}[fmt] * 3 * 64 * 32
        assert ExpertWeights.random(spec, "bf16", num_experts=2).bytes_per_expert == spec.expert_bytes("bf16")
    w = ExpertWeights.random((3, 64, 32), "int8", seed=1)
    assert w.fmt == "int8_b32" and w.gate.dtype == torch.int8 and w.gate_scale.shape == (3, 32, 2)
    assert w.down_scale.shape == (3, 64, 1) and w.shape == (3, 64, 32) and w.num_experts == 3
    with pytest.raises(ValueError, match="unsupported kernel format"):
        ExpertWeights.random((3, 64, 32), "q4_k")
    with pytest.raises(ValueError, match="multiple of 32"):
        ExpertWeights.random((3, 48, 32), "int8")
    with pytest.raises(ValueError, match=r"down: expected shape \(3, 64, 32\)"):
        ExpertWeights("f32", w.gate.float(), w.up.float(), torch.zeros(3, 32, 64))
    with pytest.raises(ValueError, match="gate_scale: expected float32"):
        ExpertWeights("int8", w.gate, w.up, w.down, None, w.up_scale, w.down_scale)


def test_from_tensors_quantizes_within_half_a_step():
    g = torch.Generator().manual_seed(0)
    gate, up, down = torch.randn(2, 32, 64, generator=g), torch.randn(2, 32, 64, generator=g), torch.randn(2, 64, 32, generator=g)
    w = ExpertWeights.from_tensors(gate, up, down, fmt="int8")
    deq = w.dequantized(dtype=torch.float32)
    for orig, d, s in zip((gate, up, down), deq, (w.gate_scale, w.up_scale, w.down_scale)):
        step = s.repeat_interleave(32, dim=-1)
        assert bool(((orig - d).abs() <= 0.5 * step + 1e-7).all())
    q, s = quantize_blocks(torch.tensor([[0.0] * 32 + [1.0, -2.0] + [0.5] * 30]))
    assert s[0, 0].item() == 0.0 and abs(s[0, 1].item() - 2.0 / 127) < 1e-8 and q[0, 33].item() == -127
    torch.testing.assert_close(dequantize_blocks(q, s)[0, 32:34], torch.tensor([1.0, -2.0]), atol=1e-2, rtol=0)
    assert ExpertWeights.from_tensors(gate, up, down).fmt == "f32"
    assert ExpertWeights.from_tensors(gate, up, down, fmt="bf16").gate.dtype == torch.bfloat16


def test_missing_compiler_gives_clear_error(monkeypatch, case):
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_errors", {})
    monkeypatch.setattr(dispatch, "_auto_cache", {})
    monkeypatch.setenv("CXX", "no-such-compiler-moespec")
    with pytest.raises(ExtensionBuildError, match="missing C\\+\\+ compiler 'no-such-compiler-moespec'"):
        build.load_cpu()
    x, ids, _ = case
    w = ExpertWeights.random((6, 64, 32), "f32", seed=0)  # fresh: no cpp call plan kept on it yet
    with pytest.raises(ExtensionBuildError, match="C\\+\\+ compiler"):
        expert_forward(x, ids, w, backend="cpp")
    # where the extension is required (CI), auto refuses; elsewhere it falls back to the torch
    # backend, which still computes the right thing, and says why once
    monkeypatch.setenv(build.REQUIRE_ENV, "cpp")
    with pytest.raises(ExtensionBuildError, match="MOESPEC_REQUIRE_BUILD=cpp requires"):
        expert_forward(x, ids, w, backend="auto")
    monkeypatch.setenv(build.REQUIRE_ENV, "0")
    with pytest.warns(RuntimeWarning, match="backend='auto' uses the torch backend: .*C\\+\\+ compiler"):
        y = expert_forward(x, ids, w, backend="auto")
    torch.testing.assert_close(y, expert_forward(x, ids, w, backend="torch"))


def test_missing_ninja_gives_clear_error(monkeypatch):
    import torch.utils.cpp_extension as ce

    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(ce, "is_ninja_available", lambda: False)
    with pytest.raises(ExtensionBuildError, match="ninja"):
        build.load_cpu()


def test_static_cxx_runtime_gives_clear_error(monkeypatch, tmp_path):
    """A compiler that links libstdc++ statically into shared libraries (a CXX wrapper on one GPU
    machine did: every bad-input check of the ops segfaulted there) is refused before building."""
    if shutil.which("g++") is None or shutil.which("readelf") is None:
        pytest.skip("needs g++ and readelf")
    monkeypatch.setattr(build, "_loaded", {})
    monkeypatch.setattr(build, "_cxx_checked", {})
    monkeypatch.delenv("CXX", raising=False)
    assert build.cxx_runtime_problem() is None  # this machine's compiler: dynamic libstdc++
    wrapper = tmp_path / "gxx-static"  # a compiler wrapper as on that machine
    wrapper.write_text('#!/bin/sh\nexec g++ -static-libstdc++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    assert "links libstdc++ statically" in build.cxx_runtime_problem()
    with pytest.raises(ExtensionBuildError, match="links libstdc\\+\\+ statically.*CXX="):
        build.load_cpu()


def test_import_compiles_nothing(tmp_path):
    code = ("import sys, moespec.kernels; "
            "assert 'torch.utils.cpp_extension' not in sys.modules, 'cpp_extension imported'; "
            "import torch; assert not torch.cuda.is_initialized()")
    env = {"MOESPEC_BUILD": str(tmp_path / "b"), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)
    assert not (tmp_path / "b").exists()


def test_auto_picks_cpp_on_cpu_when_it_builds():
    want = "cpp" if cpp_present() else "torch"
    assert dispatch.resolve_backend("auto", torch.device("cpu")) == want
