"""The papermill runner behind ``moespec reproduce``: order, parameters, failures, manifest; every
run writing only inside its own run folder (figures included); the run folder held against a
second live run; honest interrupts (SIGINT/SIGTERM); clear errors for a bad ``--out``."""

from __future__ import annotations

import ast
import json
import re
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import nbformat
import pytest

from conftest import repository_snapshot
from moespec import cli, paths, runner


def _notebook(path, params_src: str, *body_src: str):
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell(params_src)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params] + [nbformat.v4.new_code_cell(src) for src in body_src]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))
    return path


#: a notebook body that writes what a real one writes: a figure and a row of data
WRITES = ('from moespec import io, paths\n'
          'io.write_text(paths.figures_dir() / "01_figure.txt", f"profile {profile}")\n'
          'io.write_text(paths.run_data_dir() / "bench" / "rows.csv", "n,t\\n1,2\\n")\n'
          'print("figures", paths.figures_dir())')


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_RUNS", str(tmp_path / "runs"))
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "02_second.ipynb", 'profile = "full"\ndevice = "cpu"', 'print("second", profile)')
    _notebook(nbs / "01_first.ipynb", 'profile = "full"\ndevice = "cpu"\nseed = 3\nwidth = 2',
              'print("first", profile, width * 10)', WRITES)
    return nbs


def _printed(executed: Path) -> str:
    nb = json.loads(executed.read_text())
    return "".join("".join(o.get("text", "")) for c in nb["cells"] for o in c.get("outputs", []))


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
    assert data["profile"] == "quick" and data["status"] == "complete" and "hardware" in data and "versions" in data
    assert "first quick 70" in _printed(tmp_path / "run" / "01_first.ipynb")


def test_manifest_records_the_parameters_the_notebook_ran_with(folder, tmp_path):
    """Read back from what papermill injected into the executed notebook, not from the request."""
    manifest = json.loads(runner.reproduce(profile=None, out=tmp_path / "run", extra={"profile": "quick"},
                                           progress=False, notebooks_folder=folder).read_text())
    executed = json.loads((tmp_path / "run" / "01_first.ipynb").read_text())
    injected = executed["metadata"]["papermill"]["parameters"]
    assert injected == {"profile": "quick"}
    assert manifest["profile"] == "quick"
    assert manifest["notebooks"][0]["parameters"] == {"profile": "quick", "device": "cpu", "seed": 3, "width": 2}
    assert "first quick 20" in _printed(tmp_path / "run" / "01_first.ipynb")


def test_a_parameter_given_twice_differently_is_refused(folder, tmp_path):
    with pytest.raises(runner.NotebookError, match=r"profile given twice with different values: --profile quick "
                                                   r"and -p profile='full'"):
        runner.reproduce("quick", out=tmp_path / "run", extra={"profile": "full"}, progress=False,
                         notebooks_folder=folder)
    with pytest.raises(runner.NotebookError, match=r"device given twice"):
        runner.reproduce("quick", out=tmp_path / "run", device="cuda", extra={"device": "cpu"}, progress=False,
                         notebooks_folder=folder)
    assert not (tmp_path / "run").exists()                       # refused before anything ran
    with pytest.raises(runner.NotebookError, match=r"parameter 'width' given twice with different values: 1 and 2"):
        runner.parse_assignments(["width=1", "width=2"])
    assert runner.parse_assignments(["width=1", "width=1"]) == {"width": 1}


def test_cli_refuses_conflicting_profile(folder, tmp_path, monkeypatch, capsys):
    """(Before, this ran every notebook with the full profile under a manifest saying quick.)"""
    monkeypatch.setattr(paths, "notebooks_dir", lambda: folder)
    assert cli.main(["reproduce", "--profile", "quick", "-p", "profile=full", "--no-progress",
                     "--out", str(tmp_path / "run")]) == 1
    assert "profile given twice with different values" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


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


