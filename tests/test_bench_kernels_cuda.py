"""The CUDA benchmark script's GPU-free parts: arguments, the byte and bandwidth arithmetic of a
result row, the uniform-routing ubar(n), the report, and on-device weight generation (on CPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from moespec import paths
from moespec.bench.timing import MachineState, Timing
from bench_scripts import load_benchmark

SCRIPT = paths.ROOT / "benchmarks" / "bench_kernels_cuda.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_kernels_cuda")


def test_ubar_uniform_hand_values(bench):
    assert bench.ubar_uniform(1, 8, 64) == pytest.approx(1.0)
    # N = 64, m = 8, n = 2: q = 7/8, E[U] = 64 (1 - 49/64) = 15, ubar = 15/16
    assert bench.ubar_uniform(2, 8, 64) == pytest.approx(15 / 16)
    assert bench.ubar_uniform(9, 4, 32) < bench.ubar_uniform(2, 4, 32) < 1.0


def test_row_arithmetic(bench):
    ns = lambda *v: tuple(float(t) * 1e3 for t in v)  # microseconds -> ns  # noqa: E731
    timings = {"slot": Timing("slot", ns(10, 11, 12, 13, 14)),   # median 12 us, q25 11, q75 13
               "dedup": Timing("dedup", ns(7, 8, 8, 8, 9)),      # median 8 us, q25 8, q75 8
               "read": Timing("read", ns(100, 100, 100))}
    b = 1_000_000
    row = bench.row_for("olmoe", "bf16", 2, (64, 2048, 1024), 8, 12, b, timings, 1_000_000_000, MachineState())
    assert row["slot_bytes"] == 16 * b and row["dedup_bytes"] == 12 * b
    assert row["beta_slot_GBps"] == pytest.approx(16e6 / 12e-6 / 1e9)
    assert row["beta_dedup_GBps"] == pytest.approx(12e6 / 8e-6 / 1e9)
    assert row["beta_read_GBps"] == pytest.approx(1e9 / 100e-6 / 1e9)
    assert row["r"] == pytest.approx((12e6 / 8e-6) / (16e6 / 12e-6))  # = 1.125
    assert row["r_q25"] == pytest.approx((12e6 / 8e-6) / (16e6 / 11e-6))
    assert row["r_q75"] == pytest.approx((12e6 / 8e-6) / (16e6 / 13e-6))
    assert row["ubar_uniform"] == pytest.approx(15 / 16) and row["dedup_faster_uniform"] == 1
    assert set(row) == set(bench.FIELDS)
    text = bench.report_markdown([row, {**row, "n": 1}], {"GPU": "test"})
    assert "## olmoe, bf16" in text and "| 2 | 12 | 12.0 | 8.0 |" in text and "1.125" in text


def test_device_random_weights_on_cpu(bench):
    for fmt in ("f32", "bf16", "int8_b32"):
        w = bench.device_random_weights((4, 64, 32), fmt, "cpu", seed=0)
        assert w.shape == (4, 64, 32) and w.fmt == fmt
        assert w.bytes_per_expert == {"f32": 4, "bf16": 2, "int8_b32": 36 / 32}[fmt] * 3 * 64 * 32
    w = bench.device_random_weights((4, 64, 32), "int8_b32", "cpu", seed=0)
    assert int(w.gate.min()) >= -127 and bool((w.gate_scale > 0).all())


def test_cli_help_and_clear_error_without_gpu(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and "--quick" in out.stdout
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the no-GPU message cannot be checked")
    out = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)], capture_output=True,
                         text=True)
    assert out.returncode != 0 and "no GPU visible to torch" in out.stderr
