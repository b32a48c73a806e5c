"""The oracle's cost model: Cost(i, k, a) = t_draft(k) + t_target(U(i, k, a), L_prefix) (paper 2, Section 4.2).

``CostModel`` holds the fitted coefficients: t_draft(k) = a k + b (eq. A4, eq. 6) and
t_target(U, L) = beta0 + alpha U + c L (eq. 3 with the context term; the "Ubar + L" model of A.9,
fitted on all rounds). ``RoundCostModel`` takes its levels from the round model of notebook 05
(:mod:`moespec.predict.round_model`: the draft's, verify pass's and host's time per round, measured
in decode loops) and only the regression's sensitivity to the union and the context, so that the
oracle's plain baseline is the measured plain step. ``KernelCostModel`` replaces the single alpha
by paper 1's per-kernel cost: the per-slot kernel reads m * top_k expert slots per layer whatever
the routing, the deduplicating kernel reads the union U, each at its own bandwidth.
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
class RoundCostModel:
    """Cost(i, k, a) with a round model's levels (:mod:`moespec.predict.round_model`): t_draft(k) =
    the round model's draft time per round (``draft_levels_ms[k]``, its draft term at k = 0..kmax,
    extended past kmax by a per drafted token; without levels, a k + b), and

        t_target(U, L, m) = tau(m) + h(m - 1) + alpha (U - U_bar(m)) + c (L - L_bar),

    the round model's verify pass of m tokens and host work at its own mean union U_bar(m) and depth
    L_bar, moved by the regression's alpha per unit of union and c per context token (eq. (3) /
    (A3)). Past the last m where tau, h and U_bar are all known (M), level and union are taken at M,
    and the union term carries the rest. ``experts=False``: the alpha = 0 ablation, the level's
    expert part alpha U_bar(m) removed with the term (Appendix B.4). Times in ms."""

    tau_ms: tuple
    host_ms: tuple
    U_bar: tuple
    L_bar: float
    alpha: float
    c: float
    draft_a: float
    draft_b: float
    label: str = "round model"
    draft_scale: float = 1.0
    experts: bool = True
    draft_levels_ms: tuple = ()

    def __post_init__(self):
        if not (len(self.tau_ms) and len(self.host_ms) and len(self.U_bar)):
            raise ValueError("a round cost model needs verify, host and union levels for m = 1 at least")
        if any(not np.isfinite(x) for x in (*self.tau_ms, *self.host_ms, *self.U_bar, self.L_bar, self.alpha, self.c,
                                                *self.draft_levels_ms)):
            raise ValueError(f"round cost model {self.label!r}: non-finite level or coefficient")

    @classmethod
    def from_round_model(cls, round_model, fitted: CostModel, U_bar, label: str = "round model") -> "RoundCostModel":
        """From a :class:`moespec.predict.round_model.RoundModel` (a real draft's, with its fit) and
        the regression's ``fitted`` alpha and c; ``U_bar``: the mean union of a verify pass of
        m = 1, 2, ... tokens in measured rounds."""
        rm = round_model
        K = rm.kmax + 1
        if rm.draft.a_s is None:
            raise ValueError(f"round model {rm.context!r}: its draft {rm.draft.name!r} has no fit a k + b")
        return cls(tuple(1e3 * rm.tau("dedup")), tuple(1e3 * rm.host.values_s[:K]), tuple(float(u) for u in U_bar),
                   float(rm.depth if rm.depth is not None else 0.0), float(fitted.alpha), float(fitted.c),
                   1e3 * rm.draft.a_s, 1e3 * rm.draft.b_s, label,
                   draft_levels_ms=tuple(float(x) for x in 1e3 * rm.draft.term.values_s))

    @property
    def anchor(self) -> int:
        """M: the largest pass size whose verify, host and union levels are all known."""
        return min(len(self.tau_ms), len(self.host_ms), len(self.U_bar))

    @property
    def beta0(self) -> float:
        """The intercept this model implies for a one-token pass at context 0 (for tables)."""
        return self._level(1) - (self.alpha * self.U_bar[0] if self.experts else 0.0) - self.c * self.L_bar

    def _levels(self) -> tuple[np.ndarray, np.ndarray]:
        """(tau(m) + h(m - 1), U_bar(m)) for m = 1..M."""
        M = self.anchor
        return (np.asarray(self.tau_ms[:M], float) + np.asarray(self.host_ms[:M], float),
                np.asarray(self.U_bar[:M], float))

    def _level(self, m: int) -> float:
        return float(self._levels()[0][min(int(m), self.anchor) - 1])

    def t_draft(self, k):
        k = np.asarray(k, dtype=float)
        if not self.draft_levels_ms:
            return np.where(k > 0, (self.draft_a * k + self.draft_b) * self.draft_scale, 0.0)
        levels = np.asarray(self.draft_levels_ms, float)
        top = levels.size - 1
        known = levels[np.clip(k, 0, top).astype(int)]
        return np.where(k > 0, np.where(k <= top, known, levels[top] + self.draft_a * (k - top)) * self.draft_scale, 0.0)

    def t_target(self, U, L, m):
        level, ubar = self._levels()
        idx = np.minimum(np.asarray(m, dtype=int), self.anchor) - 1
        level, ubar = level[idx], ubar[idx]
        if not self.experts:
            return level - self.alpha * ubar + self.c * (np.asarray(L, dtype=float) - self.L_bar)
        return level + self.alpha * (np.asarray(U, dtype=float) - ubar) + self.c * (np.asarray(L, dtype=float) - self.L_bar)

    def with_draft_scale(self, scale: float) -> "RoundCostModel":
        if scale < 0:
            raise ValueError(f"draft scale must be >= 0; got {scale}")
        return replace(self, draft_scale=self.draft_scale * scale, label=f"{self.label}, draft x{scale:g}")

    def without_experts(self) -> "RoundCostModel":
        return replace(self, experts=False, label=f"{self.label}, alpha=0")


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
