"""The oracle's cost model: Cost(i, k, a) = t_draft(k) + t_target(U(i, k, a), L_prefix) (paper 2, Section 4.2).

``CostModel`` holds the fitted coefficients: t_draft(k) = a k + b (eq. A4, eq. 6) and
t_target(U, L) = beta0 + alpha U + c L (eq. 3 with the context term; the "Ubar + L" model of A.9,
fitted on all rounds). ``KernelCostModel`` replaces the single alpha by paper 1's per-kernel cost:
the per-slot kernel reads m * top_k expert slots per layer whatever the routing, the deduplicating
kernel reads the union U, each at its own bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class CostModel:
    draft_a: float      # ms per draft token (A4)
    draft_b: float      # ms per round (A4)
    beta0: float        # ms
    alpha: float        # ms per unique expert (layer-averaged union)
    c: float            # ms per context token
    label: str = "fitted"

    def t_draft(self, k):
        return self.draft_a * np.asarray(k, dtype=float) + self.draft_b

    def t_target(self, U, L, m=None):
        """Verification time of a pass with layer-averaged union U at context L (m unused here)."""
        return self.beta0 + self.alpha * np.asarray(U, dtype=float) + self.c * np.asarray(L, dtype=float)

    def with_draft_scale(self, scale: float) -> "CostModel":
        """A counterfactual: the same target cost with a draft ``scale`` times as expensive (a, b scaled)."""
        if scale < 0:
            raise ValueError(f"draft scale must be >= 0; got {scale}")
        return replace(self, draft_a=self.draft_a * scale, draft_b=self.draft_b * scale,
                       label=f"{self.label}, draft x{scale:g}")

    def without_experts(self) -> "CostModel":
        """The alpha = 0 ablation (Appendix B.4): the expert term removed, everything else kept."""
        return replace(self, alpha=0.0, label=f"{self.label}, alpha=0")


@dataclass(frozen=True)
class KernelCostModel:
    """Paper 1's per-kernel verification cost in place of a single alpha.

    t_target = beta0 + c L + layers * expert_bytes * n_read / bandwidth, where n_read is m * topk
    expert slots for the per-slot kernel (``kernel="slot"``) and the union U for the deduplicating
    kernel (``kernel="dedup"``). Bandwidths in bytes per ms.
    """
    draft_a: float
    draft_b: float
    beta0: float
    c: float
    layers: int
    expert_bytes: float
    top_k: int
    bandwidth: float
    kernel: str
    label: str = "per-kernel"

    def __post_init__(self):
        if self.kernel not in ("slot", "dedup"):
            raise ValueError(f"kernel must be 'slot' or 'dedup'; got {self.kernel!r}")
        if self.bandwidth <= 0 or self.expert_bytes <= 0:
            raise ValueError("bandwidth and expert_bytes must be positive")

    def t_draft(self, k):
        return self.draft_a * np.asarray(k, dtype=float) + self.draft_b

    def t_target(self, U, L, m):
        n_read = np.asarray(U, dtype=float) if self.kernel == "dedup" else \
            np.asarray(m, dtype=float) * self.top_k
        return (self.beta0 + self.c * np.asarray(L, dtype=float)
                + self.layers * self.expert_bytes * n_read / self.bandwidth)


def cost_matrix(U, L_prefix, model) -> np.ndarray:
    """Cost(i, k, a) = t_draft(k) + t_target(U(i, k, a), L_prefix(i), m = k + 1), ``[N, Lmax, Lmax + 1]``.

    U: ``[N, Lmax, Lmax + 1]`` layer-averaged unions of the junk-tail passes; L_prefix: ``[N]``.
    """
    U = np.asarray(U, dtype=float)
    L_prefix = np.asarray(L_prefix, dtype=float)
    if U.ndim != 3 or U.shape[2] != U.shape[1] + 1:
        raise ValueError(f"U: expected [N, Lmax, Lmax + 1]; got {U.shape}")
    if L_prefix.shape != (U.shape[0],):
        raise ValueError(f"L_prefix: expected shape [{U.shape[0]}]; got {L_prefix.shape}")
    k = np.arange(1, U.shape[1] + 1, dtype=float)[None, :, None]
    out = model.t_draft(k) + model.t_target(U, L_prefix[:, None, None], k + 1)
    return np.where(np.isnan(U), np.nan, np.broadcast_to(out, U.shape))   # keep a > k marked unused


def cost_ar(L_prefix, topk: int, model) -> float:
    """Cost of plain autoregressive decoding of the same N tokens: one m = 1 pass per token, whose
    union is the topk experts of that token in every layer; no draft cost."""
    L_prefix = np.asarray(L_prefix, dtype=float)
    return float(np.sum(model.t_target(np.full(L_prefix.shape, float(topk)), L_prefix, 1)))
