"""Run the notebooks through papermill: the engine behind ``moespec reproduce``.

Every notebook in ``notebooks/`` named ``NN_name.ipynb`` runs in order of ``NN``. Each has a
cell tagged ``parameters`` holding literal values, among them ``profile`` ("quick" or "full") and
``device``. Parameters the notebook does not declare are an error before anything runs. A run
writes the executed notebooks and a provenance manifest (``manifest.json``) into its run folder;
figures and tables go to ``figures/`` (``MOESPEC_FIGURES``), written by the notebooks themselves.
"""

from __future__ import annotations

import datetime as _dt
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from . import io, paths, provenance

PROFILES = ("quick", "full")


class NotebookError(RuntimeError):
    """A notebook could not run: unknown parameters, missing file, or a failing cell."""


class UnknownParameterError(NotebookError):
    pass


@dataclass
class NotebookRun:
    name: str
    parameters: dict
    wall_s: float
    output: Path


def discover(folder: Path | None = None) -> list[Path]:
    """The notebooks of ``folder`` (default ``notebooks/``), in run order (by file name)."""
    folder = folder or paths.notebooks_dir()
    found = sorted(p for p in folder.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise NotebookError(f"no notebooks named NN_name.ipynb in {folder}")
    return found


def select(notebooks: list[Path], only: Iterable[str] | None) -> list[Path]:
    """Keep the notebooks whose stem or number matches one of ``only`` (e.g. "01" or "01_routing_reuse")."""
    if not only:
        return notebooks
    wanted = list(only)
    chosen = [nb for nb in notebooks
              if any(nb.stem == w or nb.stem.split("_", 1)[0] == w or nb.name == w for w in wanted)]
    missing = [w for w in wanted
               if not any(nb.stem == w or nb.stem.split("_", 1)[0] == w or nb.name == w for nb in notebooks)]
    if missing:
        raise NotebookError(f"--only names no notebook: {missing}; notebooks: {[nb.stem for nb in notebooks]}")
    return chosen


def declared_parameters(notebook: Path) -> dict[str, Any]:
    """The parameters (name -> default) of the notebook's cell tagged ``parameters``."""
    import papermill as pm

    declared = pm.inspect_notebook(str(notebook))
    if not declared:
        raise NotebookError(f"{notebook.name} has no cell tagged 'parameters'")
    import ast

    out = {}
    for name, info in declared.items():
        default = info.get("default")
        try:  # papermill reports defaults as source text; the cell holds literals only
            out[name] = ast.literal_eval(default) if isinstance(default, str) else default
        except (ValueError, SyntaxError):
            out[name] = default
    return out


def check_parameters(notebook: Path, parameters: dict[str, Any]) -> dict[str, Any]:
    """Raise :class:`UnknownParameterError` for any parameter the notebook does not declare."""
    declared = declared_parameters(notebook)
    unknown = sorted(set(parameters) - set(declared))
    if unknown:
        raise UnknownParameterError(
            f"{notebook.name}: unknown parameter(s) {unknown}; it declares {sorted(declared)}")
    return declared


def run_notebook(notebook: Path, out_dir: Path, parameters: dict[str, Any]) -> NotebookRun:
    """Execute one notebook with papermill into ``out_dir``; raise :class:`NotebookError` naming
    the notebook and the failing cell."""
    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    check_parameters(notebook, parameters)
    out = paths.ensure(Path(out_dir)) / notebook.name
    start = time.perf_counter()
    try:
        pm.execute_notebook(str(notebook), str(out), parameters=parameters, progress_bar=False,
                            cwd=str(notebook.parent), kernel_name="python3")
    except PapermillExecutionError as exc:
        where = _describe_cell(out, exc.cell_index)
        raise NotebookError(
            f"{notebook.name} failed in {where}: {exc.ename}: {exc.evalue}. "
            f"Executed notebook with the traceback: {out}") from None
    return NotebookRun(notebook.stem, dict(parameters), time.perf_counter() - start, out)


def _describe_cell(executed: Path, index: int) -> str:
    """Name the failing cell as the author sees it: its 1-based number among the notebook's own
    cells (papermill's injected-parameters and error-banner cells not counted) and its first line."""
    import json

    added = {"injected-parameters", "papermill-error-cell-tag"}
    try:
        cells = json.loads(executed.read_text())["cells"]
        own = [c for c in cells if not added & set(c.get("metadata", {}).get("tags", []))]
        number, cell = next((i + 1, c) for i, c in enumerate(own)
                            if c.get("metadata", {}).get("papermill", {}).get("exception"))
        first = next((line.strip() for line in "".join(cell["source"]).splitlines() if line.strip()), "")
        return f"cell {number} ({first[:60]!r})"
    except (OSError, ValueError, KeyError, StopIteration):
        return f"cell index {index}"


def reproduce(profile: str = "full", only: Iterable[str] | None = None, out: Path | None = None,
              extra: dict[str, Any] | None = None, device: str | None = None,
              progress: bool = True, notebooks_folder: Path | None = None) -> Path:
    """Run the notebooks in order; return the path of the run's ``manifest.json``.

    ``extra`` parameters go to every notebook that declares them; a name that no selected
    notebook declares is an error.
    """
    if profile not in PROFILES:
        raise NotebookError(f"unknown profile {profile!r}; choose one of {PROFILES}")
    notebooks = select(discover(notebooks_folder), only)
    extra = dict(extra or {})
    declared = {nb: declared_parameters(nb) for nb in notebooks}
    orphan = sorted(k for k in extra if not any(k in d for d in declared.values()))
    if orphan:
        raise UnknownParameterError(
            f"unknown parameter(s) {orphan}: no selected notebook declares them")
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_dir = paths.ensure(Path(out) if out else paths.runs_dir() / f"{stamp}-{profile}")
    manifest = {"started": _dt.datetime.now().isoformat(timespec="seconds"), "profile": profile,
                "figures_dir": str(paths.figures_dir()), **provenance.full_record(), "notebooks": []}
    from tqdm.auto import tqdm

    bar = tqdm(notebooks, desc=f"moespec reproduce ({profile})", unit="notebook", disable=not progress)
    for nb in bar:
        bar.set_postfix_str(nb.stem)
        params = {"profile": profile}
        if device is not None:
            params["device"] = device
        params.update({k: v for k, v in extra.items() if k in declared[nb]})
        for required in params:
            if required not in declared[nb]:
                raise UnknownParameterError(f"{nb.name} does not declare the parameter {required!r}")
        try:
            result = run_notebook(nb, run_dir, params)
        except NotebookError:
            manifest["failed"] = nb.stem
            io.write_json(run_dir / "manifest.json", manifest)
            raise
        effective = {**declared[nb], **params}
        manifest["notebooks"].append({"name": result.name, "parameters": effective,
                                      "seed": effective.get("seed"),
                                      "wall_s": round(result.wall_s, 2), "output": str(result.output)})
        io.write_json(run_dir / "manifest.json", manifest)
    manifest["finished"] = _dt.datetime.now().isoformat(timespec="seconds")
    return io.write_json(run_dir / "manifest.json", manifest)


def parse_assignments(items: Iterable[str]) -> dict[str, Any]:
    """Parse ``KEY=VALUE`` strings; values are read as Python literals where possible."""
    import ast

    out = {}
    for item in items:
        if "=" not in item:
            raise NotebookError(f"parameter {item!r} is not KEY=VALUE")
        key, value = item.split("=", 1)
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # quiet the kernel's debugger warning
