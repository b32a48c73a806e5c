"""The papermill runner behind ``moespec reproduce``: order, parameters, failures, manifest."""

from __future__ import annotations

import json

import nbformat
import pytest

from moespec import runner


def _notebook(path, params_src: str, body_src: str):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(params_src)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(body_src)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_FIGURES", str(tmp_path / "figures"))
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "02_second.ipynb", 'profile = "full"\ndevice = "cpu"', 'print("second", profile)')
    _notebook(nbs / "01_first.ipynb", 'profile = "full"\ndevice = "cpu"\nseed = 3\nwidth = 2',
              'print("first", profile, width * 10)')
    return nbs


def test_discover_orders_by_number(folder):
    assert [p.stem for p in runner.discover(folder)] == ["01_first", "02_second"]


def test_reproduce_writes_manifest_and_passes_parameters(folder, tmp_path):
    manifest = runner.reproduce("quick", out=tmp_path / "run", extra={"width": 7},
                                progress=False, notebooks_folder=folder)
    data = json.loads(manifest.read_text())
    assert [n["name"] for n in data["notebooks"]] == ["01_first", "02_second"]
    first = data["notebooks"][0]
    assert first["parameters"] == {"profile": "quick", "device": "cpu", "seed": 3, "width": 7}
    assert first["seed"] == 3 and first["wall_s"] > 0
    assert data["profile"] == "quick" and "hardware" in data and "versions" in data
    executed = json.loads((tmp_path / "run" / "01_first.ipynb").read_text())
    printed = "".join("".join(o.get("text", "")) for c in executed["cells"] for o in c.get("outputs", []))
    assert "first quick 70" in printed


def test_unknown_parameter_is_an_error_before_running(folder, tmp_path):
    with pytest.raises(runner.UnknownParameterError, match="nonsense"):
        runner.reproduce("quick", out=tmp_path / "run", extra={"nonsense": 1},
                         progress=False, notebooks_folder=folder)
    assert not (tmp_path / "run" / "01_first.ipynb").exists()


def test_unknown_profile_and_only(folder, tmp_path):
    with pytest.raises(runner.NotebookError, match="profile"):
        runner.reproduce("medium", progress=False, notebooks_folder=folder)
    with pytest.raises(runner.NotebookError, match="names no notebook"):
        runner.select(runner.discover(folder), ["09"])
    assert [p.stem for p in runner.select(runner.discover(folder), ["02"])] == ["02_second"]


def test_failing_cell_names_notebook_and_cell(tmp_path, monkeypatch):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_broken.ipynb", 'profile = "full"\ndevice = "cpu"', 'raise ValueError("bad trace file")')
    _notebook(nbs / "02_after.ipynb", 'profile = "full"\ndevice = "cpu"', 'print(1)')
    with pytest.raises(runner.NotebookError, match=r"01_broken.ipynb failed in cell 2 .*ValueError: bad trace file"):
        runner.reproduce("quick", out=tmp_path / "run", progress=False, notebooks_folder=nbs)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["failed"] == "01_broken"
    assert not (tmp_path / "run" / "02_after.ipynb").exists()


def test_parse_assignments():
    assert runner.parse_assignments(["a=1", "b=x", "c=[1, 2]", "d='s'"]) == {"a": 1, "b": "x", "c": [1, 2], "d": "s"}
    with pytest.raises(runner.NotebookError):
        runner.parse_assignments(["novalue"])
