"""Transition probabilities P(a | k) of the sequence-conditioned model (paper 2, Section 4.2, eq. 7).

The state is a position i in a reference sequence X_1..X_N (i tokens of it are already produced;
i = N is absorbing). The draft's confidence in the reference is a per-token vector

    q[t] = P_draft(x_{t+1} | X_{<=t}),   t = 0 .. N-1

(the draft's probability of reference token t+1 given the true prefix). At state i the j-th draft
position (j = 0 .. k-1) matches the reference with probability

    p_j(i) = q[i + j]   if i + j < N,   and 0 beyond the end of the reference

(a draft token past the end has no reference token to match, so it never counts as accepted).
With c_a = prod_{j < a} p_j (c_0 = 1), the number of accepted tokens a for a draft of length k is

    P(a | k) = c_a * (1 - p_a)   for a < k        (eq. 7)
    P(k | k) = c_k                                 (full acceptance)

These telescope to sum_a P(a | k) = 1. After a round the state moves to min(i + a + 1, N): the
target always emits one token of its own (the bonus token), so a round advances at least one
position and the state graph is acyclic (Section 4.1). Since p_j = 0 past the end, a <= N - i and
the clamp only absorbs the bonus token of a round that reaches the end.

Arrays use k-index ``k - 1`` (k = 1 .. Lmax) and a-index ``a`` (a = 0 .. Lmax); entries with a > k
have probability 0.
"""

from __future__ import annotations

import numpy as np


def _check_probabilities(p: np.ndarray, name: str) -> None:
    if not np.all(np.isfinite(p)):
        raise ValueError(f"{name}: contains NaN or inf (expected probabilities in [0, 1])")
    if p.size and (p.min() < 0.0 or p.max() > 1.0):
        raise ValueError(f"{name}: probabilities must lie in [0, 1]; found min {p.min():.6g}, "
                         f"max {p.max():.6g}")


def confidence_windows(q, lmax: int) -> np.ndarray:
    """p_j(i) for every state i and draft position j: array ``[N, lmax]`` built from q ``[N]``.

    A 2-D input ``[N, lmax]`` is taken as given (any per-state model of p_j), after checks.
    """
    if not isinstance(lmax, (int, np.integer)) or lmax < 1:
        raise ValueError(f"lmax must be a positive integer; got {lmax!r}")
    q = np.asarray(q, dtype=np.float64)
    if q.ndim == 2:
        if q.shape[1] != lmax:
            raise ValueError(f"p: shape {q.shape} has {q.shape[1]} draft positions; expected lmax = {lmax}")
        _check_probabilities(q, "p")
        return q
    if q.ndim != 1:
        raise ValueError(f"p: expected shape [N] (per-token confidences) or [N, lmax]; got {q.shape}")
    _check_probabilities(q, "p")
    n = q.shape[0]
    padded = np.concatenate([q, np.zeros(lmax)])
    idx = np.arange(n)[:, None] + np.arange(lmax)[None, :]
    return padded[idx]


def acceptance_probs(q, lmax: int) -> np.ndarray:
    """P(a | k) for every state: array ``[N, lmax, lmax + 1]`` (paper 2, eq. 7).

    ``out[i, k - 1, a]`` is the probability that a draft of length k at state i has exactly a
    accepted tokens; rows sum to 1 and entries with a > k are 0.
    """
    pw = confidence_windows(q, lmax)
    n = pw.shape[0]
    c = np.ones((n, lmax + 1))
    c[:, 1:] = np.cumprod(pw, axis=1)              # c_a = prod_{j<a} p_j
    stop = c[:, :lmax] * (1.0 - pw)                 # c_a (1 - p_a), a = 0 .. lmax-1
    lower = (np.arange(lmax + 1)[None, :] < np.arange(1, lmax + 1)[:, None]).astype(np.float64)
    out = np.pad(stop, ((0, 0), (0, 1)))[:, None, :] * lower[None]     # a < k: c_a (1 - p_a)
    r = np.arange(lmax)
    out[:, r, r + 1] = c[:, 1:]                                         # a = k: c_k
    return out


def next_states(n: int, lmax: int) -> np.ndarray:
    """min(i + a + 1, N) for i = 0..N-1 and a = 0..lmax: array ``[N, lmax + 1]`` of ints."""
    return np.minimum(np.arange(n)[:, None] + np.arange(lmax + 1)[None, :] + 1, n)