def test_failing_cell_names_notebook_and_cell(tmp_path):
    nbs = tmp_path / "nbs"
    nbs.mkdir()
    _notebook(nbs / "01_broken.ipynb", 'profile = "full"\ndevice = "cpu"', 'raise ValueError("bad trace file")')
    _notebook(nbs / "02_after.ipynb", 'profile = "full"\ndevice = "cpu"', 'print(1)')
    with pytest.raises(runner.NotebookError, match=r"01_broken.ipynb failed in cell 2 .*ValueError: bad trace file"):
        runner.reproduce("quick", out=tmp_path / "run", progress=False, notebooks_folder=nbs)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["failed"] == "01_broken" and manifest["status"] == "failed"
    assert not (tmp_path / "run" / "02_after.ipynb").exists()


def test_parse_assignments():
    assert runner.parse_assignments(["a=1", "b=x", "c=[1, 2]", "d='s'"]) == {"a": 1, "b": "x", "c": [1, 2], "d": "s"}
    with pytest.raises(runner.NotebookError):
        runner.parse_assignments(["novalue"])


# --- where a run writes ----------------------------------------------------------------------------
def test_every_run_writes_only_inside_its_run_folder(folder, tmp_path):
    """Figures and data of a quick run land in its own folder (default runs/<time>-quick, or --out);
    the committed figures/ and the repository's data/ and runs/ are untouched. Two runs started in
    the same second get two folders."""
    before = repository_snapshot()
    first = runner.reproduce("quick", progress=False, notebooks_folder=folder).parent
    second = runner.reproduce("quick", progress=False, notebooks_folder=folder).parent
    out = runner.reproduce("quick", out=tmp_path / "mine", progress=False, notebooks_folder=folder).parent
    assert first != second and first.parent == second.parent == tmp_path / "runs"
    for run in (first, second, out):
        assert (run / "figures" / "01_figure.txt").read_text() == "profile quick"
        assert (run / "data" / "bench" / "rows.csv").is_file()
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["figures_dir"] == str(run / "figures") and manifest["data_dir"] == str(run / "data")
        assert f"figures {run / 'figures'}" in _printed(run / "01_first.ipynb")
    assert repository_snapshot() == before


def test_a_notebook_run_by_hand_writes_to_the_scratch_folder(folder, tmp_path, monkeypatch):
    """Opened in JupyterLab or run by papermill directly (no MOESPEC_RUN_DIR), a notebook writes
    into runs/scratch/, never into the committed figures/."""
    import papermill as pm

    monkeypatch.delenv(paths.RUN_DIR_ENV)
    assert paths.figures_dir() == tmp_path / "runs" / "scratch" / "figures"
    assert paths.figures_dir() != paths.committed_figures_dir()
    before = repository_snapshot()
    pm.execute_notebook(str(folder / "01_first.ipynb"), str(tmp_path / "by-hand.ipynb"), progress_bar=False,
                        kernel_name="python3")
    assert (tmp_path / "runs" / "scratch" / "figures" / "01_figure.txt").read_text() == "profile full"
    assert (tmp_path / "runs" / "scratch" / "data" / "bench" / "rows.csv").is_file()
    assert repository_snapshot() == before


def test_publishing_run_refreshes_the_committed_figures(folder, tmp_path, monkeypatch):
    """Only the publishing run (make reproduce) writes outside its folder: measurements into data/,
    its figures into figures/ (a file it did not produce is removed, README.md stays) with its
    manifest as MANIFEST.json. It is refused for anything but the full run of every notebook."""
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "README.md").write_text("about")
    (committed / "99_stale.png").write_text("old")
    monkeypatch.setattr(paths, "committed_figures_dir", lambda: committed)
    monkeypatch.setenv("MOESPEC_DATA", str(tmp_path / "data"))
    manifest = runner.reproduce(out=tmp_path / "run", progress=False, notebooks_folder=folder, publish=True)
    assert (committed / "01_figure.txt").read_text() == "profile full"
    assert not (committed / "99_stale.png").exists() and (committed / "README.md").read_text() == "about"
    assert json.loads((committed / "MANIFEST.json").read_text()) == json.loads(manifest.read_text())
    assert (tmp_path / "data" / "bench" / "rows.csv").is_file() and not (tmp_path / "run" / "data").exists()
    assert (tmp_path / "run" / "figures" / "01_figure.txt").is_file()       # the run folder keeps its own copy
    for kwargs in (dict(profile="quick"), dict(only=["01"]), dict(extra={"width": 3}), dict(device="cpu")):
        with pytest.raises(runner.NotebookError, match="--publish refreshes the committed figures/"):
            runner.reproduce(out=tmp_path / "run2", progress=False, notebooks_folder=folder, publish=True, **kwargs)


