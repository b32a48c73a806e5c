"""Atomic file writes and resumable row logs, shared by every module that writes results.

A result is either fully written or not present: each write goes to a temporary file in the
same folder and is renamed over the target (``os.replace`` is atomic on POSIX).
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping


@contextmanager
def atomic_path(target: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``target``; on success rename it to ``target``.

    Writers that need a filename (``np.savez``, ``fig.savefig``, ``df.to_csv``) write to the
    yielded path. On an exception the temporary file is removed and ``target`` is untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=target.suffix or ".tmp",
                               dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        # mkstemp creates the file 0600; a result file gets the usual mode (0666 less the umask)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_path, 0o666 & ~umask)
        os.replace(tmp_path, target)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def write_text(target: str | os.PathLike, text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text)
    return Path(target)


def write_json(target: str | os.PathLike, obj: Any) -> Path:
    return write_text(target, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_dataframe(target: str | os.PathLike, df) -> Path:
    """Write a pandas DataFrame as CSV atomically (index dropped)."""
    with atomic_path(target) as tmp:
        df.to_csv(tmp, index=False)
    return Path(target)


def save_figure(fig, target: str | os.PathLike, **kwargs) -> Path:
    """Save a matplotlib figure atomically; the format follows the target's suffix."""
    target = Path(target)
    kwargs.setdefault("bbox_inches", "tight")
    kwargs.setdefault("dpi", 150)
    with atomic_path(target) as tmp:
        fig.savefig(tmp, format=target.suffix.lstrip(".") or "png", **kwargs)
    return target


class RowLog:
    """An append-only CSV of measured rows, flushed after every row so that a sweep resumes.

    ``done_keys()`` returns the key tuples already on disk; a sweep skips those. A partly
    written last line (a crash mid-write) is dropped on open, never silently merged.
    """

    def __init__(self, path: str | os.PathLike, fieldnames: list[str], key: list[str]):
        self.path = Path(path)
        self.fieldnames = list(fieldnames)
        self.key = list(key)
        missing = [k for k in self.key if k not in self.fieldnames]
        if missing:
            raise ValueError(f"RowLog key columns {missing} are not among the fields {self.fieldnames}")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.exists():
            self._check_and_repair()

    def _check_and_repair(self) -> None:
        text = self.path.read_text()
        if not text:
            return
        lines = text.splitlines(keepends=True)
        header = next(csv.reader([lines[0]]))
        if header != self.fieldnames:
            raise ValueError(
                f"{self.path}: its columns {header} differ from this sweep's {self.fieldnames}; "
                "move the file away or use another path (it is never overwritten)")
        if not text.endswith("\n"):  # a crash mid-row: keep the complete rows only
            write_text(self.path, "".join(lines[:-1]))

    def rows(self) -> list[dict[str, str]]:
        if not self.path.exists():
            return []
        with self.path.open(newline="") as fh:
            return list(csv.DictReader(fh))

    def done_keys(self) -> set[tuple[str, ...]]:
        return {tuple(row[k] for k in self.key) for row in self.rows()}

    def key_of(self, row: Mapping[str, Any]) -> tuple[str, ...]:
        return tuple(str(row[k]) for k in self.key)

    def append(self, row: Mapping[str, Any]) -> None:
        unknown = set(row) - set(self.fieldnames)
        if unknown:
            raise ValueError(f"{self.path}: row has unknown columns {sorted(unknown)}")
        new = not self.path.exists() or self.path.stat().st_size == 0
        with self.path.open("a", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=self.fieldnames)
            if new:
                writer.writeheader()
            writer.writerow(dict(row))
            fh.flush()
            os.fsync(fh.fileno())

    def extend(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.append(row)
