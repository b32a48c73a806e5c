"""The extension's memory read probe and benchmarks/bench_read_patterns.py's arithmetic."""

from __future__ import annotations

import pytest
import torch

from bench_scripts import load_benchmark
from kernel_cases import skip_if_absent
from moespec.kernels import build


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_read_patterns")


def test_summarize_pairs_each_round_with_its_read(bench):
    # reference: 100 bytes in 10, 20 ns -> 10, 5 GB/s; probe: 50 bytes in 10, 5 ns -> 5, 10 GB/s
    df = bench.summarize([10, 20], 100, {("lanes", 0, 512): [10, 5]}, {("lanes", 0, 512): 50})
    row = df.iloc[0]
    assert row.pattern == "lanes" and row.fmas_per_line == 0 and row.prefetch_bytes == 512 and row.rounds == 2
    assert row.GBps == 7.5 and row.read_GBps == 7.5                  # medians of (5, 10) and (10, 5)
    assert row.over_read == pytest.approx(1.25)                        # median of paired 0.5 and 2.0
    assert row.over_read_q25 == pytest.approx(0.875) and row.over_read_q75 == pytest.approx(1.625)
    assert row.read_min_GBps == 5 and row.read_max_GBps == 10 and bool(row.read_unsteady)
    assert not bool(bench.summarize([10, 11], 100, {("halves", 2, 0): [10, 10]}, {("halves", 2, 0): 100}).iloc[0].read_unsteady)


@pytest.mark.parametrize("isa", ["avx512", "portable"])
@pytest.mark.parametrize("pattern", ["halves", "lanes", "whole", "side", "fused"])
@pytest.mark.parametrize("fmas, prefetch", [(0, 0), (3, 0), (0, 4096)])
def test_read_probe_reads_every_byte_it_counts(pattern, fmas, prefetch, isa, monkeypatch):
    """A buffer of ones: the running sum counts one per float read (fmas = 0), so checksum * 4 is
    the bytes read; the byte count is the pattern's share of the buffer (whole 64-byte lines).
    Both loops (AVX-512 where present, portable under MOESPEC_CPU_ISA=portable)."""
    skip_if_absent("cpp")
    monkeypatch.setenv("MOESPEC_CPU_ISA", isa)
    buf = torch.ones(2**20)  # 4 MiB
    ns, nbytes, checksum = build.load_cpu().read_probe(buf, pattern, 2**18, 2, fmas, prefetch)
    assert ns > 0 and 0.85 * buf.numel() * 4 <= nbytes <= buf.numel() * 4 and nbytes % 64 == 0
    if fmas == 0:
        assert checksum * 4 == nbytes
    else:
        assert checksum > nbytes / 4  # the multiply-adds of ones add to the sum


@pytest.mark.parametrize("args, message", [
    (("diagonal", 2**18, 2, 0, 0), "pattern must be"),
    (("halves", 2**18, 0, 0, 0), "threads must be"),
    (("halves", 2**18, 2, 65, 0), "fmas_per_line"),
    (("halves", 2**18, 2, 0, 100), "prefetch_bytes"),
    (("lanes", 100, 2, 0, 0), "matrix_bytes"),
    (("whole", 2**18 + 1, 2, 0, 0), "matrix_bytes"),
])
def test_read_probe_rejects_bad_arguments(args, message):
    skip_if_absent("cpp")
    with pytest.raises(RuntimeError, match=message):
        build.load_cpu().read_probe(torch.ones(2**20), *args)
    with pytest.raises(RuntimeError, match="at least 1 MiB"):
        build.load_cpu().read_probe(torch.ones(1000), "halves", 2**18, 2, 0, 0)


def test_script_rejects_unknown_pattern(bench):
    with pytest.raises(SystemExit):
        bench.main(["--patterns", "zigzag"])
