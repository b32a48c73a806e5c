"""Bad input refused at the boundary (issue 25): at least one case per entry point and per
invariant, each checking the error type and that the message names the file (or option) and the
field. Categories: tables (CSV), counts, byte shares, bands, traces and their model, run status,
notebook parameters, sweep grids and schedulers, output paths, published tables, atomic writes,
and the command line (one line per refusal, never a raw traceback)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moespec import advice, cli, paths, provenance, runner, sweep
from moespec.predict import run_file
from moespec.advice.errors import AdviceInputError
from moespec.report.run import ReportError, RunFiles
from moespec.routing import RoutingTrace
from moespec import paper_reference as t1
from moespec.tables.bandwidth import PAPER_LABEL
from moespec.validate import InputError, invariants, jsonfile, parameters, reference, runs
from moespec.validate.outputs import private_folder, writable_file, writable_folder
from moespec.validate.tables import Column, read_csv
from test_advise import _fake_expert_op_run
from test_runner import _notebook

COMMITTED = paths.ROOT / "figures"
PUBLISHED = paths.reference_dir() / "paper1_table1_bandwidth.csv"


def names(exc_info, *parts):
    """The refusal's message names every one of ``parts`` (file, row, field, found value)."""
    message = str(exc_info.value)
    for part in parts:
        assert str(part) in message, f"{part!r} not in {message!r}"
    return message


# --- tables: the generic typed reader ---------------------------------------------------------------
@pytest.mark.parametrize("content, says", [
    (b"", "the file is empty (0 bytes)"),
    (b"accepted,rejections\n", "a header but 0 row(s)"),
    (b"\x1f\x8b\x08\x00junk", "gzip-compressed data"),
    (b"\xff\xfea,b\n", "not UTF-8 text (byte 0xff at offset 0)"),
    (b'a,b\n"1,2\n', "not a readable CSV table"),
    (b"x,y\n1,2\n", "missing column(s) ['accepted', 'rejections']"),
])
def test_unreadable_tables_name_the_file(tmp_path, content, says):
    path = tmp_path / "t.csv"
    path.write_bytes(content)
    with pytest.raises(InputError) as exc:
        read_csv(path, [Column("accepted", "count"), Column("rejections", "count")])
    names(exc, path, says)


