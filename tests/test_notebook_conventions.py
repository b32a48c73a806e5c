"""Every committed notebook: outputs stripped, a parameters cell with profile and device, paired
with its jupytext py:percent file, no function or class defined inside it."""

from __future__ import annotations

import ast
import json

import pytest

from moespec import paths, runner

NOTEBOOKS = sorted(paths.notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stripped_and_parameterized(nb_path):
    nb = json.loads(nb_path.read_text())
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    assert all(not c.get("outputs") and not c.get("execution_count") for c in code), \
        f"{nb_path.name} is committed with outputs; strip them"
    declared = runner.declared_parameters(nb_path)
    assert {"profile", "device"} <= set(declared), f"{nb_path.name} lacks profile/device parameters"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1
    for stmt in ast.parse("".join(tagged[0]["source"])).body:
        assert isinstance(stmt, (ast.Assign, ast.AnnAssign, ast.Expr)), "parameters cell holds literals only"
        if isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            ast.literal_eval(stmt.value)
    for cell in code:
        src = "".join(cell["source"])
        tree = ast.parse("\n".join(l for l in src.splitlines() if not l.lstrip().startswith(("%", "!"))))
        defs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Lambda))]
        assert not defs, f"{nb_path.name} defines helper code; move it into moespec/"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_py_in_sync(nb_path):
    import jupytext

    py = nb_path.with_suffix(".py")
    assert py.exists(), f"{nb_path.name} has no paired {py.name} (jupytext --set-formats ipynb,py:percent)"
    a = [c.source.strip() for c in jupytext.read(nb_path).cells]
    b = [c.source.strip() for c in jupytext.read(py).cells]
    assert a == b, f"{nb_path.name} and {py.name} differ; run: jupytext --sync {nb_path}"


@pytest.mark.parametrize("nb_path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebooks_write_only_through_the_run_folder(nb_path):
    """A notebook names no folder to write into: figures go to paths.figures_dir() and
    measurements to paths.run_data_dir() (or paths.expert_op_dir()), which moespec reproduce
    points at the run folder and which default to runs/scratch/ when a notebook is opened by hand."""
    src = "\n".join("".join(c["source"]) for c in json.loads(nb_path.read_text())["cells"] if c["cell_type"] == "code")
    # paths.committed_figures_dir() may be read (notebook 08 falls back to the committed run's
    # tables); that nothing is written there is checked by every notebook test (repository unchanged)
    for banned in ("paths.data_dir()", "paths.bench_dir()", "paths.traces_dir()",
                   "paths.ROOT", "MOESPEC_", '"figures/', "'figures/"):
        assert banned not in src, f"{nb_path.name} writes through {banned}; use paths.figures_dir() / paths.run_data_dir()"


def test_unknown_parameter_is_an_error():
    if not NOTEBOOKS:
        pytest.skip("no notebooks yet")
    with pytest.raises(runner.UnknownParameterError, match="no_such_parameter"):
        runner.check_parameters(NOTEBOOKS[0], {"no_such_parameter": 1})
