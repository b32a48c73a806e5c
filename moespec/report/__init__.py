"""``moespec report RUN``: a run's results as one report beside its figures, and the README's and
docs' numbers, written from files.

* **The run's report**, ``REPORT.md`` beside the run's figures and tables (``runs/<run>/figures/``,
  or the committed ``figures/``): a section per notebook, each rendered from the run's own tables
  (:mod:`moespec.report.sections`). ``moespec reproduce`` writes it when a run finishes;
  ``tests/test_report.py`` checks that the committed ``figures/REPORT.md`` is what the committed
  files give.
* **Blocks** in README.md, docs/*.md and figures/README.md: everything between

      <!-- moespec-report:NAME key=value ... -->
      ...
      <!-- /moespec-report:NAME -->

  is rewritten by the block function ``NAME`` (:mod:`moespec.report.blocks`) from the run folder or
  from a committed record the marker names by its path (:mod:`moespec.report.records`). A block
  whose file is missing fails with a :class:`ReportError` naming the file (a marker with
  ``if-present`` states the file's absence instead). ``tests/test_report.py`` renders every block
  from the committed ``figures/`` and fails when the text differs: no number in a block is typed.

Adding a block: write ``name(run, **params) -> str`` decorated with ``@block("name", "file it reads",
...)`` in :mod:`~moespec.report.sections` (a run's files) or :mod:`~moespec.report.records` (a
committed record), put the two markers where the text goes and run ``moespec report figures``
(docs/DEVELOPING.md). A report section lists its parts in :data:`~moespec.report.sections.SECTIONS`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from moespec.report.render import DOC_GLOBS, check_files, doc_files, render_text, update_files
from moespec.report.run import ReportError, RunFiles
from moespec.report.sections import REPORT_NAME, report_text, write_report

__all__ = ["DOC_GLOBS", "REPORT_NAME", "ReportError", "RunFiles", "check_files", "doc_files", "render_text",
           "report_text", "update_files", "write_report", "write_run_report"]


def write_run_report(run_dir: str | Path) -> Path | None:
    """``REPORT.md`` of a finished run (``moespec reproduce`` calls it last). A report that cannot be
    written leaves the run as it is and says why in one line on stderr; returns the path or None."""
    try:
        return write_report(run_dir)
    except (ReportError, OSError) as exc:
        print(f"moespec report: {Path(run_dir) / 'figures' / REPORT_NAME} not written: {exc}", file=sys.stderr)
        return None
