"""Finding the marked blocks of a Markdown file and rewriting them, and writing a run's report
(:mod:`moespec.report`)."""

from __future__ import annotations

import difflib
import re
import shlex
from pathlib import Path

from moespec import io, paths
from moespec.validate.outputs import writable_file
from moespec.report.blocks import BLOCKS
from moespec.report.run import ReportError, RunFiles
from moespec.report.sections import report_path, report_text

#: The documents whose blocks ``moespec report`` writes, relative to the repository root.
DOC_GLOBS = ("README.md", "docs/*.md", "figures/README.md")

#: Markers stand alone on their lines (an indented or quoted example in a page is not a marker).
_OPEN = re.compile(r"^<!-- moespec-report:(?P<name>[\w-]+)(?P<args>[^>\n]*?)-->$", re.M)
_CLOSE = re.compile(r"^<!-- /moespec-report:(?P<name>[\w-]+) -->$", re.M)


def doc_files(root: Path | None = None) -> list[Path]:
    """README.md, docs/*.md and figures/README.md under ``root`` (the repository by default)."""
    root = Path(root) if root else paths.ROOT
    out = []
    for pattern in DOC_GLOBS:
        out += sorted(root.glob(pattern))
    return out


def _params(args: str, where: str) -> tuple[dict, bool]:
    """``key=value`` words of a marker (shell quoting) and whether it says ``if-present``."""
    params, optional = {}, False
    for word in shlex.split(args):
        if word == "if-present":
            optional = True
        elif "=" in word:
            key, value = word.split("=", 1)
            params[key.replace("-", "_")] = value
        else:
            raise ReportError(f"{where}: marker word {word!r} is neither key=value nor if-present")
    return params, optional


def render_text(text: str, run: RunFiles, where: str = "<text>") -> str:
    """``text`` with every marked block rewritten from ``run``. Refuses unknown block names,
    an opening marker without its closing one (and the reverse), and nested blocks."""
    out, pos = [], 0
    while True:
        m = _OPEN.search(text, pos)
        stray = _CLOSE.search(text, pos, m.start() if m else len(text))
        if stray is not None:
            line = text.count("\n", 0, stray.start()) + 1
            raise ReportError(f"{where}:{line}: closing marker of block {stray['name']!r} without its opening one")
        if m is None:
            out.append(text[pos:])
            return "".join(out)
        name, line = m["name"], text.count("\n", 0, m.start()) + 1
        here = f"{where}:{line} (block {name!r})"
        close = re.compile(rf"^<!-- /moespec-report:{re.escape(name)} -->$", re.M).search(text, m.end())
        if close is None:
            raise ReportError(f"{here}: no closing marker <!-- /moespec-report:{name} -->")
        inner = _OPEN.search(text, m.end(), close.start())
        if inner is not None:
            raise ReportError(f"{here}: block {inner['name']!r} opens inside it; blocks do not nest")
        if name not in BLOCKS:
            raise ReportError(f"{here}: unknown block; known blocks: {sorted(BLOCKS)}")
        params, optional = _params(m["args"], here)
        fn, needs = BLOCKS[name]
        try:
            missing = [f for f in (n.format(**params) for n in needs) if not run.has(f)]
            if missing and optional:
                body = (f"*(The run {run_label(run)} has no {', '.join(f'`{f}`' for f in missing)}: it predates "
                        "the table. `make reproduce` writes it, `moespec report figures` fills this in.)*")
            else:
                body = fn(run, **params)
        except ReportError as exc:
            raise ReportError(f"{here}: {exc}") from exc
        except TypeError as exc:
            raise ReportError(f"{here}: {exc}") from exc
        out.append(text[pos:m.end()] + "\n" + body.strip("\n") + "\n" + close.group(0))
        pos = close.end()


def run_label(run: RunFiles) -> str:
    """The run's start, for the text of a block that has no file to read."""
    return f"of {str(run.manifest.get('started', '?')).replace('T', ' ')}"


def _diff(old: str, new: str, path: Path) -> str:
    return "".join(difflib.unified_diff(old.splitlines(True), new.splitlines(True), str(path), f"{path} (report)", n=1))


def _rendered(run_dir: str | Path, files, allow_incomplete: bool = False,
              writing: bool = False) -> dict[Path, tuple[str, str]]:
    """``{file: (text now, text from the run)}`` for every file whose blocks change, and for the
    run's ``REPORT.md`` when ``files`` is None (the default documents) and it changes. Every file
    must be a readable Markdown file (and, when ``writing``, writable) before any is rendered."""
    with_report = files is None
    files = [Path(p) for p in (files if files is not None else doc_files())]
    for path in files:
        if not path.is_file():
            raise ReportError(f"--files {path}: expected a Markdown file; found "
                              f"{'a folder' if path.is_dir() else 'nothing (no such file)'}", where=str(path))
        if writing:
            writable_file(path, "--files", ReportError)
    run = RunFiles(run_dir, allow_incomplete)
    out = {}
    if with_report:
        path = report_path(run)
        if writing and path.exists():
            writable_file(path, "the run's report", ReportError)
        old, new = (path.read_text() if path.is_file() else ""), report_text(run)
        if new != old:
            out[path] = (old, new)
    for path in files:
        try:
            old = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ReportError(f"{path}: not a readable text file ({exc})", where=str(path)) from None
        new = render_text(old, run, str(path.relative_to(paths.ROOT) if path.is_relative_to(paths.ROOT) else path))
        if new != old:
            out[path] = (old, new)
    return out


def check_files(run_dir: str | Path, files=None, allow_incomplete: bool = False) -> dict[Path, str]:
    """``{file: unified diff}`` for every file whose blocks differ from what ``run_dir`` gives (and
    the run's ``REPORT.md`` when ``files`` is None)."""
    return {path: _diff(old, new, path) for path, (old, new) in _rendered(run_dir, files, allow_incomplete).items()}


def update_files(run_dir: str | Path, files=None, allow_incomplete: bool = False) -> list[Path]:
    """Rewrite the blocks of ``files`` (default :func:`doc_files`, and then the run's ``REPORT.md``
    too) from ``run_dir``; returns the files that changed. Every file is checked writable and rendered
    before any is written, so bad
    input changes nothing; a write that still fails names the files written before it.
    ``allow_incomplete``: write from a run that did not finish (:class:`RunFiles`)."""
    changed = _rendered(run_dir, files, allow_incomplete, writing=True)
    written = []
    for path, (_, new) in changed.items():
        try:
            io.write_text(path, new)
        except OSError as exc:
            raise ReportError(f"{path}: not written ({exc.strerror or exc}); written before it: "
                              f"{[str(p) for p in written] or 'none'}", where=str(path)) from None
        written.append(path)
    return written
