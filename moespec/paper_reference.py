"""The two papers' published numbers (``data/paper_reference/``), read in one place.

Paper 1's Tables 1, 3, 4, 7 and 8 and its scalars, and paper 2's scalars, transcribed from the
papers' text: measurements on the papers' hardware, never ours. Tables and figures show them beside
our results under :data:`PAPER1_LABEL` / :data:`PAPER2_LABEL`; no prediction takes them as input.

Every reader checks the file against the SHA-256 that ``data/paper_reference/digests.json``
records (:mod:`moespec.validate.reference`) and refuses an edited copy with one line naming the
file, the recorded digest and the one found. After a transcription error is corrected,
``python -m moespec.validate.reference`` rewrites the record.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import paths
from moespec.validate import reference
from moespec.validate.invariants import check_byte_share_rows
from moespec.validate.tables import Column, check_rows, read_csv

#: Label of paper 1's published rows wherever they stand beside ours.
PAPER1_LABEL = "paper 1, published (their hardware)"
#: Label of paper 2's published values wherever they stand beside ours.
PAPER2_LABEL = "paper 2, published (Qwen3-Coder-30B-A3B + EAGLE-3, A100)"

#: The reference files by short name.
FILES = {"table1_bandwidth": "paper1_table1_bandwidth.csv", "table3_predictions": "paper1_table3_predictions.csv",
         "table4_deepseek": "paper1_table4_deepseek.csv", "table7_error": "paper1_table7_error.csv",
         "table8_rules": "paper1_table8_rules.csv", "paper1_scalars": "paper1_scalars.csv",
         "paper2_scalars": "paper2_scalars.csv"}
#: Columns each file must carry.
_COLUMNS = {"table1_bandwidth": ("engine", "model", "reread_cost", "n2_beta_slot_GBps", "n2_beta_dedup_GBps", "n2_r",
                                 "n2_ubar", "n8_beta_slot_GBps", "n8_beta_dedup_GBps", "n8_r", "n8_ubar"),
            "paper1_scalars": ("quantity", "model_or_engine", "value", "where"),
            "paper2_scalars": ("quantity", "value", "where")}


class ReferenceFileError(ValueError):
    """A reference file that is missing, edited or lacks a column."""


def path(name: str) -> Path:
    """Where the reference file ``name`` (a key of :data:`FILES`) lies."""
    if name not in FILES:
        raise KeyError(f"no paper reference file {name!r}; known {sorted(FILES)}")
    return paths.reference_dir() / FILES[name]


def checked_path(name: str) -> Path:
    """:func:`path`, after checking that the file exists and is byte for byte the recorded one."""
    where = path(name)
    if not where.is_file():
        raise ReferenceFileError(f"{where}: the papers' reference file is missing (data/paper_reference)")
    expected = reference.recorded()["files"].get(FILES[name], {}).get("sha256")
    found = reference.file_digest(where)
    if found != expected:
        raise ReferenceFileError(f"{where}: sha256 expected {expected} (data/paper_reference/digests.json), found "
                                 f"{found}: a published table is read as transcribed; restore it, or after "
                                 "correcting a transcription run python -m moespec.validate.reference")
    return where


def read(name: str, **read_csv) -> pd.DataFrame:
    """The reference file ``name`` as a DataFrame (``read_csv``: :func:`pandas.read_csv` options),
    checked (:func:`checked_path`) and with the columns it must carry."""
    where = checked_path(name)
    df = pd.read_csv(where, **read_csv)
    if missing := [c for c in _COLUMNS.get(name, ()) if c not in df.columns]:
        raise ReferenceFileError(f"{where}: expected column(s) {missing}, found {list(df.columns)}")
    return df


# --- paper 1 ----------------------------------------------------------------------------------
def table1() -> pd.DataFrame:
    """Paper 1's Table 1 (effective bandwidths, r, ubar at n = 2 and 8, re-read cost) as published;
    ``reread_cost`` as text ("" where the paper has a dash)."""
    df = read("table1_bandwidth", dtype={"reread_cost": str}, keep_default_na=False, na_values=[""])
    df["reread_cost"] = df["reread_cost"].fillna("")
    return df


def paper1_table(name: str) -> pd.DataFrame:
    """One of paper 1's Tables 3, 4, 7, 8 (``table3_predictions``, ``table4_deepseek``,
    ``table7_error``, ``table8_rules``) with ``source`` = :data:`PAPER1_LABEL`."""
    return read(name).assign(source=PAPER1_LABEL)


def paper1_scalars() -> pd.DataFrame:
    """Paper 1's scalars (quantity, model_or_engine, value as text, where)."""
    return read("paper1_scalars")


