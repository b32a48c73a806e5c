"""The decision of ``moespec advise``, from verify curves and acceptance rates, by the theory of
paper 1 (Section 3; Table 2's bounds): from which pass size the deduplicating kernel is faster,
the best draft length k*(a) and its speedup per kernel, the error bands of bounds (17)-(21), and
the share of throughput a wrong choice loses. Every number is a call into :mod:`moespec.theory`
or :func:`moespec.predict.crossover`; nothing here re-derives the math.

Three engines are compared: per-slot kernel at every pass size ("slot"), deduplicating kernel
from n = 2 ("dedup", n = 1 runs the per-slot kernel either way), and "switch": per-slot below the
predicted crossover, deduplicating from it (what an engine with a configurable cap does).
"""

from __future__ import annotations

import numpy as np

from moespec import theory as th
from moespec.predict import crossover

from .inputs import VerifyCurves

ENGINES = ("slot", "dedup", "switch")
ENGINE_NAMES = {"slot": "per-slot kernel at every n", "dedup": "deduplicating kernel from n = 2",
                "switch": "per-slot below the crossover, deduplicating from it"}
SCHEMA_ID = "moespec.advice/1"


def switch_times(curves: VerifyCurves, n_switch: int | None) -> np.ndarray:
    """tau_switch(n): per-slot for n < n_switch, deduplicating from n_switch (per-slot throughout
    when there is no crossover)."""
    n = np.arange(1, curves.n_max + 1)
    if n_switch is None:
        return curves.tau["slot"].copy()
    return np.where(n < n_switch, curves.tau["slot"], curves.tau["dedup"])


def step_times(curves: VerifyCurves, engine: str, n_switch: int | None) -> np.ndarray:
    """V(k) = tau(k + 1) + h(k), k = 0..kmax (paper 1, Sec. 3.1), of one engine."""
    tau = switch_times(curves, n_switch) if engine == "switch" else curves.tau[engine]
    return tau[: curves.kmax + 1] + curves.h


def _opt(x):
    return None if x is None else int(x)


def kernel_decision(curves: VerifyCurves) -> dict:
    """The pass size from which deduplication is faster: the predicted crossover (smallest n from
    which S(n) > 0 through n_max), and its interval from the saving interval (earliest: where the
    upper end stays positive; latest, i.e. guaranteed: where the lower end does)."""
    S = curves.saving
    rows = []
    for i in range(curves.n_max):
        row = {"n": i + 1, "tau_slot_ms": 1e3 * curves.tau["slot"][i], "tau_dedup_ms": 1e3 * curves.tau["dedup"][i],
               "saving_ms": 1e3 * S[i], "saving_lo_ms": 1e3 * curves.S_lo[i], "saving_hi_ms": 1e3 * curves.S_hi[i],
               "dedup_faster": bool(S[i] > 0), "sign_certain": bool(curves.S_lo[i] > 0 or curves.S_hi[i] < 0)}
        if curves.ubar is not None and curves.r is not None:
            row.update(ubar=float(curves.ubar[i]), r=float(curves.r[i]))
            if i > 0:
                row["kernels_agree_19"] = bool(th.kernels_agree(curves.ubar[i], curves.r[i], curves.eps))
                if curves.log_gap_range is not None:  # (19) over the rounding of the table read
                    row["margin_19_verdict"] = th.margin_verdict(*curves.log_gap_range[i], curves.eps)
        rows.append(row)
    return {"from_n": _opt(crossover(S)), "earliest_n": _opt(crossover(curves.S_hi)),
            "guaranteed_from_n": _opt(crossover(curves.S_lo)), "interval": curves.interval, "pass_sizes": rows}


def _engine_at(V: np.ndarray, a: float, delta: float) -> dict:
    T = np.asarray(th.throughput(V, a), float)
    k = int(th.best_draft_length(V, a))
    sp = float(th.speedup(V, a, k))
    lo, hi = th.speedup_interval(delta)
    neighbours = [j for j in (k - 1, k + 1) if 0 <= j < len(V)]
    return {"k_star": k, "speedup": sp, "speedup_lo": sp * float(lo), "speedup_hi": sp * float(hi),
            "throughput_per_s": float(T[k]), "k_star_certain": bool(th.separation_holds(V, a, delta)),
            "loss_k_off_by_one": float(max(1 - T[j] / T[k] for j in neighbours)) if neighbours else 0.0,
            "speedup_by_k": [float(x) for x in T / T[0]]}


def decide(curves: VerifyCurves, acceptance) -> dict:
    """The advice for acceptance rates ``acceptance`` (floats in [0, 1), or (a, label) pairs), as a
    JSON-ready dict (schema :data:`moespec.advice.report.ADVICE_SCHEMA`)."""
    pairs = [(float(x[0]), str(x[1])) if isinstance(x, (tuple, list)) else (float(x), "given")
             for x in acceptance]
    if not pairs:
        raise ValueError("acceptance: give at least one acceptance rate")
    th.expected_tokens(np.array([a for a, _ in pairs]), 0)  # theory's check: every a in [0, 1)
    eps = curves.eps
    delta = float(th.delta_from_eps(eps))
    kd = kernel_decision(curves)
    n_switch = kd["from_n"]
    per_a = []
    for a, label in pairs:
        engines = {e: _engine_at(step_times(curves, e, n_switch), a, delta) for e in ENGINES}
        # on a tie the simpler engine (order of ENGINES) is recommended
        best = max(ENGINES, key=lambda e: engines[e]["throughput_per_s"])
        top = engines[best]["throughput_per_s"]
        rec = engines[best]
        per_a.append({
            "a": a, "label": label, "engines": engines,
            "recommended": {"engine": best, "engine_name": ENGINE_NAMES[best], "k": rec["k_star"],
                            "speculate": rec["k_star"] > 0, "speedup": rec["speedup"],
                            "speedup_lo": rec["speedup_lo"], "speedup_hi": rec["speedup_hi"],
                            "verify_pass_tokens": rec["k_star"] + 1, "k_certain": rec["k_star_certain"]},
            "loss_if_wrong": {
                "per_slot_kernel_only": 1 - engines["slot"]["throughput_per_s"] / top,
                "dedup_kernel_only": 1 - engines["dedup"]["throughput_per_s"] / top,
                "draft_length_off_by_one": rec["loss_k_off_by_one"],
                "plain_decoding": 1 - 1 / rec["speedup"],
                "bound_20": float(th.throughput_loss_bound(delta))}})
    lo, hi = th.speedup_interval(delta)
    return {"schema": SCHEMA_ID, "subject": dict(curves.subject), "inputs": list(curves.inputs),
            "assumptions": list(curves.assumptions),
            "error": {"eps": eps, "delta": delta, "verify_time_rel_17": delta,
                      "margin_19": float(th.faster_kernel_margin(eps)), "loss_bound_20": float(th.throughput_loss_bound(delta)),
                      "speedup_factor_21": [float(lo), float(hi)]},
            "draft_time_ms": [1e3 * float(x) for x in curves.h],
            "dedup": kd, "acceptance": per_a}
