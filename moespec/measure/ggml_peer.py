"""ctypes wrapper over ``libggml_peer.so``: ggml's CPU MUL_MAT_ID expert FFN as a peer kernel.

    from moespec.measure.ggml_peer import GgmlExperts, available
    peer = GgmlExperts.from_weights(w, fmt="q8_0", threads=2)         # w: moespec.kernels.ExpertWeights
    y = peer(x, ids, gates)                                           # [n, H] float32, like expert_forward

The peer computes what llama.cpp's ``build_moe_ffn`` computes for a SwiGLU MoE layer (see
``driver.cpp``): ``ggml_mul_mat_id`` for gate and up, ``ggml_swiglu_split``, ``ggml_mul_mat_id`` for
down, the routing weights, and the sum over slots, on ggml's CPU backend. ggml's MUL_MAT_ID groups
the pass's rows by expert, so each distinct expert is read once per matrix: a deduplicating kernel.

Formats: ``f32``, ``bf16`` (ggml's fp32->bf16 rounding, nearest even) and ``q8_0`` (ggml's own
quantizer: one scale per 32 values, like moespec's ``int8_b32``, but the scale is stored as fp16,
34 bytes per 32 weights against int8_b32's 36). Build the library first with
``.venv/bin/python benchmarks/ggml_peer/build.py`` (the build script and ``driver.cpp`` stay with
the benchmarks); :func:`available` says whether it is there.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch

from moespec import paths
from moespec.kernels.weights import normalize_format as kernel_format

#: ggml formats and the code driver.cpp takes; moespec's names map onto them.
FORMATS = {"f32": 0, "bf16": 1, "q8_0": 2}
#: moespec's format -> the peer's format of the same weights.
FROM_MOESPEC = {"f32": "f32", "bf16": "bf16", "int8_b32": "q8_0"}

_c_int64, _c_float_p = ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
_lib = None


class PeerNotBuilt(RuntimeError):
    """``libggml_peer.so`` is missing or cannot be loaded; the message says how to build it."""


def library_path() -> Path:
    return paths.build_dir() / "ggml" / "libggml_peer.so"


def available() -> bool:
    """Whether the peer library is built and loads here (builds nothing)."""
    try:
        load()
    except PeerNotBuilt:
        return False
    return True


def load() -> ctypes.CDLL:
    """The loaded library (once per process); :class:`PeerNotBuilt` when absent."""
    global _lib
    if _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        raise PeerNotBuilt(f"the ggml peer is not built ({path} missing); build it with "
                           ".venv/bin/python benchmarks/ggml_peer/build.py (needs cmake, a C/C++ "
                           "compiler and PyPI access for the llama-cpp-python sdist)")
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise PeerNotBuilt(f"cannot load {path}: {exc}; rebuild with benchmarks/ggml_peer/build.py") from exc
    lib.ggml_peer_error.restype = ctypes.c_char_p
    lib.ggml_peer_error.argtypes = [ctypes.c_void_p]
    lib.ggml_peer_version.restype = ctypes.c_char_p
    lib.ggml_peer_expert_bytes.restype = _c_int64
    lib.ggml_peer_expert_bytes.argtypes = [ctypes.c_int, _c_int64, _c_int64]
    lib.ggml_peer_create.restype = ctypes.c_void_p
    lib.ggml_peer_create.argtypes = [ctypes.c_int, _c_int64, _c_int64, _c_int64, ctypes.c_int, ctypes.c_int,
                                     _c_float_p, _c_float_p, _c_float_p]
    lib.ggml_peer_run.restype = ctypes.c_int
    lib.ggml_peer_run.argtypes = [ctypes.c_void_p, _c_int64, _c_int64, ctypes.POINTER(ctypes.c_int32),
                                  _c_float_p, _c_float_p, _c_float_p]
    lib.ggml_peer_weight_bytes.restype = _c_int64
    lib.ggml_peer_weight_bytes.argtypes = [ctypes.c_void_p]
    lib.ggml_peer_destroy.restype = None
    lib.ggml_peer_destroy.argtypes = [ctypes.c_void_p]
    _lib = lib
    return lib


def version() -> str:
    """ggml's version and commit string and the CPU features it was built with."""
    return load().ggml_peer_version().decode()