def test_a_folder_held_by_a_live_run_is_refused(folder, tmp_path):
    """A second run into a folder a live run holds is refused, naming the folder and the holder;
    once the holder is gone (even killed), the folder is free again."""
    held = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from moespec import runner
        with runner.hold_folder({str(held)!r}):
            print("held", flush=True)
            time.sleep(120)
    """)], stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(paths.ROOT)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(runner.RunFolderBusy, match=rf"--out {held} is held by a live run \(pid {holder.pid} "):
            runner.reproduce("quick", out=held, progress=False, notebooks_folder=folder)
        assert not (held / "01_first.ipynb").exists()
    finally:
        holder.kill()
        holder.wait()
    runner.reproduce("quick", out=held, progress=False, notebooks_folder=folder)   # a dead holder holds nothing
    with runner.hold_folder(held):                                                 # nor does a finished run
        with pytest.raises(runner.RunFolderBusy, match=f"pid {os.getpid()}"):
            runner.reproduce("quick", out=held, progress=False, notebooks_folder=folder)


@pytest.mark.parametrize("bad,message", [
    ("a file", r"--out {}: exists and is not a folder"),
    ("/proc/moespec-run", r"--out /proc/moespec-run: cannot create or write the run folder"),
])
def test_a_bad_out_is_a_clear_error_before_anything_runs(folder, tmp_path, bad, message, capsys, monkeypatch):
    out = tmp_path / "file.txt" if bad == "a file" else Path(bad)
    if bad == "a file":
        out.write_text("not a folder")
    with pytest.raises(runner.NotebookError, match=message.format(out)):
        runner.reproduce("quick", out=out, progress=False, notebooks_folder=folder)
    monkeypatch.setattr(paths, "notebooks_dir", lambda: folder)
    assert cli.main(["reproduce", "--profile", "quick", "--out", str(out), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("moespec reproduce: --out") and "Traceback" not in err and err.count("\n") == 1


# --- interrupts ------------------------------------------------------------------------------------
INTERRUPT_SCRIPT = """
import sys
from pathlib import Path
from moespec import cli, paths
paths.notebooks_dir = lambda: Path(sys.argv[1])
sys.exit(cli.main(["reproduce", "--profile", "quick", "--out", sys.argv[2], "--no-progress"]))
"""


@pytest.mark.parametrize("sig,status", [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"])
def test_an_interrupted_run_says_so_everywhere(tmp_path, sig, status):
    """SIGINT (Ctrl-C) or SIGTERM in the middle of a cell: one line on stderr, exit status 128 +
    signal, a manifest with status interrupted naming the notebook and cell, the partial notebook
    marked interrupted (metadata, cell statuses, a banner), and the kernel shut down."""
    nbs, out, started = tmp_path / "nbs", tmp_path / "run", tmp_path / "kernel.pid"
    nbs.mkdir()
    _notebook(nbs / "01_slow.ipynb", 'profile = "full"\ndevice = "cpu"', 'import os, time',
              f'# the long cell\nopen({str(started)!r}, "w").write(str(os.getpid()))\ntime.sleep(120)',
              'print("never")')
    _notebook(nbs / "02_next.ipynb", 'profile = "full"\ndevice = "cpu"', 'print("never")')
    proc = subprocess.Popen([sys.executable, "-c", INTERRUPT_SCRIPT, str(nbs), str(out)], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(paths.ROOT)})
    deadline = time.monotonic() + 120
    while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.3)                                   # the cell that wrote the file sleeps now
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == status, stderr
    lines = [line for line in stderr.splitlines() if line.startswith("moespec")]
    name = signal.Signals(sig).name
    assert lines == [f"moespec reproduce: interrupted by {name} in 01_slow, cell 3 ('# the long cell'); "
                     f"manifest {out / 'manifest.json'} (status: interrupted)"]
    assert "Traceback" not in stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "interrupted" and manifest["notebooks"] == []
    assert manifest["interrupted"] == {"signal": name, "notebook": "01_slow", "cell": "cell 3 ('# the long cell')",
                                       "output": str(out / "01_slow.ipynb")}
    nb = json.loads((out / "01_slow.ipynb").read_text())
    assert nb["metadata"]["papermill"]["exception"] is True
    assert nb["metadata"]["moespec"]["status"] == "interrupted" and nb["metadata"]["moespec"]["signal"] == name
    assert "interrupted by" in "".join(nb["cells"][0]["source"])           # the banner
    statuses = {"".join(c["source"])[:15]: c["metadata"]["papermill"]["status"] for c in nb["cells"][1:]}
    assert statuses["# the long cell"] == "interrupted" and statuses['print("never")'] == "pending"
    assert statuses["import os, time"] == "completed"
    assert not (out / "02_next.ipynb").exists()
    kernel = int(started.read_text())
    for _ in range(50):                               # the kernel does not outlive the run
        try:
            os.kill(kernel, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(kernel, signal.SIGKILL)
        pytest.fail(f"the notebook's kernel (pid {kernel}) outlived the interrupted run")


def test_progress_names_the_notebook_and_its_cell(folder, tmp_path, capsys):
    """With progress on, a run says which notebook it is in and which of its cells it executes."""
    runner.reproduce("quick", out=tmp_path / "run", progress=True, notebooks_folder=folder)
    err = capsys.readouterr().err
    assert "moespec reproduce (quick)" in err
    # papermill's cell bar per notebook: 01_first holds 4 cells with the injected parameters, 02_second 3
    assert "01_first:" in err and "/4 [" in err and "02_second:" in err and "/3 [" in err and "cell/s" in err


def test_a_relative_out_is_the_callers_folder(folder, tmp_path, monkeypatch):
    """``--out runs/x`` names a folder under the caller's working directory; the notebook kernels
    run in the notebooks' folder, so the run folder they are told must be absolute (a relative one
    put the figures and data under notebooks/runs/x)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    manifest = runner.reproduce("quick", out=Path("runs/rel"), progress=False, notebooks_folder=folder)
    assert manifest == work / "runs" / "rel" / "manifest.json"
    assert (work / "runs" / "rel" / "figures" / "01_figure.txt").read_text() == "profile quick"
    assert (work / "runs" / "rel" / "data" / "bench" / "rows.csv").exists()
    assert not (folder / "runs").exists()


