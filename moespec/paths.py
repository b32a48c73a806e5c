"""Repository-root-anchored paths. Nothing else in moespec computes a path from ``__file__``.

Every location can be moved with an environment variable, so that tests and users can point
moespec at their own folders without editing code.
"""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root (the folder holding ``pyproject.toml``).
ROOT: Path = Path(__file__).resolve().parent.parent


def _env_path(var: str, default: Path) -> Path:
    value = os.environ.get(var)
    return Path(value).expanduser().resolve() if value else default


def shared_dir() -> Path:
    """The read-only ``shared/`` folder beside the checkout (papers, raw data, reference tables)."""
    return _env_path("MOESPEC_SHARED", ROOT.parent / "shared")


def data_dir() -> Path:
    """``data/``: corpora copied with attribution, traces, cached models, benchmark rows."""
    return _env_path("MOESPEC_DATA", ROOT / "data")


def figures_dir() -> Path:
    """``figures/``: every figure and table the notebooks write."""
    return _env_path("MOESPEC_FIGURES", ROOT / "figures")


def committed_figures_dir() -> Path:
    """The checkout's ``figures/``: the committed full run's figures and tables, whatever
    ``MOESPEC_FIGURES`` says (notebooks read it as the fallback input of a run without its own)."""
    return ROOT / "figures"


def runs_dir() -> Path:
    """``runs/``: one folder per ``moespec reproduce`` run (executed notebooks, manifest)."""
    return _env_path("MOESPEC_RUNS", ROOT / "runs")


def notebooks_dir() -> Path:
    return ROOT / "notebooks"


def build_dir() -> Path:
    """Build folder for the C++/CUDA extensions (inside the repository, ignored by git)."""
    return _env_path("MOESPEC_BUILD", ROOT / "build")


def models_dir() -> Path:
    """Cached embedded models (trained by ``make reproduce``; not committed)."""
    return data_dir() / "models"


def traces_dir() -> Path:
    return data_dir() / "traces"


def bench_dir() -> Path:
    """Benchmark rows (CSV) written as they are measured, so sweeps resume."""
    return data_dir() / "bench"


def reference_dir() -> Path:
    """The papers' published tables (labelled reference data, never our result)."""
    return data_dir() / "paper_reference"


def ensure(path: Path) -> Path:
    """Create ``path`` (a folder) if missing and return it."""
    path.mkdir(parents=True, exist_ok=True)
    return path
