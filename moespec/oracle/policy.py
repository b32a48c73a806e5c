"""An online early-exit draft-length policy built on paper 2's delta-space boundary (beyond the paper).

Paper 2 (Section 5.2) suggests, and leaves to future work, a policy that keeps drafting while the
marginal ratio dE[Cost]/dE[a] of one more draft token stays under the slope learned offline.
Here, at state i, after drafting k tokens the policy knows only what an online system knows:

- the draft's own confidences q_j in the tokens it drafted (its greedy chain from the true prefix),
  so dE[a](k -> k+1) ~= prod_{j<=k} q_j (the probability that all k + 1 tokens are accepted);
- the cost model and, from offline data, the mean junk-tail union for each k, so
  dE[Cost](k -> k+1) ~= t_draft(k+1) - t_draft(k) + t_target(Ubar[k+1]) - t_target(Ubar[k])
  (the context term cancels).

It drafts k + 1 while dE[Cost]/dE[a] <= slope and k < Lmax. Its value is then computed exactly
under the sequence-conditioned model (``bellman.evaluate_policy``), on held-out sequences, against
the oracle's bound, fixed k, and the best fixed k.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .transitions import acceptance_probs


def mean_union_by_k(U, p) -> np.ndarray:
    """Offline mean expected union E_a[U(i, k, a)] over states, per k: ``[Lmax]`` (training data)."""
    U = np.asarray(U, dtype=float)
    P = acceptance_probs(p, U.shape[1])
    return np.einsum("ika,ika->ik", P, np.where(P > 0, U, 0.0)).mean(axis=0)


@dataclass(frozen=True)
class EarlyExitPolicy:
    slope: float              # ms per expected accepted token (learned offline, delta space)
    marginal_cost: np.ndarray  # [Lmax - 1]: dE[Cost](k -> k+1) for k = 1..Lmax-1, ms

    @classmethod
    def fit(cls, slope: float, ubar_by_k, model) -> "EarlyExitPolicy":
        """Build from the offline slope, the offline mean union per k and the cost model."""
        ubar_by_k = np.asarray(ubar_by_k, dtype=float)
        k = np.arange(1, len(ubar_by_k) + 1)
        c = model.t_draft(k) + model.t_target(ubar_by_k, 0.0, k + 1)
        return cls(float(slope), np.diff(c))

    def decide(self, q) -> np.ndarray:
        """Draft lengths for every state from the online confidences q ``[N, Lmax]`` (q[i, j] = the
        draft's probability of its own j-th drafted token at state i). Returns ints in 1..Lmax."""
        q = np.asarray(q, dtype=float)
        lmax = len(self.marginal_cost) + 1
        if q.ndim != 2 or q.shape[1] < lmax:
            raise ValueError(f"q: expected [N, >= {lmax}]; got {q.shape}")
        gain = np.cumprod(q[:, :lmax], axis=1)[:, 1:]            # dE[a](k -> k+1), k = 1..Lmax-1
        with np.errstate(divide="ignore"):
            ratio = np.where(gain > 0, self.marginal_cost[None, :] / gain, np.inf)
        go = ratio <= self.slope                                  # [N, Lmax-1]
        # draft k+1 only if every earlier step also continued: length = 1 + leading run of True
        return 1 + np.cumprod(go, axis=1).sum(axis=1).astype(np.int64)
