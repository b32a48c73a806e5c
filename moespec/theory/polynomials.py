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
                      tol: float = 1e-15, max_iter: int = 400) -> np.ndarray:
    """Vectorized bracketing root finder: for each element, where increasing ``f`` crosses ``target``.

    Assumes f(lo) <= target < f(hi) element-wise (callers handle the ends). Keeps a bracket
    [lo, hi] with f(lo) <= target < f(hi) and shrinks it by Illinois false position, with a
    bisection step wherever four steps failed to halve the bracket; stops when every bracket is
    narrower than ``tol`` and returns the midpoints (error at most tol/2).
    """
    target = np.asarray(target, dtype=float)
    lo = np.full(target.shape, lo, dtype=float)
    hi = np.full(target.shape, hi, dtype=float)
    if not target.size:
        return lo
    flo, fhi = f(lo) - target, f(hi) - target
    last = np.zeros(target.shape, dtype=np.int8)          # +1: hi moved last time, -1: lo moved
    history = [np.full(target.shape, np.inf)] * 4          # bracket widths of the last 4 steps
    for _ in range(max_iter):
        width = hi - lo
        if np.max(width) <= tol:
            break
        mid = 0.5 * (lo + hi)
        with np.errstate(divide="ignore", invalid="ignore"):
            x = lo - flo * width / (fhi - flo)
        # safeguard: bisect where false position left the bracket or failed to halve it in 4 steps
        x = np.where((x > lo) & (x < hi) & (width <= 0.5 * history[0]), x, mid)
        history = history[1:] + [width]
        fx = f(x) - target
        above = fx > 0
        # Illinois: an endpoint kept twice in a row has its f halved, so both ends converge.
        flo = np.where(above & (last == 1), 0.5 * flo, flo)
        fhi = np.where(~above & (last == -1), 0.5 * fhi, fhi)
        hi, fhi = np.where(above, x, hi), np.where(above, fx, fhi)
        lo, flo = np.where(above, lo, x), np.where(above, flo, fx)
        hi = np.where(fx == 0, x, hi)        # f(x) = target exactly: x is the crossing (f strictly rises)
        last = np.where(above, 1, -1).astype(np.int8)
    return 0.5 * (lo + hi)
