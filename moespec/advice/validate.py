"""The boundary of ``moespec advise`` for the files a user gives it beside a run file, checked
where they enter (:mod:`moespec.validate`), with the errors raised as
:class:`~moespec.advice.errors.AdviceInputError`:

* a bandwidth table (:data:`BANDWIDTH_TABLE`): typed columns and ranges, byte shares
  1/n <= ubar(n) <= 1 with ubar(1) = 1;
* an acceptance table: counts that are non-negative integers, used and labelled as they are, or
  rates in [0, 1); labels that are not empty;
* a routing trace used with a model must have that model's L, N and m.

The run file itself is checked by :mod:`moespec.predict.run_file`; :func:`label_incomplete` says
in the advice which notebooks' tables a run file of an unfinished run holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from moespec.model_shapes import get_spec
from moespec.validate import invariants
from moespec.validate.tables import Column, check_columns, parse_csv

from .errors import AdviceInputError

_POS = dict(low=0, low_open=True)
#: A bandwidth table with one row per n (``--bandwidth``; notebook 02's ``02_bandwidth_by_n.csv``).
BANDWIDTH_TABLE = (Column("n", "int", low=1), Column("beta_slot_GBps", **_POS), Column("beta_dedup_GBps", **_POS),
                   Column("ubar", required=False), Column("expert_bytes", required=False, **_POS),
                   Column("model", "str", required=False), Column("source", "str", required=False))
ACCEPTANCE_COUNTS = (Column("accepted", "count"), Column("rejections", "count"), Column("label", "str", required=False))
ACCEPTANCE_RATES = (Column("a", low=0, high=1, high_open=True), Column("label", "str", required=False))


def read_bandwidth_table(path: str | Path, needed) -> pd.DataFrame:
    """A bandwidth table with one row per n, checked: the columns of :data:`BANDWIDTH_TABLE` (those
    in ``needed`` required) and its byte shares."""
    path = Path(path)
    known = {c.name for c in BANDWIDTH_TABLE}
    columns = [Column(c.name, c.kind, c.low, c.high, c.low_open, c.high_open, c.name in needed, c.missing_ok,
                      c.choices) for c in BANDWIDTH_TABLE]
    df = parse_csv(path, "bandwidth table", AdviceInputError)
    typed = check_columns(df, path, columns, AdviceInputError)
    # columns without a declared type are checked for presence only (their values are kept as read)
    check_columns(df, path, [Column(n, "str", required=True, missing_ok=True) for n in needed if n not in known],
                  AdviceInputError, min_rows=0)
    if "ubar" in typed.columns and typed["ubar"].notna().all():
        invariants.check_byte_share_rows(typed, path, "n", "ubar", error=AdviceInputError)
    return typed


def table_header(path: str | Path, what: str = "bandwidth table") -> list[str]:
    """The column names of a CSV (its first line), refusing an empty or unreadable file."""
    return list(parse_csv(path, what, AdviceInputError, nrows=0).columns)


def acceptance(path: str | Path) -> list[tuple[float, str]]:
    """Acceptance rates from a measured table (``--acceptance-table``): columns ``accepted`` and
    ``rejections`` (counts of drafted tokens accepted and of steps ended by a rejection; pooled
    geometric maximum-likelihood estimate accepted / (accepted + rejections), one per ``label`` if
    that column is present), or a column ``a`` (one rate per row, ``label`` optional). Returns
    [(a, label)]. Counts must be non-negative integers (used and printed as they are), rates in [0, 1)."""
    path = Path(path)
    df = parse_csv(path, "acceptance table", AdviceInputError)
    out = []
    if {"accepted", "rejections"} <= set(df.columns):
        df = check_columns(df, path, ACCEPTANCE_COUNTS, AdviceInputError)
        groups = df.groupby("label", sort=False) if "label" in df.columns else [(path.name, df)]
        for label, g in groups:
            acc, rej = int(g["accepted"].sum()), int(g["rejections"].sum())
            if acc + rej == 0:
                raise AdviceInputError(f"{path}: group {label!r}: expected at least one drafted token accepted or "
                                       "rejected; found 0 accepted and 0 rejections", where=str(path),
                                       field="accepted", found=0)
            if rej == 0:   # the estimate accepted / (accepted + rejections) would be 1: every draft accepted
                raise AdviceInputError(f"{path}: group {label!r}, column 'rejections': expected at least one rejection "
                                       f"(the pooled estimate accepted / (accepted + rejections) must be < 1); found "
                                       f"{acc} accepted and 0 rejections", where=str(path), field="rejections",
                                       expected=">= 1 in the group", found=0)
            out.append((acc / (acc + rej), f"{label}: pooled MLE, {acc} accepted, {rej} rejections"))
    elif "a" in df.columns:
        df = check_columns(df, path, ACCEPTANCE_RATES, AdviceInputError)
        labels = df["label"] if "label" in df.columns else [f"{path.name} row {i + 1}" for i in range(len(df))]
        out = [(float(a), str(lab)) for a, lab in zip(df["a"], labels)]
    else:
        raise AdviceInputError(f"{path}: need columns 'accepted' and 'rejections', or a column 'a'; found "
                               f"{list(df.columns)}", where=str(path), field="columns", found=list(df.columns))
    return out


def label_incomplete(curves, run: dict, sources: dict) -> None:
    """For advice from the run file of an unfinished run (allowed): the source says so and an
    assumption names the notebooks whose tables the file holds, and whether each finished."""
    if run["complete"]:
        return
    used = {}
    for part in sources.values():
        for name in part["files"]:
            if name[:2].isdigit() and name[2:3] == "_":
                used.setdefault(name[:2], []).append(name)
    done = {name.split("_", 1)[0]: name for name in run["finished_notebooks"]}
    parts = [f"notebook {done.get(nb, nb)} ({', '.join(dict.fromkeys(files))}; "
             f"{'finished' if nb in done else 'NOT finished in this run'})" for nb, files in sorted(used.items())]
    curves.subject["source"] = f"{curves.subject.get('source', 'this run')} (an unfinished run: {run['status']})"
    curves.assumptions.insert(0, f"the run did not finish ({run['described']}); --allow-incomplete: used the "
                                 f"tables of {'; '.join(parts) or 'no notebook'}")


def check_trace(trace, spec, model: str) -> None:
    """A trace used with the model ``spec`` (a preset, or the shape a run or table records) must
    have its shape (L, N, m): refused by name, never applied to another shape."""
    if spec is not None:
        invariants.check_trace_shape(trace, spec, model, error=AdviceInputError)


@dataclass(frozen=True)
class RoutingShape:
    """The routing shape a run or table records for its model: N experts, m per token, L MoE layers."""

    name: str
    num_experts: int
    top_k: int
    num_moe_layers: int
    paper_label: str = ""


def routing_shape(shape: dict | None, model: str):
    """The shape of ``model`` as the run file or table records it (``{"N", "m", "L"}``); without one,
    the preset of that name (a benchmark shrunk for a quick run keeps its preset's N, m and L), else
    None. A name is looked up only where no shape is recorded."""
    if shape:
        return RoutingShape(str(model).removesuffix("-shrunk"), int(shape["N"]), int(shape["m"]), int(shape["L"]))
    try:
        return get_spec(str(model).removesuffix("-shrunk"))
    except KeyError:
        return None


__all__ = ["BANDWIDTH_TABLE", "read_bandwidth_table", "table_header", "acceptance", "label_incomplete",
           "check_trace", "RoutingShape", "routing_shape"]
