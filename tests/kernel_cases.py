"""Helpers for the kernel tests: backends present, error measures, tolerances from torch's own error."""

from __future__ import annotations

import pytest
import torch

from moespec.kernels import ExpertWeights, build, expert_forward, reference_forward, torch_dedup

FORMATS = ("f32", "bf16", "int8_b32")
KERNELS = ("slot", "dedup")


def cpp_present() -> bool:
    return build.available("cpp")


#: (backend, device) pairs; cuda runs only where a GPU is present (marker), cpp only where it builds.
BACKENDS = [
    pytest.param("torch", "cpu", id="torch"),
    pytest.param("cpp", "cpu", id="cpp"),
    pytest.param("cuda", "cuda", id="cuda", marks=pytest.mark.cuda),
]


def skip_if_absent(backend: str) -> None:
    if backend == "cpp" and not cpp_present():
        pytest.skip("the C++ extension does not build here (see ExtensionBuildError)")


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error relative to the reference's largest magnitude (an elementwise bound)."""
    return float((y.double().cpu() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def tolerance(x, ids, w: ExpertWeights, gates, ref) -> float:
    """Torch's own error at the format's precision (its dedup kernel: bf16 matmuls for bf16,
    int8-block activations for int8; fp32 for f32), times 2, plus a floor of fp32 rounding."""
    own = rel_err(torch_dedup(x.float(), ids, w.to("cpu"), gates), ref)
    return 2.0 * own + 2e-6


def check(x, ids, w, gates, backend, device, kernel, ref=None):
    """Run one backend/kernel and assert it matches the fp64 reference within the tolerance."""
    ref = reference_forward(x, ids, w, gates) if ref is None else ref
    tol = tolerance(x, ids, w, gates, ref)
    dev = torch.device(device)
    y = expert_forward(x.to(dev), ids.to(dev), w.to(dev), None if gates is None else gates.to(dev),
                       kernel=kernel, backend=backend)
    assert y.shape == x.shape and y.dtype == torch.float32 and y.device.type == dev.type
    err = rel_err(y, ref)
    assert err <= tol, f"{backend}/{kernel}/{w.fmt}: error {err:.3g} > tolerance {tol:.3g}"
    return y, err, tol
