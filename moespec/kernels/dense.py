"""The dense linear ``y = x W^T`` of the weights a pass reads once outside the experts (attention
projections, the LM head) in the kernels' formats.

Why. A decode step's bytes outside the experts (paper 1's D + kv(n - 1) term: attention per layer,
the LM head per step) are what make a verify pass cheaper than k + 1 steps. The byte-faithful
subject with every component faithful (:mod:`moespec.engine.widen`, docs/engine.md) reads them in
the experts' format, on the experts' dot kernels, so that a byte costs the same wherever it is read.

Precision (the rules of :mod:`moespec.kernels.reference`): ``f32`` keeps x in float32; ``bf16``
rounds x to bfloat16; ``int8_b32`` quantizes x to int8 blocks of 32 along K with one fp32 scale each
(like ggml's Q8_0 activations), and W holds int8 blocks of 32 along K with one fp32 scale each.

Backends: ``cpp`` (``csrc/cpu/dense.cpp``: the expert operation's dot kernels, threads and non-finite
rule) on CPU; ``torch`` (the same precision rules in float32 matmuls: the readable reference and
the path off CPU, which reads dequantized float32 weights, not the format's bytes); ``auto`` picks
``cpp`` on CPU when the extension builds (:func:`moespec.kernels.dispatch.resolve_backend`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from moespec.kernels import build
from moespec.kernels.reference import non_finite_rows_to_nan
from moespec.kernels.weights import KERNEL_FORMATS, dequantize_blocks, normalize_format, quantize_blocks
from moespec.model_shapes import format_bytes

BACKENDS = ("auto", "torch", "cpp")


@dataclass
class DenseWeights:
    """One weight matrix ``[N, K]`` (N outputs, K inputs) in a kernel format: ``values`` float32,
    bfloat16 or int8; ``scale`` the int8 block scales ``[N, K/32]`` (None for the float formats).
    Treat it as immutable (the CPU int8 packing is computed once and kept)."""

    fmt: str
    values: torch.Tensor
    scale: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.fmt = normalize_format(self.fmt)
        if self.values.dim() != 2:
            raise ValueError(f"dense weights: expected a [N, K] matrix, found shape {tuple(self.values.shape)}")
        if self.values.dtype != KERNEL_FORMATS[self.fmt]:
            raise TypeError(f"dense weights in {self.fmt}: expected {KERNEL_FORMATS[self.fmt]} values, "
                            f"found {self.values.dtype}")
        n, k = self.values.shape
        if self.fmt == "int8_b32":
            if self.scale is None or tuple(self.scale.shape) != (n, k // 32) or k % 32:
                found = None if self.scale is None else tuple(self.scale.shape)
                raise ValueError(f"int8_b32 dense weights [{n}, {k}] need K a multiple of 32 and scales "
                                 f"[{n}, {k // 32}]; found scales {found}")
        elif self.scale is not None:
            raise ValueError(f"scales are only taken with int8_b32 weights, not {self.fmt}")

    @classmethod
    def from_float(cls, weight: torch.Tensor, fmt: str) -> "DenseWeights":
        """``weight [N, K]`` (e.g. an ``nn.Linear``'s) stored in ``fmt``: cast (f32, bf16) or
        quantized per block of 32 along K (:func:`moespec.kernels.weights.quantize_blocks`)."""
        fmt = normalize_format(fmt)
        w = weight.detach()
        if fmt == "int8_b32":
            q, s = quantize_blocks(w)
            return cls(fmt, q.contiguous(), s.contiguous())
        return cls(fmt, w.to(KERNEL_FORMATS[fmt]).contiguous())

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(int(v) for v in self.values.shape)

    @property
    def nbytes(self) -> int:
        """The bytes one pass reads: the matrix in its format (int8_b32: 36 bytes per 32 values)."""
        n, k = self.shape
        return format_bytes(n * k, self.fmt)

    @property
    def device(self) -> torch.device:
        return self.values.device

    def dequantized(self, dtype=torch.float32) -> torch.Tensor:
        if self.fmt == "int8_b32":
            return dequantize_blocks(self.values, self.scale, dtype)
        return self.values.to(dtype)


def _activations(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """x as the kernels see it in ``fmt`` (module docstring), in float32."""
    if fmt == "bf16":
        return x.to(torch.bfloat16).float()
    if fmt == "int8_b32":
        return dequantize_blocks(*quantize_blocks(x))
    return x


def torch_dense(x: torch.Tensor, weights: DenseWeights) -> torch.Tensor:
    """The reference: ``x W^T`` in float32 from the format's activations and the dequantized W,
    with the non-finite rule of every backend (docs/kernels.md)."""
    y = _activations(x, weights.fmt) @ weights.dequantized(torch.float32).T
    return non_finite_rows_to_nan(y, x, None)


def dense_forward(x: torch.Tensor, weights: DenseWeights, backend: str = "auto") -> torch.Tensor:
    """``y = x W^T``: ``x [n, K]`` floating, ``weights`` :class:`DenseWeights` ``[N, K]``; returns
    ``[n, N]`` float32 (module docstring for the backends and precision)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    if not isinstance(weights, DenseWeights):
        raise TypeError(f"weights must be a DenseWeights, found {type(weights).__name__}")
    n_out, k = weights.shape
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != k or x.shape[0] < 1:
        found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected [n, K={k}] with n >= 1, found {found}")
    if not x.is_floating_point():
        raise TypeError(f"x: expected a floating dtype, found {x.dtype}")
    if x.device != weights.device:
        raise ValueError(f"x is on {x.device} but the weights are on {weights.device}")
    x = x.to(torch.float32).contiguous()
    backend = _resolve(backend, weights)
    if backend == "torch":
        return torch_dense(x, weights)
    fn, args = _cpp_plan(weights)
    return fn(x, *args)


def _resolve(backend: str, weights: DenseWeights) -> str:
    """``cpp`` or ``torch`` for ``backend`` (``auto``: ``cpp`` on CPU when the extension builds)."""
    if backend != "auto":
        return backend
    from moespec.kernels.dispatch import resolve_backend

    return "cpp" if resolve_backend("auto", weights.device) == "cpp" else "torch"


def _cpp_plan(weights: DenseWeights) -> tuple:
    """The C++ dense function and its weight arguments, kept on the weights object."""
    if weights.device.type != "cpu":
        raise ValueError(f"backend 'cpp' runs on CPU tensors; the weights are on {weights.device}")
    return weights._cache.get("cpp") or weights._cache.setdefault("cpp", (build.load_cpu().dense, _op_args(weights)))


def dense_call(weights: DenseWeights, backend: str = "auto"):
    """``dense_forward(x, weights, backend)`` as a function of ``x`` alone, the weights and the
    backend checked and resolved here, once (:mod:`moespec.engine.lean`). On the cpp backend it
    calls the C++ function directly: the caller passes contiguous float32 ``x [n, K]``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    if not isinstance(weights, DenseWeights):
        raise TypeError(f"weights must be a DenseWeights, found {type(weights).__name__}")
    if _resolve(backend, weights) == "cpp":
        fn, args = _cpp_plan(weights)
        return lambda x: fn(x, *args)
    return lambda x: torch_dense(x, weights)


def _op_args(weights: DenseWeights) -> tuple:
    """The weight arguments of the CPU op: int8 packed once into the kernels' interleaved layout."""
    if weights.fmt != "int8_b32":
        return weights.values, None
    packed = torch.ops.moespec.pack_int8_cpu(weights.values.unsqueeze(0)).squeeze(0).contiguous()
    return packed, weights.scale.float().contiguous()
