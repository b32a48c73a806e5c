"""The papers' published tables recognised by their content, not by where a copy lies.

``data/paper_reference/digests.json`` records the SHA-256 of every reference file and, for the
tables whose rows are read as inputs (paper 1's Table 1), one digest per row of its values in a
canonical form (numbers as floats, text stripped, column order of the published file). A row of
any CSV, wherever it lies and whatever else the CSV holds (notebook 02's Table 1 repeats the
published rows beside its own), is "paper 1, published" exactly when its digest is recorded; a
copied, renamed or re-saved file keeps the label, an edited number loses it. A row that claims
the published label (its ``source`` column) with other numbers is refused by the readers.

``python -m moespec.validate.reference`` rewrites ``digests.json`` after a reference file is
corrected (``tests/test_bad_inputs.py`` checks that the record matches the files).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io, paths

DIGESTS = "digests.json"
#: Reference tables whose rows are recognised one by one.
ROW_TABLES = ("paper1_table1_bandwidth.csv",)


def digests_path() -> Path:
    return paths.reference_dir() / DIGESTS


def file_digest(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _canonical(value) -> str:
    if value is None:
        return ""
    try:
        x = float(value)
    except (TypeError, ValueError):
        return str(value).strip()
    return "" if math.isnan(x) else repr(x)


def row_digests(df: pd.DataFrame, columns) -> list[str | None]:
    """One digest per row of ``df`` over ``columns`` (None for a row of a table that lacks one)."""
    columns = list(columns)
    if any(c not in df.columns for c in columns):
        return [None] * len(df)
    out = []
    for values in df[columns].itertuples(index=False):
        text = "\x1f".join(_canonical(v) for v in values)
        out.append(hashlib.sha256(text.encode()).hexdigest())
    return out


def _read_reference(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, dtype=str, keep_default_na=False)


def record() -> dict:
    """The digests of the reference folder's files as they are now (what ``digests.json`` holds)."""
    files = {}
    for path in sorted(paths.reference_dir().iterdir()):
        if not path.is_file() or path.suffix != ".csv":
            continue
        entry = {"sha256": file_digest(path)}
        if path.name in ROW_TABLES:
            df = _read_reference(path)
            entry["columns"] = list(df.columns)
            entry["rows"] = row_digests(df, df.columns)
        files[path.name] = entry
    return {"algorithm": "sha256", "files": files}


def recorded() -> dict:
    """``digests.json`` as committed."""
    return json.loads(digests_path().read_text())


def published_rows(df: pd.DataFrame, path: str | Path | None = None,
                   table: str = "paper1_table1_bandwidth.csv") -> np.ndarray:
    """Which rows of ``df`` (read from ``path``) are rows of the published ``table``: all of them
    when the file is byte for byte a recorded reference file, else those whose row digest is
    recorded."""
    files = recorded()["files"]
    if path is not None and Path(path).is_file() and file_digest(path) == files[table]["sha256"]:
        return np.ones(len(df), dtype=bool)
    known = set(files[table]["rows"])
    return np.array([d in known for d in row_digests(df, files[table]["columns"])], dtype=bool)


def is_published_file(path: str | Path) -> str | None:
    """The name of the reference file ``path`` is a byte-for-byte copy of, else None."""
    digest = file_digest(path)
    return next((name for name, e in recorded()["files"].items() if e["sha256"] == digest), None)


if __name__ == "__main__":
    print(f"wrote {io.write_json(digests_path(), record())}")
