"""The runs of a shuffled real-draft sweep taken to the sweep's typical machine state.

A real-draft sweep (:func:`moespec.engine.draftcost.interleaved_sweep`) runs every cell (part,
prompt, draft cost, k, kernel) in one shuffled order, so every cell meets the same mixture of the
machine's moments. On a shared machine those moments move a run's time by several percent, and
they are not independent from run to run: consecutive runs' residuals correlate, and the
same-round reference read (:class:`moespec.measure.regimes.ReferenceRead`, timed just before each
run) explains part of their variance. Both are measured beside each run, so part of each run's
noise can be taken out before any statistic is formed.

A run's *residual* is its log throughput minus the mean of its cell's (cells of one run have none
and take no part in the estimates). Each run gets a *machine factor* ``f`` from two parts:

1. its read: the residuals of the repeated cells regressed on the log of the run's read about its
   cell's mean (the within-cell regression: the raw log read would attenuate the slope by the
   share of the read's variance that lies within cells), one slope ``b`` for the sweep's plain runs
   and one for its drafted runs (a plain step is all weight reads; a drafted round adds the
   draft's compute, which the read does not move), each run's read term
   ``b (log B - median log B)``. ``B`` is the geometric mean of the two reads that bracket the run:
   its own same-round read, timed just before it, and the next run's, timed just after it
   (:func:`run_reads`; the last run of a sweep has its own alone). A group with fewer than
   :data:`MIN_GROUP_RUNS` repeated runs, or no spread of read within its cells, takes the slope
   over the whole sweep;
2. its neighbours in time: after step 1, the median residual of the :data:`NEIGHBOURS` nearest runs
   of repeated cells before it and after it in the sweep's order (``seq``), the run itself left
   out (:data:`ITERATIONS` passes, each on what the passes before left).

``f = exp(read term + neighbour term)``, above 1 for a run that met a faster moment than typical.
A run *adjusted* to the typical state has its times multiplied by ``f`` and its throughput divided
by it (:func:`adjusted`); its speedup is recomputed over its own part's adjusted plain runs. In a
shuffled order the factor's distribution is the same for every cell, so the adjustment moves no
cell's expectation: it takes out noise and nothing else (the covariate adjustment of a randomized
experiment). The runs' files keep the times as measured, with ``machine_factor`` beside them; the
round models and the scored speedups are the adjusted runs'.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from .speedups import speedups_by_part

#: The columns that name a cell of a real-draft sweep (one setting run several times).
CELL = ["part", "prompt", "draft_cost", "k", "dedup"]
#: A run's time columns (:func:`moespec.engine.speculative.summarize_steps`): scaled by the factor.
TIME_COLUMNS = ("time_s", "t_step_median_s", "t_verify_median_s", "t_draft_median_s", "t_step_mean_s",
                "t_verify_mean_s", "t_draft_mean_s", "h_median_s", "t_host_mean_s")
#: Runs on each side whose residuals estimate a run's neighbour term, and the passes over them
#: (chosen on the per-run noise the adjustment leaves, the spread of the adjusted runs about their
#: cells' means, never on a prediction).
NEIGHBOURS, ITERATIONS = 4, 1
FACTOR = "machine_factor"
#: The fewest repeated runs of a group (plain, drafted) whose slope is its own (fewer: the sweep's slope).
MIN_GROUP_RUNS = 10


def _plain_or_drafted(rows: pd.DataFrame) -> pd.Series:
    """Each run's read-slope group: ``plain`` (k = 0) or ``drafted``."""
    return pd.Series(np.where(rows["k"].to_numpy() == 0, "plain", "drafted"), index=rows.index)


@dataclass(frozen=True)
class MachineFactors:
    """:func:`machine_factors`' result: ``factor`` per row (the rows' index), the read ``slope``
    (d log throughput / d log read; 0 where the rows carry no reads), the settings, and the runs
    of repeated cells the estimates rest on."""
    factor: pd.Series
    slope: float
    neighbours: int
    iterations: int
    repeated_runs: int
    #: each group's slope (plain, drafted; the sweep's where a group took it); ``slope`` is the sweep's
    group_slopes: dict | None = None


def _checked(rows: pd.DataFrame) -> pd.DataFrame:
    cell = [c for c in CELL if c != "part" or c in rows.columns]
    if missing := sorted({*cell, "seq", "throughput"} - set(rows.columns)):
        raise ValueError(f"real-draft runs lack column(s) {missing} (machine adjustment)")
    thr = rows["throughput"].to_numpy(float)
    if not (np.isfinite(thr) & (thr > 0)).all():
        raise ValueError(f"real-draft runs: throughput must be positive and finite in every run; "
                         f"{int((~(np.isfinite(thr) & (thr > 0))).sum())} of {len(thr)} are not")
    if rows["seq"].duplicated().any():
        raise ValueError("real-draft runs: seq (a run's place in the sweep) repeats; one sweep's rows are needed")
    return rows


