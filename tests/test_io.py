"""Atomic writes and the resumable row log."""

from __future__ import annotations

import os
import stat

import pytest

from moespec import io


def test_atomic_write_replaces_whole_or_not_at_all(tmp_path):
    target = tmp_path / "out" / "table.csv"
    io.write_text(target, "first\n")
    with pytest.raises(RuntimeError):
        with io.atomic_path(target) as tmp:
            tmp.write_text("half a resu")
            raise RuntimeError("crash mid-write")
    assert target.read_text() == "first\n"
    assert [p.name for p in target.parent.iterdir()] == ["table.csv"]  # no temporary left behind
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(target.stat().st_mode) == 0o666 & ~umask


def test_rowlog_resumes_and_drops_a_partial_last_row(tmp_path):
    path = tmp_path / "rows.csv"
    log = io.RowLog(path, ["n", "kernel", "t"], key=["n", "kernel"])
    log.append({"n": 1, "kernel": "slot", "t": 0.5})
    log.append({"n": 1, "kernel": "dedup", "t": 0.25})
    with path.open("a") as fh:
        fh.write("2,slo")  # a crash in the middle of a row
    again = io.RowLog(path, ["n", "kernel", "t"], key=["n", "kernel"])
    assert again.done_keys() == {("1", "slot"), ("1", "dedup")}
    assert again.rows()[1] == {"n": "1", "kernel": "dedup", "t": "0.25"}
    with pytest.raises(ValueError, match="unknown columns"):
        again.append({"n": 2, "kernel": "slot", "t": 1, "extra": 0})


def test_rowlog_refuses_a_file_with_other_columns(tmp_path):
    path = tmp_path / "rows.csv"
    io.RowLog(path, ["a", "b"], key=["a"]).append({"a": 1, "b": 2})
    with pytest.raises(ValueError, match="differ from this sweep"):
        io.RowLog(path, ["a", "c"], key=["a"])
    assert path.read_text().splitlines()[0] == "a,b"  # never overwritten
    with pytest.raises(ValueError, match="key columns"):
        io.RowLog(tmp_path / "other.csv", ["a"], key=["z"])
