"""The staircase k*(a) and its step points for any positive step time (paper 1, Sec. 3.3,
Appendix B.3).

alpha_{k,i} (i < k) is the least acceptance above which draft length k has higher throughput than
i. By (B.27), T_a(k) > T_a(i) iff G_a(k)/G_a(i) > V(k)/V(i), and the ratio (B.26) rises with a.
We solve it in the form a^(i+1) P_(k-i-1)(a) / P_i(a) > V(k)/V(i) - 1 (eq. B.23), whose left side
rises strictly from 0 (a = 0) to (k-i)/(i+1) (a -> 1): well conditioned even where alpha is small.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._checks import check_acceptance, check_draft_length, check_step_times, harmonize, scalar_out
from .polynomials import bisect_increasing, geometric_prefix
from .speculation import best_draft_length, expected_tokens

#: Bisection stops when the bracket of every alpha is narrower than this (error <= TOL/2).
TOL = 1e-13


def _excess(a, i, k):
    """a^(i+1) P_(k-i-1)(a) / P_i(a) = G_a(k)/G_a(i) - 1 (eqs. B.23, B.26), increasing in a."""
    P = geometric_prefix(a, int(k.max()))          # one pass gives every P_n(a) needed
    rows = np.arange(a.shape[0])
    return a ** (i + 1) * P[rows, k - i - 1] / P[rows, i]


def _ratio_thresholds(d: np.ndarray, i: np.ndarray, k: np.ndarray) -> np.ndarray:
    """inf{a in [0,1): G_a(k)/G_a(i) - 1 > d}, 1 if none, element-wise (pairs i < k)."""
    d = np.asarray(d, dtype=float)
    limit = (k - i) / (i + 1)                      # sup of the excess on [0, 1)
    out = np.where(d <= 0, 0.0, 1.0)
    inside = (d > 0) & (d < limit)
    if inside.any():
        ii, kk = i[inside], k[inside]
        out[inside] = bisect_increasing(lambda a: _excess(a, ii, kk), d[inside], tol=TOL)
    # (k, i) = (1, 0): the excess is a itself, so alpha_{1,0} = d exactly (a_1 of B.36).
    linear = inside & (i == 0) & (k == 1)
    out[linear] = d[linear]
    return out


def pair_thresholds(V) -> np.ndarray:
    """alpha[k, i] for 0 <= i < k <= kmax: the infimum of J_{k,i} = {a in [0,1): T_a(k) > T_a(i)},
    1 when J is empty (paper 1, Appendix B.3, eqs. B.26-B.27). Entries with i >= k are NaN.

    Found by bisection on the monotone ratio (B.26) to 1e-13; the relative step
    V(k)/V(i) - 1 is formed exactly first when ``V`` holds Fractions.
    """
    V = check_step_times(V)
    K = len(V)
    kk, ii = np.nonzero(np.tril(np.ones((K, K), dtype=bool), -1))
    # Exact step for Fractions (object arrays), then one rounding to float.
    d = np.array([float(V[k] / V[i] - 1) for k, i in zip(kk, ii)], dtype=float)
    alpha = np.full((K, K), np.nan)
    alpha[kk, ii] = _ratio_thresholds(d, ii, kk)
    return alpha


def step_points(V) -> np.ndarray:
    """a_j = max_{0<=i<j} min_{j<=k<=kmax} alpha_{k,i} for j = 1..kmax (paper 1, eq. B.31):
    k*(a) >= j for every a in (a_j, 1) and k*(a) < j for every a in [0, a_j). 1 where k*
    never reaches j. Returned as a float array of length kmax (entry j-1 is a_j)."""
    alpha = pair_thresholds(V)
    K = alpha.shape[0]
    return np.array([max(min(alpha[k, i] for k in range(j, K)) for i in range(j))
                     for j in range(1, K)], dtype=float)


@dataclass(frozen=True)
class Staircase:
    """k*(a) on [0, 1) as a left-continuous step function (paper 1, Sec. 3.3; eqs. B.28, B.31).

    ``values[t]`` holds on (breakpoints[t-1], breakpoints[t]] (with breakpoints[-1] = 0 and
    breakpoints[len] = 1); ``at_zero`` is k*(0). A rise of more than one at a breakpoint is a
    jump over draft lengths that are never best.
    """

    breakpoints: tuple[float, ...]
    values: tuple[int, ...]
    at_zero: int

    def __call__(self, a):
        """k*(a) read off the staircase (exact away from float ties at the breakpoints)."""
        arr = np.asarray(check_acceptance(a), dtype=float)
        idx = np.searchsorted(np.asarray(self.breakpoints, dtype=float), arr, side="left")
        out = np.where(arr == 0, self.at_zero, np.asarray(self.values)[idx])
        return scalar_out(out.astype(np.int64), np.ndim(a) == 0)

    @property
    def jumps(self) -> list[tuple[float, int, int]]:
        """(breakpoint, k* below, k* above) for every rise of more than one."""
        return [(b, lo, hi) for b, lo, hi in zip(self.breakpoints, self.values[:-1], self.values[1:])
                if hi - lo > 1]


def staircase(V) -> Staircase:
    """The staircase a -> k*(a) on [0, 1), breakpoints and values, from the exact step points
    (paper 1, eq. B.31): for a in (0, 1), k*(a) = #{j : a_j < a} (eq. B.28 makes a_j
    non-decreasing). Jumps of more than one length are kept."""
    V = check_step_times(V)
    a = step_points(V)
    breaks = np.unique(a[(a > 0) & (a < 1)])
    values = [int(np.sum(a <= 0))] + [int(np.sum(a <= b)) for b in breaks]
    return Staircase(tuple(float(b) for b in breaks), tuple(values), best_draft_length(V, 0))


def convex_hypothesis(V, a=None) -> None:
    """Raise ValueError unless the increments c_i = V(i) - V(i-1) satisfy the hypothesis of the
    convex shortcut: c_(i+1) >= a c_i for i = 1..kmax-1 at acceptance(s) ``a`` (eq. B.35), or,
    with ``a=None``, 0 <= c_1 <= ... <= c_kmax (convex, non-decreasing V; eq. B.36)."""
    V = check_step_times(V, min_len=2)
    c = V[1:] - V[:-1]
    if a is None:
        if np.any(c < 0) or np.any(c[1:] < c[:-1]):
            raise ValueError("convex shortcut (10)/(B.36) needs 0 <= c_1 <= c_2 <= ... (V convex and "
                             f"non-decreasing); found increments c = {list(c)}")
        return
    arr = np.atleast_1d(np.asarray(a, dtype=c.dtype if c.dtype == object else float))
    for x in arr.flat:
        bad = np.nonzero(c[1:] < x * c[:-1])[0]
        if bad.size:
            i = int(bad[0]) + 1
            raise ValueError(f"convex criterion (B.35) needs c_(i+1) >= a c_i; at a = {x!r}, "
                             f"c_{i + 1} = {c[i]!r} < a c_{i} = {x * c[i - 1]!r}")


def reaches_convex(V, a, j: int):
    """k*(a) >= j decided by j and j - 1 alone: a^j V(j-1) > G_a(j-1) c_j (paper 1, eq. (10);
    eq. B.35). Valid only under c_(i+1) >= a c_i for every i (checked; ValueError otherwise)."""

    V, arr = harmonize(check_step_times(V, min_len=2), check_acceptance(a))
    j = check_draft_length(j, len(V) - 1, name="j", min_k=1)
    convex_hypothesis(V, arr)
    out = arr ** j * V[j - 1] > expected_tokens(arr, np.int64(j - 1)) * (V[j] - V[j - 1])
    return bool(out) if np.ndim(a) == 0 else np.asarray(out, dtype=bool)


def convex_step_points(V) -> np.ndarray:
    """Step points of a convex, non-decreasing step time (paper 1, eq. B.36):
    a_j = inf{a in [0,1): h_j(a) > c_j / V(j-1)}, h_j(a) = a^j / G_a(j-1) (eq. B.32), so
    a_1 = min(c_1/V(0), 1). Raises ValueError when V is not convex and non-decreasing."""
    V = check_step_times(V, min_len=2)
    convex_hypothesis(V)
    j = np.arange(1, len(V))
    # h_j is the excess G_a(j)/G_a(j-1) - 1 with i = j - 1, and c_j/V(j-1) = V(j)/V(j-1) - 1.
    d = np.array([float(V[t] / V[t - 1] - 1) for t in j], dtype=float)
    return _ratio_thresholds(d, j - 1, j)     # entry 0 is a_1 = min(c_1/V(0), 1) exactly