def test_typed_columns_name_row_column_expected_and_found(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("n,x,k\n1,0.5,3\n2,abc,4\n3,inf,2.5\n")
    with pytest.raises(InputError) as exc:
        read_csv(path, [Column("n", "int", low=1), Column("x"), Column("k", "count")])
    names(exc, path, "row 2 (line 3)", "column 'x'", "expected a finite number", "found 'abc'", "1 more such row")
    assert exc.value.field == "row 2 (line 3), column 'x'" and exc.value.found == "abc"
    path.write_text("n,k\n1,3\n2,2.5\n")
    with pytest.raises(InputError) as exc:
        read_csv(path, [Column("n", "int", low=1), Column("k", "count")])
    names(exc, "row 2 (line 3)", "column 'k'", "non-negative integer count", "2.5")
    path.write_text("n,k\n1,3\n2,7\n")
    df = read_csv(path, [Column("n", "int", low=1), Column("k", "count")])
    assert df["k"].dtype == np.int64 and df["k"].tolist() == [3, 7]


# --- counts: an acceptance table's counts are used and labelled as they are --------------------------
@pytest.mark.parametrize("rows, cell", [("-100,-1", "-100"), ("10.5,3.2", "10.5"), ("3,-1", "-1")])
def test_acceptance_counts_must_be_non_negative_integers(tmp_path, rows, cell):
    path = tmp_path / "acc.csv"
    path.write_text(f"accepted,rejections\n{rows}\n")
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(COMMITTED, acceptance_table=path)
    names(exc, path, "row 1 (line 2)", "non-negative integer count", cell)


def test_acceptance_counts_are_used_and_labelled_as_they_are(tmp_path):
    path = tmp_path / "acc.csv"
    path.write_text("accepted,rejections,label\n5,1,chat\n2,2,chat\n9,1,code\n")
    assert advice.acceptance_from_table(path) == [(7 / 10, "chat: pooled MLE, 7 accepted, 3 rejections"),
                                                  (9 / 10, "code: pooled MLE, 9 accepted, 1 rejections")]
    path.write_text("accepted,rejections,label\n5,1,\n")
    with pytest.raises(AdviceInputError) as exc:
        advice.acceptance_from_table(path)
    names(exc, path, "column 'label'", "non-empty text")
    path.write_text("accepted,rejections\n0,0\n")
    with pytest.raises(AdviceInputError) as exc:
        advice.acceptance_from_table(path)
    names(exc, path, "accepted", "found 0 accepted and 0 rejections")
    path.write_text("a\n0.5\n1.5\n")
    with pytest.raises(AdviceInputError) as exc:
        advice.acceptance_from_table(path)
    names(exc, path, "row 2 (line 3)", "column 'a'", "< 1", "1.5")


# --- byte shares: 1/n <= ubar(n) <= 1, ubar(1) = 1 ----------------------------------------------------
def _per_n_table(path, ubar):
    pd.DataFrame({"model": "olmoe", "n": np.arange(1, 10), "beta_slot_GBps": 20.0, "beta_dedup_GBps": 10.0,
                  "ubar": ubar, "expert_bytes": 1000.0}).to_csv(path, index=False)
    return path


@pytest.mark.parametrize("ubar, row, expected", [
    (np.full(9, 0.1), "row 1 (line 2)", "ubar(1) = 1"),                          # the table
    (np.r_[1.0, 0.9, 0.2, np.full(6, 0.5)], "row 3 (line 4)", "1/n <= ubar(n) <= 1 at n = 3"),   # 0.2 < 1/3
    (np.r_[1.0, 1.2, np.full(7, 0.5)], "row 2 (line 3)", "1/n <= ubar(n) <= 1 at n = 2"),
])
def test_byte_share_outside_its_range_is_refused(tmp_path, ubar, row, expected):
    path = _per_n_table(tmp_path / "bw.csv", ubar)
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(bandwidth=path, eps=0.05, acceptance=[0.5])
    names(exc, path, row, "column 'ubar'", expected)


def test_byte_share_of_a_table1_row_and_of_notebook_03(tmp_path):
    pub = pd.read_csv(PUBLISHED, dtype={"reread_cost": str}, keep_default_na=False)
    pub.loc[2, "n8_ubar"] = 0.1   # below 1/8
    pub.to_csv(tmp_path / "t1.csv", index=False)
    with pytest.raises(InputError) as exc:
        t1.read_table1(tmp_path / "t1.csv")
    names(exc, "t1.csv", "row 3 (line 4)", "column 'n8_ubar'", "at n = 8", "0.1")
    run = _fake_expert_op_run(tmp_path / "run", build=False)
    bw = pd.read_csv(run / "03_bandwidth_all_models.csv")
    bw.loc[0, "ubar"] = 0.9
    bw.to_csv(run / "03_bandwidth_all_models.csv", index=False)
    with pytest.raises(run_file.RunFileError) as exc:     # refused where the run file is built
        run_file.write_run_file(run)
    names(exc, "03_bandwidth_all_models.csv", "row 1 (line 2)", "ubar(1) = 1", "0.9")
    doc = run_file.build_run_file(_fake_expert_op_run(tmp_path / "ok", build=False))
    doc["expert_op_fits"]["bandwidth"][0]["ubar"] = 0.9   # and where a run file made by hand is read
    (tmp_path / "hand.json").write_text(json.dumps(doc))
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(tmp_path / "hand.json", [0.5], free_draft=True)
    names(exc, "hand.json", "expert_op_fits.bandwidth", "ubar(1) = 1", "0.9")
    assert invariants.check_byte_share(1 / np.arange(1, 10), "x").tolist() == (1 / np.arange(1, 10)).tolist()


# --- a trace must fit the model it is used with ----------------------------------------------------------
def _small_trace(path):
    ids = np.tile(np.array([0, 1]), (20, 1, 1))    # 1 layer, m = 2, N = 4
    return RoutingTrace([ids], num_experts=4).save(path)


def test_a_trace_of_another_model_is_refused(tmp_path):
    trace = _small_trace(tmp_path / "small.npz")
    run = _fake_expert_op_run(tmp_path / "run")
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(run, [0.5], trace=trace)
    names(exc, trace, "ids (layers, L)", "meta.num_experts (N)", "L = 16 MoE layers, N = 64 experts, m = 8",
          "found L = 1 MoE layers, N = 4 experts, m = 2")
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(bandwidth=PUBLISHED, engine="llama.cpp CUDA", model="OLMoE", trace=trace, acceptance=[0.7])
    names(exc, trace, "OLMoE", "N = 4 experts")


# --- trace files: every member checked ------------------------------------------------------------------
def _rewrite(src, dst, member, data):
    with zipfile.ZipFile(src) as z:
        members = {n: z.read(n) for n in z.namelist()}
    members[member] = data
    with zipfile.ZipFile(dst, "w") as z:
        for n, b in members.items():
            z.writestr(n, b)
    return dst


def _npy(array):
    import io

    buf = io.BytesIO()
    np.save(buf, array)
    return buf.getvalue()


@pytest.mark.parametrize("member, data, field, says", [
    ("ids.npy", b"garbage", "field 'ids'", "expected a numpy array (.npy member)"),
    ("expert_bytes.npy", _npy(np.array(["x"])), "field 'expert_bytes'", "expected an array of numbers"),
    ("meta.npy", _npy(np.array([json.dumps({"format": "moespec-routing-trace", "version": 1, "num_experts": 4,
                                            "doc_ids": ["0"], "meta": [1]})])), "field meta", "an object or null"),
    ("meta.npy", _npy(np.array([json.dumps({"format": "moespec-routing-trace", "version": 1, "num_experts": 4,
                                            "doc_ids": ["0"], "model": 5})])), "field model", "a string or null"),
])
def test_bad_trace_members_name_the_file_and_field(tmp_path, member, data, field, says):
    bad = _rewrite(_small_trace(tmp_path / "t.npz"), tmp_path / "bad.npz", member, data)
    with pytest.raises(ValueError) as exc:
        RoutingTrace.load(bad)
    names(exc, bad, field, says)


# --- run status --------------------------------------------------------------------------------------------
def _run_with_manifest(tmp_path, manifest, lock: dict | None = None):
    run = _fake_expert_op_run(tmp_path / "run", build=False)
    (run / "manifest.json").write_text(json.dumps(manifest))
    if lock is not None:
        (run / runs.LOCK_NAME).write_text(json.dumps(lock))
    return run


@pytest.mark.parametrize("manifest, says", [
    ({"status": "failed", "failed": "03_fits", "notebooks": [{"name": "02_expert_op_benchmark"}]},
     "status 'failed' in notebook 03_fits; notebooks finished: 02_expert_op_benchmark"),
    ({"status": "interrupted", "interrupted": {"notebook": "03_fits", "cell": "cell 5"}},
     "status 'interrupted' in notebook 03_fits"),
    ({"failed": "03_fits"}, "status 'failed' in notebook 03_fits"),        # manifests before 'status'
])
def test_unfinished_runs_are_refused_naming_status_and_notebook(tmp_path, manifest, says):
    run = _run_with_manifest(tmp_path, manifest)
    with pytest.raises(run_file.RunFileError) as exc:
        run_file.write_run_file(run)
    names(exc, run / "manifest.json", "field status", says, "--allow-incomplete")
    run_file.write_run_file(run, allow_incomplete=True)   # the file says so, and advise refuses it
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(run, [0.5], free_draft=True)
    names(exc, run / run_file.RUN_FILE, "field run.status", says, "--allow-incomplete")


def test_a_stale_running_manifest_is_reported_as_such(tmp_path):
    run = _run_with_manifest(tmp_path, {"status": "running", "current": "03_fits", "notebooks": []},
                             lock={"pid": 4242, "host": "elsewhere"})   # the lock file is there but not held
    with pytest.raises(run_file.RunFileError) as exc:
        run_file.write_run_file(run)
    names(exc, "status 'running' in notebook 03_fits", "(pid 4242 on host elsewhere) is gone", "stale manifest")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (run / runs.LOCK_NAME).unlink()   # no lock file: the manifest's own pid and host tell
    (run / "manifest.json").write_text(json.dumps({"status": "running", "pid": dead.pid, "host": socket.gethostname()}))
    assert runs.run_status(run).stale is True


def test_a_live_run_is_refused_and_its_own_notebooks_may_read_it(tmp_path, monkeypatch):
    run = _fake_expert_op_run(tmp_path / "run", build=False)
    with runner.hold_folder(run):
        (run / "manifest.json").write_text(json.dumps({"status": "running", "current": "08_advise"}))
        with pytest.raises(run_file.RunFileError) as exc:
            run_file.write_run_file(run)
        names(exc, "status 'running' in notebook 08_advise, still running (pid")
        monkeypatch.setenv(paths.RUN_DIR_ENV, str(run))   # notebook 08 of that very run
        run_file.write_run_file(run)
        assert advice.advise(run, [0.5], free_draft=True)["subject"]["source"] == "this run"


def test_allow_incomplete_says_which_notebooks_tables_it_used(tmp_path):
    run = _run_with_manifest(tmp_path, {"status": "failed", "failed": "06_predictions",
                                        "notebooks": [{"name": "03_fits", "wall_s": 1.0}]})
    run_file.write_run_file(run, allow_incomplete=True)
    adv = advice.advise(run, [0.5], allow_incomplete=True, free_draft=True)
    assert adv["subject"]["source"] == "this run (an unfinished run: failed)"
    assert adv["assumptions"][0].startswith("the run did not finish (status 'failed' in notebook 06_predictions")
    assert "tables of notebook 03_fits (03_fit_coefficients.csv, 03_epsilon.csv, 03_bandwidth_all_models.csv; " \
           "finished)" in adv["assumptions"][0]
    assert "unfinished run" in advice.format_text(adv) and "--allow-incomplete" in advice.format_explain(adv)


@pytest.mark.parametrize("content, says", [
    ("[1, 2]", "field (top level): expected an object; found [1, 2]"),
    ('{"status": ', "not valid JSON (line 1, column 12"),
    ('{"status": "done"}', "field status: expected one of"),
    ('{"status": "complete", "notebooks": ["x"]}', "field notebooks[0]: expected an object"),
])
def test_malformed_manifests_name_the_field(tmp_path, content, says):
    run = _fake_expert_op_run(tmp_path / "run", build=False)
    (run / "manifest.json").write_text(content)
    with pytest.raises(run_file.RunFileError) as exc:
        run_file.write_run_file(run)
    names(exc, run / "manifest.json", says)
    with pytest.raises(ReportError) as exc:
        RunFiles(run)
    names(exc, run / "manifest.json", says)


def test_report_refuses_an_unfinished_run_unless_allowed(tmp_path):
    run = tmp_path / "figs"
    run.mkdir()
    (run / "MANIFEST.json").write_text(json.dumps({"status": "failed", "failed": "06_predictions", "publish": True,
                                                   "started": "2026-12-02T10:00:00", "notebooks": [{"name": "05_whole_model"}]}))
    with pytest.raises(ReportError) as exc:
        RunFiles(run)
    names(exc, run / "MANIFEST.json", "field status", "06_predictions", "moespec report")
    from moespec.report import render_text

    text = render_text("<!-- moespec-report:run-identity -->\n<!-- /moespec-report:run-identity -->\n",
                       RunFiles(run, allow_incomplete=True))
    assert ("The unfinished `make reproduce` (status 'failed' in notebook 06_predictions; notebooks finished: "
            "05_whole_model) run of 2026-12-02 10:00 UTC") in text


# --- notebook parameters -----------------------------------------------------------------------------------
@pytest.mark.parametrize("extra, says", [
    ({"seed": "abc"}, "parameter 'seed': expected an integer; found 'abc' (str)"),
    ({"kmax": -3}, "parameter 'kmax': expected >= 1; found -3"),
    ({"eps_override": 0.7}, "parameter 'eps_override': expected >= 0 and < 0.5; found 0.7"),
    ({"bandwidth_csv": "no/such.csv"}, "parameter 'bandwidth_csv': expected an existing file or folder"),
    ({"device": "tpu"}, "parameter 'device': expected 'cpu', 'cuda' or 'cuda:<index>'; found 'tpu'"),
])
def test_reproduce_refuses_bad_parameters_before_anything_runs(tmp_path, extra, says):
    out = tmp_path / "run"
    with pytest.raises(runner.ParameterError) as exc:
        runner.reproduce(profile="quick", only=["04"], out=out, extra=extra, progress=False)
    names(exc, "04_theory.ipynb", says)
    assert not out.exists()


@pytest.mark.parametrize("notebook, extra, says", [
    ("08", {"acceptance": [0.5, 1.2]}, "parameter 'acceptance[1]': expected >= 0 and < 1; found 1.2"),
    ("08", {"acceptance": []}, "parameter 'acceptance': expected a non-empty list; found []"),
    ("05", {"sizes": {"depths": "abc"}}, "parameter 'sizes.depths': expected a list of integers or None; found 'abc'"),
    ("05", {"sizes": {"real_prompts": 0}}, "parameter 'sizes.real_prompts': expected >= 1; found 0"),
    ("05", {"sizes": {"draft_calibration": "before"}}, "parameter 'sizes': expected a key of the sizes of the "
     "notebook's profiles (moespec.notebook_profiles.DEFAULTS): ['a_values', "),
    ("05", {"subject": {"draft_cost": -0.1}}, "parameter 'subject.draft_cost': expected >= 0; found -0.1"),
    ("05", {"subject": {"layers": "4"}}, "parameter 'subject.layers': expected an integer; found '4' (str)"),
    ("05", {"subject": {"modle": "default"}}, "parameter 'subject': expected a key of the fields of "
     "moespec.notebook_profiles.SubjectSpec: ['draft', 'draft_cost', 'dtype', 'fmt', 'layers', 'layout', 'like', "
     "'model', 'trace_file']; found key 'modle'"),
    ("06", {"subject": "default"}, "parameter 'subject': expected a dict; found 'default' (str)"),
    ("05", {"threads": 0}, "parameter 'threads': expected >= 1; found 0"),
    ("00", {"retrain": 1}, "parameter 'retrain': expected True or False; found 1 (int)"),
    ("03", {"transfer_models": "qwen3"}, "parameter 'transfer_models': expected a list of texts; found 'qwen3'"),
])
def test_parameter_types_come_from_the_defaults(notebook, extra, says):
    nb = runner.select(runner.discover(), [notebook])[0]
    with pytest.raises(runner.ParameterError) as exc:
        runner.check_parameters(nb, extra)
    names(exc, nb.name, says)


def test_every_notebook_default_passes_its_own_rules():
    from moespec.notebook_profiles import DEFAULTS, SubjectSpec

    declared_anywhere = set()
    for nb in runner.discover():
        declared = runner.declared_parameters(nb)
        declared_anywhere |= set(declared)
        assert parameters.check_values(nb, declared, declared) == declared
        for table in DEFAULTS.get(nb.stem[:2], {}).values():
            parameters.check_values(nb, {k: v for k, v in table.items() if k in declared}, declared)
            if "sizes" in declared:                     # the sizes dict takes every profile value
                declared_anywhere |= set(table)
                assert parameters.check_values(nb, {"sizes": table}, declared) == {"sizes": table}
        if "subject" in declared:
            declared_anywhere |= set(SubjectSpec.types())
            assert parameters.check_values(nb, {"subject": SubjectSpec().args()}, declared) == {
                "subject": SubjectSpec().args()}
    assert not set(parameters.RULES) - declared_anywhere, "rules for parameters no notebook declares"


def test_relative_paths_resolve_against_the_users_folder(tmp_path, monkeypatch):
    nbs = tmp_path / "notebooks"
    nbs.mkdir()
    _notebook(nbs / "01_w.ipynb", 'profile = "full"\nout_dir = ""',
              'from pathlib import Path\nPath(out_dir).mkdir(parents=True, exist_ok=True)\n'
              '(Path(out_dir) / "x.txt").write_text("x")')
    user = tmp_path / "user"
    user.mkdir()
    monkeypatch.chdir(user)
    manifest = runner.reproduce("quick", out=tmp_path / "run", extra={"out_dir": "rel"}, progress=False,
                                notebooks_folder=nbs)
    assert (user / "rel" / "x.txt").read_text() == "x" and not (nbs / "rel").exists()
    data = json.loads(manifest.read_text())
    assert data["notebooks"][0]["parameters"]["out_dir"] == str(user / "rel")
    # what a stale manifest is told by: the process, the host, the notebooks planned and the one running
    assert (data["pid"], data["host"], data["planned"], data["current"]) == (os.getpid(), socket.gethostname(),
                                                                           ["01_w"], None)


# --- sweep grids and schedulers ------------------------------------------------------------------------------
@pytest.mark.parametrize("grid, says", [
    ({"jobs": [{"notebook": []}]}, "field jobs[0].notebook: expected a list of at least 1 item(s); found []"),
    ({"parameters": {"profile": "turbo"}, "jobs": [{"notebook": "04"}]},
     "jobs[0] (the grid): 04_theory.ipynb: parameter 'profile': expected one of ['quick', 'full']; found 'turbo'"),
    ({"jobs": [{"notebook": "04", "grid": {"kmax": 3}}]}, "field jobs[0].grid.kmax: expected a list; found 3"),
    ({"jobs": [{"notebook": 4}]}, "field jobs[0].notebook: expected a string"),
])
def test_sweep_grids_are_checked_before_anything_runs(grid, says):
    with pytest.raises(sweep.SweepError) as exc:
        sweep.expand(grid, where="g.toml")
    names(exc, "g.toml", says)


def test_sweep_paths_resolve_against_the_grid_file_and_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "grids").mkdir()
    (tmp_path / "grids" / "t1.csv").write_text("x")
    (tmp_path / "cwd").mkdir()
    (tmp_path / "cwd" / "e.csv").write_text("x")
    monkeypatch.chdir(tmp_path / "cwd")
    [job] = sweep.expand({"jobs": [{"notebook": "04", "parameters": {"bandwidth_csv": "t1.csv"}}]},
                         base=tmp_path / "grids", overrides={"epsilon_csv": "e.csv"})
    assert job.parameters == {"bandwidth_csv": str(tmp_path / "grids" / "t1.csv"),
                              "epsilon_csv": str(tmp_path / "cwd" / "e.csv")}
    with pytest.raises(sweep.SweepError) as exc:
        sweep.expand({"jobs": [{"notebook": "04"}]}, overrides={"seed": "abc"})
    names(exc, "(-p)", "parameter 'seed'", "'abc'")


