"""The C++ driver's stage clock (moespec.kernels.call_stages), benchmarks/bench_call_stages.py's
arithmetic and its figure."""

from __future__ import annotations

import time

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from kernel_cases import skip_if_absent  # noqa: E402
from moespec.kernels import ExpertWeights, build, expert_forward  # noqa: E402
from moespec.kernels.call_stages import STAGES, CallStages, stage_clock, timed_call  # noqa: E402
from moespec.plots.kernels import STAGE_STYLE, call_stages_figure  # noqa: E402
from bench_scripts import load_benchmark  # noqa: E402


def test_from_clock_exact_durations():
    # Python before 1000 ns, driver [entry, setup_done, first_item, work_done, exit], Python after
    st = CallStages.from_clock(1_000, [3_000, 10_000, 12_000, 912_000, 915_000], 920_000)
    assert (st.python_in, st.setup, st.wake, st.work, st.combine, st.python_out) == (2.0, 7.0, 2.0, 900.0, 3.0, 5.0)
    assert st.total == pytest.approx(919.0) and st.fixed == pytest.approx(19.0) and st.op == pytest.approx(912.0)


def test_from_clock_rejects_missing_and_disordered_records():
    with pytest.raises(ValueError, match="no stage record"):
        CallStages.from_clock(1, [0, 0, 0, 0, 0], 2)
    with pytest.raises(ValueError, match="out of order"):
        CallStages.from_clock(1_000, [3_000, 2_000, 12_000, 912_000, 915_000], 920_000)
    with pytest.raises(ValueError, match="out of order"):  # the call ended after Python's clock read
        CallStages.from_clock(1_000, [3_000, 10_000, 12_000, 912_000, 915_000], 914_000)


@pytest.mark.parametrize("fmt", ["f32", "int8_b32"])
@pytest.mark.parametrize("kernel", ["slot", "dedup"])
def test_timed_call_same_output_and_consistent_stages(fmt, kernel):
    skip_if_absent("cpp")
    w = ExpertWeights.random((12, 64, 96), fmt, seed=3)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[0, 5, 7], [5, 7, 11], [1, 5, 0]])
    gates = torch.rand(3, 3, generator=torch.Generator().manual_seed(1))
    plain = expert_forward(x, ids, w, gates, kernel=kernel, backend="cpp")
    t0 = time.monotonic_ns()
    y, st = timed_call(x, ids, w, gates, kernel=kernel)
    wall_us = (time.monotonic_ns() - t0) / 1e3
    assert torch.equal(y, plain)  # the clock changes nothing of the result
    values = [getattr(st, k) for k in STAGES]
    assert all(v >= 0 for v in values) and st.work > 0
    assert st.total <= wall_us  # the stages lie within the call
    # switched off again afterwards: a plain call leaves no record
    mod = build.load_cpu()
    expert_forward(x, ids, w, gates, kernel=kernel, backend="cpp")
    assert mod.take_last_stages() == [0, 0, 0, 0, 0]


def test_stage_clock_block_records_every_call_and_reads_clear():
    skip_if_absent("cpp")
    w = ExpertWeights.random((10, 32, 64), "bf16", seed=0)
    x = torch.randn(2, 32)
    ids = torch.tensor([[0, 1], [1, 2]])
    mod = build.load_cpu()
    with stage_clock():
        for _ in range(3):
            _, st = timed_call(x, ids, w)
            assert st.work > 0
        assert mod.take_last_stages() == [0, 0, 0, 0, 0]  # timed_call took the record already
    expert_forward(x, ids, w, backend="cpp")
    assert mod.take_last_stages() == [0, 0, 0, 0, 0]


def test_timed_call_passes_errors_through():
    skip_if_absent("cpp")
    w = ExpertWeights.random((10, 32, 64), "f32", seed=0)
    with pytest.raises(ValueError, match="ids"):
        timed_call(torch.randn(2, 32), torch.tensor([[0, 10], [1, 2]]), w)
    assert build.load_cpu().take_last_stages() == [0, 0, 0, 0, 0]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_call_stages")


def test_summarize_ratios_on_hand_made_rounds(bench):
    # two rounds: 36 MB requested; work 900 us of a 1000 us call; read 40 and 36 GB/s
    st = CallStages(python_in=20.0, setup=40.0, wake=5.0, work=900.0, combine=5.0, python_out=30.0)
    row = bench.summarize([(36e6, st, 40e9), (36e6, st, 36e9)], expert_bytes=4_500_000)
    assert row["U_mean"] == 8.0 and row["reps"] == 2
    assert row["total_us"] == pytest.approx(1000.0) and row["fixed_us"] == pytest.approx(100.0)
    assert row["fixed_share"] == pytest.approx(0.1) and row["work_us"] == 900.0
    # per round: 36 MB / 1 ms = 36 GB/s over 40 and 36 -> 0.9 and 1.0, median 0.95
    assert row["total_over_read"] == pytest.approx(0.95)
    assert row["work_over_read"] == pytest.approx(np.median([36e6 / 900e-6 / 40e9, 36e6 / 900e-6 / 36e9]))
    # the op: set-up + wake + work + combine = 950 us
    assert row["op_over_read"] == pytest.approx(np.median([36e6 / 950e-6 / 40e9, 36e6 / 950e-6 / 36e9]))


def test_call_stages_figure_stacks_to_one():
    rows = pd.DataFrame([{"model": "toy", "fmt": fmt, "n": n, "read_GBps": 35.0, "total_over_read": 0.9,
                          "work_over_read": 0.95, **{f"{k}_us": 10.0 * (i + 1) for i, k in enumerate(STAGE_STYLE)}}
                         for fmt in ("f32", "int8_b32") for n in (1, 9)])
    fig = call_stages_figure(rows, "toy")
    axes = fig.get_axes()
    assert len(axes) == 2 and axes[1].get_title().startswith("int8_b32, read 35.0 GB/s")
    bars = axes[0].patches  # 6 stages x 2 values of n
    assert len(bars) == 12
    tops = {}
    for bar in bars:
        x = round(bar.get_x() + bar.get_width() / 2, 3)
        tops[x] = max(tops.get(x, 0.0), bar.get_y() + bar.get_height())
    assert all(t == pytest.approx(1.0) for t in tops.values())
    # the work stage (first in STAGE_STYLE: 10 of 210) at the bottom
    assert bars[0].get_y() == 0 and bars[0].get_height() == pytest.approx(10 / 210)
    with pytest.raises(ValueError, match="no rows for model"):
        call_stages_figure(rows, "other")


def test_bench_format_rejects_bad_protocol_and_copies(bench):
    with pytest.raises(ValueError, match="protocol must be one of"):
        bench.bench_format("olmoe", "f32", [1], 1, 1, 1, 0, protocol="hot")
    with pytest.raises(ValueError, match="warm-code needs at least 2 layer copies"):
        bench.bench_format("olmoe", "f32", [1], 1, 1, 1, 0, protocol="warm-code", copies=1)
