"""What the benchmark scripts share (moespec.measure.protocols): the regime check, the layer
copies, the rotating timed call, the protocol check, the common arguments and the row columns."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from moespec.measure import protocols


def test_read_unsteady_flags_a_regime_change():
    """A block whose reference reads span more than UNSTEADY_READ (a change of bandwidth regime
    between rounds) is flagged; a steady one is not."""
    assert protocols.UNSTEADY_READ == 1.25
    assert not protocols.read_unsteady([35e9, 36e9, 37.5e9, 34e9])
    assert not protocols.read_unsteady([40e9, 50e9])          # exactly 1.25: still steady
    assert protocols.read_unsteady([35e9, 36e9, 64e9, 35.5e9])
    assert protocols.read_unsteady(np.array([60e9, 47.9e9]))


def test_layer_copies_are_handed_out_in_turn():
    """Under warm-code every call takes the next layer copy, whichever kernel calls: consecutive
    calls never read the same copy (with two or more)."""
    copies = protocols.Copies(["a", "b", "c"])
    assert [copies.next() for _ in range(7)] == ["a", "b", "c", "a", "b", "c", "a"]
    single = protocols.Copies(["only"])
    assert single.next() == single.next() == "only"


def test_rotating_call_logs_its_passes():
    log, seen = [], []
    call = protocols.rotating(["p0", "p1"], log, lambda ids: seen.append(ids) or len(seen))
    assert [call() for _ in range(3)] == [1, 2, 3]
    assert log == seen == ["p0", "p1", "p0"]


@pytest.mark.parametrize("protocol, copies, message", [("lukewarm", 3, "protocol must be one of"),
                                                       ("warm-code", 1, "at least 2 layer copies")])
def test_check_protocol_refuses(protocol, copies, message):
    with pytest.raises(ValueError, match=message):
        protocols.check_protocol(protocol, copies)


def test_check_protocol_counts_the_copies():
    assert protocols.check_protocol("cold", 5) == 1          # a flush evicts: one copy is enough
    assert protocols.check_protocol("warm-code", 4) == 4


def test_read_flush_reads_the_bytes():
    flush = protocols.read_flush(4096)
    assert float(flush()) == 1024.0                           # 1024 float32 ones


def test_common_arguments():
    ap = protocols.add_common_arguments(argparse.ArgumentParser(), reps=9)
    args = ap.parse_args(["--protocol", "warm-code", "--copies", "4"])
    assert (args.threads, args.flush_mib, args.reps, args.membw_gib, args.seed, args.protocol, args.copies) == \
        (2, None, 9, None, 0, "warm-code", 4)
    assert protocols.sizes(args) == (None, None)           # the machine's (timing.flush_bytes, read_bytes)
    assert protocols.sizes(ap.parse_args(["--flush-mib", "1920", "--membw-gib", "2"])) == (1920 * 2**20, 2**31)
    bare = protocols.add_common_arguments(argparse.ArgumentParser(), protocol=False, membw=False, seed=False)
    assert sorted(vars(bare.parse_args([]))) == ["flush_mib", "threads"]
    with pytest.raises(SystemExit):
        ap.parse_args(["--protocol", "hot"])


def test_run_columns_and_stamp(monkeypatch):
    monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", "1")
    monkeypatch.delenv("MOESPEC_CPU_THREADS", raising=False)
    cols = protocols.run_columns()
    assert cols["thp"] == "1" and cols["cpu_threads"] == "auto" and "cpu_isa" not in cols
    assert len(protocols.stamp()) == 16 and protocols.stamp().endswith("Z")