def test_plain_schedulers_off_this_machine_are_refused(tmp_path):
    import dask

    with pytest.raises(sweep.SweepError) as exc:
        sweep.scheduler_security("tcp://10.1.2.3:8786")
    names(exc, "--scheduler tcp://10.1.2.3:8786", "plain tcp:// connection to 10.1.2.3", "--insecure")
    assert exc.value.field == "scheme"
    for local in ("tcp://127.0.0.1:8786", "localhost:8786", "tcp://[::1]:8786"):
        assert sweep.scheduler_security(local) is None
    assert sweep.scheduler_security("tcp://10.1.2.3:8786", insecure=True) is None
    with pytest.raises(sweep.SweepError) as exc:
        sweep.scheduler_security("tls://10.1.2.3:8786")
    names(exc, "--scheduler tls://10.1.2.3:8786", "distributed.comm.tls.ca-file", "distributed.comm.tls.client.cert")
    with dask.config.set({"distributed.comm.tls.ca-file": "/c/ca.pem", "distributed.comm.tls.client.cert": "/c/me.pem",
                          "distributed.comm.tls.client.key": "/c/me.key"}):
        security = sweep.scheduler_security("tls://10.1.2.3:8786")
    assert (security.require_encryption, security.tls_ca_file, security.tls_client_key) == (True, "/c/ca.pem", "/c/me.key")
    with pytest.raises(sweep.SweepError):   # run_sweep checks it before anything else
        sweep.run_sweep({"jobs": [{"notebook": "04"}]}, out=tmp_path / "s", scheduler="tcp://10.1.2.3:8786")
    assert not (tmp_path / "s").exists()


