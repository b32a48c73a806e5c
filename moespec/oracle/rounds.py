"""Speculative-round records: the unit of observation of paper 2's cost regression (Appendix A.2).

One row per verification round r of a speculative run: the stage timings T_T (target verification
pass) and T_D (drafting K tokens), m = K + 1 verified positions, the routing signal Ubar_r of eq. (5)
(per-layer union of experts over the m positions of the pass, averaged over MoE layers), the context
length L (tokens already in the KV cache when the pass starts), the generation id (cluster and
CV group), the Spec-Bench category, and covariates for the factor analysis (Table A2).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RoundRecord:
    gen_id: str          # one generation = one question answered at one K (cluster / CV group)
    question_id: int
    category: str
    K: int               # draft tokens proposed this round
    m: int               # verified positions = K + 1
    round_idx: int       # position of the round within its generation
    L: int               # context length before the pass (prompt + generated so far)
    T_T_ms: float        # target verification pass
    T_D_ms: float        # drafting the K tokens
    ubar: float          # eq. (5): mean over MoE layers of |union of experts over the m positions|
    umax: float          # max over MoE layers of the same union (the E_max factor)
    accepted: int        # draft tokens accepted (a); the round emits a + 1 tokens
    kv_use: float        # KV-cache occupancy after the pass: (L + m) / max positions
    source: str          # "measured" (this machine) or "synthetic"


ROUND_COLUMNS = [f.name for f in fields(RoundRecord)]
#: Columns kept when present: ``ref_GBps``, the bandwidth of a same-round reference read
#: (:mod:`moespec.measure.regimes`) taken before the round's generation.
OPTIONAL_COLUMNS = ["ref_GBps"]
_FLOAT = ["T_T_ms", "T_D_ms", "ubar", "umax", "kv_use"]
_INT = ["question_id", "K", "m", "round_idx", "L", "accepted"]


def union_sizes(ids, num_experts: int) -> np.ndarray:
    """Cumulative per-layer union sizes over positions.

    ids: integer array ``[..., T, layers, topk]`` of selected experts (eq. A1). Returns
    ``[..., T, layers]`` where entry t is |union over positions 0..t of the layer's experts| (eq. A2).
    """
    ids = np.asarray(ids)
    if ids.ndim < 3 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"ids: expected an integer array [..., T, layers, topk]; got {ids.dtype} {ids.shape}")
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(f"ids: expert ids must lie in 0..{num_experts - 1}; found {ids.min()}..{ids.max()}")
    onehot = np.zeros(ids.shape[:-1] + (num_experts,), dtype=bool)
    np.put_along_axis(onehot, ids, True, axis=-1)
    return np.logical_or.accumulate(onehot, axis=-3).sum(axis=-1)


def ubar(ids, num_experts: int) -> float:
    """Ubar_r of eq. (5) for one pass: ids ``[m, layers, topk]`` → mean over layers of the union size."""
    ids = np.asarray(ids)
    if ids.ndim != 3:
        raise ValueError(f"ids: expected [m, layers, topk] for one pass; got {ids.shape}")
    return float(union_sizes(ids, num_experts)[-1].mean())


def rounds_frame(records) -> pd.DataFrame:
    """A validated table of rounds from ``RoundRecord`` objects or dicts with the same fields."""
    rows = [asdict(r) if isinstance(r, RoundRecord) else dict(r) for r in records]
    extra = [c for c in OPTIONAL_COLUMNS if any(c in r for r in rows)]
    return validate_rounds(pd.DataFrame(rows, columns=ROUND_COLUMNS + extra))


def validate_rounds(df: pd.DataFrame, where: str = "rounds") -> pd.DataFrame:
    """Check a rounds table (columns, types, m = K + 1, positive times); return it with clean dtypes."""
    missing = [c for c in ROUND_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"{where}: missing columns {missing}; expected {ROUND_COLUMNS}")
    df = df[ROUND_COLUMNS + [c for c in OPTIONAL_COLUMNS if c in df.columns]].copy()
    for c in _FLOAT:
        df[c] = pd.to_numeric(df[c], errors="raise").astype(float)
        if not np.isfinite(df[c]).all():
            raise ValueError(f"{where}: column {c} has NaN/inf values")
    for c in _INT:
        df[c] = pd.to_numeric(df[c], errors="raise").astype(np.int64)
    df["gen_id"] = df["gen_id"].astype(str)
    df["category"] = df["category"].astype(str)
    bad = df.index[df["m"] != df["K"] + 1]
    if len(bad):
        raise ValueError(f"{where}: m must equal K + 1; row {bad[0]} has K={df.K[bad[0]]}, m={df.m[bad[0]]}")
    for c in ("T_T_ms", "T_D_ms"):
        if (df[c] < 0).any():
            raise ValueError(f"{where}: column {c} has negative times (min {df[c].min():.4g})")
    if (df["K"] < 0).any() or ((df["accepted"] < 0) | (df["accepted"] > df["K"])).any():
        raise ValueError(f"{where}: need K >= 0 and 0 <= accepted <= K")
    return df.reset_index(drop=True)


def synthetic_rounds(coef: dict, ks=range(1, 11), generations_per_k: int = 20, rounds_per_gen: int = 40,
                     noise_ms: float = 0.05, draft_noise_ms: float = 0.02, num_experts: int = 64,
                     topk: int = 8, seed: int = 0) -> pd.DataFrame:
    """Rounds drawn from model (4) and (A4) with known coefficients, for tests and the quick profile.

    coef: ``{"beta0": {m: ms}, "alpha": {m: ms per expert}, "c": ms per token, "draft_a": ms per
    draft token, "draft_b": ms}``. Ubar is drawn per round between topk and min(N, m * topk); each
    generation adds its own offset to T_T so that rounds within a generation are correlated (the
    reason for clustered standard errors).
    """
    rng = np.random.default_rng(seed)
    rows = []
    for K in ks:
        m = K + 1
        for g in range(generations_per_k):
            gen_offset = rng.normal(0.0, noise_ms)
            L0 = int(rng.integers(20, 200))
            for r in range(rounds_per_gen):
                lo, hi = topk, min(num_experts, m * topk)
                u = lo + (hi - lo) * rng.beta(2.0, 2.0)
                L = L0 + 2 * r + int(rng.integers(0, 3 * K + 1))
                tt = coef["beta0"][m] + coef["alpha"][m] * u + coef["c"] * L + gen_offset \
                    + rng.normal(0.0, noise_ms)
                td = coef["draft_a"] * K + coef["draft_b"] + rng.normal(0.0, draft_noise_ms)
                rows.append(RoundRecord(f"syn-K{K}-g{g}", g, "synthetic", K, m, r, L, max(tt, 1e-6),
                                        max(td, 1e-6), u, min(num_experts, u * 1.2), int(rng.integers(0, K + 1)),
                                        (L + m) / 4096, "synthetic"))
    return rounds_frame(rows)
