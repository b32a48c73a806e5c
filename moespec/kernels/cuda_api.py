"""The CUDA kernels' C launch API (``csrc/cuda/moespec_cuda.h``) through ctypes: the execution path
and launch choices (``moespec_cuda_tuning``) and the launch plan of a call (``moespec_cuda_plan``).

The torch ops always run the current tuning; benchmarks switch it between calls (the legacy
three-launch path against the fused two-launch one, programmatic dependent launch on or off) and
record the plan beside their timings. The same structures drive the CPU emulation of the kernels
in ``tests/test_cuda_emulated.py``. Field order mirrors the header (a test compares them).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from moespec.kernels import build

#: ``enum moespec_path``.
PATHS = {"auto": 0, "legacy": 1, "fused": 2}
#: ``MOESPEC_ERR_TUNING``.
ERR_TUNING = -9


class ExpertArgs(ctypes.Structure):
    """``moespec_expert_args``."""
    _fields_ = [("n", ctypes.c_int), ("m", ctypes.c_int), ("N", ctypes.c_int), ("H", ctypes.c_int),
                ("I", ctypes.c_int), ("x", ctypes.c_void_p), ("ids", ctypes.c_void_p), ("gates", ctypes.c_void_p),
                ("w_fmt", ctypes.c_int), ("w_gate", ctypes.c_void_p), ("w_up", ctypes.c_void_p),
                ("w_down", ctypes.c_void_p), ("s_gate", ctypes.c_void_p), ("s_up", ctypes.c_void_p),
                ("s_down", ctypes.c_void_p), ("y", ctypes.c_void_p), ("workspace", ctypes.c_void_p),
                ("workspace_bytes", ctypes.c_size_t)]


class Tuning(ctypes.Structure):
    """``moespec_cuda_tuning``."""
    _fields_ = [(f, ctypes.c_int) for f in ("path", "pdl", "ring_gu", "ring_dn", "dn_warps", "gu_blocks_per_sm")]


class Plan(ctypes.Structure):
    """``moespec_cuda_plan``."""
    _fields_ = [(f, ctypes.c_int) for f in (
        "path", "launches", "tile", "grid_gu_x", "grid_gu_y", "iters_gu", "grid_dn_x", "grid_dn_y", "iters_dn",
        "threads_dn", "smem_gu", "smem_dn", "ring_gu", "ring_dn", "pdl")]

    def as_dict(self) -> dict:
        d = {f: getattr(self, f) for f, _ in self._fields_}
        d["path"] = {v: k for k, v in PATHS.items()}.get(d["path"], d["path"])
        return d


@dataclass(frozen=True)
class TuningChoice:
    """One set of launch choices, as a benchmark names them (``legacy``, ``fused``, ``fused-nopdl``...)."""

    path: str = "auto"
    pdl: int = -1
    ring_gu: int = 0
    ring_dn: int = 0
    dn_warps: int = 0
    gu_blocks_per_sm: int = 0

    def struct(self) -> Tuning:
        if self.path not in PATHS:
            raise ValueError(f"path must be one of {sorted(PATHS)}, got {self.path!r}")
        return Tuning(path=PATHS[self.path], pdl=self.pdl, ring_gu=self.ring_gu, ring_dn=self.ring_dn,
                      dn_warps=self.dn_warps, gu_blocks_per_sm=self.gu_blocks_per_sm)


def weights_format(fmt: str) -> int:
    """``enum moespec_wfmt`` of an ExpertWeights format name."""
    try:
        return {"f32": 0, "bf16": 1, "int8_b32": 2}[fmt]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}; expected f32, bf16 or int8_b32") from None


def expert_args(x, ids, weights, gates, y) -> ExpertArgs:
    """The argument struct for contiguous tensors (x float32 [n, H], ids int64 [n, m], gates
    float32 [n, m] or None, y float32 [n, H]) and an ExpertWeights; pointers are the tensors'
    data pointers, so the tensors must outlive the call."""
    ptr = lambda t: None if t is None else t.data_ptr()  # noqa: E731
    w = weights
    return ExpertArgs(n=x.shape[0], m=ids.shape[1], N=w.num_experts, H=w.hidden_size, I=w.intermediate_size,
                      x=ptr(x), ids=ptr(ids), gates=ptr(gates), w_fmt=weights_format(w.fmt), w_gate=ptr(w.gate),
                      w_up=ptr(w.up), w_down=ptr(w.down), s_gate=ptr(w.gate_scale), s_up=ptr(w.up_scale),
                      s_down=ptr(w.down_scale), y=ptr(y))


def status_message(lib, status: int) -> str:
    lib.moespec_cuda_status_string.restype = ctypes.c_char_p
    return lib.moespec_cuda_status_string(status).decode()


def set_tuning(lib, choice: TuningChoice) -> None:
    """Make ``choice`` the library's tuning; ValueError naming the range when it is refused."""
    st = lib.moespec_cuda_set_tuning(ctypes.byref(choice.struct()))
    if st != 0:
        raise ValueError(f"{choice}: {status_message(lib, st)}")


def get_tuning(lib) -> Tuning:
    t = Tuning()
    lib.moespec_cuda_get_tuning(ctypes.byref(t))
    return t


def get_plan(lib, x, ids, weights, kernel: str) -> Plan:
    """How a call with these tensors and ``kernel`` ('slot' or 'dedup') would run under the current
    tuning on the current device (no launch)."""

    if kernel not in ("slot", "dedup"):
        raise ValueError(f"kernel must be 'slot' or 'dedup', got {kernel!r}")
    x = x.float().contiguous()
    a = expert_args(x, ids.to(torch.int64).contiguous(), weights, None, x)
    plan = Plan()
    st = lib.moespec_cuda_get_plan(ctypes.byref(a), {"slot": 0, "dedup": 1}[kernel], ctypes.byref(plan))
    if st != 0:
        raise RuntimeError(f"moespec_cuda_get_plan: {status_message(lib, st)}")
    return plan


def loaded_library() -> ctypes.CDLL:
    """The CUDA extension that :func:`moespec.kernels.build.load_cuda` loaded into this process
    (the same handle: tuning set here applies to ``torch.ops.moespec.*`` on CUDA tensors)."""


    build.load_cuda()
    paths = [p for p in torch.ops.loaded_libraries if "moespec_cuda" in str(p)]
    if not paths:
        raise RuntimeError("the moespec CUDA extension is not among torch.ops.loaded_libraries")
    return ctypes.CDLL(sorted(paths)[-1])
