"""Shared fixtures: notebook execution through papermill with the quick profile, CUDA skip marker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moespec import paths


def pytest_collection_modifyitems(config, items):
    cuda = None
    for item in items:
        if "cuda" in item.keywords:
            if cuda is None:
                import torch

                cuda = torch.cuda.is_available()
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU; none present"))


def notebook_text(nb_path: Path) -> str:
    """All stream and text/plain outputs of an executed notebook, joined (what it printed)."""
    nb = json.loads(Path(nb_path).read_text())
    parts = []
    for cell in nb["cells"]:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                parts.append("".join(out.get("text", "")))
            elif "data" in out and "text/plain" in out["data"]:
                parts.append("".join(out["data"]["text/plain"]))
    return "\n".join(parts)


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """Run ``notebooks/<name>.ipynb`` with the quick profile; return (executed path, figures dir, text).

    Figures go to a temporary ``figures/`` so tests never touch the repository's.
    """
    from moespec import runner

    def _run(name: str, **params):
        figures = tmp_path / "figures"
        monkeypatch.setenv("MOESPEC_FIGURES", str(figures))
        nb = paths.notebooks_dir() / f"{name}.ipynb"
        (tmp_path / "run").mkdir(exist_ok=True)  # papermill does not create the output folder
        result = runner.run_notebook(nb, tmp_path / "run", {"profile": "quick", **params})
        return result.output, figures, notebook_text(result.output)

    return _run


@pytest.fixture
def one_thread():
    """One torch intra-op thread for the test: on busy shared cores two OpenMP threads spin-wait
    on each other (measured 5x slower). Use with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
