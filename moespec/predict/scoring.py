"""Scoring chain (22) against the whole-model measurements of one context depth (paper 1, Section 4
and 4.4; Tables 3, 4, 7, 8; Figures 4-6): the measured verify times and saving come from the run's
round model (:mod:`moespec.predict.round_model`, verify passes timed inside decode loops), the step
times of both the measurement and every version from the same round model with only its verify
term replaced, the measured best draft lengths from the oracle-draft runs' throughputs."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moespec.runstats import throughput_grid
from moespec.measure.regimes import classify
from moespec.theory import (best_draft_length, crossover, crossover_distance, relative_step_error,
                            speedup_interval, throughput, throughput_loss_bound)

from .chain import KERNELS, Chain, calibrate, chain, fitted_layer_times, layer_times, saving_band
from .round_model import RoundModel


@dataclass
class Measured:
    """Whole-model measurements of one context depth: ``round_model`` (the verify times tau_p(n),
    the measured saving S(n) with its 95 % interval, draft and host time per round, all timed
    inside decode loops), the oracle runs' median throughput ``T_runs[i, k]`` at acceptance
    ``a_values[i]`` (tokens/s), and the engine's bandwidth error ``eps``."""

    round_model: RoundModel
    a_values: np.ndarray
    T_runs: np.ndarray
    eps: float

    @property
    def tau(self) -> dict:
        return {p: self.round_model.verify[p].values_s for p in KERNELS}

    @property
    def saving(self):
        """The measured saving (:class:`~moespec.predict.round_model.Term`): the mean over runs of the
        paired (same prompt and repetition) difference, with its 95 % interval."""
        return self.round_model.saving

    @property
    def S(self) -> np.ndarray:
        return self.saving.values_s


def evaluate(c: Chain, meas: Measured, n_from: int = 2) -> dict:
    """Score one version against one configuration's measurements (Tables 3, 4, 7, 8; Fig. 5)."""
    n_last = len(meas.S)
    sl = slice(n_from - 1, n_last)
    S_hat = c.saving[:n_last]
    err = np.abs(S_hat - meas.S)[sl]
    half = saving_band(c, meas.eps)[:n_last]
    inside = np.abs(S_hat - meas.S)[sl] <= half[sl]
    Msum = (c.M["slot"] + c.M["dedup"])[:n_last]
    x = np.max(err / Msum[sl])  # implied eps: smallest eps whose band (18) covers every point
    amp = Msum[sl] / np.maximum(np.abs(meas.S[sl]), 0.05e-3)  # Table 7 floors |S| at 0.05 ms
    decided = (meas.saving.lo_s > 0) | (meas.saving.hi_s < 0)
    decided[: n_from - 1] = False
    sign_ok = int(np.sum(decided & (np.sign(S_hat) == np.sign(meas.S))))
    rel = {p: np.abs(c.tau[p][:n_last] / meas.tau[p] - 1)[sl] for p in KERNELS}
    K = meas.T_runs.shape[1]   # the draft lengths the oracle runs measured, k = 0..K-1
    V = meas.round_model.step_times("dedup")[:K]
    V_hat = c.step_times(meas.round_model)[:K]
    a = np.asarray(meas.a_values, float)
    rows = np.arange(len(a))
    k_runs = np.argmax(meas.T_runs, axis=1)  # smallest maximiser of the measured throughput
    k_V = best_draft_length(V, a)
    T_V = throughput(V, a)
    valid = bool(np.all(V_hat > 0))  # a non-positive predicted step time predicts nothing
    if valid:
        delta = float(relative_step_error(V_hat, V))
        k_hat = best_draft_length(V_hat, a)
        T_hat = throughput(V_hat, a)
        loss_runs = 1 - meas.T_runs[rows, k_hat] / meas.T_runs.max(axis=1)
        loss_V = 1 - T_V[rows, k_hat] / T_V.max(axis=1)
        sp_ratio = (T_hat[rows, k_hat] / T_hat[:, 0]) / (T_V[rows, k_V] / T_V[:, 0])
    else:
        delta = float("inf")
        k_hat = np.full(len(a), -1)
        loss_runs = loss_V = sp_ratio = np.full(len(a), np.nan)
    # Bounds (20) and (21) need delta < 1; from delta = 1 on they say nothing (vacuous).
    vacuous = delta >= 1
    lo, hi = (0.0, np.inf) if vacuous else speedup_interval(delta)
    loss_bound = 1.0 if vacuous else throughput_loss_bound(delta)
    return {
        "version": c.name,
        "saving_err_ms": float(err.max() * 1e3),
        "in_band": int(inside.sum()), "band_points": int(inside.size),
        "crossover_pred": crossover(S_hat, n_from), "crossover_meas": crossover(meas.S, n_from),
        "crossover_distance": crossover_distance(crossover(S_hat, n_from), crossover(meas.S, n_from), n_last),
        "sign_correct": sign_ok, "sign_total": int(decided.sum()),
        "tau_err": float(max(rel["slot"].max(), rel["dedup"].max())),
        "tau_err_dedup": float(rel["dedup"].max()),
        "amplification_min": float(amp.min()), "amplification_max": float(amp.max()),
        "implied_eps": float(x / (1 + x)), "eps": float(meas.eps),
        "delta": delta, "valid_step_times": valid,
        "k_hat": k_hat.tolist(), "k_meas": k_runs.tolist(), "k_V": k_V.tolist(),
        "kstar_within1": int(np.sum(np.abs(k_hat - k_runs) <= 1)) if valid else 0, "kstar_values": int(len(a)),
        "loss_runs": float(np.max(loss_runs)), "loss_V": float(np.max(loss_V)),
        "bounds_vacuous": bool(vacuous), "loss_bound20": float(loss_bound),
        "loss_inside_bound20": bool(valid and np.max(loss_V) <= loss_bound + 1e-12),
        "speedup_err": float(np.max(np.abs(sp_ratio - 1))) if valid else float("nan"),
        "speedup_bound21": hi - 1,
        "speedup_inside_bound21": bool(valid and np.all((sp_ratio >= lo - 1e-12) & (sp_ratio <= hi + 1e-12))),
    }


