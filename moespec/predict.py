"""The prediction chain of paper 1, Section 4: per-layer expert-operation times -> whole-model
verify time (22) -> saving, crossover, best draft length and speedup, each scored against the
whole-model measurements, and the pre-registered scoring rules (Section 4.4, Appendix E, Table 8).

Versions of the chain (all through eq. (22)):

* **prediction**: t_{p,l}(n) from the fits (4)/(E.1) evaluated at each window's union bytes;
* **measured-time**: t_{p,l}(n) the measured median operation time on each window;
* **calibrated**: the measured-time version plus the measured growth with n of the time outside
  the expert operation, taken from the verify time with deduplication off.

Arrays over pass sizes are indexed by n - 1 (column 0 is n = 1); arrays over draft lengths by k.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import paths
from moespec.engine.runs import step_overhead, throughput_grid
from moespec.fit import COEFS, fitted_time
from moespec.measure.regimes import classify
from moespec.theory import (best_draft_length, relative_step_error, saving_bound, speedup_interval,
                            throughput, throughput_loss_bound)

KERNELS = ("slot", "dedup")


# --- per-layer operation times -------------------------------------------------------------
def layer_times(windows: pd.DataFrame, num_layers: int, n_max: int = 9, time_col: str = "t_s") -> dict:
    """t_{p,l}(n): per kernel, the mean over windows of layer l's operation time, ``[L, n_max]``.

    ``windows`` has one row per (window, layer, kernel, n) with ``time_col``. Layers missing from
    the rows are not invented: when the rows cover only some layers, the returned arrays hold those
    layers and ``scale = num_layers / covered`` tells :func:`chain` to scale their sum (a stated
    assumption: the timed layers stand for all). Every kernel must have every n in 1..n_max
    (n = 1 only for the per-slot kernel, which runs n = 1 with deduplication off and on).
    """
    need = {"layer", "kernel", "n", time_col}
    if missing := need - set(windows.columns):
        raise ValueError(f"window times lack column(s) {sorted(missing)}; expected {sorted(need)}")
    layers = sorted(int(x) for x in windows["layer"].unique())
    if any(not 0 <= layer < num_layers for layer in layers):
        raise ValueError(f"window times name layers {layers}, outside 0..{num_layers - 1}")
    mean = windows.groupby(["kernel", "layer", "n"])[time_col].mean()
    out = {}
    for p in KERNELS:
        arr = np.full((len(layers), n_max), np.nan)
        for i, layer in enumerate(layers):
            for n in range(1 if p == "slot" else 2, n_max + 1):
                key = (p, layer, n)
                if key not in mean.index:
                    raise ValueError(f"no {p} operation time for layer {layer} at n={n}")
                arr[i, n - 1] = mean[key]
        out[p] = arr
    out["dedup"][:, 0] = out["slot"][:, 0]  # n = 1 runs the per-slot kernel either way
    out["scale"] = num_layers / len(layers)
    out["layers"] = layers
    return out


def fitted_layer_times(fits: pd.DataFrame, union: np.ndarray, m: int, expert_bytes) -> dict:
    """t_{p,l}(n) from the fits (4) (per-slot) and (E.1) (deduplicating) of :mod:`moespec.fit`,
    averaged over the windows of recorded routing, ``[L, n_max]`` per kernel.

    Both fits are affine in U at fixed n, so their mean over a layer's windows equals the fit at
    the windows' mean union ``union[l, n-1]`` (:func:`moespec.routing.mean_union`). ``fits`` has
    one row per (layer, kernel); n = 1 takes the per-slot fit (the kernel the engine runs there).
    ``expert_bytes``: b, a scalar or one value per layer. A layer without a fit of its own takes
    the mean coefficients of the fitted layers (the paper fits two layers of DeepSeek-V2-Lite and
    applies them to all; every layer of one model shares the expert shape).
    """
    union = np.asarray(union, float)
    L, n_max = union.shape
    if np.isnan(union).any():
        n_bad = sorted({int(j) + 1 for j in np.argwhere(np.isnan(union))[:, 1]})
        raise ValueError(f"the routing has no window of n = {n_bad} tokens (documents too short); "
                         f"record longer documents or lower n_max")
    b = np.broadcast_to(np.asarray(expert_bytes, float), (L,))
    n = np.arange(1, n_max + 1)
    out = {}
    for p in KERNELS:
        f = fits[fits["kernel"] == p].set_index("layer")
        if f.empty:
            raise ValueError(f"no {p} fit among the fits (kernels found: {sorted(set(fits['kernel']))})")
        shared = f[list(COEFS[p])].mean()
        out[p] = np.stack([fitted_time(p, f.loc[layer] if layer in f.index else shared, n, m, union[layer], b[layer])
                           for layer in range(L)])
    out["dedup"][:, 0] = out["slot"][:, 0]
    return out


# --- the chain ------------------------------------------------------------------------------
@dataclass
class Chain:
    """One version's whole-model predictions: tau[p][n-1] (22) and the expert times M[p][n-1]."""

    name: str
    tau: dict
    M: dict
    meta: dict = field(default_factory=dict)

    @property
    def saving(self) -> np.ndarray:
        return self.tau["slot"] - self.tau["dedup"]


