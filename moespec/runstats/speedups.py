"""Statistics of measured speculative runs, one row per run: each run's speedup over its prompt's
plain runs, the share of its rounds whose draft began with two tokens, and the oracle grid's
median throughput per (a, k). Both the engine (which measures the runs) and the predictions
(which are scored against them) read these; they depend on pandas and numpy alone."""

from __future__ import annotations

import numpy as np
import pandas as pd


def speedup_over_plain(runs: pd.DataFrame) -> np.ndarray:
    """Each run's throughput over the median throughput of the same prompt's plain runs (k = 0) in
    the same bandwidth regime (``regime`` column), all of the prompt's plain runs where that regime
    has none. Over a subset of a sweep's rows (one repetition, say) it divides by that subset's
    plain runs only."""
    missing = {"prompt", "k", "regime", "throughput"} - set(runs.columns)
    if missing:
        raise ValueError(f"draft-cost runs lack columns {sorted(missing)}")
    plain = runs[runs.k == 0]
    if unplain := sorted(set(runs.prompt) - set(plain.prompt)):
        raise ValueError(f"no plain run (k = 0) for prompts {unplain}: their speedups have no denominator")
    by_regime = plain.groupby(["prompt", "regime"])["throughput"].median()
    by_prompt = plain.groupby("prompt")["throughput"].median()
    base = [by_regime.get((p, g), by_prompt[p]) for p, g in zip(runs.prompt, runs.regime)]
    return runs["throughput"].to_numpy(float) / np.asarray(base, float)


def speedups_by_part(runs: pd.DataFrame) -> pd.Series:
    """Each run's :func:`speedup_over_plain` over the plain runs of its own part (column ``part``;
    all the rows one part where there is none), on the rows' index."""
    parts = runs.groupby("part", sort=False).groups.values() if "part" in runs else [runs.index]
    out = pd.Series(np.nan, index=runs.index)
    for idx in parts:
        out.loc[idx] = speedup_over_plain(runs.loc[idx])
    return out


def catch_up_share(runs: pd.DataFrame) -> pd.Series:
    """Per run (rows of :func:`moespec.engine.speculative.summarize_steps`' fields): the share of its
    rounds whose draft began with two tokens (the last draft and the bonus token, after a round that
    accepted every draft), ``catch_up`` / ``steps``; 0 at k = 0."""
    if missing := sorted({"k", "steps", "catch_up"} - set(runs.columns)):
        raise ValueError(f"speculative runs lack column(s) {missing} (catch-up share)")
    steps = runs["steps"].astype(float)
    if (steps <= 0).any():
        raise ValueError("runs with no steps have no catch-up share")
    count = runs["catch_up"].astype(float)
    drafted = runs["k"] >= 1
    if count[drafted].isna().any():
        raise ValueError(f"speculative runs: catch_up missing in {int(count[drafted].isna().sum())} of "
                         f"{int(drafted.sum())} drafted runs")
    return pd.Series((count / steps).where(drafted, 0.0), index=runs.index, name="catch_up_share")


def throughput_grid(runs: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(a_values, ks, T[a, k]): the median throughput of the oracle runs per (a, k) (tokens/s)."""
    med = runs.groupby(["a", "k"])["throughput"].median().unstack("k").sort_index()
    if med.isna().any().any():
        raise ValueError("oracle runs do not cover every (a, k) pair")
    return med.index.to_numpy(float), med.columns.to_numpy(int), med.to_numpy()


def regret_interval(by_rep: np.ndarray, k: int, resamples: int = 4000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, float]:
    """The interval of the regret of running the draft length in row ``k`` of ``by_rep`` [k, rep]
    (each repetition's speedup per draft length, one column per repetition): the repetitions
    resampled with replacement, the same ones for every row (paired), each row's speedup the median
    of the resampled repetitions, the regret 1 - S(k) / max_j S(j) per resample; its ``level``
    percentile interval. NaN without two repetitions."""
    by_rep = np.asarray(by_rep, dtype=float)
    R = by_rep.shape[1]
    if R < 2:
        return float("nan"), float("nan")
    idx = np.random.default_rng(seed).integers(0, R, size=(resamples, R))
    boot = np.median(by_rep[:, idx], axis=2)                        # [k, resamples]
    lost = 1 - boot[k] / boot.max(axis=0)
    lo, hi = np.quantile(lost, [(1 - level) / 2, (1 + level) / 2])
    return float(lo), float(hi)