def curves(d: int, chains: dict, meas: Measured, grid: pd.DataFrame | None = None) -> pd.DataFrame:
    """Tidy per-n rows for plots, tables and ``moespec advise``: the measured tau and S (with
    interval; version ``measured``, timed in decode loops), notebook 05's shuffled grid when given
    (version ``measured-grid``, a :func:`moespec.engine.verify.summarize_verify` table), and for each
    version of the chain its tau, saving, band of (18) at the engine's eps and predicted expert
    times M_p(n) (the memory part of bound (17)). Times in ms."""
    rows = []
    n_last = len(meas.S)
    for i in range(n_last):
        rows.append({"d": d, "n": i + 1, "version": "measured", "tau_slot_ms": meas.tau["slot"][i] * 1e3,
                     "tau_dedup_ms": meas.tau["dedup"][i] * 1e3, "S_ms": meas.S[i] * 1e3,
                     "S_lo_ms": meas.saving.lo_s[i] * 1e3, "S_hi_ms": meas.saving.hi_s[i] * 1e3})
    if grid is not None:
        for _, r in grid[grid["d"] == d].sort_values("n").iterrows():
            rows.append({"d": d, "n": int(r["n"]), "version": "measured-grid", "tau_slot_ms": r["tau_slot_s"] * 1e3,
                         "tau_dedup_ms": r["tau_dedup_s"] * 1e3, "S_ms": r["S_s"] * 1e3,
                         "S_lo_ms": r["S_lo_s"] * 1e3, "S_hi_ms": r["S_hi_s"] * 1e3})
    for name, c in chains.items():
        band = saving_band(c, meas.eps)
        for i in range(n_last):
            rows.append({"d": d, "n": i + 1, "version": name, "tau_slot_ms": c.tau["slot"][i] * 1e3,
                         "tau_dedup_ms": c.tau["dedup"][i] * 1e3, "S_ms": c.saving[i] * 1e3,
                         "band_ms": band[i] * 1e3, "M_slot_ms": c.M["slot"][i] * 1e3,
                         "M_dedup_ms": c.M["dedup"][i] * 1e3})
    return pd.DataFrame(rows)