def chain(name: str, tau1: float, times: dict) -> Chain:
    """Eq. (22): tau_p(n) = tau_meas(1) + Σ_l (t_{p,l}(n) − t_l(1)), with t_l(1) the per-slot
    one-token time; the predicted expert time is M_p(n) = Σ_l t_{p,l}(n) (paper 1, Section 4)."""
    scale = float(times.get("scale", 1.0))
    one = times["slot"][:, 0]
    tau = {p: tau1 + scale * (times[p] - one[:, None]).sum(axis=0) for p in KERNELS}
    M = {p: scale * times[p].sum(axis=0) for p in KERNELS}
    return Chain(name, tau, M, {"tau1": tau1, "scale": scale})


def calibrate(base: Chain, tau_meas_slot: np.ndarray, name: str = "calibrated") -> Chain:
    """The calibrated version (Section 4): ``base`` plus the growth with n of the time outside the
    expert operation, read off the measured verify time with deduplication off:
    tau_cal_p(n) = tau_p(n) + (tau_meas_slot(n) − tau_slot(n))."""
    resid = np.asarray(tau_meas_slot, float) - base.tau["slot"]
    return Chain(name, {p: base.tau[p] + resid for p in KERNELS}, dict(base.M), {**base.meta, "calibrated_from": base.name})


# --- derived quantities -----------------------------------------------------------------------
def crossover(S: np.ndarray, n_from: int = 2) -> int | None:
    """Smallest n >= n_from from which the saving's point estimate stays positive through the
    last n (paper 1, Section 2); None when there is none. ``S[n-1]`` is S(n)."""
    S = np.asarray(S, float)
    n_last = len(S)
    best = None
    for n in range(n_last, n_from - 1, -1):
        if S[n - 1] > 0:
            best = n
        else:
            break
    return best


def crossover_distance(pred: int | None, meas: int | None, n_last: int) -> int:
    """|pred − meas| with 'none' counted as n_last + 1 (Table 8: a measured crossover at n = 9
    is within one of none)."""
    none = n_last + 1
    return abs((none if pred is None else pred) - (none if meas is None else meas))


def saving_band(c: Chain, eps: float) -> np.ndarray:
    """Half-width of the saving bound (18) around the predicted saving: eps/(1−eps)·(M_slot(n) +
    M_dedup(n)), with the predicted expert times (paper 1, Section 4, Figure 4). From eps = 1 on
    the bound says nothing: the band is infinite."""
    if eps >= 1:
        return np.full_like(c.M["slot"], np.inf, dtype=float)
    return np.asarray(saving_bound(eps, c.M["slot"], c.M["dedup"]), float)


def step_times(tau_dedup: np.ndarray, h: np.ndarray) -> np.ndarray:
    """V(k) = tau_dedup(k + 1) + h(k), k = 0..kmax (paper 1, Section 3.1)."""
    h = np.asarray(h, float)
    return np.asarray(tau_dedup, float)[: len(h)] + h


@dataclass
class Measured:
    """Whole-model measurements of one configuration (one context depth).

    tau[p][n-1]: median verify times; S, S_lo, S_hi: measured saving and its 95% interval;
    h[k]: time per step outside the verify pass; T_runs[i, k]: throughput of the speculative runs
    at acceptance a_values[i] (tokens/s); eps: the engine's bandwidth error.
    """

    tau: dict
    S: np.ndarray
    S_lo: np.ndarray
    S_hi: np.ndarray
    h: np.ndarray
    a_values: np.ndarray
    T_runs: np.ndarray
    eps: float


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
    decided = (meas.S_lo > 0) | (meas.S_hi < 0)
    decided[: n_from - 1] = False
    sign_ok = int(np.sum(decided & (np.sign(S_hat) == np.sign(meas.S))))
    rel = {p: np.abs(c.tau[p][:n_last] / meas.tau[p] - 1)[sl] for p in KERNELS}
    V = step_times(meas.tau["dedup"], meas.h)
    V_hat = step_times(c.tau["dedup"], meas.h)
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