def test_submitit_pickles_need_a_folder_only_the_user_can_write(tmp_path):
    shared = tmp_path / "sweep" / "submitit"
    shared.mkdir(parents=True)
    shared.chmod(0o777)
    with pytest.raises(sweep.SweepError) as exc:
        sweep._run_submitit([], "local", tmp_path / "sweep", {}, bar=None)
    names(exc, shared, "only this user can write", "drwxrwxrwx")
    fresh = private_folder(tmp_path / "new" / "submitit")
    assert fresh.stat().st_mode & 0o777 == 0o700


# --- output paths, checked before the work -----------------------------------------------------------------
def test_output_paths_are_checked_before_the_work(tmp_path):
    afile = tmp_path / "f.txt"
    afile.write_text("x")
    with pytest.raises(InputError) as exc:
        writable_file(tmp_path, "--json")
    names(exc, "--json", tmp_path, "expected a file name; found a folder")
    with pytest.raises(InputError) as exc:
        writable_file(afile / "x.json", "--json")
    names(exc, afile, "is a file, not a folder")
    with pytest.raises(InputError) as exc:
        writable_folder(afile, "--out")
    names(exc, "--out", afile, "expected a folder; found a file")
    assert writable_file(tmp_path / "new" / "deeper" / "a.json") == tmp_path / "new" / "deeper" / "a.json"
    assert not (tmp_path / "new").exists()   # nothing is created by the check


