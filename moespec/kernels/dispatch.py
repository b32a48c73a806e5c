"""``expert_forward``: input checks and the choice of backend for the expert operation."""

from __future__ import annotations

import warnings

import numpy as np
import torch

from moespec.kernels import build, reference
from moespec.kernels.weights import ExpertWeights

KERNELS = ("slot", "dedup")
BACKENDS = ("auto", "torch", "cpp", "cuda")
_TORCH = {"slot": reference.torch_slot, "dedup": reference.torch_dedup}
_auto_cache: dict[str, str] = {}


def check_inputs(x, ids, weights, gates=None, id_values: bool = True):
    """Validate the arguments of :func:`expert_forward`; return ``(x, ids, gates)`` as contiguous
    float32 / int64 / float32 (or None) tensors. Raises ``ValueError`` / ``TypeError`` naming the
    argument, what was expected and what was found. ``id_values=False`` leaves the id values
    (range, duplicates) to the caller: the C++ op checks them itself, and doing it here as well cost
    ~0.15-0.2 ms per call once the caches are cold (numpy/torch code paths), 5-10 % of a one-token
    call; :func:`check_id_values` gives the same error then."""
    if not isinstance(weights, ExpertWeights):
        raise TypeError(f"weights must be an ExpertWeights, found {type(weights).__name__}")
    n_exp, hidden, _ = weights.shape
    dev = weights.device
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != hidden or x.shape[0] < 1:
        found = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"x: expected [n, H={hidden}] with n >= 1, found {found}")
    if not x.is_floating_point():
        raise TypeError(f"x: expected a floating dtype (float32, bfloat16, float16, float64), found {x.dtype}")
    n = x.shape[0]
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != n:
        found = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ids: expected [n={n}, m], found {found}")
    if ids.dtype not in (torch.int64, torch.int32, torch.int16, torch.uint8, torch.int8):
        raise TypeError(f"ids: expected an integer dtype (int64 or int32), found {ids.dtype}")
    m = ids.shape[1]
    if not 1 <= m <= n_exp:
        raise ValueError(f"ids: m={m} experts per token, expected 1 <= m <= N={n_exp}")
    for name, t in (("x", x), ("ids", ids), ("gates", gates)):
        if t is not None and t.device != dev:
            raise ValueError(f"{name} is on {t.device} but the weights are on {dev}")
    if ids.dtype != torch.int64 or not ids.is_contiguous():
        ids = ids.to(torch.int64).contiguous()
    if id_values:
        check_id_values(ids, n_exp)
    if gates is not None:
        if not isinstance(gates, torch.Tensor) or tuple(gates.shape) != (n, m):
            found = tuple(gates.shape) if isinstance(gates, torch.Tensor) else type(gates).__name__
            raise ValueError(f"gates: expected [n={n}, m={m}], found {found}")
        if not gates.is_floating_point():
            raise TypeError(f"gates: expected a floating dtype, found {gates.dtype}")
        gates = gates.to(torch.float32).contiguous()
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    return x, ids, gates


def check_id_values(ids: torch.Tensor, n_exp: int) -> None:
    """Every id in ``[0, n_exp)`` and each token's ``m`` ids distinct (top-k routing); ``ValueError``
    naming the first offending token otherwise. ``ids``: int64 ``[n, m]``."""
    m = ids.shape[1]
    lib, arr = (np, ids.numpy()) if ids.device.type == "cpu" else (torch, ids)
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= n_exp:
        raise ValueError(f"ids: expert ids must lie in [0, {n_exp}), found min {lo}, max {hi}")
    if m > 1:
        srt = lib.sort(arr, axis=1) if lib is np else arr.sort(dim=1).values
        dup = (srt[:, 1:] == srt[:, :-1]).any(1)
        if bool(dup.any()):
            t = int(dup.nonzero()[0][0])
            raise ValueError(f"ids: token {t} selects an expert twice ({ids[t].tolist()}); a token's m experts "
                             "must be distinct (top-k routing)")


def _op_weights(weights: ExpertWeights) -> tuple:
    """The weight tensors the compiled CPU ops read: int8 is repacked once per weights object
    into the CPU's interleaved layout (``pack_int8_cpu``; same bytes, see docs/kernels.md)."""
    if weights.fmt != "int8_b32" or weights.device.type != "cpu":
        return weights.tensors()
    packed = weights.cached("cpu_int8_packed", lambda: tuple(
        torch.ops.moespec.pack_int8_cpu(t) for t in (weights.gate, weights.up, weights.down)))
    return packed + (weights.gate_scale, weights.up_scale, weights.down_scale)


