"""Tables 5 and 6 of paper 1 (Appendix D.1 and E): which expert kernel each engine runs at each
pass size n, with deduplication off and on, its requested bytes and its factor f_l, from the
source readings in ``data/engines/kernel_dispatch.csv`` (each row cites repository, file, commit
and function; ``data/engines/SOURCE.md``).

A row covers the pass sizes ``n_from..n_to`` (``n_to`` empty: no upper end) of one engine and
setting (``upstream``: an engine with no deduplication switch; ``dedup off`` / ``dedup on``: an
engine with one). Its ``bytes`` rule is ``nmb`` (the per-slot kernel requests one expert per
(token, slot) pair: E_slot(n) = n m W, paper 1 Sec. 2), ``Ub`` (the deduplicating kernel requests
each distinct expert f_l times its bytes: E_dedup(n) = sum_l f_l w_l U_l(n)) or empty where the
byte count was not read from the source. The byte counts are computed for a model shape of
:mod:`moespec.model_shapes` over its L MoE layers, W = sum_l w_l.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from moespec import paths
from moespec.model_shapes import MoESpec
from moespec.validate.tables import Column, check_rows, read_csv

SETTINGS = ("upstream", "dedup off", "dedup on")
BYTE_RULES = ("nmb", "Ub", "")
KINDS = ("per-slot", "deduplicating", "tiled")
#: The columns of kernel_dispatch.csv, in order (tests/test_dispatch.py pins them).
COLUMNS = ("engine", "setting", "n_from", "n_to", "kernel", "kind", "bytes", "f_l", "repository", "file",
           "commit", "where", "note")
_CHECKS = [Column("engine", "str"), Column("setting", "str", choices=SETTINGS), Column("n_from", "int", low=1),
           Column("n_to", "float", low=1, missing_ok=True), Column("kernel", "str"),
           Column("kind", "str", choices=KINDS), Column("bytes", "str", missing_ok=True, choices=("nmb", "Ub")),
           Column("f_l", low=1, missing_ok=True), Column("repository", "str"), Column("file", "str"),
           Column("commit", "str", missing_ok=True), Column("where", "str"), Column("note", "str", missing_ok=True)]


def dispatch_path() -> Path:
    return paths.data_dir() / "engines" / "kernel_dispatch.csv"


def load_dispatch(path: str | Path | None = None) -> pd.DataFrame:
    """The source readings, checked: every column of :data:`COLUMNS`, known settings, kinds and
    byte rules, n_from <= n_to, a commit on every row read from a repository (rows from paper 1
    name none), and no two rows of one engine and setting covering the same n."""
    path = Path(path) if path is not None else dispatch_path()
    df = read_csv(path, _CHECKS, "kernel dispatch table", dtype=str, keep_default_na=False, na_values=[""])
    extra = [c for c in df.columns if c not in COLUMNS]
    check_rows(df, path, np.array([bool(extra)] * len(df)), "columns", f"exactly {list(COLUMNS)}", [extra] * len(df))
    n_to = df["n_to"].fillna(np.inf)
    check_rows(df, path, (n_to < df["n_from"]).to_numpy(), "columns 'n_from', 'n_to'", "n_from <= n_to",
               list(zip(df["n_from"], df["n_to"])))
    from_repo = df["repository"] != "paper 1"
    check_rows(df, path, (from_repo & (df["commit"].str.len() < 7)).to_numpy(), "column 'commit'",
               "the commit the source was read at (>= 7 hex digits)", df["commit"])
    check_rows(df, path, ((df["kind"] == "per-slot") & (df["bytes"] != "nmb")).to_numpy(), "column 'bytes'",
               "'nmb' for a per-slot kernel", df["bytes"])
    for (engine, setting), g in df.groupby(["engine", "setting"], sort=False):
        spans = sorted(zip(g["n_from"], g["n_to"].fillna(np.inf), g.index))
        for (a0, a1, _), (b0, _, j) in zip(spans, spans[1:]):
            if b0 <= a1:
                check_rows(df, path, (df.index == j), "columns 'n_from', 'n_to'",
                           f"pass sizes not covered by another row of {engine!r}, {setting!r} "
                           f"(that one covers {a0}..{a1:g})", list(zip(df["n_from"], df["n_to"])))
    df["n_to"] = n_to
    return df


def kernel_row(dispatch: pd.DataFrame, engine: str, setting: str, n: int) -> pd.Series:
    """The row of ``engine`` and ``setting`` that covers pass size ``n``."""
    g = dispatch[(dispatch["engine"] == engine) & (dispatch["setting"] == setting)]
    hit = g[(g["n_from"] <= n) & (n <= g["n_to"])]
    if len(hit) != 1:
        raise ValueError(f"kernel dispatch: {engine!r}, {setting!r} has no row covering n = {n} "
                         f"(rows cover {list(zip(g['n_from'], g['n_to']))})")
    return hit.iloc[0]


def pass_bytes(row: pd.Series, n: int, spec: MoESpec, fmt: str | None = None, union=None) -> tuple:
    """(E, E_low, E_high): the bytes a pass of ``n`` tokens requests over the L MoE layers of
    ``spec`` in ``fmt`` under ``row``'s rule. Per-slot: E = n m W exactly. Deduplicating: E =
    f_l U W with ``union`` the mean distinct experts per layer at n (None: E is NaN and the range
    is [f_l m W, f_l min(nm, N) W], one expert repeated by every token to none repeated). NaN
    where the row's bytes or f_l were not read."""
    W = float(sum(spec.layer_expert_bytes(fmt)))
    m, N = spec.top_k, spec.num_experts
    if row["bytes"] == "nmb":
        E = n * m * W
        return E, E, E
    if row["bytes"] != "Ub" or not np.isfinite(row["f_l"]):
        return np.nan, np.nan, np.nan
    f = float(row["f_l"])
    E = np.nan if union is None else f * float(union) * W
    return E, f * m * W, f * min(n * m, N) * W


