"""Seeded synthetic routing processes, each returning a :class:`RoutingTrace`.

* :func:`uniform`: independent uniform routing, each token-layer set a uniform m-subset of N;
  rho(n) = 1 - q^(n-1), q = 1 - m/N (paper 1, Sec. 2).
* :func:`periodic`: a repeated pattern of expert sets started at a uniformly random phase, so the
  process is stationary (paper 1, App. B.2, "No single threshold": patterns 01, 00012, 00102 with
  N = 3, m = 1, where each symbol is one expert). With m > 1, symbol s stands for the expert set
  {s m, ..., s m + m - 1}, so the reuse of the pattern is unchanged.
* :func:`sticky`: a stationary Markov process with reuse set by parameters. Each document and
  layer routes inside a working set H of h experts (a uniform h-subset of N). At each token every
  slot keeps its expert with probability p; the other slots draw distinct experts uniformly from
  H minus the current set. The process is stationary from a uniform m-subset of H, and the
  indicator "expert e is selected" is a two-state Markov chain (stay p, enter b = m(1-p)/(h-m)),
  which gives the closed form :func:`sticky_reuse`:  rho(n) = 1 - (1-p)(1-b)^(n-2), n >= 2;
  rho(2) = p. With h = N and p = m/N it is the uniform curve 1 - q^(n-1).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from moespec.routing.trace import RoutingTrace


def _lengths(num_docs: int, doc_len: int | Sequence[int]) -> np.ndarray:
    if isinstance(doc_len, (int, np.integer)):
        lengths = np.full(int(num_docs), int(doc_len))
    else:
        lengths = np.asarray(doc_len, dtype=np.int64)
        if lengths.shape != (num_docs,):
            raise ValueError(f"doc_len: expected one length per document ({num_docs}), found {lengths.shape}")
    if num_docs < 1 or np.any(lengths < 1):
        raise ValueError(f"need num_docs >= 1 and every document length >= 1, found {num_docs}, {lengths.min()}")
    return lengths


def _check_shape(num_layers: int, num_experts: int, top_k: int) -> None:
    if num_layers < 1 or not 1 <= top_k < num_experts:
        raise ValueError(f"need L >= 1 and 1 <= m < N, found L={num_layers}, m={top_k}, N={num_experts}")


def uniform(num_docs: int, doc_len: int | Sequence[int], num_layers: int, num_experts: int,
            top_k: int, seed: int = 0, **trace_kw) -> RoutingTrace:
    """Independent uniform routing: every S_{l,t} a uniform m-subset of the N experts."""
    _check_shape(num_layers, num_experts, top_k)
    lengths = _lengths(num_docs, doc_len)
    rng = np.random.default_rng(seed)
    docs = []
    for T in lengths:
        # the m smallest of N uniform keys form a uniform m-subset; chunked to bound memory
        parts = []
        for lo in range(0, int(T), 8192):
            keys = rng.random((min(8192, int(T) - lo), num_layers, num_experts), dtype=np.float32)
            parts.append(np.argpartition(keys, top_k - 1, axis=-1)[..., :top_k])
        docs.append(np.concatenate(parts))
    trace_kw.setdefault("source", f"synthetic uniform (m/N = {top_k}/{num_experts})")
    trace_kw.setdefault("meta", {"process": "uniform", "seed": seed})
    return RoutingTrace(docs, num_experts, **trace_kw)


def periodic(pattern: str | Sequence[int], num_docs: int, doc_len: int | Sequence[int],
             num_experts: int | None = None, top_k: int = 1, num_layers: int = 1, seed: int = 0,
             **trace_kw) -> RoutingTrace:
    """Repeat ``pattern`` (e.g. "00102") from a uniformly random phase per document and layer.

    Symbol s selects experts {s m, ..., s m + m - 1}; N defaults to m (max symbol + 1).
    """
    symbols = np.array([int(c) for c in pattern], dtype=np.int64)
    if symbols.size == 0 or symbols.min() < 0:
        raise ValueError(f"pattern must be a non-empty sequence of symbols >= 0, found {pattern!r}")
    need = top_k * (int(symbols.max()) + 1)
    num_experts = need if num_experts is None else int(num_experts)
    if num_experts < need:
        raise ValueError(f"pattern {pattern!r} with m = {top_k} needs N >= {need}, found N = {num_experts}")
    lengths = _lengths(num_docs, doc_len)
    rng = np.random.default_rng(seed)
    period = symbols.size
    docs = []
    for T in lengths:
        phase = rng.integers(0, period, size=num_layers)
        sym = symbols[(np.arange(T)[:, None] + phase[None, :]) % period]          # [T, L]
        docs.append(sym[..., None] * top_k + np.arange(top_k))                     # [T, L, m]
    label = "".join(str(s) for s in symbols)
    trace_kw.setdefault("source", f"synthetic periodic pattern {label}")
    trace_kw.setdefault("meta", {"process": "periodic", "pattern": label, "seed": seed})
    return RoutingTrace(docs, num_experts, **trace_kw)


def sticky_reuse(n_max: int, keep: float, top_k: int, working_set: int) -> np.ndarray:
    """Exact rho(n), n = 1..n_max, of the sticky process (module docstring): ``[n_max]``."""
    p, m, h = float(keep), top_k, working_set
    b = m * (1 - p) / (h - m)
    n = np.arange(1, n_max + 1)
    rho = 1 - (1 - p) * (1 - b) ** np.maximum(n - 2, 0)
    rho[0] = 0.0
    return rho


def calibrate_sticky(rho2: float, num_experts: int, top_k: int, rho_n: float | None = None,
                     n: int = 9) -> tuple[float, int]:
    """(keep p, working set h) so that the sticky process has rho(2) = ``rho2`` exactly and, if
    ``rho_n`` is given, rho(n) as close to it as an integer h in [2m, N] allows (else h = N)."""
    _check_shape(1, num_experts, top_k)
    if not 0 <= rho2 < 1:
        raise ValueError(f"rho2 must be in [0, 1), found {rho2}")
    lo, hi = 2 * top_k, num_experts
    if lo > hi:
        raise ValueError(f"the sticky process needs N >= 2m, found N = {num_experts}, m = {top_k}")
    if rho_n is None:
        return float(rho2), hi
    if not n >= 3 or not 0 <= rho_n < 1:
        raise ValueError(f"need n >= 3 and rho_n in [0, 1), found n = {n}, rho_n = {rho_n}")
    ratio = (1 - rho_n) / (1 - rho2)
    if ratio >= 1:   # no growth of reuse beyond rho(2) is possible; the largest h comes closest
        return float(rho2), hi
    b = 1 - ratio ** (1 / (n - 2))
    h_cont = top_k + top_k * (1 - rho2) / b
    cands = {min(max(c, lo), hi) for c in (math.floor(h_cont), math.ceil(h_cont))}
    best = min(cands, key=lambda h: abs(sticky_reuse(n, rho2, top_k, h)[-1] - rho_n))
    return float(rho2), int(best)


def sticky(num_docs: int, doc_len: int | Sequence[int], num_layers: int, num_experts: int,
           top_k: int, keep: float, working_set: int | None = None, seed: int = 0,
           **trace_kw) -> RoutingTrace:
    """The stationary sticky process (module docstring) with rho(2) = ``keep``.

    ``working_set`` h in [2m, N] (default N) sets how fast reuse grows with n: rho(n) is
    :func:`sticky_reuse`. Documents and layers are independent.
    """
    _check_shape(num_layers, num_experts, top_k)
    if num_experts > np.iinfo(np.int16).max:
        raise ValueError(f"sticky supports N <= 32767, found {num_experts}")
    h = num_experts if working_set is None else int(working_set)
    m = top_k
    if not 2 * m <= h <= num_experts:
        raise ValueError(f"working_set must be in [2m, N] = [{2 * m}, {num_experts}], found {h}")
    if not 0 <= keep <= 1:
        raise ValueError(f"keep must be in [0, 1], found {keep}")
    lengths = _lengths(num_docs, doc_len)
    rng = np.random.default_rng(seed)
    B, Tmax = len(lengths) * num_layers, int(lengths.max())
    rows = np.arange(B)[:, None]

    # working set per (document, layer): the first h of a random permutation of the N experts
    H = np.argsort(rng.random((B, num_experts)), axis=1)[:, :h].astype(np.int16)
    local = np.empty((Tmax, B, m), dtype=np.int16)   # ids inside H (N <= 32767 here)
    local[0] = np.argsort(rng.random((B, h)), axis=1)[:, :m]  # stationary start: uniform m-subset
    for t in range(1, Tmax):
        prev = local[t - 1]
        keys = rng.random((B, h))
        keys[rows, prev] = 2.0                 # never redraw a current expert
        fresh = np.argsort(keys, axis=1)[:, :m]  # uniform random order of H \ S_t (h - m >= m)
        local[t] = np.where(rng.random((B, m)) < keep, prev, fresh)
    ids = np.take_along_axis(H[None], local, axis=2)          # [Tmax, B, m] global ids
    ids = ids.reshape(Tmax, len(lengths), num_layers, m).transpose(1, 0, 2, 3)
    docs = [ids[d, :T] for d, T in enumerate(lengths)]
    trace_kw.setdefault("source", f"synthetic sticky (rho(2) = {keep:.3f}, h = {h})")
    trace_kw.setdefault("meta", {"process": "sticky", "keep": keep, "working_set": h, "seed": seed})
    return RoutingTrace(docs, num_experts, **trace_kw)


def calibrated(spec, targets: dict[int, float], num_docs: int, doc_len: int | Sequence[int],
               seed: int = 0, fmt: str | None = None) -> RoutingTrace:
    """A sticky trace with the shape of ``spec`` (a :class:`moespec.model_shapes.MoESpec`: N, m, L and
    bytes w_l in ``fmt``) calibrated to ``targets`` = {2: rho(2)[, n: rho(n)]} (the largest n
    other than 2 sets the working set). The trace's source says it is synthetic and calibrated."""
    if 2 not in targets:
        raise ValueError(f"targets must include rho(2), found n = {sorted(targets)}")
    others = [n for n in targets if n > 2]
    n = max(others) if others else None
    keep, h = calibrate_sticky(targets[2], spec.num_experts, spec.top_k,
                               rho_n=targets[n] if n else None, n=n or 9)
    cal = "rho(2)" + (f" and rho({n})" if n else "")
    return sticky(num_docs, doc_len, spec.num_moe_layers, spec.num_experts, spec.top_k, keep, h,
                  seed=seed, expert_bytes=spec.layer_expert_bytes(fmt), model=spec.name,
                  source=f"synthetic {spec.paper_label or spec.name}, calibrated to paper 1 {cal}",
                  meta={"process": "sticky", "keep": keep, "working_set": h, "seed": seed,
                        "calibration_targets": {str(k): v for k, v in targets.items()},
                        "targets_from": "paper 1 published layer means (data/paper_reference)",
                        "format": fmt or spec.default_format})
