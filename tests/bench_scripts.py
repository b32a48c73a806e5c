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


def render_record_block(tmp_path, monkeypatch, block: str, record: dict, name: str = "record.json") -> str:
    """The report block ``block`` rendered from ``record`` written as ``name`` at a stand-in
    repository root (``tmp_path``), with an empty run folder beside it."""
    import json

    from moespec import report
    from moespec.report.run import RunFiles

    monkeypatch.setattr(paths, "ROOT", tmp_path)
    (tmp_path / name).write_text(json.dumps(record))
    figs = tmp_path / "figs"
    figs.mkdir(exist_ok=True)
    doc = f"<!-- moespec-report:{block} file={name} -->\nold\n<!-- /moespec-report:{block} -->\n"
    return report.render_text(doc, RunFiles(figs))
