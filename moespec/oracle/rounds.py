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

from moespec.routing.stats import union_sizes


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
