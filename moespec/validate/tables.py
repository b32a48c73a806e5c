"""CSV tables read with typed columns: the boundary check of every table a command reads.

A table is described by its :class:`Column` s (type and range, required or optional);
:func:`read_csv` reads the file and refuses, naming the file, the row (1-based, and the line of
the file) and the column, what was expected and what was found:

* a missing, empty (0 bytes), gzip-compressed or non-UTF-8 file, one pandas cannot parse, and a
  table with a header but no rows;
* a missing required column;
* a cell that is not of its column's type (a word in a number column, 2.5 in an integer column, a
  negative count), outside its range, or empty where a value is needed.

Numbers are converted (``kind="int"``/``"count"`` columns become int64, ``"float"`` float64), so
what the caller computes with is what was checked.
"""

from __future__ import annotations

import io as _io
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
import pandas as pd

from .errors import InputError, refuse

KINDS = ("float", "int", "count", "str", "bool")
_GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True)
class Column:
    """One column of a table. ``kind``: ``float``, ``int``, ``count`` (an integer >= 0), ``str``
    or ``bool``; ``low``/``high``: the range (``low_open``/``high_open``: the end excluded);
    ``required``: the column must be present; ``missing_ok``: empty cells are allowed (NaN, or ""
    for strings); ``choices``: the values a ``str`` column may hold."""

    name: str
    kind: str = "float"
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    required: bool = True
    missing_ok: bool = False
    choices: tuple | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Column {self.name!r}: kind must be one of {KINDS}, found {self.kind!r}")

    def expected(self) -> str:
        """What a cell must be, in words (for messages)."""
        what = {"float": "a finite number", "int": "an integer", "count": "a non-negative integer count",
                "str": "a non-empty text", "bool": "true or false"}[self.kind]
        ends = []
        if self.low is not None and not (self.kind == "count" and self.low == 0):
            ends.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            ends.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        if self.choices:
            what = f"one of {list(self.choices)}"
        return what + (f" {' and '.join(ends)}" if ends else "")


def row_label(df: pd.DataFrame, i: int) -> str:
    """Row ``i`` (0-based position) of a table read from CSV, by its place in the file (its index
    label, so a filtered table still names the file's row): ``row 3 (line 4)``, the header being
    line 1 (tables are read without comment or blank lines)."""
    label = df.index[i]
    pos = int(label) if isinstance(label, (int, np.integer)) else i
    return f"row {pos + 1} (line {pos + 2})"


def _text(path: Path, what: str, error) -> str:
    if not path.exists():
        raise error(f"{what}: {path} is missing", where=str(path))
    if not path.is_file():
        raise error(f"{what}: {path} is not a file", where=str(path))
    raw = path.read_bytes()
    if not raw:
        raise error(f"{path}: the file is empty (0 bytes); expected a CSV table with a header line", where=str(path))
    if raw[:2] == _GZIP_MAGIC:
        raise error(f"{path}: gzip-compressed data, not a CSV text table (decompress it first)", where=str(path))
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte {raw[exc.start]:#04x} at offset {exc.start}); "
                    "expected a CSV table", where=str(path)) from None


def parse_csv(path: str | Path, what: str = "table", error: type[InputError] = InputError,
              **read_kwargs) -> pd.DataFrame:
    """The file as a DataFrame (pandas' ``read_csv``), refusing what pandas cannot read with the
    file named (never a pandas or decoding error of its own)."""
    path = Path(path)
    text = _text(path, what, error)
    header = text.split("\n", 1)[0]
    for sep, name in (("\t", "tab"), (";", "semicolon")):
        if "sep" not in read_kwargs and "," not in header and sep in header:
            raise error(f"{path}: header: expected comma-separated columns (a CSV table); found one column holding "
                        f"{name} characters ({header[:60]!r}): a {name}-separated file; write it with commas",
                        where=str(path), field="header", expected="comma-separated columns",
                        found=f"{name}-separated")
    try:
        return pd.read_csv(_io.StringIO(text), **read_kwargs)
    except pd.errors.EmptyDataError:
        raise error(f"{path}: no header line; expected a CSV table", where=str(path)) from None
    except (pd.errors.ParserError, ValueError) as exc:
        raise error(f"{path}: not a readable CSV table ({str(exc).strip().splitlines()[0]})", where=str(path)) from None