def measured_at(round_model: RoundModel, oracle: pd.DataFrame, d: int, eps: float) -> Measured:
    """One depth's measurements: the round model of that depth and the throughput grid of the
    oracle runs there (:func:`moespec.runstats.throughput_grid`)."""
    if round_model.saving is None:
        raise ValueError(f"round model {round_model.context!r} has no measured saving (both kernels needed)")
    runs_d = oracle[oracle["d"] == d]
    if runs_d.empty:
        raise ValueError(f"no oracle runs at depth d={d}")
    a_vals, ks, T_runs = throughput_grid(runs_d)
    if list(ks) != list(range(len(ks))) or len(ks) > round_model.kmax + 1:
        raise ValueError(f"oracle runs at d={d} cover k = {list(ks)}; scoring needs k = 0..K-1 with K - 1 <= "
                         f"{round_model.kmax} (the round model's kmax)")
    return Measured(round_model, a_vals, T_runs, eps)


def evaluate_depths(round_models: dict, oracle: pd.DataFrame, fits: pd.DataFrame, windows: pd.DataFrame,
                    wiki_union: np.ndarray, text_union: dict, num_layers: int, m: int, expert_bytes,
                    eps: float, grid: pd.DataFrame | None = None) -> tuple[dict, pd.DataFrame]:
    """The chain (22) in its four versions at every depth of ``round_models`` ({d: RoundModel}),
    each scored by :func:`evaluate` (paper 1, Section 4; Tables 3, 4, 7, 8; Figures 4-6).

    ``windows``: the expert-operation timings on windows of recorded routing (rows of
    :mod:`moespec.measure.expert_op` of kind ``window``, time in ``t_s``), for the measured-time
    version; ``fits`` (:func:`moespec.fit.fit_layers`) with ``wiki_union`` (the WikiText windows'
    mean union per layer and n, :func:`moespec.routing.mean_union`) for the prediction version
    and ``text_union[d]`` (the verified text's) for the text version; ``expert_bytes``: b. Every
    version is anchored at the round model's one-token pass tau_slot(1) (eq. (22)'s tau_meas(1)).
    ``grid``: notebook 05's shuffled-grid summary, written beside the loop's in the curves.

    Returns ``(metrics, curves)``: ``{(version, d): evaluate(...)}`` and the tidy per-n rows of
    :func:`curves` for every depth.
    """
    optimes = layer_times(windows, num_layers)
    wiki_times = fitted_layer_times(fits, wiki_union, m, expert_bytes)
    metrics, parts = {}, []
    for d in sorted(round_models):
        meas = measured_at(round_models[d], oracle, d, eps)
        tau1 = float(meas.tau["slot"][0])
        measured_time = chain("measured-time", tau1, optimes)
        chains = {"prediction": chain("prediction", tau1, wiki_times),
                  "text": chain("text", tau1, fitted_layer_times(fits, text_union[d], m, expert_bytes)),
                  "measured-time": measured_time,
                  "calibrated": calibrate(measured_time, meas.tau["slot"])}
        for v, c in chains.items():
            metrics[(v, d)] = evaluate(c, meas)
        parts.append(curves(d, chains, meas, grid))
    return metrics, pd.concat(parts, ignore_index=True)


def bench_regimes(rows: pd.DataFrame, threshold: float | None) -> pd.Series:
    """The bandwidth regime of every row of an expert-operation benchmark run
    (:mod:`moespec.measure.expert_op`): that of its group's read-bandwidth row (``kind == membw``,
    the same interleaved group), classified at ``threshold`` (GB/s; None: one regime)."""

    reads = rows[rows["kind"] == "membw"]
    if threshold is None or reads.empty:
        return pd.Series("one", index=rows.index)
    bw = reads["requested_bytes"].astype(float) / reads["t_median_s"].astype(float) / 1e9
    label = dict(zip(reads["layer"].astype(int), classify(bw.to_numpy(), threshold)))
    if reads["n"].astype(int).nunique() > 1:   # interleave="n": one read per (layer, n)
        label = dict(zip(zip(reads["layer"].astype(int), reads["n"].astype(int)), classify(bw.to_numpy(), threshold)))
        return pd.Series([label.get((int(l), int(n)), "") for l, n in zip(rows["layer"], rows["n"])], index=rows.index)
    return rows["layer"].astype(int).map(label).fillna("")


def in_regime(frame: pd.DataFrame, regimes: pd.Series, regime: str, min_share: float = 0.0) -> tuple[pd.DataFrame, bool]:
    """(the rows of ``frame`` in ``regime``, True), or (all rows, False) when that regime holds
    none of them or less than ``min_share`` of them (the caller says so)."""
    sel = regimes == regime
    if sel.sum() == 0 or sel.mean() < min_share:
        return frame, False
    return frame[sel.to_numpy()], True
