"""Geometric sums P_n(x) = 1 + x + ... + x^n (paper 1, Appendix B) and a vectorized bisection.

P_n is evaluated by repeated multiply-add rather than by (1 - x^(n+1))/(1 - x): the closed form
loses relative accuracy as x -> 1, and the loop stays exact on Fractions.
"""

from __future__ import annotations

import numpy as np


def geometric_prefix(x: np.ndarray, kmax: int) -> np.ndarray:
    """[..., kmax+1] array whose last axis is P_0(x), ..., P_kmax(x) (so G_x(k) = P_k(x), eq. B.1)."""
    out = np.empty(x.shape + (kmax + 1,), dtype=x.dtype)
    power = np.ones_like(x)
    total = np.ones_like(x)
    out[..., 0] = total
    for j in range(1, kmax + 1):
        power = power * x
        total = total + power
        out[..., j] = total
    return out


def geometric_sum(x: np.ndarray, n: np.ndarray) -> np.ndarray:
    """P_n(x) elementwise for broadcast arrays ``x`` and integer ``n >= 0`` (eq. B.23's P)."""
    x, n = np.broadcast_arrays(x, n)
    nmax = int(n.max()) if n.size else 0
    power = np.ones_like(x)
    total = np.ones_like(x)
    out = np.ones_like(x)
    for j in range(1, nmax + 1):
        power = power * x
        total = total + power
        out = np.where(n == j, total, out)
    return out


def bisect_increasing(f, target: np.ndarray, lo: float = 0.0, hi: float = 1.0,
                      tol: float = 1e-15, max_iter: int = 200) -> np.ndarray:
    """Vectorized bisection: for each element, the point where increasing ``f`` crosses ``target``.

    Assumes f(lo) <= target < f(hi) element-wise (callers handle the ends). Stops when every
    bracket is narrower than ``tol``; returns the bracket midpoints (error at most tol/2).
    """
    target = np.asarray(target, dtype=float)
    lo = np.full(target.shape, lo, dtype=float)
    hi = np.full(target.shape, hi, dtype=float)
    for _ in range(max_iter):
        if not target.size or np.max(hi - lo) <= tol:
            break
        mid = 0.5 * (lo + hi)
        above = f(mid) > target
        hi = np.where(above, mid, hi)
        lo = np.where(above, lo, mid)
    return 0.5 * (lo + hi)
