"""Speculation under geometric acceptance for any positive step time (paper 1, Secs. 1 and 3.2,
Appendix B.1).

A step drafts k tokens and verifies k + 1 in one pass; each draft survives with probability a,
in order, until the first rejection. ``V`` is the step-time vector (V(0), ..., V(kmax)).
"""

from __future__ import annotations

import numpy as np

from ._checks import (check_acceptance, check_draft_length, check_step_times, harmonize,
                      is_scalar, scalar_out)
from .polynomials import geometric_prefix, geometric_sum


def expected_tokens(a, k):
    """G_a(k) = 1 + a + ... + a^k, the expected tokens a step of draft length k emits
    (paper 1, Sec. 1; eq. B.1).

    ``a`` in [0, 1) and integer ``k >= 0``, scalars or broadcastable arrays. Exact for Fractions.
    """
    arr = check_acceptance(a)
    karr = np.asarray(k)
    if karr.dtype.kind not in "iu":
        raise TypeError(f"k: draft length must be an integer (or integer array); found {k!r}")
    if np.any(karr < 0):
        raise ValueError(f"k: draft length must be >= 0; found {karr[karr < 0].flat[0]}")
    out = geometric_sum(arr, karr)
    return scalar_out(out, is_scalar(a) and is_scalar(k))


def throughput(V, a):
    """T_a(k) = G_a(k) / V(k) for k = 0..kmax (paper 1, Sec. 1).

    Returns an array [..., kmax+1] (leading axes those of ``a``); for scalar ``a``, a 1-D array.
    Exact (object array of Fractions) when ``V`` and ``a`` are exact.
    """
    V, arr = harmonize(check_step_times(V), check_acceptance(a))
    return geometric_prefix(arr, len(V) - 1) / V


def best_draft_length(V, a):
    """k*(a), the smallest maximizer of T_a(k) over k = 0..kmax (paper 1, Sec. 1).

    ``a`` may be an array (result: integer array of its shape). Floats: ties are broken by
    float comparison; pass Fractions for exact ties (e.g. at a step point).
    """
    V, arr = harmonize(check_step_times(V), check_acceptance(a))
    if arr.dtype == object:
        # exact: argmax returns the first maximal index, i.e. the smallest maximizer.
        out = np.argmax(geometric_prefix(arr, len(V) - 1) / V, axis=-1)
    else:
        # floats: one pass over k keeping the running best (strict ">" keeps the smallest
        # maximizer); no [..., kmax+1] array, about 3x faster on 10^5 values.
        inv = 1.0 / V
        out = np.zeros(arr.shape, dtype=np.int64)
        best = np.full(arr.shape, inv[0])
        power, total = np.ones_like(arr), np.ones_like(arr)
        for k in range(1, len(V)):
            power *= arr
            total += power
            T = total * inv[k]
            out = np.where(T > best, k, out)
            np.maximum(best, T, out=best)
    return int(out) if is_scalar(a) else np.asarray(out, dtype=np.int64)


def speedup(V, a, k):
    """T_a(k) / T_a(0) = G_a(k) V(0) / V(k), the speedup of draft length k over plain decoding
    (paper 1, eq. (9); eq. B.17)."""
    V, arr = harmonize(check_step_times(V), check_acceptance(a))
    k = check_draft_length(k, len(V) - 1)
    return scalar_out(geometric_sum(arr, np.int64(k)) * V[0] / V[k], is_scalar(a))


def faster_than_plain(V, a, k):
    """True where draft length k has higher throughput than plain decoding:
    V(k) - V(0) < (a + ... + a^k) V(0) (paper 1, eq. (8); eq. B.2)."""
    V, arr = harmonize(check_step_times(V), check_acceptance(a))
    k = check_draft_length(k, len(V) - 1, min_k=1)
    out = V[k] - V[0] < (geometric_sum(arr, np.int64(k)) - 1) * V[0]
    return bool(out) if is_scalar(a) else np.asarray(out, dtype=bool)


def first_threshold(V):
    """a0 = V(1)/V(0) - 1: one draft is faster than none exactly when a > a0, equal at a = a0
    (paper 1, Sec. 3.2; eq. B.4). May lie outside [0, 1) (then always / never)."""
    V = check_step_times(V, min_len=2)
    return V[1] / V[0] - 1
