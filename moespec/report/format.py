"""Number and table formatting shared by the report's blocks and sections (:mod:`moespec.report`)."""

from __future__ import annotations

import math
from datetime import datetime
from pathlib import Path

import pandas as pd

from moespec.report.run import ReportError
from moespec.validate import run_identity


def num(x, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; "n/a" for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{float(x):.{digits}f}"


def span(values, digits: int = 3) -> str:
    """"lo–hi" of ``values`` (one number when they agree at this precision)."""
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return "n/a"
    lo, hi = num(min(v), digits), num(max(v), digits)
    return lo if lo == hi else f"{lo}–{hi}"


def pct(x, digits: int = 1) -> str:
    return f"{100 * float(x):.{digits}f} %"


def md_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in rows]
    return "\n".join(lines)


def frame_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a Markdown table, floats to ``digits`` decimals, NaN as empty."""
    def cell(v):
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            if abs(v) >= 1e6:
                return f"{v:.4g}"
            text = f"{v:.{digits}f}"
            return text.rstrip("0").rstrip(".") if "." in text else text
        return str(v)
    return md_table([str(c) for c in df.columns], [[cell(v) for v in row] for row in df.itertuples(index=False)])


def named_table(df: pd.DataFrame, file: str, columns: str | tuple | list = "", digits: str | int = 3) -> str:
    """``df`` (the file ``file``) as a Markdown table under its name, ``columns`` (comma-separated, or
    a sequence of names) only; a name ending in ``?`` is shown where the file has it (a column that
    tables of older runs lack)."""
    if columns:
        want = [c.strip() for c in columns.split(",")] if isinstance(columns, str) else list(columns)
        want = [c.rstrip("?") for c in want if not c.endswith("?") or c.rstrip("?") in df.columns]
        missing = [c for c in want if c not in df.columns]
        if missing:
            raise ReportError(f"{file} has no columns {missing} (it has {list(df.columns)})")
        df = df[want]
    else:   # the run's stamp is checked where the file is read, not shown
        df = df.drop(columns=[c for c in run_identity.COLUMNS if c in df.columns])
    return f"`{file}`:\n\n" + frame_table(df, int(digits))


def short_commit(commit) -> str:
    return str(commit or "?")[:7]


def when(stamp: str) -> str:
    """An ISO time stamp ``YYYY-MM-DDTHH:MM:SS`` as ``YYYY-MM-DD HH:MM UTC``."""
    try:
        return datetime.fromisoformat(str(stamp)).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return str(stamp)


def machine(record: dict) -> str:
    """The machine of a provenance record in words, e.g. "AMD EPYC, 2 logical CPUs, 24 GiB, no GPU"."""
    hw = record.get("hardware", record)
    cpu = hw.get("cpu", {})
    mem = cpu.get("MemTotal", "")
    gib = f", {int(mem.split()[0]) / 2**20:.0f} GiB" if mem.endswith("kB") else ""
    gpus = hw.get("gpus") or []
    gpu = ", no GPU" if not gpus else ", " + ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g)
                                                      for g in gpus)
    return f"{cpu.get('cpu_model', '?')}, {cpu.get('logical_cpus', '?')} logical CPUs{gib}{gpu}"


def run_folder_name(man: dict) -> str:
    """The run folder a manifest was written in (``runs/<stamp>-full``)."""
    if man.get("run_dir"):
        return f"runs/{Path(man['run_dir']).name}"
    for nb in man.get("notebooks", []):
        if nb.get("output"):
            return f"runs/{Path(nb['output']).parent.name}"
    return "?"


def verdict(ok: bool) -> str:
    return "met" if ok else "**not met**"
