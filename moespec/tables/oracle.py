"""Tables of paper 2 (Appendix A) for this machine, and paper 2's published scalars as labelled reference.

The regression numbers come from :mod:`moespec.oracle.regression` in the current run; the published
scalars are read from ``data/paper_reference/paper2_scalars.csv`` and only ever shown beside ours.
"""

from __future__ import annotations

import re

import pandas as pd

from moespec import paths

PAPER_LABEL = "paper 2, published (Qwen3-Coder-30B-A3B + EAGLE-3, A100)"


def model_comparison(fits) -> pd.DataFrame:
    """Table A6 analogue: one row per fitted model (in-sample R², GroupKFold R², RMSE, MAPE, MedAPE)."""
    return pd.DataFrame([f.summary() for f in fits])


def coefficients(fit) -> pd.DataFrame:
    """The coefficient table of one fit with clustered standard errors (eq. A3 / A4 style)."""
    return fit.coef.assign(model=fit.name)[["model", "term", "estimate", "se", "p"]]


def paper_scalars() -> pd.DataFrame:
    """Paper 2's published scalars as stored (quantity, value, where) — reference, never an input."""
    path = paths.reference_dir() / "paper2_scalars.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: paper 2's published scalars are missing")
    df = pd.read_csv(path)
    missing = {"quantity", "value", "where"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return df.assign(source=PAPER_LABEL)


def paper_number(quantity: str) -> float:
    """The leading number of one published scalar (e.g. 'about 2.8 (up to Lmax=12)' -> 2.8)."""
    df = paper_scalars().set_index("quantity")
    if quantity not in df.index:
        raise KeyError(f"paper2_scalars.csv has no quantity {quantity!r}")
    m = re.search(r"-?\d+(\.\d+)?(e-?\d+)?", str(df.loc[quantity, "value"]))
    if not m:
        raise ValueError(f"paper2_scalars.csv: {quantity!r} has no number: {df.loc[quantity, 'value']!r}")
    return float(m.group(0))


def ours_vs_paper(ours: dict) -> pd.DataFrame:
    """Side-by-side rows: our measured value and paper 2's published one (labelled), per quantity."""
    ref = paper_scalars().set_index("quantity")
    rows = [{"quantity": q, "ours (this machine)": v,
             "paper 2, published (their hardware)": ref.loc[q, "value"] if q in ref.index else ""}
            for q, v in ours.items()]
    return pd.DataFrame(rows)
