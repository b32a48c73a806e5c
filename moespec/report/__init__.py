"""``moespec report RUN_DIR``: the README's and docs' result tables and numbers, written from a
run's files into marked blocks.

A block in a Markdown file is everything between

    <!-- moespec-report:NAME key=value ... -->
    ...
    <!-- /moespec-report:NAME -->

and is rewritten by the block function ``NAME`` (:mod:`moespec.report.blocks`) from the run folder
(a ``runs/<run>/`` folder or the committed ``figures/``: its tables and manifest) and, where a block
names them, committed benchmark files (``benchmarks/results/``) and reference tables. A block whose
file is missing fails with a :class:`ReportError` naming the file (a marker with ``if-present``
states the file's absence in the text instead). ``tests/test_report.py`` renders every committed
README/docs block from the committed ``figures/`` and fails when the text differs: no number in a
block is typed by hand.

Adding a block: write a function ``name(run, **params) -> str`` in :mod:`moespec.report.blocks`
decorated with ``@block("name", "file it reads", ...)``, put the two markers where the text goes
and run ``moespec report figures`` (docs/DEVELOPING.md).
"""

from __future__ import annotations

from moespec.report.render import DOC_GLOBS, ReportError, check_files, doc_files, render_text, update_files
from moespec.report.run import RunFiles

__all__ = ["DOC_GLOBS", "ReportError", "RunFiles", "check_files", "doc_files", "render_text", "update_files"]
