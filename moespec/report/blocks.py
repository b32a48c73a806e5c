"""The registry of report blocks: a block is a function ``fn(run, **params) -> str`` (Markdown) that
writes one marked block of README.md or docs/*.md, or one part of a run's ``REPORT.md``, from files.

``@block(name, *files)`` registers it; ``files`` are the run's files it reads, ``{param}`` filled
from the marker (a marker with ``if-present`` writes a note instead of failing when one is missing).
Marker parameters arrive as strings. The blocks themselves live in :mod:`moespec.report.sections`
(the run's own files: the report's sections and the README's advise example) and
:mod:`moespec.report.records` (committed records a marker names by path).
"""

from __future__ import annotations

#: name -> (function, run files it reads)
BLOCKS: dict[str, tuple] = {}


def block(name: str, *files: str):
    """Register the block ``name``, which reads ``files`` of the run."""
    def deco(fn):
        if name in BLOCKS:
            raise ValueError(f"report block {name!r} is defined twice")
        BLOCKS[name] = (fn, tuple(files))
        return fn
    return deco


# The modules that define blocks register them on import.
from moespec.report import records, sections  # noqa: E402,F401