# --- pre-registered scoring rules (Table 8) ---------------------------------------------------
def rules_path() -> Path:
    return paths.data_dir() / "preregistration" / "scoring_rules.json"


def load_rules(path: str | Path | None = None) -> dict:
    """Read the scoring rules file unchanged; raise naming the file if it is malformed."""
    path = Path(path) if path else rules_path()
    try:
        rules = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"scoring rules {path} not found; they must be written (and committed) "
                                "before the speculative runs") from None
    for key in ("rules", "versions_scored", "n_range", "acceptance_values"):
        if key not in rules:
            raise ValueError(f"{path}: missing field {key!r}")
    return rules


def rules_provenance(path: str | Path | None = None) -> dict:
    """The rules file's sha256, the commit that first added it and its time, and whether the file
    on disk is byte for byte the committed one (``unchanged``). ``commit`` is None outside git."""
    path = Path(path) if path else rules_path()
    data = path.read_bytes()
    out = {"path": str(path), "sha256": hashlib.sha256(data).hexdigest(), "commit": None,
           "committed_at": None, "unchanged": None}
    root = paths.ROOT

    def git(*args):
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20)

    try:
        rel = str(path.resolve().relative_to(root))
        log = git("log", "--diff-filter=A", "--format=%H %cI", "--", rel)
    except (ValueError, OSError, subprocess.SubprocessError):
        return out
    if log.returncode or not log.stdout.strip():
        return out
    commit, when = log.stdout.strip().splitlines()[-1].split()
    show = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=root, capture_output=True, timeout=20)
    out.update(commit=commit, committed_at=when,
               unchanged=show.returncode == 0 and show.stdout == data)
    return out


def _rule_value(rule: dict, m: dict) -> tuple[str, bool]:
    kind = rule["kind"]
    if kind == "crossover_within_one":
        fmt = lambda c: "-" if c is None else str(c)  # noqa: E731
        return (f"{fmt(m['crossover_pred'])}/{fmt(m['crossover_meas'])}",
                m["crossover_distance"] <= rule.get("tolerance", 1))
    if kind == "kstar_within_one_count":
        return str(m["kstar_within1"]), m["kstar_within1"] >= rule["min_count"]
    if kind == "max_loss":
        return f"{100 * m['loss_runs']:.1f}%", m["loss_runs"] <= rule["max"]
    if kind == "sign_where_interval_excludes_zero":
        return f"{m['sign_correct']} of {m['sign_total']}", m["sign_correct"] == m["sign_total"]
    if kind == "max_verify_rel_error":
        return f"{100 * m['tau_err']:.1f}%", m["tau_err"] <= rule["max"]
    if kind == "best_speedup_inside_bound21":
        return f"delta={m['delta']:.3f}", bool(m["speedup_inside_bound21"])
    raise ValueError(f"unknown rule kind {kind!r} in the scoring rules")


def score(metrics: dict, rules: dict) -> pd.DataFrame:
    """Decide every rule for every (version, depth) in ``metrics`` ({(version, d): evaluate(...)}).

    Returns one row per (version, rule) with a value and a verdict per depth and ``holds_all``;
    the rules are applied exactly as read (:func:`load_rules`)."""
    rows = []
    depths = sorted({d for _, d in metrics})
    for version in rules["versions_scored"]:
        if not any(v == version for v, _ in metrics):
            continue
        for rule in rules["rules"]:
            row = {"version": version, "rule": rule["text"]}
            ok_all = True
            for d in depths:
                if (version, d) not in metrics:
                    continue
                value, ok = _rule_value(rule, metrics[(version, d)])
                row[f"d{d}"] = f"{value}, {'holds' if ok else 'fails'}"
                ok_all &= bool(ok)
            row["holds_all"] = ok_all
            rows.append(row)
    return pd.DataFrame(rows)