def check_columns(df: pd.DataFrame, path, columns: Sequence[Column], error: type[InputError] = InputError,
                  min_rows: int = 1) -> pd.DataFrame:
    """Check (and convert) the columns of ``df``, read from ``path``; see the module docstring."""
    missing = [c.name for c in columns if c.required and c.name not in df.columns]
    if missing:
        raise error(f"{path}: missing column(s) {missing}; expected at least "
                    f"{[c.name for c in columns if c.required]}; found {list(df.columns)}",
                    where=str(path), field=missing[0], expected="the column", found=list(df.columns))
    if len(df) < min_rows:
        raise error(f"{path}: a header but {len(df)} row(s); expected at least {min_rows} row(s) of data",
                    where=str(path), expected=f">= {min_rows} rows", found=len(df))
    df = df.copy()
    for col in columns:
        if col.name in df.columns:
            df[col.name] = _check_column(df, path, col, error)
    return df


def _first_bad(df, path, col: Column, bad: np.ndarray, values, error, expected: str | None = None):
    i = int(np.flatnonzero(bad)[0])
    more = int(bad.sum()) - 1
    refuse(path, f"{row_label(df, i)}, column {col.name!r}", expected or col.expected(), values[i],
           hint=f"{more} more such row(s)" if more else "", error=error)


def _check_column(df: pd.DataFrame, path, col: Column, error) -> pd.Series:
    raw = df[col.name]
    blank = raw.isna().to_numpy() | (raw.astype(str).str.strip() == "").to_numpy()
    if col.kind == "str":
        text = raw.where(~blank, "").astype(str)
        if not col.missing_ok and blank.any():
            _first_bad(df, path, col, blank, raw.to_numpy(), error)
        if col.choices:
            off = ~blank & ~text.isin(col.choices).to_numpy()
            if off.any():
                _first_bad(df, path, col, off, raw.to_numpy(), error)
        return text
    if col.kind == "bool":
        words = raw.astype(str).str.strip().str.lower()
        truth = words.isin(["true", "1", "yes"]).to_numpy()
        off = ~truth & ~words.isin(["false", "0", "no"]).to_numpy() & ~(blank & col.missing_ok)
        if off.any():
            _first_bad(df, path, col, off, raw.to_numpy(), error)
        return pd.Series(truth, index=df.index)
    num = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
    if not col.missing_ok and blank.any():
        _first_bad(df, path, col, blank, raw.to_numpy(), error)
    present = ~blank
    bad = present & ~np.isfinite(num)                # words, inf, nan written out
    if col.kind in ("int", "count"):
        bad |= present & np.isfinite(num) & (num != np.round(num))
    if col.kind == "count":
        bad |= present & (num < 0)
    with np.errstate(invalid="ignore"):
        if col.low is not None:
            bad |= present & ((num <= col.low) if col.low_open else (num < col.low))
        if col.high is not None:
            bad |= present & ((num >= col.high) if col.high_open else (num > col.high))
    if bad.any():
        _first_bad(df, path, col, bad, raw.to_numpy(), error)
    if col.kind in ("int", "count") and not blank.any():
        return pd.Series(num.astype(np.int64), index=df.index)
    return pd.Series(num, index=df.index)


def read_csv(path: str | Path, columns: Iterable[Column], what: str = "table",
             error: type[InputError] = InputError, min_rows: int = 1, **read_kwargs) -> pd.DataFrame:
    """Read ``path`` and check ``columns`` (:func:`parse_csv`, :func:`check_columns`)."""
    df = parse_csv(path, what, error, **read_kwargs)
    return check_columns(df, Path(path), list(columns), error, min_rows)


def check_rows(df: pd.DataFrame, path, bad, field: str, expected: str, found,
               error: type[InputError] = InputError) -> None:
    """Refuse the first row where ``bad`` (a boolean mask over ``df``'s rows) holds: a check that
    involves several columns (``found``: the values shown, one per row)."""
    bad = np.asarray(bad, dtype=bool)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        more = int(bad.sum()) - 1
        refuse(path, f"{row_label(df, i)}, {field}", expected, list(found)[i],
               hint=f"{more} more such row(s)" if more else "", error=error)
