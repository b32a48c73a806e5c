"""Loading a benchmark script (benchmarks/*.py, not a package) as a module, for the tests of its
GPU-free and data-free parts."""

from __future__ import annotations

import importlib.util
from types import ModuleType

from moespec import paths


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` imported under the module name ``name``."""
    spec = importlib.util.spec_from_file_location(name, paths.ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
