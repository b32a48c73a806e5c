"""``moespec sweep``: grids of papermill jobs on a Dask LocalCluster (two workers) and through
submitit's local executor, with quick-profile notebooks: one folder and manifest per job,
finished jobs skipped on a rerun, a failing job reported with its notebook and cell while the
others finish, tables merged per notebook output."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

import engine_fixtures as fx
from moespec import sweep
from moespec.cli import main as cli_main
from moespec.routing import import_jsonl, reuse
from test_runner import _notebook  # the runner tests' stand-in notebooks


@pytest.fixture
def folder(tmp_path):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "01_a.ipynb", 'profile = "full"\nwidth = 2\nout_dir = ""', "print(width)")
    _notebook(nbs / "02_b.ipynb", 'profile = "full"\nseed = 0', "print(seed)")
    return nbs


# --- grids (no notebook runs) -------------------------------------------------------------------
def test_expand_cartesian_product_and_ids(folder):
    grid = {"parameters": {"profile": "quick"},
            "jobs": [{"notebook": "01", "grid": {"width": [1, 2, 3]}},
                     {"notebook": ["01", "02"], "parameters": {}},
                     {"notebook": "02_b", "grid": {"seed": [0, 1]}}]}
    jobs = sweep.expand(grid, folder, overrides={"seed": 5})
    got = [(j.name, j.parameters) for j in jobs]
    assert got == [("01_a", {"profile": "quick", "width": 1}), ("01_a", {"profile": "quick", "width": 2}),
                   ("01_a", {"profile": "quick", "width": 3}), ("01_a", {"profile": "quick"}),
                   ("02_b", {"profile": "quick", "seed": 5})]  # the override wins; repeats dropped
    assert len({j.id for j in jobs}) == 5 and jobs[0].id.startswith("01_a-")
    assert sweep.Job(jobs[0].notebook, dict(jobs[0].parameters)).id == jobs[0].id  # stable


@pytest.mark.parametrize("grid, message", [
    ({"jobs": [{"notebook": "01", "parameters": {"depth": 3}}]}, r"01_a.ipynb does not declare parameter\(s\) \['depth'\]"),
    ({"jobs": [{"notebook": "07"}]}, r"jobs\[0\]: --only names no notebook: \['07'\]"),
    ({"jobs": [{"notebook": "01", "grid": {"width": []}}]}, r"field jobs\[0\]\.grid\.width: expected a list of at least 1 item"),
    ({"jobs": [{"notebook": "02"}], "parameters": {"width": 1}}, r"no notebook of the grid declares \['width'\]"),
    ({"jobs": []}, r"field jobs: expected a list of at least 1 item"),
    ({"jobs": [{"notebook": "01", "params": {}}]}, r"field jobs\[0\]\.params: expected only the fields \['grid', 'notebook', 'parameters'\]; found an unknown field"),
    ({"job": []}, r"field (job: expected only the fields|jobs: expected the field)"),
    ({"jobs": [{"notebook": []}]}, r"field jobs\[0\]\.notebook: .*found \[\]"),
    ({"parameters": {"profile": "turbo"}, "jobs": [{"notebook": "01"}]}, r"jobs\[0\] \(the grid\): 01_a.ipynb: parameter 'profile': expected one of \['quick', 'full'\]; found 'turbo'"),
])
def test_bad_grids_name_the_problem(folder, grid, message):
    with pytest.raises(sweep.SweepError, match=message):
        sweep.expand(grid, folder)


def test_grid_files(tmp_path, folder):
    toml = tmp_path / "g.toml"
    toml.write_text('[parameters]\nprofile = "quick"\n\n[[jobs]]\nnotebook = "02"\ngrid = { seed = [1, 2] }\n')
    assert [j.parameters["seed"] for j in sweep.expand(sweep.read_grid(toml), folder)] == [1, 2]
    js = tmp_path / "g.json"
    js.write_text(json.dumps({"jobs": [{"notebook": "01"}]}))
    assert sweep.read_grid(js) == {"jobs": [{"notebook": "01"}]}
    (tmp_path / "bad.toml").write_text("[[jobs]\n")
    with pytest.raises(sweep.SweepError, match=r"bad.toml: unreadable grid"):
        sweep.read_grid(tmp_path / "bad.toml")
    with pytest.raises(sweep.SweepError, match="a grid is a .toml or .json file"):
        (tmp_path / "g.yaml").write_text("x")
        sweep.read_grid(tmp_path / "g.yaml")
    with pytest.raises(sweep.SweepError, match="no such grid file"):
        sweep.read_grid(tmp_path / "none.toml")
    with pytest.raises(sweep.SweepError, match="--scheduler .* needs --executor dask"):
        sweep.run_sweep(js, out=tmp_path / "s", executor="submitit-local", scheduler="tcp://x:1",
                        notebooks_folder=folder, progress=False)


# --- real quick-profile notebooks ---------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.notebook
def test_dask_local_cluster_two_workers(tmp_path, monkeypatch):
    """Notebook 04 (quick) at two kmax, and one job whose Table-1 file lacks its columns: that one
    is reported with its notebook and cell, the others finish; a rerun skips them. (A Table-1 file
    that does not exist is refused before any job runs.)"""
    monkeypatch.setenv("MOESPEC_RUN_DIR", str(tmp_path / "not-here"))  # jobs write in their own folders
    missing = {"jobs": [{"notebook": "04", "parameters": {"bandwidth_csv": str(tmp_path / "missing.csv")}}]}
    with pytest.raises(sweep.SweepError, match=r"parameter 'bandwidth_csv': expected an existing file"):
        sweep.run_sweep(missing, out=tmp_path / "sweep", executor="dask", workers=2, progress=False)
    assert not (tmp_path / "sweep").exists()
    (tmp_path / "broken.csv").write_text("engine,model\nx,OLMoE\n")
    grid = {"parameters": {"profile": "quick"},
            "jobs": [{"notebook": "04", "grid": {"kmax": [3, 4]}},
                     {"notebook": "04", "parameters": {"bandwidth_csv": str(tmp_path / "broken.csv")}}]}
    result = sweep.run_sweep(grid, out=tmp_path / "sweep", executor="dask", workers=2, progress=False)
    assert [j["status"] for j in result.jobs] == ["finished", "finished", "failed"]
    failed = result.failed[0]
    assert "04_theory.ipynb failed in cell" in failed["error"] and "broken.csv: missing column(s)" in failed["error"]
    assert not (tmp_path / "not-here").exists()
    per_job = []
    for job in result.jobs[:2]:
        folder = tmp_path / "sweep" / "jobs" / job["job"]
        manifest = json.loads((folder / "manifest.json").read_text())
        assert manifest["status"] == "finished" and manifest["parameters"]["kmax"] in (3, 4)
        assert manifest["effective_parameters"]["device"] == "cpu" and "hardware" in manifest
        assert (folder / "04_theory.ipynb").is_file()
        per_job.append(pd.read_csv(folder / "figures" / "04_step_points.csv"))
    merged = pd.read_csv(tmp_path / "sweep" / "tables" / "04_step_points.csv")
    assert sorted(merged["param_kmax"].unique().tolist()) == [3, 4]
    assert len(merged) == sum(len(df) for df in per_job)
    k4 = merged[merged["param_kmax"] == 4].reset_index(drop=True)
    np.testing.assert_allclose(k4["a_4"].to_numpy(), per_job[1]["a_4"].to_numpy())
    assert k4["a_1"].notna().all() and merged[merged["param_kmax"] == 3]["a_4"].isna().all()
    summary = json.loads((tmp_path / "sweep" / "sweep.json").read_text())
    assert [j["label"] for j in summary["jobs"]][:2] == ["kmax=3", "kmax=4"]

    started = {j["job"]: j["started"] for j in result.jobs[:2]}
    again = sweep.run_sweep(grid, out=tmp_path / "sweep", executor="dask", workers=2, progress=False)
    assert [j["status"] for j in again.jobs] == ["skipped", "skipped", "failed"]
    for job in again.jobs[:2]:
        manifest = json.loads((tmp_path / "sweep" / "jobs" / job["job"] / "manifest.json").read_text())
        assert manifest["started"] == started[job["job"]]  # not run again
    assert len(pd.read_csv(tmp_path / "sweep" / "tables" / "04_step_points.csv")) == len(merged)


@pytest.mark.slow
@pytest.mark.notebook
def test_submitit_local_executor_on_an_imported_trace(tmp_path, capsys):
    """The README's chain on the fixtures: a vLLM dump imported, then notebook 01 (quick) on the
    imported trace and notebook 04 (quick), as submitit local jobs through the CLI."""
    trace_path = tmp_path / "olmoe_vllm.npz"
    trace = import_jsonl(fx.FIXTURES / "vllm_olmoe.jsonl", "vllm", config=fx.FIXTURES / "config_olmoe.json",
                         source="stand-in routing (fixture)")
    trace.save(trace_path)
    grid = tmp_path / "grid.toml"
    grid.write_text('[parameters]\nprofile = "quick"\n\n'
                    '[[jobs]]\nnotebook = "01"\nparameters = { model = "none", load_recorded = false }\n\n'
                    '[[jobs]]\nnotebook = "04"\nparameters = { kmax = 3 }\n')
    rc = cli_main(["sweep", str(grid), "--executor", "submitit-local", "--out", str(tmp_path / "sweep"),
                   "-p", f"trace_file={trace_path}", "--executor-option", "timeout_min=10", "--no-progress"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    assert "2 of 2 jobs done" in out.out
    table = pd.read_csv(tmp_path / "sweep" / "tables" / "01_table_reuse.csv")
    row = table[table["source"] == "stand-in routing (fixture)"].iloc[0]
    assert row["param_trace_file"] == str(trace_path) and row["tokens"] == trace.num_tokens
    np.testing.assert_allclose(row["rho_hat_2"], np.nanmean(reuse(trace, 9)[:, 1]), rtol=1e-9)
    assert (tmp_path / "sweep" / "tables" / "04_step_points.csv").is_file()
    assert list((tmp_path / "sweep" / "submitit").glob("*_log.out"))  # the jobs ran through submitit


# --- one writer per sweep folder --------------------------------------------------------------------------
def test_a_second_sweep_into_a_held_folder_is_refused(tmp_path, folder, monkeypatch, capsys):
    """Two sweeps into one --out at once (two threads; the executor stands in for Dask and waits):
    the first runs its job, the second is refused naming the first, and nothing of it runs."""
    import threading

    from moespec import runner

    started, release, ran = threading.Event(), threading.Event(), []

    def fake_dask(records, scheduler, workers, bar, security=None):
        ran.append([r["id"] for r in records])
        started.set()
        assert release.wait(30)
        return [{"job": r["id"], "notebook": "01_a", "parameters": r["parameters"], "status": "failed",
                 "error": "stand-in"} for r in records]

    monkeypatch.setattr(sweep, "_run_dask", fake_dask)
    grid = {"jobs": [{"notebook": "01", "parameters": {"profile": "quick"}}]}
    out = tmp_path / "sweep"
    first = threading.Thread(target=lambda: sweep.run_sweep(grid, out=out, notebooks_folder=folder, progress=False))
    first.start()
    try:
        assert started.wait(30)
        with pytest.raises(runner.RunFolderBusy, match=r"sweep folder --out .*sweep is held by a live run \(pid "
                                                       rf"{__import__('os').getpid()} on "):
            sweep.run_sweep(grid, out=out, notebooks_folder=folder, progress=False)
    finally:
        release.set()
        first.join(30)
    assert len(ran) == 1 and (out / "sweep.json").is_file()
    # released: the next sweep into the folder runs
    release.set()
    assert sweep.run_sweep(grid, out=out, notebooks_folder=folder, progress=False, force=True).jobs
    assert len(ran) == 2


def test_cli_sweep_refuses_a_folder_another_process_holds(tmp_path, folder, capsys):
    import subprocess
    import sys

    out = tmp_path / "sweep"
    code = (f"import sys\nfrom pathlib import Path\nfrom moespec import runner\n"
            f"with runner.hold_folder(Path({str(out)!r})):\n    print('held', flush=True)\n    sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        grid = tmp_path / "g.json"
        grid.write_text(json.dumps({"jobs": [{"notebook": "01", "parameters": {"profile": "quick"}}]}))
        assert cli_main(["sweep", str(grid), "--out", str(out), "--no-progress"]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"is held by a live run (pid {holder.pid} on " in err
    finally:
        holder.communicate("", timeout=30)