def test_advise_prints_its_answer_even_when_the_json_cannot_be_written(tmp_path, monkeypatch, capsys):
    def full_disk(result, path):
        raise OSError(28, "No space left on device", str(path))

    monkeypatch.setattr(advice, "write_json", full_disk)
    assert cli.main(["advise", str(COMMITTED), "-a", "0.7", "--json", str(tmp_path / "a.json")]) == 1
    out, err = capsys.readouterr()
    assert "Kernel switch: per-slot kernel for passes of up to" in out
    assert err.strip() == f"moespec advise: the advice above was not written to {tmp_path / 'a.json'}: " \
                          f"{tmp_path / 'a.json'}: No space left on device"


# --- published tables, by content ---------------------------------------------------------------------------
def test_digests_record_the_reference_files_as_they_are():
    assert reference.recorded() == reference.record(), "run python -m moespec.validate.reference"


def test_a_copied_table_stays_published_and_an_edited_one_does_not(tmp_path, monkeypatch):
    copy = tmp_path / "elsewhere" / "renamed.csv"
    copy.parent.mkdir()
    shutil.copy(PUBLISHED, copy)
    assert (t1.read_table1(copy)["source"] == PAPER_LABEL).all()
    adv = advice.advise(bandwidth=copy, engine="llama.cpp CUDA", model="OLMoE", acceptance=[0.7], free_draft=True)
    assert adv["subject"]["source"] == PAPER_LABEL and adv["error"]["eps"] == 0.054
    resaved = pd.read_csv(copy)            # re-saved by pandas, rows reordered: same content, same label
    resaved.iloc[::-1].to_csv(copy, index=False)
    assert (t1.read_table1(copy)["source"] == PAPER_LABEL).all()
    edited = pd.read_csv(PUBLISHED)
    edited.loc[0, "n2_beta_slot_GBps"] = 700
    edited.to_csv(copy, index=False)
    assert t1.read_table1(copy)["source"].tolist()[:2] == ["ours (renamed.csv)", PAPER_LABEL]
    edited.insert(0, "source", PAPER_LABEL)   # an edited row that still claims the paper's label
    edited.to_csv(copy, index=False)
    with pytest.raises(InputError) as exc:
        t1.read_table1(copy)
    names(exc, copy, "row 1 (line 2)", "column 'source'", "digests.json", "--source")
    assert (t1.read_table1(copy, source="my edit")["source"] == "my edit").all()
    monkeypatch.chdir(tmp_path)            # the label does not depend on the working directory either
    shutil.copy(PUBLISHED, "here.csv")
    assert (t1.read_table1("here.csv")["source"] == PAPER_LABEL).all()


