"""Repository-root-anchored paths. Nothing else in moespec computes a path from ``__file__``.

Every location can be moved with an environment variable, so that tests and users can point
moespec at their own folders without editing code.

Where a run writes. Everything a run produces goes into its run folder, :func:`run_dir`:
figures and tables in :func:`figures_dir`, measurement rows (expert-operation benchmark, engine
runs, oracle rounds) and the traces it records in :func:`run_data_dir`. ``moespec reproduce``
sets the run folder of every notebook it runs (``MOESPEC_RUN_DIR``); a notebook opened by hand
(JupyterLab, papermill directly, a Python session) writes into the scratch folder ``runs/scratch/``.
Notebooks call :func:`figures_dir` and :func:`run_data_dir` and never name a folder themselves.
Only the publishing run (``make reproduce``: ``moespec reproduce --publish``) keeps its
measurements in the shared ``data/`` caches (``MOESPEC_RUN_DATA``) and, when it finishes, copies
its figures into the committed ``figures/`` (:func:`committed_figures_dir`). Shared inputs are
read from ``data/`` (corpora, the trained models, recorded traces); the one shared cache any run
may fill is the trained models' (``data/models``, written atomically, as ``build/`` is for the
compiled extension).
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder holding ``pyproject.toml``).
ROOT: Path = Path(__file__).resolve().parent.parent


def _env_path(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default


def data_dir() -> Path:
    """``data/``: corpora copied with attribution, traces, cached models, benchmark rows."""
    return _env_path("MOESPEC_DATA", ROOT / "data")


#: Set by ``moespec reproduce`` for each notebook: the run folder (see the module docstring).
RUN_DIR_ENV = "MOESPEC_RUN_DIR"
#: Set by the publishing run only: where its measurements go (the shared ``data/``).
RUN_DATA_ENV = "MOESPEC_RUN_DATA"


def runs_dir() -> Path:
    """``runs/``: one folder per ``moespec reproduce`` run (executed notebooks, manifest, figures,
    data) and ``scratch/`` for notebooks run by hand."""
    return _env_path("MOESPEC_RUNS", ROOT / "runs")


def scratch_dir() -> Path:
    """``runs/scratch/``: the run folder of a notebook opened by hand (not through ``moespec reproduce``)."""
    return runs_dir() / "scratch"


def run_dir() -> Path:
    """The folder the current run writes into: ``$MOESPEC_RUN_DIR`` (set by ``moespec reproduce``
    for each notebook), else :func:`scratch_dir` (a notebook opened by hand)."""
    return _env_path(RUN_DIR_ENV, scratch_dir())


def figures_dir() -> Path:
    """Where a notebook writes its figures and tables: ``<run folder>/figures``. Notebooks call
    this (``io.save_figure(fig, paths.figures_dir() / "01_fig1_reuse.png")``)."""
    return run_dir() / "figures"


def run_data_dir() -> Path:
    """Where a run writes its measurements (benchmark rows, engine runs, oracle rounds, the traces
    it records): ``<run folder>/data``; for the publishing run ``$MOESPEC_RUN_DATA`` (``data/``,
    whose caches a later ``make reproduce`` resumes from)."""
    return _env_path(RUN_DATA_ENV, run_dir() / "data")


def committed_figures_dir() -> Path:
    """``figures/``: the committed figures, refreshed only by the publishing run
    (``make reproduce``), never written by a notebook directly."""
    return ROOT / "figures"


def notebooks_dir() -> Path:
    return ROOT / "notebooks"


def build_dir() -> Path:
    """Build folder for the C++/CUDA extensions (inside the repository, ignored by git)."""
    return _env_path("MOESPEC_BUILD", ROOT / "build")


def models_dir() -> Path:
    """The embedded models: committed with the full recipe's build (``make models`` retrains them
    in place; :mod:`moespec.zoo.build`)."""
    return data_dir() / "models"


def traces_dir() -> Path:
    """``data/traces``: the shared recorded traces (written by the publishing run)."""
    return data_dir() / "traces"


def run_traces_dir() -> Path:
    """Where the current run saves the traces it records: ``<run data>/traces``."""
    return run_data_dir() / "traces"


def trace_dirs() -> list[Path]:
    """Where a run looks for recorded traces, in order: its own (:func:`run_traces_dir`), then the
    shared :func:`traces_dir` (one folder when they coincide, as for the publishing run)."""
    own, shared = run_traces_dir(), traces_dir()
    return [own] if own.resolve() == shared.resolve() else [own, shared]


def trace_files() -> list[Path]:
    """Every ``*.npz`` trace of :func:`trace_dirs`, sorted by name; a trace the run recorded itself
    shadows a shared one of the same file name."""
    found: dict[str, Path] = {}
    for folder in trace_dirs():
        for path in sorted(folder.glob("*.npz")) if folder.is_dir() else []:
            found.setdefault(path.name, path)
    return [found[name] for name in sorted(found)]


def bench_dir() -> Path:
    """``data/bench``: rows of the benchmark scripts (``benchmarks/``, ``make bench-kernels``),
    written as they are measured, so sweeps resume."""
    return data_dir() / "bench"


def expert_op_dir() -> Path:
    """Rows of the expert-operation benchmark of the current run (notebooks 02 and 03 write them,
    07 reads its bandwidths): ``<run data>/bench/expert_op``."""
    return run_data_dir() / "bench" / "expert_op"


def reference_dir() -> Path:
    """The papers' published tables (labelled reference data, never our result)."""
    return data_dir() / "paper_reference"


def ensure(path: Path) -> Path:
    """Create ``path`` (a folder) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path
