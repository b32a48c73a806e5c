"""The boundary of ``moespec advise``: every file it reads, checked where it enters
(:mod:`moespec.validate`), with the errors raised as :class:`~moespec.advice.inputs.AdviceInputError`.

* The run's tables (:data:`RUN_TABLES`, by file name) and a bandwidth table (:data:`BANDWIDTH_TABLE`):
  typed columns and ranges (verify times > 0, bands >= 0, eps >= 0, h(k) >= 0, n >= 1), byte
  shares 1/n <= ubar(n) <= 1 with ubar(1) = 1, a measured interval whose ends are in order.
* An acceptance table: counts that are non-negative integers, used and labelled as they are, or
  rates in [0, 1); labels that are not empty.
* The run's manifest (:mod:`moespec.validate.runs`): an unfinished run is refused unless allowed
  (:func:`incomplete_runs_allowed`, ``--allow-incomplete``); then :func:`label_incomplete` says in
  the advice which notebooks' tables it used.
* A routing trace used with a model must have that model's L, N and m.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from pathlib import Path

import numpy as np
import pandas as pd

from moespec.fit import COEFS
from moespec.tables.bandwidth import PAPER_LABEL
from moespec.tables.theory import label_of_rows
from moespec.validate import invariants, runs
from moespec.validate.errors import InputError
from moespec.validate.tables import Column, check_columns, check_rows, parse_csv

_POS = dict(low=0, low_open=True)
_ANY = dict(required=False, missing_ok=True)

#: Columns of the run tables advise reads, by file name (types, ranges, empty cells allowed).
_CURVES = (Column("d", "int", low=0), Column("n", "int", low=1), Column("version", "str"),
           Column("tau_slot_ms", **_POS), Column("tau_dedup_ms", **_POS),
           Column("band_ms", low=0, missing_ok=True), Column("S_lo_ms", missing_ok=True),
           Column("S_hi_ms", missing_ok=True), Column("M_slot_ms", low=0, **_ANY), Column("M_dedup_ms", low=0, **_ANY))
RUN_TABLES: dict[str, tuple[Column, ...]] = {
    "06_curves.csv": _CURVES,
    "06_curves_loaded.csv": _CURVES,
    "06_epsilon.csv": (Column("eps_engine", low=0),),
    "06_epsilon_loaded.csv": (Column("eps_engine", low=0),),
    "06_table7_error.csv": (Column("d", "int", low=0), Column("engine_eps", low=0, missing_ok=True),
                            Column("source", "str")),
    "06_fits.csv": (Column("fmt", "str"),),
    "06_table3_predictions.csv": (Column("model", "str", missing_ok=True), Column("engine", "str", missing_ok=True),
                                  Column("source", "str")),
    "05_real_draft_acceptance.csv": (Column("state", "str"), Column("a", low=0, high=1, high_open=True, required=False),
                                     Column("a_pooled", low=0, high=1, required=False),
                                     Column("accepted", "count", required=False),
                                     Column("rejections", "count", required=False), Column("label", "str", required=False)),
    "05_draft_cost_predictions.csv": (Column("state", "str"), Column("draft_cost", low=0), Column("k", "int", low=1),
                                      Column("measured", **_POS)),
    "03_fit_coefficients.csv": (Column("model", "str"), Column("layer", "int", low=0),
                                Column("kernel", "str", choices=tuple(COEFS)),
                                *(Column(c, missing_ok=True) for c in ("t_op", "c_u", "c_g", "c_t", "c_re")),
                                Column("n_passes", "count", required=False)),
    "03_epsilon.csv": (Column("eps_engine", low=0),),
    "03_bandwidth_all_models.csv": (Column("model", "str"), Column("n", "int", low=1), Column("ubar"),
                                    Column("expert_bytes", **_POS), Column("read_GBps", low=0, **_ANY)),
}
#: A bandwidth table with one row per n (``--bandwidth``; notebook 02's ``02_bandwidth_by_n.csv``).
BANDWIDTH_TABLE = (Column("n", "int", low=1), Column("beta_slot_GBps", **_POS), Column("beta_dedup_GBps", **_POS),
                   Column("ubar", required=False), Column("expert_bytes", required=False, **_POS),
                   Column("model", "str", required=False), Column("source", "str", required=False))
ACCEPTANCE_COUNTS = (Column("accepted", "count"), Column("rejections", "count"), Column("label", "str", required=False))
ACCEPTANCE_RATES = (Column("a", low=0, high=1, high_open=True), Column("label", "str", required=False))

_ALLOW_INCOMPLETE = contextvars.ContextVar("moespec_advise_allow_incomplete", default=False)


def _error():
    from .inputs import AdviceInputError

    return AdviceInputError


def _row_checks(df: pd.DataFrame, path: Path) -> None:
    """Checks of a run table that involve several columns."""
    error = _error()
    if {"n", "ubar"} <= set(df.columns) and df["ubar"].notna().all():
        invariants.check_byte_share_rows(df, path, "n", "ubar", error=error)
    if path.name == "06_curves.csv" and {"S_lo_ms", "S_hi_ms", "version"} <= set(df.columns):
        measured = (df["version"] == "measured").to_numpy()
        lo, hi = df["S_lo_ms"].to_numpy(float), df["S_hi_ms"].to_numpy(float)
        check_rows(df, path, measured & (lo > hi), "columns 'S_lo_ms' <= 'S_hi_ms'",
                   "an interval whose lower end is not above its upper end", [f"[{a}, {b}]" for a, b in zip(lo, hi)],
                   error)
    if "source" in df.columns and path.name not in RUN_TABLES:
        check_rows(df, path, (df["source"] == PAPER_LABEL).to_numpy(), "column 'source'",
                   "a label of these numbers (paper 1 publishes no per-n table; its Table 1 has n = 2 and 8)",
                   df["source"].tolist(), error)


def read_table(path: str | Path, needed, what: str) -> pd.DataFrame:
    """A table advise reads (``needed``: the columns the caller uses), checked: the columns of
    :data:`RUN_TABLES` for the file's name (else of :data:`BANDWIDTH_TABLE` for a bandwidth table),
    those in ``needed`` required, and the row checks that involve several columns."""
    path = Path(path)
    error = _error()
    schema = RUN_TABLES.get(path.name) or (BANDWIDTH_TABLE if what == "bandwidth table" else ())
    known = {c.name for c in schema}
    columns = [Column(c.name, c.kind, c.low, c.high, c.low_open, c.high_open, c.name in needed, c.missing_ok,
                      c.choices) for c in schema]
    columns += [Column(name, "str", required=True, missing_ok=True) for name in needed if name not in known]
    df = parse_csv(path, what, error)
    # columns without a declared type are checked for presence only (their values are kept as read)
    untyped = [c for c in columns if c.name not in known]
    typed = check_columns(df, path, [c for c in columns if c.name in known], error)
    check_columns(df, path, untyped, error, min_rows=0)
    _row_checks(typed, path)
    return typed


def table_header(path: str | Path, what: str = "bandwidth table") -> list[str]:
    """The column names of a CSV (its first line), refusing an empty or unreadable file."""
    return list(parse_csv(path, what, _error(), nrows=0).columns)


def acceptance(path: str | Path) -> list[tuple[float, str]]:
    """Acceptance rates from a measured table; see :func:`moespec.advice.acceptance_from_table`.
    Counts must be non-negative integers (they are used and printed as they are)."""
    path = Path(path)
    error = _error()
    df = parse_csv(path, "acceptance table", error)
    out = []
    if {"accepted", "rejections"} <= set(df.columns):
        df = check_columns(df, path, ACCEPTANCE_COUNTS, error)
        groups = df.groupby("label", sort=False) if "label" in df.columns else [(path.name, df)]
        for label, g in groups:
            acc, rej = int(g["accepted"].sum()), int(g["rejections"].sum())
            if acc + rej == 0:
                raise error(f"{path}: group {label!r}: expected at least one drafted token accepted or rejected; "
                            "found 0 accepted and 0 rejections", where=str(path), field="accepted", found=0)
            out.append((acc / (acc + rej), f"{label}: pooled MLE, {acc} accepted, {rej} rejections"))
    elif "a" in df.columns:
        df = check_columns(df, path, ACCEPTANCE_RATES, error)
        labels = df["label"] if "label" in df.columns else [f"{path.name} row {i + 1}" for i in range(len(df))]
        out = [(float(a), str(lab)) for a, lab in zip(df["a"], labels)]
    else:
        raise error(f"{path}: need columns 'accepted' and 'rejections', or a column 'a'; found {list(df.columns)}",
                    where=str(path), field="columns", found=list(df.columns))
    return out


# --- the run's status -----------------------------------------------------------------------------
@contextlib.contextmanager
def incomplete_runs_allowed(allowed: bool = True):
    """Inside the block, advise reads the tables of a run that did not finish (``--allow-incomplete``)."""
    token = _ALLOW_INCOMPLETE.set(bool(allowed))
    try:
        yield
    finally:
        _ALLOW_INCOMPLETE.reset(token)


def run_status(run: str | Path) -> runs.RunStatus:
    return runs.run_status(run, _error())


def check_run(run: str | Path, man: dict | None) -> runs.RunStatus:
    """The run's status; an unfinished run refused unless :func:`incomplete_runs_allowed`. ``man``:
    the manifest the caller found (beside the tables when the run folder has none)."""
    status = run_status(run)
    if status.manifest is None and man is not None:   # only the outputs folder has one: judge by it
        status = runs.status_from(man, None)
    if not (status.complete or status.own or _ALLOW_INCOMPLETE.get()):
        runs.refuse_incomplete(status, "moespec advise", _error())
    return status


def label_incomplete(curves, status: runs.RunStatus) -> None:
    """For advice from an unfinished run (allowed): the source says so and an assumption names
    the notebooks whose tables were used, and whether each finished."""
    if status.complete or status.own:
        return
    used = {}
    for item in curves.inputs:
        m = re.match(r"(\d\d)_", Path(str(item).split(" ")[0]).name)
        if m:
            used.setdefault(m.group(1), []).append(Path(str(item).split(" ")[0]).name)
    done = {name.split("_", 1)[0]: name for name in status.finished}
    parts = [f"notebook {done.get(nb, nb)} ({', '.join(files)}; "
             f"{'finished' if nb in done else 'NOT finished in this run'})" for nb, files in sorted(used.items())]
    curves.subject["source"] = f"{curves.subject.get('source', 'this run')} (an unfinished run: {status.status})"
    curves.assumptions.insert(0, f"the run did not finish ({status.describe()}); --allow-incomplete: used the "
                                 f"tables of {'; '.join(parts) or 'no notebook'}")


def check_trace(trace, spec, model: str) -> None:
    """A trace used with the preset ``spec`` must have its shape (L, N, m)."""
    if spec is not None:
        invariants.check_trace_shape(trace, spec, model, error=_error())


def bandwidth_source(label: str | None, rows_source: str) -> str:
    """The label of a bandwidth table's rows: ``label`` (``--source``,
    :func:`moespec.tables.theory.label_of_rows`) when given, else what the reader recognised."""
    return rows_source if label is None else label_of_rows(label)


__all__ = ["RUN_TABLES", "BANDWIDTH_TABLE", "read_table", "table_header", "acceptance", "incomplete_runs_allowed",
           "check_run", "label_incomplete", "check_trace", "bandwidth_source", "InputError"]