def resolve_backend(backend: str, device: torch.device) -> str:
    """The concrete backend for ``backend`` on ``device``; ``auto`` picks the fastest one that
    builds here: ``cpp`` on CPU, ``cuda`` on a GPU, else ``torch`` with a ``RuntimeWarning`` naming
    why the extension is missing (an error instead where ``MOESPEC_REQUIRE_BUILD`` requires it)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, found {backend!r}")
    if backend == "auto":
        want = "cuda" if device.type == "cuda" else "cpp"
        if want not in _auto_cache:
            _auto_cache[want] = want if build.available(want) else "torch"
            if _auto_cache[want] == "torch":  # said once per process, not at every call
                warnings.warn(f"backend='auto' uses the torch backend: the {want} extension is not available here "
                              f"({build.build_error(want)})", RuntimeWarning, stacklevel=3)
        return _auto_cache[want]
    if backend == "cpp" and device.type != "cpu":
        raise ValueError(f"backend 'cpp' runs on CPU tensors; the weights are on {device}")
    if backend == "cuda" and device.type != "cuda":
        raise ValueError(f"backend 'cuda' runs on CUDA tensors; the weights are on {device}")
    return backend


def expert_forward(x, ids, weights: ExpertWeights, gates=None, kernel: str = "slot",
                   backend: str = "auto") -> torch.Tensor:
    """The expert operation of one MoE layer (SwiGLU experts, see :mod:`moespec.kernels.reference`):
    ``y_t = sum_s g_ts W_down[e] (silu(W_gate[e] x_t) * W_up[e] x_t)`` with ``e = ids[t, s]``.

    Args:
        x: ``[n, H]`` floating activations (computed in float32).
        ids: ``[n, m]`` integer expert ids, each row ``m`` distinct values in ``[0, N)``.
        weights: the layer's experts (:class:`ExpertWeights`, format f32 / bf16 / int8_b32).
        gates: ``[n, m]`` routing weights; ``None`` means all ones.
        kernel: ``"slot"`` (one expert read per (token, slot) pair) or ``"dedup"`` (each distinct
            expert read once per pass).
        backend: ``"torch"``, ``"cpp"``, ``"cuda"`` or ``"auto"`` (fastest present for the device).
    Returns:
        ``[n, H]`` float32.
    """
    # The cpp backend's fast path: once a (weights, kernel, backend) combination has resolved to
    # the C++ kernel, its function and weight arguments are kept on the weights object and the
    # arguments go straight to it. The C++ function checks every argument before any work
    # (devices, dtypes, shapes, contiguity, id range, duplicate ids) and refuses with RuntimeError
    # (TypeError from pybind11 for non-tensors); the checked path below then converts what can be
    # converted or names the problem. Why: once the caches are cold (after the benchmark's flush,
    # or between layers) each Python step costs microseconds; the checked path took ~40-50 us more
    # than this one, 3 % of a one-token int8 OLMoE call (docs/kernels.md).
    plan = getattr(weights, "_cache", None)
    plan = plan.get(("cpp", kernel, backend)) if plan is not None else None
    if plan is not None:
        try:
            return plan[0](x, ids, gates, *plan[1])
        except (RuntimeError, TypeError):
            pass
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, found {kernel!r}")
    if not isinstance(weights, ExpertWeights):
        raise TypeError(f"weights must be an ExpertWeights, found {type(weights).__name__}")
    resolved = resolve_backend(backend, weights.device)
    if resolved == "cpp":
        return _cpp_forward(x, ids, weights, gates, kernel, backend)
    x, ids, gates = check_inputs(x, ids, weights, gates)
    if resolved == "torch":
        return _TORCH[kernel](x, ids, weights, gates)
    build.load_cuda()
    return _op(kernel)(x, ids, gates, *_op_weights(weights))


def _op(kernel: str):
    """The compiled op of ``kernel`` (CPU or CUDA by the tensors' device)."""
    return torch.ops.moespec.expert_slot if kernel == "slot" else torch.ops.moespec.expert_dedup


def _cpp_forward(x, ids, weights: ExpertWeights, gates, kernel: str, backend: str) -> torch.Tensor:
    """The checked path to the C++ CPU kernel, called through the extension module (pybind11)
    rather than the dispatcher (see csrc/cpu/registration.cpp): converts the arguments (dtypes, layouts) or
    names what is wrong as the other backends do, and keeps the function and the weight arguments
    on the weights object for :func:`expert_forward`'s fast path."""
    fn, wargs = _cpp_plan(weights, kernel, backend)
    x, ids, gates = check_inputs(x, ids, weights, gates, id_values=False)
    try:
        return fn(x, ids, gates, *wargs)
    except RuntimeError:
        check_inputs(x, ids, weights, gates)  # id range, duplicate ids: the usual ValueError
        raise


def _cpp_plan(weights: ExpertWeights, kernel: str, backend: str) -> tuple:
    """The C++ CPU function of ``kernel`` and its weight arguments, kept on the weights object."""
    return weights.cached(("cpp", kernel, backend), lambda: (
        getattr(build.load_cpu(), "expert_dedup" if kernel == "dedup" else "expert_slot"), _op_weights(weights)))


def expert_call(weights: ExpertWeights, kernel: str, backend: str = "auto"):
    """``expert_forward(x, ids, weights, gates, kernel, backend)`` as a function of ``(x, ids,
    gates)`` whose weights, kernel and backend are checked and resolved here, once (a model's
    decode loop, :mod:`moespec.engine.lean`). On the cpp backend it calls the C++ function
    directly, which still checks its tensor arguments (devices, dtypes, shapes, contiguity, id
    range) and raises ``RuntimeError``: the caller passes contiguous float32 x ``[n, H]``, int64
    ids and float32 gates ``[n, m]``. Other backends go through :func:`expert_forward`."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, found {kernel!r}")
    if not isinstance(weights, ExpertWeights):
        raise TypeError(f"weights must be an ExpertWeights, found {type(weights).__name__}")
    if resolve_backend(backend, weights.device) == "cpp":
        fn, wargs = _cpp_plan(weights, kernel, backend)
        return lambda x, ids, gates: fn(x, ids, gates, *wargs)
    return lambda x, ids, gates: expert_forward(x, ids, weights, gates=gates, kernel=kernel, backend=backend)