def test_notebooks_command_lists_every_parameter_with_its_type(capsys):
    """``moespec notebooks``: every parameter the notebooks' ``parameters`` cells declare (papermill
    must parse each line, comments included), with its type and default, and the typed keys of the
    subject and sizes dicts."""
    from moespec import cli

    assert cli.main(["notebooks"]) == 0
    out = capsys.readouterr().out
    blocks = dict(re.findall(r"^(\d\d_\w+)\n((?:  .*\n)+)", out, re.M))
    assert sorted(blocks) == [nb.stem for nb in runner.discover()]
    for nb in runner.discover():
        source = nb.with_suffix(".py").read_text()
        cell = source.split('# %% tags=["parameters"]\n', 1)[1].split("\n# %%", 1)[0]
        assigned = [n.targets[0].id for n in ast.parse(cell).body if isinstance(n, ast.Assign)]
        assert re.findall(r"^  (\w+): ", blocks[nb.stem], re.M) == assigned, nb.stem
    assert "  draft_fit: a text = ''" in blocks["08_advise"]
    assert re.search(r"  subject: a dict = \{\}.*\n      keys: model \(a text\)", blocks["05_whole_model"])
    assert re.search(r"  sizes: a dict = \{\}.*\n      keys: depths \(a list of integers or None\)", blocks["05_whole_model"])
    assert "  subject: a dict" in blocks["07_ssp_oracle"] and "  model:" not in blocks["07_ssp_oracle"]
