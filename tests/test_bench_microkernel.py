"""The extension's micro-kernel pace function and benchmarks/bench_microkernel.py's arithmetic."""

from __future__ import annotations

import math

import pytest

from bench_scripts import load_benchmark
from kernel_cases import skip_if_absent
from moespec.kernels import build


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_microkernel")


def test_summarize_hand_values(bench):
    df = bench.summarize({("int8_b32", "L1", 2): [1.0, 2.0, 4.0], ("f32", "L2", 1): [0.5]})
    row = df[df.fmt == "int8_b32"].iloc[0]
    assert row.ns_per_64B == 2.0 and row.ns_per_64B_token == 1.0 and row.rounds == 3
    assert row.ns_per_64B_q25 == 1.5 and row.ns_per_64B_q75 == 3.0
    assert row.weights_GBps_per_core == 32.0 and row.token_GBps_per_core == 64.0  # 64 B / 2 ns, x 2 tokens
    assert df[df.fmt == "f32"].iloc[0].weights_GBps_per_core == 128.0


@pytest.mark.parametrize("fmt", ["f32", "bf16", "int8_b32"])
def test_microkernel_ns_runs_every_format(fmt):
    skip_if_absent("cpp")
    ns = build.load_cpu().microkernel_ns(fmt, 3, 5, 1024 + 64, 2)  # a partial int8 group, rows < 16
    assert math.isfinite(ns) and ns > 0


@pytest.mark.parametrize("args, message", [
    (("f16", 1, 8, 2048, 1), "format must be"),
    (("f32", 0, 8, 2048, 1), "T must be in"),
    (("f32", 10, 8, 2048, 1), "T must be in"),
    (("bf16", 1, 0, 2048, 1), "nrows and reps"),
    (("int8_b32", 1, 8, 100, 1), "multiple of 32"),
])
def test_microkernel_ns_rejects_bad_arguments(args, message):
    skip_if_absent("cpp")
    with pytest.raises(RuntimeError, match=message):
        build.load_cpu().microkernel_ns(*args)


def test_script_rejects_unknown_size(bench):
    with pytest.raises(SystemExit):
        bench.main(["--sizes", "L3"])
