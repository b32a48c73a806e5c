"""Loading a benchmark or helper script (benchmarks/*.py, scripts/*.py: not packages) as a
module, for the tests of its GPU-free and data-free parts."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from moespec import paths


def _load(folder: str, name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, paths.ROOT / folder / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under the module name ``name``."""
    return _load("benchmarks", name)


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` imported under the module name ``name``."""
    return _load("scripts", name)