def cell_keys(rows: pd.DataFrame, columns=CELL) -> pd.Series:
    """Each run's cell (:data:`CELL`, ``part`` where present) as one key; a plain run's missing draft
    cost counts as one value."""
    keys = [c for c in columns if c in rows.columns]
    return rows[keys].assign(draft_cost=rows["draft_cost"].fillna(-1.0)).astype(str).agg("|".join, axis=1)


def _slope(within: np.ndarray, r: np.ndarray) -> float | None:
    """The least-squares slope of ``r`` on ``within`` through the origin; None without spread."""
    return float(np.sum(within * r) / np.sum(within ** 2)) if within.size and np.ptp(within) > 0 else None


def _group_slopes(within: np.ndarray, r: np.ndarray, groups: np.ndarray, fit: np.ndarray, fallback: float) -> dict:
    """{group: slope} for every group in ``groups``: the slope of ``r`` on ``within`` over the
    group's runs in ``fit``, or ``fallback`` where they are fewer than :data:`MIN_GROUP_RUNS` or
    have no spread of read."""
    out = {}
    for group in pd.unique(groups):
        mine = (groups == group) & fit
        own = _slope(within[mine], r[mine]) if mine.sum() >= MIN_GROUP_RUNS else None
        out[str(group)] = fallback if own is None else own
    return dict(sorted(out.items()))


def _in_order(rows: pd.DataFrame):
    """One sweep's runs in sweep order: (order, cells, repeated (a run of a cell run at least
    twice), log throughput, log read)."""
    order = _checked(rows).sort_values("seq")
    cells = cell_keys(order)
    repeated = (cells.groupby(cells).transform("size") >= 2).to_numpy()
    return order, cells, repeated, np.log(order["throughput"].to_numpy(float)), np.log(run_reads(order))


def _residuals(log_t: np.ndarray, cells: pd.Series) -> np.ndarray:
    s = pd.Series(log_t, index=cells.index)
    return (s - s.groupby(cells).transform("mean")).to_numpy()


def _neighbour_medians(r: np.ndarray, repeated: np.ndarray, h: int) -> np.ndarray:
    """Per run (rows in sweep order), the median of ``r`` over the ``h`` nearest repeated runs
    before it and the ``h`` after it, itself left out; 0 where it has none."""
    pos = np.flatnonzero(repeated)
    out = np.zeros(len(r))
    for i in range(len(r)):
        j = np.searchsorted(pos, i)
        before = pos[max(0, j - h):j]
        after = pos[j + (j < len(pos) and pos[j] == i):][:h]
        near = np.r_[before, after]
        if near.size:
            out[i] = float(np.median(r[near]))
    return out


def run_reads(order: pd.DataFrame) -> np.ndarray:
    """Each run's read ``B`` (GB/s) for the machine factor, the runs ``order`` in sweep order
    (``seq`` ascending, column ``ref_GBps``): the geometric mean of its own same-round read (timed
    just before it) and the next run's (timed just after it ends; the last run its own alone). NaN
    where a read it takes is missing."""
    own = order["ref_GBps"].to_numpy(float) if "ref_GBps" in order else np.full(len(order), np.nan)
    if own.size == 0:
        return own
    return np.sqrt(own * np.r_[own[1:], own[-1]])


def machine_factors(rows: pd.DataFrame, neighbours: int = NEIGHBOURS, iterations: int = ITERATIONS) -> MachineFactors:
    """Each run's machine factor (module docstring) over the runs of one sweep in one machine state
    (columns :data:`CELL` (``part`` optional), ``seq``, ``throughput``, ``ref_GBps`` optional): the
    run's read ``B`` from :func:`run_reads`, one read slope for the plain runs and one for the
    drafted ones."""
    if int(neighbours) < 1 or int(iterations) < 0:
        raise ValueError(f"neighbours must be >= 1 and iterations >= 0; found {neighbours}, {iterations}")
    order, cells, repeated, log_t, log_b = _in_order(rows)
    r = _residuals(log_t, cells)
    slope, read_term, group_slopes = 0.0, np.zeros(len(order)), None
    if repeated.sum() >= 3 and np.isfinite(log_b).all():
        within = _residuals(log_b, cells)                    # the read about its cell's mean, as r is
        if (pooled := _slope(within[repeated], r[repeated])) is not None:
            slope = pooled
            groups = _plain_or_drafted(order).to_numpy()
            group_slopes = _group_slopes(within, r, groups, repeated, slope)
            read_term = np.array([group_slopes[str(g)] for g in groups]) * (log_b - np.median(log_b))
    drift = np.zeros(len(order))
    if repeated.any():
        for _ in range(int(iterations)):
            drift += _neighbour_medians(_residuals(log_t - read_term - drift, cells), repeated, int(neighbours))
    factor = pd.Series(np.exp(read_term + drift), index=order.index).reindex(rows.index)
    return MachineFactors(factor, slope, int(neighbours), int(iterations), int(repeated.sum()), group_slopes)


