"""The machine adjustment of a real-draft sweep's runs (moespec.runstats.machine_adjust): the read
slopes (one for the plain runs, one for the drafted) and the neighbour term on hand-checkable
sweeps, the run's read from the two reads that bracket it, the run itself left out, no cell moved
in expectation under a shuffled order, and clear refusals."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec.runstats import machine_adjust as MA
from moespec.runstats import speedup_over_plain


def sweep(throughput, cells, ref=None) -> pd.DataFrame:
    """Rows in sweep order: ``cells`` (prompt, k) per run, plain runs k = 0."""
    n = len(throughput)
    rows = pd.DataFrame({"part": "test", "prompt": [c[0] for c in cells], "k": [c[1] for c in cells],
                         "draft_cost": [np.nan if c[1] == 0 else 0.1 for c in cells], "dedup": True,
                         "seq": np.arange(n), "throughput": np.asarray(throughput, float),
                         "ref_GBps": np.nan if ref is None else np.asarray(ref, float), "regime": "one",
                         "time_s": 32 / np.asarray(throughput, float), "t_verify_mean_s": 1 / np.asarray(throughput, float)})
    rows["speedup"] = speedup_over_plain(rows)
    return rows


def bracketing_log_read(ref) -> np.ndarray:
    """Each run's log read as the adjustment takes it, about its median: the geometric mean of its
    own read and the next run's (the last run's its own alone)."""
    ref = np.asarray(ref, float)
    b = np.log(np.sqrt(ref * np.r_[ref[1:], ref[-1]]))
    return b - np.median(b)


def test_read_slope_recovered_and_taken_out_exactly():
    rng = np.random.default_rng(1)
    cells = [(0, 0), (0, 1), (1, 0), (1, 1)] * 6
    base = {(0, 0): 30.0, (0, 1): 45.0, (1, 0): 28.0, (1, 1): 40.0}
    ref = rng.uniform(10, 20, len(cells))
    x = bracketing_log_read(ref)
    thr = np.array([base[c] for c in cells]) * np.exp(0.5 * x)
    mf = MA.machine_factors(sweep(thr, cells, ref))
    assert mf.slope == pytest.approx(0.5) and mf.group_slopes == pytest.approx({"drafted": 0.5, "plain": 0.5})
    assert mf.factor.to_numpy() == pytest.approx(np.exp(0.5 * x))      # nothing left for the neighbours
    adj = MA.adjusted(sweep(thr, cells, ref).assign(machine_factor=mf.factor))
    assert adj["throughput"].to_numpy() == pytest.approx([base[c] for c in cells])
    assert adj["time_s"].to_numpy() == pytest.approx(32 / np.array([base[c] for c in cells]))
    # speedups recomputed over the adjusted plain runs: every k = 1 run at its cell's exact ratio
    assert adj.loc[adj.k == 1, "speedup"].to_numpy() == pytest.approx(
        [base[(p, 1)] / base[(p, 0)] for p, k in cells if k == 1])


def test_bracketing_reads_by_hand():
    order = pd.DataFrame({"seq": [0, 1, 2], "ref_GBps": [10.0, 40.0, 20.0]})
    # each run: its own read and the next run's (timed just after it), the last its own alone
    assert MA.run_reads(order) == pytest.approx([20.0, np.sqrt(800.0), 20.0])
    assert np.isnan(MA.run_reads(order.drop(columns="ref_GBps"))).all()


def test_neighbour_term_takes_out_a_step_in_the_machine():
    cells = [(0, 0), (0, 1)] * 20                          # two cells alternating, 40 runs
    base = np.array([30.0 if k == 0 else 45.0 for _, k in cells])
    step = np.where(np.arange(40) >= 20, 1.1, 1.0)          # the machine 10 % faster from run 20 on
    rows = sweep(base * step, cells)
    mf = MA.machine_factors(rows, neighbours=2)
    assert mf.slope == 0.0 and mf.repeated_runs == 40       # no reads: the neighbour term only
    adj = MA.adjusted(rows.assign(machine_factor=mf.factor))["throughput"].to_numpy()
    # each cell's mean sits halfway (log) between the two stretches: away from the step every run is
    # taken exactly to it, base x sqrt(1.1)
    interior = np.r_[0:18, 22:40]
    assert adj[interior] == pytest.approx(base[interior] * np.sqrt(1.1))
    assert MA.run_noise(rows.assign(machine_factor=mf.factor)) > 0.04
    assert MA.run_noise(MA.adjusted(rows.assign(machine_factor=mf.factor))) < 0.02


def test_a_run_is_not_adjusted_by_itself():
    cells = [(0, 0), (0, 1)] * 10
    thr = np.array([30.0 if k == 0 else 45.0 for _, k in cells])
    thr[9] *= 2.0                                           # one run twice as fast, its neighbours not
    mf = MA.machine_factors(sweep(thr, cells), neighbours=4)
    # its factor is the median of its 8 neighbours' residuals, none of them its own: 4 runs of the
    # other cell at 0, and 4 of its own cell at -log 2 / 10 (the fast run lifted their cell's mean)
    assert mf.factor.iloc[9] == pytest.approx(np.exp(-np.log(2) / 20))
    assert MA.adjusted(sweep(thr, cells).assign(machine_factor=mf.factor))["throughput"].iloc[9] > 1.9 * 45


def test_no_cell_moved_in_expectation_under_a_shuffled_order():
    rng = np.random.default_rng(7)
    grid = [(p, k) for p in range(4) for k in range(5)] * 12          # 20 cells x 12 runs, shuffled
    cells = [grid[i] for i in rng.permutation(len(grid))]
    n = len(cells)
    drift = np.zeros(n)
    for i in range(1, n):                                    # the machine's slow moments: AR(1)
        drift[i] = 0.9 * drift[i - 1] + rng.normal(0, 0.03)
    ref = np.exp(-0.8 * drift + rng.normal(0, 0.02, n)) * 15  # the read sees part of it
    base = np.array([20.0 + 3 * p + 5 * k for p, k in cells])
    thr = base * np.exp(drift + rng.normal(0, 0.03, n))
    rows, mf = MA.with_machine_factors(sweep(thr, cells, ref))
    adj = MA.adjusted(rows)
    assert MA.run_noise(adj) < 0.75 * MA.run_noise(rows)
    # per cell, the mean log factor is small against the spread of one run: the cells stay where they were
    logf = pd.Series(np.log(mf.factor.to_numpy()), index=[str(c) for c in cells])
    per_cell = logf.groupby(level=0).mean()
    assert per_cell.abs().max() < 3 * logf.std() / np.sqrt(12)
    assert abs(float(logf.mean())) < 0.01


def test_refusals():
    cells = [(0, 0), (0, 1)] * 3
    rows = sweep([30, 45, 31, 44, 29, 46], cells)
    with pytest.raises(ValueError, match="no machine_factor column"):
        MA.adjusted(rows)
    with pytest.raises(ValueError, match="positive and finite"):
        MA.adjusted(rows.assign(machine_factor=[1, 1, 0, 1, 1, 1]))
    with pytest.raises(ValueError, match=r"lack column\(s\) \['seq'\]"):
        MA.machine_factors(rows.drop(columns="seq"))
    with pytest.raises(ValueError, match="throughput must be positive and finite in every run; 1 of 6"):
        MA.machine_factors(rows.assign(throughput=[30, 45, np.nan, 44, 29, 46]))
    with pytest.raises(ValueError, match="seq .* repeats"):
        MA.machine_factors(rows.assign(seq=[0, 1, 1, 2, 3, 4]))
    with pytest.raises(ValueError, match="neighbours must be >= 1"):
        MA.machine_factors(rows, neighbours=0)
    with pytest.raises(ValueError, match="cells run at least twice"):
        MA.run_noise(rows.assign(prompt=range(6)))


def _two_slope_sweep(seed=5, reps=6):
    """Plain runs that follow the read with slope 1, drafted ones with slope 0.5 (a plain step is
    all weight reads, a drafted round adds the draft's compute), three prompts in a seeded order."""
    rng = np.random.default_rng(seed)
    cells = [(p, k) for p in range(3) for k in (0, 1, 2)] * reps
    cells = [cells[i] for i in rng.permutation(len(cells))]
    base = np.array([{0: 30.0, 1: 45.0, 2: 50.0}[k] + p for p, k in cells])
    ref = rng.uniform(10, 30, len(cells))
    power = np.array([1.0 if k == 0 else 0.5 for _, k in cells])
    return sweep(base * np.exp(power * bracketing_log_read(ref)), cells, ref), base


def test_plain_and_drafted_slopes_recovered():
    rows, base = _two_slope_sweep()
    mf = MA.machine_factors(rows, iterations=0)
    assert mf.group_slopes == pytest.approx({"drafted": 0.5, "plain": 1.0}) and 0.5 < mf.slope < 1.0
    adj = MA.adjusted(rows.assign(machine_factor=mf.factor))
    assert adj["throughput"].to_numpy() == pytest.approx(base)
    assert MA.run_noise(adj) == pytest.approx(0, abs=1e-12)
    summary = MA.factor_summary(mf, rows.assign(machine_factor=mf.factor))
    assert summary["slope_plain"] == pytest.approx(1.0) and summary["slope_drafted"] == pytest.approx(0.5)
    assert summary["slope"] == pytest.approx(mf.slope) and summary["noise_adjusted"] == pytest.approx(0, abs=1e-12)
    assert MA.settings() == {"neighbours": 4, "iterations": 1, "min_group_runs": MA.MIN_GROUP_RUNS}


def test_a_thin_group_takes_the_sweeps_slope():
    rows, _ = _two_slope_sweep()
    few = rows[(rows.k != 0) | (rows.seq < 12)]                # a handful of plain runs: under MIN_GROUP_RUNS
    few = few.assign(seq=np.arange(len(few)))
    mf = MA.machine_factors(few, iterations=0)
    plain_cells = MA.cell_keys(few[few.k == 0]).value_counts()
    assert plain_cells[plain_cells >= 2].sum() < MA.MIN_GROUP_RUNS   # the plain runs of repeated cells
    assert mf.group_slopes["plain"] == pytest.approx(mf.slope) and mf.group_slopes["drafted"] != mf.slope
