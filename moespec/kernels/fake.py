"""Fake (meta) implementations of the ``torch.ops.moespec`` ops.

A fake implementation returns empty tensors of the output's shape, dtype and device without
computing anything; FakeTensor, ``torch.compile`` (its tracing) and ``torch.export`` run it in
place of the kernel, as pytorch/extension-cpp registers one for each of its ops. Shapes are
checked with ``torch._check`` so that they also hold for symbolic sizes. The values of the ids
(range, duplicates) cannot be checked without data: the kernels check them when they run.

:func:`register` is called by :func:`moespec.kernels.build.load_cpu` once the library that
defines the schemas is loaded; the CUDA implementations share the schemas and these fakes.
"""

from __future__ import annotations

import torch

from moespec.kernels.weights import BLOCK

_registered = False


def _expert_op_fake(x, ids, gates, w_gate, w_up, w_down, s_gate, s_up, s_down):
    """``[n, H]`` float32 on x's device, after the shape and dtype checks the kernels make."""
    torch._check(x.dim() == 2 and x.dtype == torch.float32, lambda: f"x: expected float32 [n, H], found {x.dtype} "
                 f"{tuple(x.shape)}")
    torch._check(ids.dim() == 2 and ids.dtype == torch.int64, lambda: "ids: expected int64 [n, m]")
    torch._check(ids.shape[0] == x.shape[0], lambda: "ids: one row per token of x")
    torch._check(w_gate.dim() == 3 and w_up.shape == w_gate.shape and w_down.dim() == 3,
                 lambda: "w_gate, w_up: [N, I, H]; w_down: [N, H, I]")
    torch._check(w_gate.shape[2] == x.shape[1], lambda: "x: hidden size does not match the weights' H")
    torch._check(w_down.shape[1] == x.shape[1] and w_down.shape[2] == w_gate.shape[1],
                 lambda: "w_down: expected [N, H, I]")
    if gates is not None:
        torch._check(gates.shape == ids.shape and gates.dtype == torch.float32,
                     lambda: "gates: expected float32 shaped like ids")
    quantized = w_gate.dtype in (torch.int8, torch.uint8)
    torch._check(quantized == (s_gate is not None and s_up is not None and s_down is not None),
                 lambda: "int8 weights need s_gate, s_up and s_down; other formats take none")
    return x.new_empty(x.shape, dtype=torch.float32)


def _pack_int8_fake(q):
    torch._check(q.dtype == torch.int8, lambda: f"pack_int8_cpu: expected int8, found {q.dtype}")
    return torch.empty(q.shape, dtype=torch.uint8, device=q.device)


def _quantize_acts_fake(x):
    torch._check(x.dim() == 2 and x.dtype == torch.float32, lambda: "quantize_acts_int8_cpu: expected float32 [R, K]")
    rows, k = x.shape
    torch._check(k % BLOCK == 0, lambda: "quantize_acts_int8_cpu: K must be a multiple of 32")
    return (x.new_empty((rows, k), dtype=torch.int8), x.new_empty((rows, k // BLOCK), dtype=torch.float32),
            x.new_empty((rows, k // BLOCK), dtype=torch.int32))


def _dense_fake(x, w, s):
    """``[n, N]`` float32 on x's device, after the shape and dtype checks of ``dense.cpp``."""
    torch._check(x.dim() == 2 and x.dtype == torch.float32, lambda: f"x: expected float32 [n, K], found {x.dtype} "
                 f"{tuple(x.shape)}")
    torch._check(w.dim() == 2 and w.shape[1] == x.shape[1], lambda: "w: expected [N, K] with x's K")
    quantized = w.dtype in (torch.int8, torch.uint8)
    torch._check(quantized == (s is not None), lambda: "int8 weights need scales; other formats take none")
    if quantized:
        torch._check(x.shape[1] % BLOCK == 0 and tuple(s.shape) == (w.shape[0], w.shape[1] // BLOCK),
                     lambda: "int8 weights need K a multiple of 32 and scales [N, K / 32]")
    return x.new_empty((x.shape[0], w.shape[0]), dtype=torch.float32)


def register() -> None:
    """Register the fakes of ``expert_slot``, ``expert_dedup``, ``dense``, ``pack_int8_cpu`` and
    ``quantize_acts_int8_cpu`` (once per process; the schemas must be loaded)."""
    global _registered
    if _registered:
        return
    for name in ("expert_slot", "expert_dedup"):
        torch.library.register_fake(f"moespec::{name}")(_expert_op_fake)
    torch.library.register_fake("moespec::dense")(_dense_fake)
    torch.library.register_fake("moespec::pack_int8_cpu")(_pack_int8_fake)
    torch.library.register_fake("moespec::quantize_acts_int8_cpu")(_quantize_acts_fake)
    _registered = True
