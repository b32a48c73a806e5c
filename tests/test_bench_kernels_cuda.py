"""The CUDA benchmark script's GPU-free parts: arguments, the byte and bandwidth arithmetic of its
rows, r(n), the goals' verdicts, the uniform-routing ubar(n), the report, and on-device weight
generation (on CPU)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from bench_scripts import load_benchmark

from moespec import paths
from moespec.measure.timing import MachineState, Timing

SCRIPT = paths.ROOT / "benchmarks" / "bench_kernels_cuda.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_kernels_cuda")


def test_ubar_uniform_hand_values(bench):
    assert bench.ubar_uniform(1, 8, 64) == pytest.approx(1.0)
    # N = 64, m = 8, n = 2: q = 7/8, E[U] = 64 (1 - 49/64) = 15, ubar = 15/16
    assert bench.ubar_uniform(2, 8, 64) == pytest.approx(15 / 16)
    assert bench.ubar_uniform(9, 4, 32) < bench.ubar_uniform(2, 4, 32) < 1.0


def _timings(**medians_us):
    """Timings whose median is the given value (us) and quartiles +-1 us."""
    return {k: Timing(k, tuple(float(v + d) * 1e3 for d in (-2, -1, 0, 1, 2))) for k, v in medians_us.items()}


def test_rows_bytes_bandwidth_and_shares(bench):
    t = _timings(**{"fused/slot": 12, "fused/dedup": 8, "peer:torch_loop/peer/graph": 20, "read": 100_000})
    b = 1_000_000
    rows = bench.rows_for("olmoe", "bf16", 2, (64, 2048, 1024), 8, 12, b, t, 1_000_000_000, "rotate",
                          {("fused", "slot"): "fused 2 launches"}, MachineState(), ["note"])
    by = {(r["variant"], r["kernel"]): r for r in rows}
    assert len(rows) == 3 and all(set(r) == set(bench.FIELDS) for r in rows)
    slot, dedup, peer = by["fused", "slot"], by["fused", "dedup"], by["peer:torch_loop", "peer"]
    assert slot["bytes"] == 16 * b and dedup["bytes"] == 12 * b and peer["bytes"] == 12 * b
    assert slot["beta_GBps"] == pytest.approx(16e6 / 12e-6 / 1e9)
    assert dedup["beta_read_GBps"] == pytest.approx(10.0)  # 1e9 bytes in 0.1 s
    assert dedup["of_read"] == pytest.approx((12e6 / 8e-6) / 1e10)
    assert peer["graph"] == 1 and slot["graph"] == 0 and slot["plan"] == "fused 2 launches"
    assert slot["t_q25_s"] == pytest.approx(11e-6) and slot["flags"] == "note"
    assert slot["ubar_uniform"] == pytest.approx(15 / 16)
    r = bench.r_values(rows)
    assert r[("olmoe", "bf16", "rotate", "fused", 0, 2)] == pytest.approx((12e6 / 8e-6) / (16e6 / 12e-6))  # 1.125


def test_goal_summary_and_report(bench):
    """Goals met or short on hand-made rows: read 10 GB/s; per-slot at n = 1 reads 8 experts."""
    b, read = 1_000_000, 1_000_000_000
    rows = []
    for n, (ts, td, tp) in {1: (900, 1000, 2000), 2: (1700, 1500, 2000), 8: (5000, 4000, 3000)}.items():
        U = {1: 8, 2: 15, 8: 38}[n]
        t = _timings(**{"fused/slot": ts, "fused/dedup": td, "peer:grouped_mm/peer/graph": tp, "read": 100_000})
        rows += bench.rows_for("olmoe", "bf16", n, (64, 2048, 1024), 8, U, b, t, read, "rotate", {}, MachineState())
    (g,) = bench.goal_summary(rows)
    assert g["slot_n1"] == pytest.approx(8e6 / 900e-6 / 1e10)          # 0.889 >= 0.85: met
    assert g["met"]["slot_n1"] and not g["met"]["dedup"]
    assert g["dedup_min"] == pytest.approx(8e6 / 1000e-6 / 1e10)        # 0.8 at n = 1: short
    assert g["r2"] == pytest.approx((15e6 / 1500e-6) / (16e6 / 1700e-6))
    assert g["r8"] == pytest.approx((38e6 / 4000e-6) / (64e6 / 5000e-6))
    assert g["beats_peers"] is False  # at n = 8 the peer (3000 us) beats both our kernels
    text = bench.report_markdown(rows, {"GPU": "test"})
    assert "| olmoe | bf16 | rotate | 0.89 | 0.80 (short) |" in text
    assert "## olmoe, bf16, protocol rotate" in text and "grouped_mm (graph)" in text
    assert "| 1 | 8 | 10 | " in text and "0.89 [900.0]" in text


def test_args_are_checked(bench):
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "fused,turbo"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--copies", "1"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--protocols", "none"])
    a = bench.parse_args(["--peers", "none", "--protocols", "flush,rotate", "--quick"])
    assert a.peers == [] and a.protocols == ["flush", "rotate"] and a.ns == [1, 2, 9] and a.reps == 5


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


def test_summarize_reads_standalone_csv(bench, tmp_path):
    """--summarize (stdlib only) turns a CSV with bench_standalone's columns into the goals table."""
    import csv

    cols = ["model", "fmt", "n", "m", "N", "H", "I", "U", "expert_bytes", "protocol", "variant", "kernel", "graph",
            "bytes", "t_s", "t_q25_s", "t_q75_s", "beta_GBps", "t_read_s", "beta_read_GBps", "of_read", "plan",
            "reps", "gpu", "flags"]
    path = tmp_path / "standalone.csv"
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, cols)
        w.writeheader()
        for kernel, share in (("slot", 0.9), ("dedup", 0.8)):
            w.writerow({"model": "olmoe", "fmt": "int8_b32", "n": 1, "m": 8, "N": 64, "H": 2048, "I": 1024, "U": 8,
                        "expert_bytes": 7e6, "protocol": "rotate", "variant": "fused", "kernel": kernel, "graph": 0,
                        "bytes": 56e6, "t_s": 1e-5, "t_q25_s": 1e-5, "t_q75_s": 1e-5, "beta_GBps": share * 4000,
                        "t_read_s": 2.5e-4, "beta_read_GBps": 4000, "of_read": share, "plan": "fused", "reps": 5,
                        "gpu": "X", "flags": ""})
    text = bench.summarize(path)
    assert "| olmoe | int8_b32 | rotate | 0.90 | 0.80 (short) | n/a (short) | n/a (short) | n/a |" in text
    with pytest.raises(ValueError, match="missing columns"):
        (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
        bench.summarize(tmp_path / "bad.csv")
    out = subprocess.run([sys.executable, str(SCRIPT), "--summarize", str(path)], capture_output=True, text=True)
    assert out.returncode == 0 and "## Goals" in out.stdout