def curves(d: int, chains: dict, meas: Measured) -> pd.DataFrame:
    """Tidy per-n rows for plots and tables: measured tau and S (with interval), and for each
    version its tau, saving and band of (18) at the engine's eps. Times in ms."""
    rows = []
    n_last = len(meas.S)
    for i in range(n_last):
        rows.append({"d": d, "n": i + 1, "version": "measured", "tau_slot_ms": meas.tau["slot"][i] * 1e3,
                     "tau_dedup_ms": meas.tau["dedup"][i] * 1e3, "S_ms": meas.S[i] * 1e3,
                     "S_lo_ms": meas.S_lo[i] * 1e3, "S_hi_ms": meas.S_hi[i] * 1e3})
    for name, c in chains.items():
        band = saving_band(c, meas.eps)
        for i in range(n_last):
            rows.append({"d": d, "n": i + 1, "version": name, "tau_slot_ms": c.tau["slot"][i] * 1e3,
                         "tau_dedup_ms": c.tau["dedup"][i] * 1e3, "S_ms": c.saving[i] * 1e3,
                         "band_ms": band[i] * 1e3})
    return pd.DataFrame(rows)


# --- the chain per depth (notebook 06) --------------------------------------------------------
def measured_at(summary: pd.DataFrame, oracle: pd.DataFrame, d: int, eps: float) -> Measured:
    """One depth's measurements: verify times and saving from ``summary``
    (:func:`moespec.engine.verify.summarize_verify`), h(k) and the throughput grid from the oracle
    runs at that depth (:mod:`moespec.engine.runs`)."""

    s = summary[summary["d"] == d].sort_values("n")
    if s.empty:
        raise ValueError(f"no verify times at depth d={d}")
    runs_d = oracle[oracle["d"] == d]
    a_vals, _, T_runs = throughput_grid(runs_d)
    return Measured(tau={"slot": s["tau_slot_s"].to_numpy(), "dedup": s["tau_dedup_s"].to_numpy()},
                    S=s["S_s"].to_numpy(), S_lo=s["S_lo_s"].to_numpy(), S_hi=s["S_hi_s"].to_numpy(),
                    h=step_overhead(runs_d), a_values=a_vals, T_runs=T_runs, eps=eps)


def evaluate_depths(summary: pd.DataFrame, oracle: pd.DataFrame, fits: pd.DataFrame, windows: pd.DataFrame,
                    wiki_union: np.ndarray, text_union: dict, num_layers: int, m: int, expert_bytes,
                    eps: float) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """The chain (22) in its four versions at every depth of ``summary``, each scored by
    :func:`evaluate` (paper 1, Section 4; Tables 3, 4, 7, 8; Figures 4-6).

    ``windows``: the expert-operation timings on windows of recorded routing (rows of
    :mod:`moespec.measure.expert_op` of kind ``window``, time in ``t_s``), for the measured-time
    version; ``fits`` (:func:`moespec.fit.fit_layers`) with ``wiki_union`` (the WikiText windows'
    mean union per layer and n, :func:`moespec.routing.mean_union`) for the prediction version
    and ``text_union[d]`` (the verified text's) for the text version; ``expert_bytes``: b.

    Returns ``(metrics, curves, h)``: ``{(version, d): evaluate(...)}``, the tidy per-n rows of
    :func:`curves` for every depth, and the measured h(k) per depth (``d, k, h_s``).
    """
    optimes = layer_times(windows, num_layers)
    wiki_times = fitted_layer_times(fits, wiki_union, m, expert_bytes)
    metrics, parts, h_parts = {}, [], []
    for d in sorted(int(x) for x in summary["d"].unique()):
        meas = measured_at(summary, oracle, d, eps)
        tau1 = float(meas.tau["slot"][0])
        measured_time = chain("measured-time", tau1, optimes)
        chains = {"prediction": chain("prediction", tau1, wiki_times),
                  "text": chain("text", tau1, fitted_layer_times(fits, text_union[d], m, expert_bytes)),
                  "measured-time": measured_time,
                  "calibrated": calibrate(measured_time, meas.tau["slot"])}
        for v, c in chains.items():
            metrics[(v, d)] = evaluate(c, meas)
        parts.append(curves(d, chains, meas))
        h_parts.append(pd.DataFrame({"d": d, "k": np.arange(len(meas.h)), "h_s": meas.h}))
    return metrics, pd.concat(parts, ignore_index=True), pd.concat(h_parts, ignore_index=True)


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
