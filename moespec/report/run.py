"""The files a report reads: a run folder's tables and manifest, and committed repository files."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec import paths
from moespec.validate import InputError, run_identity
from moespec.validate import runs as run_checks
from moespec.validate.tables import parse_csv


class ReportError(InputError):
    """A block cannot be written: the message names the block, the document and the file."""


class RunFiles:
    """A run's tables and manifest. ``folder`` is a run folder (``runs/<run>/`` with ``figures/``
    and ``manifest.json``) or a figures folder (the committed ``figures/`` with ``MANIFEST.json``).
    Every read names the file it needed when it is missing (:class:`ReportError`). A run that did
    not finish (its manifest says running, failed or interrupted) is refused unless
    ``allow_incomplete``; :attr:`status` says what it is (:mod:`moespec.validate.runs`)."""

    def __init__(self, folder: str | Path, allow_incomplete: bool = False):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise ReportError(f"run folder {self.folder} does not exist (give a runs/<run>/ folder or figures/)")
        sub = self.folder / "figures"
        self.tables = sub if sub.is_dir() and not (self.folder / "MANIFEST.json").exists() else self.folder
        self._cache: dict = {}
        self.status = run_checks.require_complete(self.folder, allow_incomplete, "moespec report", ReportError)

    # --- the run's own files -----------------------------------------------------------------
    def path(self, name: str) -> Path:
        """``name`` among the run's tables and figures; :class:`ReportError` when it is missing."""
        p = self.tables / name
        if not p.exists():
            raise ReportError(f"{p} is missing (the run's notebooks did not write {name})")
        return p

    def has(self, name: str) -> bool:
        return (self.tables / name).exists()

    def _read_csv(self, path: Path) -> pd.DataFrame:
        """``path`` as a DataFrame, read once per report (a copy each time)."""
        if path not in self._cache:
            self._cache[path] = parse_csv(path, "table", ReportError)
        return self._cache[path].copy()

    def csv(self, name: str) -> pd.DataFrame:
        """A table of the run, checked to be of this run and, per machine state, of its state
        (:mod:`moespec.validate.run_identity`)."""
        path = self.path(name)
        df = self._read_csv(path)
        run_identity.check_table_of_run(df, path, run_checks.find_manifest(self.folder), ReportError)
        return df

    def json(self, name: str):
        return run_checks.jsonfile.load(self.path(name), "JSON file", ReportError)

    @property
    def manifest(self) -> dict:
        """The run's manifest: ``manifest.json`` of a run folder or ``MANIFEST.json`` of figures/."""
        for p in (self.folder / "manifest.json", self.folder / "MANIFEST.json", self.tables / "MANIFEST.json"):
            if p.exists():
                if p not in self._cache:
                    self._cache[p] = run_checks.read_manifest(p, ReportError)
                return self._cache[p]
        raise ReportError(f"{self.folder}: no manifest.json or MANIFEST.json (not a moespec run folder)")

    def notebook(self, name: str) -> dict:
        """The manifest's entry of notebook ``name`` (e.g. ``05_whole_model``)."""
        for nb in self.manifest.get("notebooks", []):
            if nb.get("name") == name:
                return nb
        raise ReportError(f"the manifest of {self.folder} has no notebook {name}")

    # --- committed repository files ----------------------------------------------------------
    @staticmethod
    def repo_path(relative: str) -> Path:
        """A committed file of the repository (``benchmarks/results/...``, ``data/paper_reference/...``)."""
        p = paths.ROOT / relative
        if not p.exists():
            raise ReportError(f"{p} is missing")
        return p

    def repo_csv(self, relative: str) -> pd.DataFrame:
        """A committed CSV of the repository."""
        return self._read_csv(self.repo_path(relative))

    def repo_json(self, relative: str):
        return run_checks.jsonfile.load(self.repo_path(relative), "JSON file", ReportError)
