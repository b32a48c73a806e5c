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
#: (:mod:`moespec.measure.regimes`) taken before the round's generation; ``T_host_ms``, the round's
#: host work outside drafting and verification (acceptance, cache crop; ``StepResult.t_step_s`` minus
#: its draft and verify times).
OPTIONAL_COLUMNS = ["ref_GBps", "T_host_ms"]
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
    host = ["T_host_ms"] if "T_host_ms" in df.columns else []
    for c in _FLOAT + host:
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
    for c in ["T_T_ms", "T_D_ms"] + host:
        if (df[c] < 0).any():
            raise ValueError(f"{where}: column {c} has negative times (min {df[c].min():.4g})")
    if (df["K"] < 0).any() or ((df["accepted"] < 0) | (df["accepted"] > df["K"])).any():
        raise ValueError(f"{where}: need K >= 0 and 0 <= accepted <= K")
    return df.reset_index(drop=True)


def fixed_k_speedups(rounds: pd.DataFrame, resamples: int = 2000, seed: int = 0, level: float = 0.95,
                     where: str = "rounds") -> pd.DataFrame:
    """The measured speedup of every fixed K over the K = 0 rounds, with a bootstrap interval.

    Per K: tokens per round (accepted + 1) over the round's time T_T + T_D (+ ``T_host_ms`` when the
    rounds record it), as a ratio of sums over all rounds at that K; the speedup is that throughput
    over the K = 0 rounds' (1 token per T_T (+ host)). The interval is the percentile interval of
    ``resamples`` bootstrap draws that resample generations (``gen_id``: one question at one K) with
    replacement, independently at K and at K = 0 (each draw keeps a generation's rounds together).
    Returns one row per K (including K = 0, speedup 1): K, rounds, generations, accepted_per_round,
    tokens_per_round, ms_per_round, ms_per_token, speedup, speedup_lo, speedup_hi, host_included.
    """
    rounds = validate_rounds(rounds, where)
    if not (rounds.K == 0).any():
        raise ValueError(f"{where}: no K = 0 rounds; the speedup of a fixed K is over plain decoding (K = 0)")
    if not 0 < level < 1 or resamples < 1:
        raise ValueError(f"need 0 < level < 1 and resamples >= 1; got level={level}, resamples={resamples}")
    host = "T_host_ms" in rounds.columns
    per_gen = (rounds.assign(tokens=rounds.accepted + 1,
                             ms=rounds.T_T_ms + rounds.T_D_ms + (rounds.T_host_ms if host else 0.0))
               .groupby(["K", "gen_id"]).agg(tokens=("tokens", "sum"), ms=("ms", "sum"), n=("tokens", "size"),
                                             accepted=("accepted", "sum")))
    rng = np.random.default_rng(seed)

    def draws(g: pd.DataFrame) -> np.ndarray:
        """tokens per ms of ``resamples`` resamples of the generations ``g``."""
        idx = rng.integers(len(g), size=(resamples, len(g)))
        return g.tokens.to_numpy()[idx].sum(1) / g.ms.to_numpy()[idx].sum(1)

    base = per_gen.loc[0]
    base_rate, base_draws = base.tokens.sum() / base.ms.sum(), draws(base)
    rows = []
    for K, g in per_gen.groupby(level="K"):
        rate = g.tokens.sum() / g.ms.sum()
        ratio = draws(g) / base_draws if K else np.ones(resamples)
        lo, hi = np.quantile(ratio, [(1 - level) / 2, (1 + level) / 2])
        rows.append({"K": int(K), "rounds": int(g.n.sum()), "generations": len(g),
                     "accepted_per_round": g.accepted.sum() / g.n.sum(), "tokens_per_round": g.tokens.sum() / g.n.sum(),
                     "ms_per_round": g.ms.sum() / g.n.sum(), "ms_per_token": 1 / rate, "speedup": rate / base_rate,
                     "speedup_lo": float(lo), "speedup_hi": float(hi), "host_included": host})
    return pd.DataFrame(rows)