def with_machine_factors(rows: pd.DataFrame, **settings) -> tuple[pd.DataFrame, MachineFactors]:
    """(``rows`` with column ``machine_factor``, the :class:`MachineFactors`): the runs as
    measured, each with its factor, as notebook 05 writes them."""
    mf = machine_factors(rows, **settings)
    return rows.assign(**{FACTOR: mf.factor}), mf


def adjusted(rows: pd.DataFrame) -> pd.DataFrame:
    """The runs at the sweep's typical machine state: every time column times the run's
    ``machine_factor``, the throughput over it, and the speedups recomputed over the adjusted plain
    runs of the same part (:func:`moespec.runstats.speedups.speedups_by_part`)."""
    if FACTOR not in rows.columns:
        raise ValueError(f"real-draft runs carry no {FACTOR} column: adjust them with with_machine_factors first")
    f = rows[FACTOR].to_numpy(float)
    if not (np.isfinite(f) & (f > 0)).all():
        raise ValueError(f"{FACTOR} must be positive and finite in every run")
    out = rows.copy()
    out["throughput"] = rows["throughput"] / f
    for col in TIME_COLUMNS:
        if col in out:
            out[col] = rows[col] * f
    if "speedup" in out:
        out["speedup"] = speedups_by_part(out)
    return out


def settings() -> dict:
    """The adjustment's settings as a run records them (``run.json``, key ``machine_adjustment``):
    neighbours a side, passes, and the fewest runs of a slope group."""
    return {"neighbours": NEIGHBOURS, "iterations": ITERATIONS, "min_group_runs": MIN_GROUP_RUNS}


def factor_summary(mf: MachineFactors, rows: pd.DataFrame) -> dict:
    """The adjustment in numbers (notebook 05's line): the read slope (the sweep's, and each group's
    as ``slope_<group>``: ``slope_plain``, ``slope_drafted``), the 5th and 95th percentiles
    of the factors, the runs the estimates rest on, and the noise of one run (:func:`run_noise`) of
    ``rows`` (the runs as measured, with their factors) as measured and adjusted."""
    f = mf.factor.to_numpy(float)
    return {"slope": mf.slope, "q05": float(np.quantile(f, 0.05)), "q95": float(np.quantile(f, 0.95)),
            "runs": int(f.size), "repeated_runs": mf.repeated_runs, "neighbours": mf.neighbours,
            "iterations": mf.iterations, **{f"slope_{g}": b for g, b in (mf.group_slopes or {}).items()},
            "noise_measured": run_noise(rows), "noise_adjusted": run_noise(adjusted(rows))}


def repeated_residuals(log_values, rows: pd.DataFrame) -> pd.Series:
    """Over the runs of cells run at least twice, each run's ``log_values`` (one per row, e.g. log
    throughput or log time) about its cell's mean, scaled by sqrt(n / (n - 1)) for a cell of n
    runs so that its mean square estimates one run's variance; on those rows' index, in the rows'
    order."""
    cells = cell_keys(rows)
    n = cells.groupby(cells).transform("size").to_numpy()
    keep = n >= 2
    r = _residuals(np.asarray(log_values, float), cells)
    return pd.Series((r * np.sqrt(n / np.maximum(n - 1, 1)))[keep], index=rows.index[keep])


def run_noise(rows: pd.DataFrame) -> float:
    """The noise of one run: the root mean square of the runs' :func:`repeated_residuals` of log
    throughput. Over :func:`adjusted` rows it is the noise the adjustment left: the measure its
    settings were chosen on."""
    rows = _checked(rows)
    r = repeated_residuals(np.log(rows["throughput"].to_numpy(float)), rows)
    if r.empty:
        raise ValueError("run noise needs cells run at least twice; every cell of these runs ran once")
    return float(np.sqrt(np.mean(r.to_numpy() ** 2)))