def normalize_format(fmt: str) -> str:
    """ggml's name of a format: one of :data:`FORMATS`, or a moespec name or alias
    (:func:`moespec.kernels.normalize_format`) mapped by :data:`FROM_MOESPEC` (int8_b32 -> q8_0)."""
    key = str(fmt).lower()
    if key in FORMATS:
        return key
    try:
        return FROM_MOESPEC[kernel_format(key)]
    except ValueError:
        raise ValueError(f"unsupported ggml peer format {fmt!r}; expected one of {sorted(FORMATS)} or a moespec "
                         f"format ({sorted(FROM_MOESPEC)}, with its aliases)") from None


def expert_bytes(fmt: str, hidden_size: int, intermediate_size: int) -> int:
    """Bytes ggml stores for one expert (gate + up + down) in ``fmt`` (q8_0: 34 per 32 weights)."""
    return int(load().ggml_peer_expert_bytes(FORMATS[normalize_format(fmt)], hidden_size, intermediate_size))


def _ptr(t: torch.Tensor, ctype):
    return ctypes.cast(t.data_ptr(), ctypes.POINTER(ctype))


def _f32(t, name: str, shape: tuple) -> torch.Tensor:
    t = torch.as_tensor(t)
    if not (t.is_floating_point() and t.device.type == "cpu"):
        raise ValueError(f"{name}: expected a floating-point CPU tensor, found {t.dtype} on {t.device}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: expected shape {shape}, found {tuple(t.shape)}")
    return t.to(torch.float32).contiguous()