def _source(row: pd.Series) -> str:
    where = f"{row['repository']}, {row['file']}"
    return where + (f" @ {row['commit'][:12]}" if row["commit"] else "") + f": {row['where']}"


def _rows(dispatch, engine, setting, ns, spec, fmt, union) -> list[dict]:
    out = []
    for n in ns:
        r = kernel_row(dispatch, engine, setting, n)
        E, lo, hi = pass_bytes(r, n, spec, fmt, None if union is None else union[n - 1])
        out.append({"engine": engine, "setting": setting, "n": n, "kernel": r["kernel"], "kind": r["kind"],
                    "bytes": r["bytes"] or "not read", "f_l": r["f_l"], "E_bytes": E, "E_bytes_low": lo,
                    "E_bytes_high": hi, "source": _source(r), "note": r["note"]})
    return out


def _check_union(union, ns):
    if union is None:
        return None
    union = np.asarray(union, float)
    if union.ndim != 1 or len(union) < max(ns):
        raise ValueError(f"union: expected the mean distinct experts per layer for n = 1..{max(ns)} "
                         f"(1-D, length >= {max(ns)}); found shape {union.shape}")
    return union


def table5(dispatch: pd.DataFrame, spec: MoESpec, fmt: str | None = None, ns=range(1, 10), union=None) -> pd.DataFrame:
    """Table 5 (paper 1, App. D.1): per engine and n, the kernel its default setting runs (an
    engine without a switch: ``upstream``; with one: ``dedup off``), its kind and bytes for
    ``spec`` in ``fmt`` (:func:`pass_bytes`; ``union``: mean distinct experts per layer, entry
    n-1), with the source it was read from. Engines read from paper 1 only are left out."""
    ns, union = list(ns), _check_union(union, list(ns))
    out = []
    for engine, g in dispatch[dispatch["repository"] != "paper 1"].groupby("engine", sort=False):
        setting = "upstream" if (g["setting"] == "upstream").any() else "dedup off"
        out += _rows(dispatch, engine, setting, ns, spec, fmt, union)
    return pd.DataFrame(out).assign(model=spec.name, fmt=fmt or spec.default_format)


def table6(dispatch: pd.DataFrame, spec: MoESpec, fmt: str | None = None, ns=range(1, 10), union=None) -> pd.DataFrame:
    """Table 6 (paper 1, App. E): the engines with a deduplication switch, one row per engine and
    n with the kernel, kind and bytes of each setting side by side and the deduplicating kernel's
    f_l. Rows read from paper 1 (its modified engines) keep ``source`` = the paper: theirs, not ours."""
    ns, union = list(ns), _check_union(union, list(ns))
    out = []
    switched = dispatch.groupby("engine", sort=False)["setting"].agg(lambda s: {"dedup off", "dedup on"} <= set(s))
    for engine in switched[switched].index:
        off = _rows(dispatch, engine, "dedup off", ns, spec, fmt, union)
        on = _rows(dispatch, engine, "dedup on", ns, spec, fmt, union)
        for a, b in zip(off, on):
            row = {"engine": engine, "n": a["n"]}
            for tag, r in (("off", a), ("on", b)):
                row.update({f"kernel_{tag}": r["kernel"], f"kind_{tag}": r["kind"], f"bytes_{tag}": r["bytes"],
                            f"E_bytes_{tag}": r["E_bytes"], f"E_bytes_low_{tag}": r["E_bytes_low"],
                            f"E_bytes_high_{tag}": r["E_bytes_high"]})
            row["f_l_dedup"] = b["f_l"] if b["kind"] == "deduplicating" else np.nan
            row["source"] = b["source"]
            row["note"] = b["note"]
            out.append(row)
    return pd.DataFrame(out).assign(model=spec.name, fmt=fmt or spec.default_format)


def dispatch_tables(spec: MoESpec, fmt: str | None = None, ns=range(1, 10), union=None,
                    path: str | Path | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(Table 5, Table 6) for ``spec`` in ``fmt`` from the source readings at ``path`` (default
    ``data/engines/kernel_dispatch.csv``)."""
    dispatch = load_dispatch(path)
    return table5(dispatch, spec, fmt, ns, union), table6(dispatch, spec, fmt, ns, union)
