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


@pytest.fixture(autouse=True)
def _run_folder_outside_the_repository(tmp_path_factory, monkeypatch):
    """Every test has its own run folder (``MOESPEC_RUN_DIR``) under pytest's temporary folders,
    so that nothing a test runs (a notebook, a benchmark, a saved trace) lands in the repository's
    runs/scratch, data/ or figures/."""
    monkeypatch.setenv(paths.RUN_DIR_ENV, str(tmp_path_factory.mktemp("run")))
    monkeypatch.delenv(paths.RUN_DATA_ENV, raising=False)


def repository_snapshot() -> dict[str, tuple[int, int]]:
    """(mtime, size) of every file under the repository's figures/, data/ and runs/ (what a run
    must never write outside the publishing ``make reproduce``)."""
    out = {}
    for top in (paths.committed_figures_dir(), paths.ROOT / "data", paths.ROOT / "runs"):
        for f in top.rglob("*") if top.is_dir() else []:
            if f.is_file():
                st = f.stat()
                out[str(f)] = (st.st_mtime_ns, st.st_size)
    return out


@pytest.fixture
def run_notebook(tmp_path, monkeypatch):
    """Run ``notebooks/<name>.ipynb`` with the quick profile; return (executed path, figures dir, text).

    The run folder is ``tmp_path/run`` (``MOESPEC_RUN_DIR``, as ``moespec reproduce`` sets it), so
    figures and measurements go to ``tmp_path/run/figures`` and ``tmp_path/run/data``: tests never
    touch the repository's folders.
    """
    from moespec import runner

    def _run(name: str, **params):
        run_dir = tmp_path / "run"
        monkeypatch.setenv(paths.RUN_DIR_ENV, str(run_dir))
        monkeypatch.delenv(paths.RUN_DATA_ENV, raising=False)
        nb = paths.notebooks_dir() / f"{name}.ipynb"
        run_dir.mkdir(exist_ok=True)  # papermill does not create the output folder
        before = repository_snapshot()
        result = runner.run_notebook(nb, run_dir, {"profile": "quick", **params})
        changed = sorted(set(repository_snapshot().items()) ^ set(before.items()))
        assert not changed, f"{name} wrote outside its run folder: {sorted({c[0] for c in changed})[:10]}"
        return result.output, paths.figures_dir(), notebook_text(result.output)

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