# --- atomic writes -----------------------------------------------------------------------------------------
def test_model_folder_replace_keeps_a_complete_build_at_every_step(tmp_path, monkeypatch):
    from moespec.zoo import store

    def builds():
        folder, tmp = tmp_path / "moe", tmp_path / "moe.tmp"
        for p, text in ((folder, "old"), (tmp, "new")):
            p.mkdir(exist_ok=True)
            (p / "w").write_text(text)
        return folder, tmp

    folder, tmp = builds()
    store._replace_folder(tmp, folder)                      # one atomic exchange (renameat2)
    assert (folder / "w").read_text() == "new" and not tmp.exists()
    folder, tmp = builds()
    monkeypatch.setattr(store.shutil, "rmtree", lambda p: (_ for _ in ()).throw(OSError("crash")))
    with pytest.raises(OSError):                             # a crash before the old build is deleted
        store._replace_folder(tmp, folder)
    assert (folder / "w").read_text() == "new" and (tmp / "w").read_text() == "old"
    monkeypatch.undo()
    shutil.rmtree(tmp)
    folder, tmp = builds()
    monkeypatch.setattr(store, "_exchange", lambda a, b: False)   # no renameat2: rename aside, then in
    real_rename = Path.rename

    def failing_second_rename(self, target):
        if self == tmp:
            raise OSError("crash while renaming the new build in")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", failing_second_rename)
    with pytest.raises(OSError, match="crash while renaming"):
        store._replace_folder(tmp, folder)
    assert (folder / "w").read_text() == "old"              # the old build is back in place
    monkeypatch.setattr(Path, "rename", real_rename)
    store._replace_folder(tmp, folder)
    assert (folder / "w").read_text() == "new" and not list(tmp_path.glob("moe.old-*"))