class GgmlExperts:
    """One MoE layer's experts held by ggml (weights allocated once), callable like
    ``moespec.kernels.expert_forward``. Build with :meth:`from_weights` or :meth:`from_tensors`."""

    def __init__(self, handle: int, fmt: str, shape: tuple[int, int, int], threads: int, hugepages: bool):
        self._handle = handle
        self.fmt = fmt
        self.shape = shape  # (N, H, I)
        self.threads = threads
        self.hugepages = hugepages

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, gate, up, down, fmt: str = "f32", threads: int | None = None,
                     hugepages: bool | None = None) -> "GgmlExperts":
        """Experts from float tensors ``gate, up [N, I, H]`` and ``down [N, H, I]`` stored in ``fmt``
        (``f32``, ``bf16`` or ``q8_0``) with ggml's own converters.

        ``threads``: ggml's thread count (default ``torch.get_num_threads()``, as moespec's cpp
        kernels use). ``hugepages``: madvise the weights for transparent huge pages; default: as
        torch's allocations in this process (``THP_MEM_ALLOC_ENABLE=1``, which moespec's benchmark
        sets), so the peer's weights sit on the same page size as moespec's.
        """
        lib = load()
        fmt = normalize_format(fmt)
        gate_t = torch.as_tensor(gate)
        if gate_t.dim() != 3:
            raise ValueError(f"gate: expected [N, I, H], found shape {tuple(gate_t.shape)}")
        n_exp, inter, hidden = gate_t.shape
        threads = torch.get_num_threads() if threads is None else int(threads)
        if hugepages is None:
            hugepages = os.environ.get("THP_MEM_ALLOC_ENABLE") == "1"
        g = _f32(gate_t, "gate", (n_exp, inter, hidden))
        u = _f32(up, "up", (n_exp, inter, hidden))
        d = _f32(down, "down", (n_exp, hidden, inter))
        handle = lib.ggml_peer_create(FORMATS[fmt], n_exp, hidden, inter, threads, int(bool(hugepages)),
                                      _ptr(g, ctypes.c_float), _ptr(u, ctypes.c_float), _ptr(d, ctypes.c_float))
        if not handle:
            raise ValueError(f"ggml peer: {lib.ggml_peer_error(None).decode()}")
        return cls(handle, fmt, (n_exp, hidden, inter), threads, bool(hugepages))

    @classmethod
    def from_weights(cls, w, fmt: str | None = None, threads: int | None = None,
                     hugepages: bool | None = None) -> "GgmlExperts":
        """The same experts as a ``moespec.kernels.ExpertWeights`` ``w``, converted from its exact
        values (float32) by ggml. ``fmt`` defaults to ``w``'s own: f32 -> f32, bf16 -> bf16
        (exact), int8_b32 -> q8_0 (ggml re-quantizes the dequantized int8 weights; with a block
        maximum of 127 the int8 values come back unchanged and only the scale is rounded to fp16)."""
        fmt = FROM_MOESPEC[w.fmt] if fmt is None else normalize_format(fmt)
        w = w.to("cpu")
        if w.fmt == "f32":
            gate, up, down = w.gate, w.up, w.down  # no copy
        else:
            gate, up, down = w.dequantized(dtype=torch.float32)
        return cls.from_tensors(gate, up, down, fmt, threads=threads, hugepages=hugepages)

    # --- properties -----------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.shape[1]

    @property
    def intermediate_size(self) -> int:
        return self.shape[2]

    @property
    def bytes_per_expert(self) -> int:
        """Bytes ggml reads for one expert (gate + up + down rows) in this format."""
        return expert_bytes(self.fmt, self.hidden_size, self.intermediate_size)

    @property
    def total_bytes(self) -> int:
        return int(load().ggml_peer_weight_bytes(self._live()))

    # --- the op ---------------------------------------------------------------------------
    def __call__(self, x, ids, gates=None, out: torch.Tensor | None = None) -> torch.Tensor:
        """``y [n, H]`` float32: ``y_t = sum_s g_ts W_down[e] (silu(W_gate[e] x_t) * W_up[e] x_t)``,
        ``e = ids[t, s]``, gates default 1. ``x [n, H]`` float, ``ids [n, m]`` integer in ``[0, N)``,
        ``gates [n, m]`` float or None; ``out`` (float32 ``[n, H]``, contiguous) avoids an allocation."""
        handle = self._live()
        ids_t = torch.as_tensor(ids)
        if ids_t.dim() != 2 or ids_t.is_floating_point() or ids_t.is_complex() or ids_t.dtype == torch.bool:
            raise ValueError(f"ids: expected an integer [n, m] tensor, found {ids_t.dtype} {tuple(ids_t.shape)}")
        n, m = ids_t.shape
        xt = _f32(x, "x", (n, self.hidden_size))
        idt = ids_t.to(device="cpu", dtype=torch.int32).contiguous()
        gt = None if gates is None else _f32(gates, "gates", (n, m))
        if out is None:
            out = torch.empty(n, self.hidden_size, dtype=torch.float32)
        elif out.dtype != torch.float32 or tuple(out.shape) != (n, self.hidden_size) or not out.is_contiguous():
            raise ValueError(f"out: expected contiguous float32 {(n, self.hidden_size)}, found "
                             f"{out.dtype} {tuple(out.shape)}")
        lib = load()
        rc = lib.ggml_peer_run(handle, n, m, _ptr(idt, ctypes.c_int32), _ptr(xt, ctypes.c_float),
                               None if gt is None else _ptr(gt, ctypes.c_float), _ptr(out, ctypes.c_float))
        if rc != 0:
            raise ValueError(f"ggml peer: {lib.ggml_peer_error(handle).decode()}")
        return out

    def per_slot(self, x, ids, gates=None) -> torch.Tensor:
        """The per-slot counterpart of ggml's MUL_MAT_ID (which groups a pass's rows by expert, so
        reads each distinct expert once: a deduplicating kernel, docs/ggml_peer.md): the pass's
        tokens one MUL_MAT_ID call each, as llama.cpp's decode runs them one token per step, so the
        pass reads n x m experts (a token's m experts are distinct). Same result as :meth:`__call__`
        row by row; ``y [n, H]`` float32."""
        ids_t = torch.as_tensor(ids)
        if ids_t.dim() != 2:
            raise ValueError(f"ids: expected an integer [n, m] tensor, found {ids_t.dtype} {tuple(ids_t.shape)}")
        n = ids_t.shape[0]
        xt = _f32(x, "x", (n, self.hidden_size))
        gt = None if gates is None else torch.as_tensor(gates)
        out = torch.empty(n, self.hidden_size, dtype=torch.float32)
        for t in range(n):
            self(xt[t:t + 1], ids_t[t:t + 1], None if gt is None else gt[t:t + 1], out=out[t:t + 1])
        return out

    # --- lifetime -------------------------------------------------------------------------
    def _live(self) -> int:
        if not self._handle:
            raise RuntimeError("this GgmlExperts was closed")
        return self._handle

    def close(self) -> None:
        """Free the weights, graphs and thread pool now (else at garbage collection)."""
        if self._handle and _lib is not None:
            _lib.ggml_peer_destroy(self._handle)
        self._handle = None

    def __del__(self):
        self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self) -> str:
        return (f"GgmlExperts(fmt={self.fmt!r}, N={self.num_experts}, H={self.hidden_size}, "
                f"I={self.intermediate_size}, threads={self.threads}, hugepages={self.hugepages})")
