"""Where a command writes, checked before the work: an output file or folder that cannot be
written is refused at the start (``--json``, ``--out``, ``--files``, an ``out_dir`` parameter),
not after minutes of work; and the folder that holds what others may execute (submitit's job
pickles) must be one only the user can write."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from .errors import InputError


def _first_existing(path: Path) -> Path:
    """The nearest ancestor of ``path`` (or itself) that exists: what a write would need to change."""
    p = path
    while not p.exists() and p != p.parent:
        p = p.parent
    return p


def _check_ancestor(path: Path, what: str, error) -> None:
    """The folders a write to ``path`` would create must be creatable: their nearest existing
    ancestor is a folder this process may write into."""
    base = _first_existing(path.parent)
    if not base.is_dir():
        raise error(f"{what} {path}: expected a path inside a folder; found {base} is a file, not a folder",
                    where=str(path), expected="a writable folder", found=str(base))
    if not os.access(base, os.W_OK | os.X_OK):
        raise error(f"{what} {path}: expected a folder this user may write into; found {base} is not writable",
                    where=str(path), expected="a writable folder", found=str(base))


def writable_file(path: str | Path, what: str = "output file", error: type[InputError] = InputError) -> Path:
    """``path`` (made absolute) if a file can be written there: it is not a folder, and it exists
    writable or its folder can be created and written. Nothing is created."""
    path = Path(path).expanduser().absolute()
    if path.is_dir():
        raise error(f"{what} {path}: expected a file name; found a folder", where=str(path),
                    expected="a file", found="a folder")
    if path.exists() and not os.access(path, os.W_OK):
        raise error(f"{what} {path}: expected a writable file; found it read-only", where=str(path),
                    expected="a writable file", found="read-only")
    _check_ancestor(path, what, error)
    return path


def writable_folder(path: str | Path, what: str = "output folder", error: type[InputError] = InputError) -> Path:
    """``path`` (made absolute) if it is, or can be made, a folder this process may write into.
    Nothing is created."""
    path = Path(path).expanduser().absolute()
    if path.exists():
        if not path.is_dir():
            raise error(f"{what} {path}: expected a folder; found a file", where=str(path),
                        expected="a folder", found="a file")
        if not os.access(path, os.W_OK | os.X_OK):
            raise error(f"{what} {path}: expected a folder this user may write into; found it not writable",
                        where=str(path), expected="a writable folder", found="not writable")
        return path
    _check_ancestor(path, what, error)
    return path


def private_folder(path: str | Path, what: str = "folder", error: type[InputError] = InputError) -> Path:
    """Create ``path`` (mode 0700) if missing and return it; refuse a folder that someone other
    than this user could write into (owned by another user, or writable by group or others):
    what lies there is unpickled and run (submitit's job and result pickles)."""
    path = Path(path).expanduser().absolute()
    if not path.exists():
        writable_folder(path, what, error)
        path.mkdir(parents=True, mode=0o700)
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise error(f"{what} {path}: expected a folder; found a file", where=str(path), expected="a folder",
                    found="a file")
    if info.st_uid != os.getuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise error(f"{what} {path}: expected a folder only this user can write (its files are unpickled and run); "
                    f"found owner uid {info.st_uid}, mode {stat.filemode(info.st_mode)} (chmod go-w it, or use "
                    "another --out)", where=str(path), expected="owner-only write permission",
                    found=stat.filemode(info.st_mode))
    return path