def test_a_model_and_its_tokenizer_are_one_atomic_folder(tmp_path):
    from moespec.zoo import store

    class Fake:
        hf_quantizer = None

        def save_pretrained(self, path, safe_serialization=True):
            Path(path).mkdir(parents=True, exist_ok=True)
            (Path(path) / "model.safetensors").write_text("w")

    class Tok:
        def save_pretrained(self, path):
            (Path(path) / "tokenizer.json").write_text("t")

    folder = store.save(Fake(), tmp_path / "smollm2", {"label": "x"}, tokenizer=Tok())
    assert sorted(p.name for p in folder.iterdir()) == ["model.safetensors", "moespec.json", "tokenizer.json"]


def test_neuron_cluster_cache_is_written_atomically(tmp_path, monkeypatch):
    from moespec.routing.neurons import NeuronClusters

    path = tmp_path / "clusters.npz"
    NeuronClusters(np.zeros((1, 8), int), 4, 2, 10).save(path)
    before = path.read_bytes()

    def crash(fh, **arrays):
        fh.write(b"partial")
        raise OSError("disk full")

    monkeypatch.setattr(np, "savez_compressed", crash)
    with pytest.raises(OSError):
        NeuronClusters(np.ones((1, 8), int), 4, 2, 10).save(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["clusters.npz"]


def test_provenance_reads_git_without_taking_the_index_lock(tmp_path):
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    for cmd in (["init", "-q"], ["add", "f"], ["commit", "-qm", "x"]):
        if cmd[0] == "add":
            (tmp_path / "f").write_text("a")
        subprocess.run(["git", *cmd], cwd=tmp_path, env=env, check=True)
    index = tmp_path / ".git" / "index"
    os.utime(index, (1_000_000_000, 1_000_000_000))   # the index older than the file: git would refresh it
    before = index.stat()
    assert not provenance.git_commit(tmp_path).endswith("-dirty")
    after = index.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


# --- the command line: one line per refusal, never a raw traceback ------------------------------------------
@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty.csv").write_bytes(b"")
    (tmp_path / "acc.csv").write_text("accepted,rejections\n-100,-1\n")
    (tmp_path / "g.toml").write_text('[[jobs]]\nnotebook = []\n')
    (tmp_path / "list.json").write_text("[1]")
    _small_trace(tmp_path / "small.npz")
    _fake_expert_op_run(tmp_path / "fits")
    return tmp_path


@pytest.mark.parametrize("argv, names_in_line", [
    (["advise", "{d}", "--acceptance-table", "{d}/empty.csv", "--json", "-"], ["empty.csv", "0 bytes"]),
    (["advise", str(COMMITTED), "--acceptance-table", "{d}/acc.csv"], ["acc.csv", "column 'accepted'"]),
    (["advise", str(COMMITTED), "-a", "0.7", "--json", "{d}"], ["--json", "found a folder"]),
    (["advise", "{d}/fits", "-a", "0.7", "--free-draft", "--trace", "{d}/small.npz"], ["small.npz", "N = 4"]),
    (["advise", str(COMMITTED), "-a", "0.7", "--trace", "{d}/small.npz"], ["--trace", "notebook 03's fits"]),
    (["advise", "{d}", "-a", "0.7"], ["no run file moespec_run.json", "moespec run-file"]),
    (["run-file", "{d}"], ["05_round_model.json", "03_fit_coefficients.csv"]),
    (["advise", str(COMMITTED), "-a", "0.7", "--dense-ratio", "-1"], ["--dense-ratio", "-1"]),
    (["advise", "--bandwidth", "{d}/list.json", "--model", "olmoe", "-a", "0.7"], ["list.json", "missing column"]),
    (["sweep", "{d}/g.toml", "--out", "{d}/s"], ["g.toml", "jobs[0].notebook"]),
    (["sweep", "{d}/nothere.toml"], ["nothere.toml", "no such grid file"]),
    (["reproduce", "--only", "04", "-p", "seed=abc", "--out", "{d}/r"], ["04_theory.ipynb", "'seed'"]),
    (["reproduce", "--only", "04", "--out", "{d}/acc.csv"], ["--out", "acc.csv"]),
    (["report", "{d}", "--check"], ["no manifest.json or MANIFEST.json"]),
    (["report", str(COMMITTED), "--files", "{d}/none.md"], ["--files", "none.md"]),
    (["import-routing", "{d}/none.jsonl", "--engine", "vllm", "--out", "{d}"], ["--out", "found a folder"]),
    (["build-models", "--out", "{d}/acc.csv"], ["--out", "acc.csv", "found a file"]),
])
def test_cli_refusals_are_one_line_naming_the_file(bad_files, capsys, argv, names_in_line):
    argv = [a.format(d=bad_files) for a in argv]
    assert cli.main(argv) == 1
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"moespec {argv[0]}: "), err
    assert "Traceback" not in err and not out.strip()
    for part in names_in_line:
        assert part in lines[0], (part, lines[0])


