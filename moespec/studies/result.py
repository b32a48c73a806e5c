"""What a notebook section returns: the lines it reports, the tables it shows and the files it wrote."""

from __future__ import annotations

import html
from dataclasses import dataclass, field

import pandas as pd


@dataclass
class Result:
    """``lines``: the section's summary, one finding per line (every number from its tables);
    ``tables``: name -> DataFrame shown under it; ``files``: what it wrote; ``data``: values a later
    section or the notebook's closing summary reads."""

    lines: list = field(default_factory=list)
    tables: dict = field(default_factory=dict)
    files: list = field(default_factory=list)
    data: dict = field(default_factory=dict)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def __str__(self) -> str:
        parts = [self.text]
        for name, df in self.tables.items():
            parts.append(f"{name}:\n{df.to_string(index=False, float_format=lambda x: f'{x:.4g}')}")
        return "\n\n".join(p for p in parts if p)

    def _repr_html_(self) -> str:
        out = "".join(f"<p>{html.escape(line)}</p>" for line in self.lines)
        for name, df in self.tables.items():
            out += f"<p><b>{html.escape(name)}</b></p>" + df.to_html(index=False, float_format=lambda x: f"{x:.4g}")
        return out


def table(df: pd.DataFrame, columns: list, digits: int = 3) -> pd.DataFrame:
    """The columns of ``df`` a notebook shows, rounded."""
    return df[[c for c in columns if c in df.columns]].round(digits)
