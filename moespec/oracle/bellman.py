"""The Bellman oracle of paper 2 (Section 4.3, eq. 8) and exact evaluation of any draft-length policy.

    dp[i] = min_{k in 1..Lmax} sum_{a=0}^{k} P(a | k) * ( Cost(i, k, a) + dp[min(i + a + 1, N)] ),
    dp[N] = 0,

solved by backward induction (the state graph is a DAG). The speedup bound is S = Cost_AR / dp[0].

Speed: the backward pass is sequential in i, so it is compiled with numba (``_backward``): per state
it forms c_a = prod_{j<a} p_j once and evaluates every k in O(Lmax^2) without building the
[N, Lmax, Lmax + 1] tensor of P(a | k) (N = 10^5, Lmax = 12 in well under a second). dp is
zero-padded past N (dp past N is dp[N] = 0, which is exactly the clamp min(i + a + 1, N)). Without
numba the same recursion runs as one small matrix-vector product per state in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .transitions import acceptance_probs, confidence_windows

try:
    from numba import njit
except ImportError:        # pragma: no cover - numba is a dependency; keep a slower path regardless
    njit = None


def _backward_py(pw, cost):
    n, lmax = cost.shape[0], cost.shape[1]
    P = acceptance_probs(pw, lmax)
    E = expected_cost(P, cost)
    dpx = np.zeros(n + lmax + 2)
    policy = np.empty(n, dtype=np.int64)
    for i in range(n - 1, -1, -1):
        q = E[i] + P[i] @ dpx[i + 1:i + lmax + 2]
        k = int(q.argmin())
        policy[i] = k + 1
        dpx[i] = q[k]
    return dpx[:n + 1].copy(), policy


def _backward_kernel(pw, cost, dpx, policy):
    n, lmax = pw.shape
    c = np.empty(lmax + 1)
    for i in range(n - 1, -1, -1):
        c[0] = 1.0
        for a in range(lmax):
            c[a + 1] = c[a] * pw[i, a]
        best = np.inf
        best_k = 1
        for k in range(1, lmax + 1):
            q = c[k] * (cost[i, k - 1, k] + dpx[i + k + 1])          # a = k: all accepted
            for a in range(k):                                       # a < k: c_a (1 - p_a)
                w = c[a] * (1.0 - pw[i, a])
                if w != 0.0:
                    q += w * (cost[i, k - 1, a] + dpx[i + a + 1])
            if q < best:
                best = q
                best_k = k
        dpx[i] = best
        policy[i] = best_k


if njit is not None:
    _backward_kernel = njit(cache=True, nogil=True)(_backward_kernel)


def _backward(pw, cost):
    if njit is None:
        return _backward_py(pw, cost)
    n, lmax = cost.shape[0], cost.shape[1]
    dpx = np.zeros(n + lmax + 2)
    policy = np.empty(n, dtype=np.int64)
    _backward_kernel(np.ascontiguousarray(pw), np.ascontiguousarray(cost), dpx, policy)
    return dpx[:n + 1].copy(), policy


class NegativeCostError(ValueError):
    """A cost model predicted a negative time for some Cost(i, k, a) (a linear fit outside its range)."""


def _check_cost(cost, n: int | None = None) -> np.ndarray:
    cost = np.asarray(cost, dtype=np.float64)
    if cost.ndim != 3 or cost.shape[2] != cost.shape[1] + 1:
        raise ValueError(f"cost: expected shape [N, Lmax, Lmax + 1] (state, k - 1, a); got {cost.shape}")
    if n is not None and cost.shape[0] != n:
        raise ValueError(f"cost: has {cost.shape[0]} states but p has {n}")
    # Fast path: one pass each over the whole array; only on failure look at the used entries (a <= k)
    # so that unused entries (a > k) may hold anything, e.g. NaN.
    if not np.isfinite(cost).all() or (cost.size and cost.min() < 0):
        lmax = cost.shape[1]
        valid = np.arange(lmax + 1)[None, :] <= np.arange(1, lmax + 1)[:, None]   # a <= k
        used = np.where(valid[None], cost, 0.0)
        if not np.all(np.isfinite(used)):
            bad = np.argwhere(~np.isfinite(used))[0]
            raise ValueError(f"cost: Cost(i, k, a) must be finite for every a <= k; "
                             f"found {cost[tuple(bad)]} at (i, k-1, a) = {tuple(int(b) for b in bad)}")
        if used.min() < 0:
            bad = np.argwhere(used < 0)[0]
            raise NegativeCostError(f"cost: negative cost {cost[tuple(bad)]:.6g} at (i, k-1, a) = "
                             f"{tuple(int(b) for b in bad)}; costs are times and must be >= 0")
    return cost


def _p_states(p) -> int:
    p = np.asarray(p)
    if p.ndim not in (1, 2):
        raise ValueError(f"p: expected shape [N] or [N, Lmax]; got {p.shape}")
    return p.shape[0]


def expected_cost(P: np.ndarray, cost: np.ndarray) -> np.ndarray:
    """E[Cost]_k at every state: sum_a P(a|k) Cost(i,k,a), shape ``[N, Lmax]`` (entries a > k ignored)."""
    return np.einsum("ika,ika->ik", P, np.where(P > 0, cost, 0.0))


def expected_accepted(P: np.ndarray) -> np.ndarray:
    """E[a]_k at every state: sum_a a P(a|k), shape ``[N, Lmax]``."""
    return P @ np.arange(P.shape[2], dtype=np.float64)


def bellman(p, cost):
    """Solve eq. (8) by backward induction; return ``(dp, policy)``.

    p: draft confidences, ``[N]`` (q[t] = P_draft(x_{t+1} | X_<=t), see ``transitions``) or ``[N, Lmax]``.
    cost: ``[N, Lmax, Lmax + 1]``, Cost(i, k, a) at index ``[i, k - 1, a]`` (entries a > k unused).
    dp: ``[N + 1]`` minimum expected remaining cost, dp[N] = 0. policy: ``[N]`` optimal k in 1..Lmax
    (the smallest k among ties).
    """
    cost = _check_cost(cost, _p_states(p))
    return _backward(confidence_windows(p, cost.shape[1]), cost)


def q_values(p, cost, dp) -> np.ndarray:
    """Q(i, k) = sum_a P(a|k) (Cost(i,k,a) + dp[min(i+a+1, N)]) for every state and k, ``[N, Lmax]``."""
    cost = _check_cost(cost, _p_states(p))
    n, lmax = cost.shape[0], cost.shape[1]
    P = acceptance_probs(p, lmax)
    dp = np.asarray(dp, dtype=np.float64)
    if dp.shape != (n + 1,):
        raise ValueError(f"dp: expected shape [{n + 1}]; got {dp.shape}")
    nxt = np.minimum(np.arange(n)[:, None] + np.arange(lmax + 1)[None, :] + 1, n)
    return expected_cost(P, cost) + np.einsum("ika,ia->ik", P, dp[nxt])


@dataclass(frozen=True)
class PolicyValue:
    """Expected totals of a policy from state 0 under the sequence-conditioned model."""
    cost: float        # expected total cost (dp[0] for the optimal policy)
    rounds: float      # expected number of rounds
    drafted: float     # expected number of drafted tokens (sum of k)
    accepted: float    # expected number of accepted draft tokens (sum of a)

    @property
    def mean_draft_length(self) -> float:
        """Drafted tokens per round; NaN for a sequence without rounds (N = 0)."""
        return self.drafted / self.rounds if self.rounds else float("nan")

    @property
    def mean_accepted_length(self) -> float:
        """Accepted draft tokens per round; NaN for a sequence without rounds (N = 0)."""
        return self.accepted / self.rounds if self.rounds else float("nan")


def evaluate_policy(p, cost, policy) -> PolicyValue:
    """Exact expected cost, rounds, drafted and accepted tokens of a deterministic policy i -> k.

    Backward induction of the policy's own value, v[i] = sum_a P(a|k_i)(Cost(i,k_i,a) + v[next]);
    used for the oracle's mean draft / accepted length (Figure 2), fixed k and the online policy.
    A sequence of N = 0 states costs nothing: every total is 0 (its mean lengths are NaN).
    """
    cost = _check_cost(cost, _p_states(p))
    n, lmax = cost.shape[0], cost.shape[1]
    policy = np.asarray(policy)
    if policy.shape != (n,):
        raise ValueError(f"policy: expected shape [{n}]; got {policy.shape}")
    if n and not np.issubdtype(policy.dtype, np.integer):
        raise ValueError(f"policy: draft lengths must be integers in [1, {lmax}]; found dtype {policy.dtype}")
    if n and (policy.min() < 1 or policy.max() > lmax):
        bad = int(np.argmax((policy < 1) | (policy > lmax)))
        raise ValueError(f"policy: draft lengths must be integers in [1, {lmax}]; found {policy[bad]} at state {bad}")
    if n == 0:
        return PolicyValue(0.0, 0.0, 0.0, 0.0)
    P = acceptance_probs(p, lmax)
    rows = np.arange(n)
    Pk = P[rows, policy - 1]                                    # [N, Lmax+1]
    immediate = np.stack([expected_cost(P, cost)[rows, policy - 1], np.ones(n), policy.astype(float),
                          Pk @ np.arange(lmax + 1, dtype=float)], axis=1)   # [N, 4]
    vx = np.zeros((n + lmax + 2, 4))
    for i in range(n - 1, -1, -1):
        vx[i] = immediate[i] + Pk[i] @ vx[i + 1:i + lmax + 2]
    return PolicyValue(*map(float, vx[0]))


def fixed_policy(n: int, k: int) -> np.ndarray:
    """The policy that always drafts k tokens."""
    return np.full(n, int(k), dtype=np.int64)


def speedup(cost_ar: float, value: float) -> float:
    """S = Cost_AR / dp[0] (paper 2, Section 4.3)."""
    if value <= 0:
        raise ValueError(f"expected cost must be positive; got {value}")
    return float(cost_ar) / float(value)