def test_a_bug_inside_moespec_says_so(monkeypatch, capsys):
    def broken(*a, **k):
        raise RuntimeError("an internal inconsistency")

    monkeypatch.setattr(advice, "advise", broken)
    assert cli.main(["advise", str(COMMITTED), "-a", "0.7", "--json", "-"]) == 70
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: an internal inconsistency" in err
    assert err.strip().splitlines()[-1].startswith("moespec advise: the error above is a bug in moespec")


def test_the_same_command_from_another_folder_gives_the_same_answer(tmp_path):
    """A copy of the published table, advised on from another working directory, in a fresh process."""
    shutil.copy(PUBLISHED, tmp_path / "t.csv")
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    argv = [sys.executable, "-m", "moespec.cli", "advise", "--bandwidth", "t.csv", "--engine", "llama.cpp CUDA",
            "--model", "OLMoE", "-a", "0.7", "--free-draft", "--json", "-"]
    there = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert there.returncode == 0, there.stderr
    here = advice.advise(bandwidth=PUBLISHED, engine="llama.cpp CUDA", model="OLMoE", acceptance=[0.7], free_draft=True)
    got = json.loads(there.stdout)
    assert got["subject"]["source"] == PAPER_LABEL
    assert got["acceptance"] == json.loads(json.dumps(here["acceptance"]))