def paper1_scalar(quantity: str, model_or_engine: str | None = None) -> float:
    """One numeric scalar of paper 1 (its only row, or the row of ``model_or_engine``)."""
    df = paper1_scalars()
    rows = df[df["quantity"] == quantity]
    if model_or_engine is not None:
        rows = rows[rows["model_or_engine"] == model_or_engine]
    if len(rows) != 1:
        raise KeyError(f"{FILES['paper1_scalars']}: expected one row {quantity!r}"
                       + (f" of {model_or_engine!r}" if model_or_engine else "") + f", found {len(rows)}")
    return float(rows["value"].iloc[0])


def paper1_epsilon() -> dict[str, float]:
    """Paper 1's bandwidth error eps per engine (Section 4)."""
    df = paper1_scalars()
    return {r.model_or_engine: float(r.value) for r in df[df["quantity"] == "epsilon"].itertuples()}


# --- paper 2 ----------------------------------------------------------------------------------
def paper2_scalars() -> pd.DataFrame:
    """Paper 2's scalars (quantity, value as the paper states it, where) with ``source`` =
    :data:`PAPER2_LABEL`."""
    return read("paper2_scalars").assign(source=PAPER2_LABEL)


def paper2_value(quantity: str) -> str:
    """One scalar as paper 2 states it (e.g. ``'0.9669-0.9991'``)."""
    df = paper2_scalars().set_index("quantity")
    if quantity not in df.index:
        raise KeyError(f"{FILES['paper2_scalars']} has no quantity {quantity!r}")
    return str(df.loc[quantity, "value"])


def paper2_number(quantity: str) -> float:
    """The leading number of one scalar of paper 2 (``'about 2.8 (up to Lmax=12)'`` -> 2.8)."""
    value = paper2_value(quantity)
    m = re.search(r"-?\d+(\.\d+)?(e-?\d+)?", value)
    if not m:
        raise ValueError(f"{FILES['paper2_scalars']}: {quantity!r} has no number: {value!r}")
    return float(m.group(0))


# --- tables in paper 1's Table-1 layout (the published one, or a user's) -----------------------
#: Columns a Table-1 CSV must carry (paper 1, Table 1; :func:`table1`).
TABLE1_NEEDED = ["engine", "model", "n2_beta_slot_GBps", "n2_beta_dedup_GBps", "n2_ubar",
                 "n8_beta_slot_GBps", "n8_beta_dedup_GBps", "n8_ubar"]
#: Storage format of each engine's model files in paper 1 (App. D.2); others use the preset's.
ENGINE_FORMAT = {"MLX-LM": "mlx_4bit"}


def published_table1_path() -> Path:
    """Paper 1's Table 1 as published, checked against its recorded digest (:mod:`moespec.paper_reference`)."""
    return checked_path("table1_bandwidth")


def label_of_rows(source: str) -> str:
    """A label given for a table's rows (``--source``): ``"published"`` or ``"paper1"`` (or the
    label itself) stands for :data:`PAPER1_LABEL`, paper 1's published numbers; any other text is
    the label."""
    return PAPER1_LABEL if source.strip().lower() in ("published", "paper1", PAPER1_LABEL.lower()) else source


def read_table1(path: str | Path = "", source: str | None = None) -> pd.DataFrame:
    """A Table-1 CSV (default: paper 1's published rows) with a ``source`` column. A row is paper
    1's published row (:data:`PAPER1_LABEL`) when its content is, whatever the file's name or
    folder (:func:`moespec.validate.reference.published_rows`); other rows keep the CSV's own
    ``source`` (else the file name). ``source`` labels every row instead (``"published"``: paper
    1's numbers). Refused, naming the file, row and column: a number column that is not positive,
    a byte share outside [1/n, 1] (ubar(2) in [1/2, 1], ubar(8) in [1/8, 1]), and a row whose
    ``source`` claims the published label while its numbers are not the published ones."""
    path = Path(path) if path else published_table1_path()
    if not path.exists():
        raise FileNotFoundError(f"Table-1 CSV {path} does not exist")
    columns = [Column("engine", "str"), Column("model", "str"),
               *(Column(c, low=0, low_open=True) for c in TABLE1_NEEDED[2:])]
    df = read_csv(path, columns, "Table-1 CSV", dtype={"reread_cost": str}, keep_default_na=False, na_values=[""])
    for n in (2, 8):
        check_byte_share_rows(df, path, None, f"n{n}_ubar", n=n)
    published = reference.published_rows(df, path)
    if source is not None:
        df["source"] = label_of_rows(source)
        return df
    own = df["source"].astype(str) if "source" in df.columns else pd.Series(f"ours ({path.name})", index=df.index)
    check_rows(df, path, (own == PAPER1_LABEL).to_numpy() & ~published, "column 'source'",
               "paper 1's published numbers for a row labelled as theirs (their content digest, data/paper_reference/"
               "digests.json); label an edited copy with --source (source=)", own.tolist())
    df["source"] = np.where(published, PAPER1_LABEL, own)
    return df
