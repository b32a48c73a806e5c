"""benchmarks/bench_kernels.py's tables and figure on hand-made rows (the benchmark itself needs
gigabytes of weights and minutes of quiet machine; it is run by hand, docs/kernels.md)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from moespec.plots.kernels import kernel_share_figure  # noqa: E402
from bench_scripts import load_benchmark  # noqa: E402


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_kernels")


def _rows():
    rows = []
    for fmt in ("f32", "int8_b32"):
        for n in (1, 2, 3):
            for kernel, backend, share in (("slot", "cpp", 0.9), ("dedup", "cpp", 0.8), ("dedup", "ggml", 0.5)):
                rows.append({"model": "toy", "fmt": fmt, "kernel": kernel, "backend": backend, "n": n,
                             "beta_over_read": share, "beta_over_read_q25": share - 0.01,
                             "beta_over_read_q75": share + 0.01, "read_GBps": 35.0, "layer_read_over_read": 0.97,
                             "r_n": 0.8 / 0.9 if (kernel, backend) == ("dedup", "cpp") else np.nan,
                             "dedup_over_ggml": 1.6 if (kernel, backend) == ("dedup", "cpp") else np.nan,
                             "date": "2026-11-29T13:00:00+00:00"})
    return pd.DataFrame(rows)


def test_summary_tables_and_crossover(bench):
    df = _rows()
    tables = bench.summary_tables(df)
    r = tables["r(n) = beta_dedup / beta_slot"]
    assert r.shape == (2, 3) and np.allclose(r.to_numpy(), round(0.8 / 0.9, 3))
    assert np.allclose(tables["moespec dedup / ggml MUL_MAT_ID, effective bandwidth (paired per round)"].to_numpy(), 1.6)
    # with ggml's per-slot counterpart and its r(n)
    slot_rows = df[df.backend == "ggml"].assign(kernel="slot", beta_over_read=0.25)
    both = pd.concat([df.assign(r_n_ggml=np.where((df.kernel == "dedup") & (df.backend == "cpp"), 2.0, np.nan)),
                      slot_rows], ignore_index=True)
    t2 = bench.summary_tables(both)
    assert np.allclose(t2["ggml MUL_MAT_ID beta (distinct bytes) / read bandwidth (same rounds)"].to_numpy(), 0.5)
    assert np.allclose(t2["ggml per-slot counterpart (one MUL_MAT_ID per token) beta / read bandwidth"].to_numpy(), 0.25)
    assert np.allclose(t2["ggml's r(n) = beta_MUL_MAT_ID / beta_per-slot counterpart"].to_numpy(), 2.0)
    ub = pd.DataFrame({"model": "toy", "routing": "uniform", "n": [1, 2, 3], "ubar": [1.0, 0.95, 0.85]})
    cross = bench.crossover_table(df, ub)
    # r = 0.889: ubar(2) = 0.95 is not below it, ubar(3) = 0.85 is (n = 1 never counts)
    assert cross["n_where_ubar_lt_r"].tolist() == ["3", "3"] and cross["crossover_n"].tolist() == [3, 3]


def test_kernel_share_figure_and_plot_run(bench, tmp_path):
    df = _rows()
    fig = kernel_share_figure(df, "toy")
    axes = fig.get_axes()
    assert len(axes) == 2 and [a.get_title() for a in axes] == ["f32, read 35.0 GB/s", "int8_b32, read 35.0 GB/s"]
    # three kernels with error bars per panel, plus the read (1) and the size-matched read lines
    assert all(len(a.containers) == 3 for a in axes)
    assert sorted(round(line.get_ydata()[0], 2) for line in axes[0].get_lines() if len(line.get_ydata()) == 2) == [0.97, 1.0]
    with pytest.raises(ValueError, match="no rows for model 'other'"):
        kernel_share_figure(df, "other")
    csv = tmp_path / "20261129T130000Z.csv"
    df.to_csv(csv, index=False)
    out = bench.plot_run(csv)
    assert out == [tmp_path / "20261129T130000Z_toy.png"] and out[0].stat().st_size > 10_000


@pytest.mark.parametrize("protocol, copies, message", [("lukewarm", 3, "protocol must be one of"),
                                                       ("warm-code", 1, "at least 2 layer copies")])
def test_bench_one_rejects_bad_protocols_before_any_work(bench, protocol, copies, message):
    with pytest.raises(ValueError, match=message):
        bench.bench_one("olmoe", "f32", [1], 1, 0, 0, 0, 0, False, protocol=protocol, copies=copies)
