"""Inputs that belong together (issue 54): a run's files checked against each other (hand-made mixed
run folders), options that select nothing refused by name, one writer per output folder (a second,
concurrent writer refused naming the first), and the remaining refusals naming file, field,
expected and found. No notebook runs: every case is a copy of the committed run's files, edited."""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import engine_fixtures as fx
from moespec import advice, cli, fit, paths, sweep
from moespec.advice.errors import AdviceInputError
from moespec.model_shapes import spec_from_config
from moespec.predict import run_file
from moespec.predict.round_model import RoundModels
from moespec.report.run import ReportError, RunFiles
from moespec.validate import InputError, run_identity

COMMITTED = paths.ROOT / "figures"
RUN_ID = "20261207-053012-full"   # the committed run's folder (figures/MANIFEST.json run_dir)


@pytest.fixture
def run(tmp_path):
    """A copy of the committed run's tables and manifest, without its run file."""
    folder = tmp_path / "run"
    shutil.copytree(COMMITTED, folder, ignore=shutil.ignore_patterns("*.png", "moespec_run.json"))
    return folder


def _edit_json(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def _stamp_csv(path: Path, run_id: str, machine: str) -> None:
    df = pd.read_csv(path)
    run_identity.stamp_frame(df, run_identity.RunIdentity(run_id, machine)).to_csv(path, index=False)


def _refused(run, *parts):
    with pytest.raises(run_file.RunFileError) as exc:
        run_file.build_run_file(run)
    message = str(exc.value)
    assert "\n" not in message
    for part in parts:
        assert part in message, (part, message)
    return exc.value


# --- 1. a run is one identity ------------------------------------------------------------------------------
def test_the_committed_run_without_stamps_reads_as_its_manifests_run(run):
    """figures/ predates the stamps: its files are read as the run MANIFEST.json describes, and the
    run file built from them is the committed one, number for number."""
    assert run_file.build_run_file(run) == json.loads((COMMITTED / "moespec_run.json").read_text())
    manifest = run_identity.of_manifest(json.loads((run / "MANIFEST.json").read_text()), run / "MANIFEST.json")
    assert manifest.fields == {"run_id": RUN_ID, "run_machine": "vm"}


def test_a_round_model_file_of_another_run_is_refused(run):
    _edit_json(run / "05_round_model.json", lambda d: d.update(run={"id": "20270101-000000-full", "machine": "vm",
                                                                     "schema": 1}))
    err = _refused(run, "05_round_model.json: field run.id: expected '20261207-053012-full' (the run id of",
                   "MANIFEST.json, the run folder's name (run_dir)); found '20270101-000000-full'", "are of two runs")
    assert err.field == "run_id" and err.found == "20270101-000000-full"


def test_a_table_of_another_machine_is_refused(run):
    _stamp_csv(run / "05_draft_cost_predictions.csv", RUN_ID, "laptop")
    _refused(run, "05_draft_cost_predictions.csv: column 'stamp_machine': expected 'vm'", "found 'laptop'")


def test_a_round_model_of_another_subject_is_refused(run):
    """The issue's case: a round model whose own subject is Qwen3-30B-A3B on vLLM is not labelled
    with the run's subject from notebook 06's tables."""
    _edit_json(run / "05_round_model.json",
               lambda d: [m.update(subject="Qwen3-30B-A3B on vLLM") for m in d["models"]])
    _refused(run, "column 'subject': expected 'Qwen3-30B-A3B on vLLM' (the subject of",
             "05_round_model.json, field models[].subject)", "are of two subjects")


def test_loaded_tables_copied_over_the_quiet_ones_are_refused(run):
    shutil.copy(run / "06_epsilon_loaded.csv", run / "06_epsilon.csv")
    _refused(run, "06_epsilon.csv: column 'state': expected 'quiet' (the machine state the file's name gives it); "
                  "found 'loaded'")
    shutil.copy(COMMITTED / "06_epsilon.csv", run / "06_epsilon.csv")
    shutil.copy(run / "06_curves_loaded.csv", run / "06_curves.csv")   # the report reads the chain's curves
    with pytest.raises(ReportError, match=r"06_curves.csv: column 'state': expected 'quiet' .*found 'loaded'"):
        RunFiles(run).csv("06_curves.csv")
    assert set(RunFiles(run).csv("06_curves_loaded.csv")["state"]) == {"loaded"}


def test_stamped_files_of_two_runs_without_a_manifest_are_refused(run):
    (run / "MANIFEST.json").unlink()
    _stamp_csv(run / "05_draft_cost_predictions.csv", "run-a", "host-1")
    _edit_json(run / "05_round_model.json", lambda d: d.update(run={"id": "run-b", "machine": "host-1", "schema": 1}))
    _refused(run, "column 'stamp_run_id': expected 'run-b' (the run id of", "field run.id); found 'run-a'")


def test_a_fits_table_of_another_run_is_refused_where_the_fits_decide(run):
    """A run of notebooks 01-03 only (an engine dump, gpt-oss): the run file is built from notebook
    03's tables, and one of them written by another run is refused naming it."""
    for f in list(run.glob("0[4-9]_*")):
        f.unlink()
    _stamp_csv(run / "03_fit_coefficients.csv", RUN_ID, "vm")
    _stamp_csv(run / "03_epsilon.csv", "20270101-000000-quick", "vm")
    _refused(run, "03_epsilon.csv: column 'stamp_run_id': expected '20261207-053012-full'", "'20270101-000000-quick'")
    _stamp_csv(run / "03_epsilon.csv", RUN_ID, "vm")
    assert run_file.build_run_file(run, allow_incomplete=True)["expert_op_fits"]


def test_a_file_of_two_runs_and_a_stamp_of_another_version_are_refused(tmp_path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"x": [1, 2], "stamp_run_id": ["a", "b"], "stamp_machine": "h", "stamp_schema": 1}).to_csv(path,
                                                                                                      index=False)
    with pytest.raises(InputError, match=r"t.csv: column 'stamp_run_id': expected one stamp_run_id in the file "
                                         r".*\['a', 'b'\]"):
        run_identity.of_file(path)
    pd.DataFrame({"x": [1], "stamp_run_id": "a", "stamp_machine": "h", "stamp_schema": 7}).to_csv(path, index=False)
    with pytest.raises(InputError, match=r"t.csv: column 'stamp_schema': expected the run stamp of version 1 .*found "
                                         r"'7'"):
        run_identity.of_file(path)


def test_read_bandwidth_and_times_are_range_checked_in_the_files_units(run):
    _edit_json(run / "05_round_model.json", lambda d: d["models"][0].update(read_GBps=-5))
    err = _refused(run, "05_round_model.json: field models[0].read_GBps: expected a read bandwidth > 0 GB/s",
                   "found -5 GB/s")
    assert err.found == -5
    shutil.copy(COMMITTED / "05_round_model.json", run / "05_round_model.json")
    host = {"values_ms": [-1.0] * 9, "lo_ms": [-2.0] * 9, "hi_ms": [0.0] * 9}
    _edit_json(run / "05_round_model.json", lambda d: d["models"][0]["host"].update(host))
    _refused(run, "field models[0]", "host.values_ms[0]: expected a time >= 0 ms; found -1 ms")


def test_a_run_file_copied_from_another_run_is_refused(run, tmp_path):
    run_file.write_run_file(run)
    other = tmp_path / "other"
    shutil.copytree(run, other)
    _edit_json(other / "MANIFEST.json", lambda m: m.update(run_dir="/runs/20270101-000000-full"))
    shutil.copy(run / "moespec_run.json", other / "moespec_run.json")
    with pytest.raises(run_file.RunFileError, match=r"moespec_run.json: field run.id: expected "
                                                    r"'20270101-000000-full' .*found '20261207-053012-full'"):
        run_file.read_run_file(other)
    assert run_file.read_run_file(run).doc["run"]["id"] == RUN_ID
    with pytest.raises(AdviceInputError, match="are of two runs"):   # advise reads it through the same check
        advice.advise(other, [0.7])


def test_a_notebook_reads_only_its_own_runs_round_models(tmp_path, monkeypatch):
    """What notebooks 06 and 07 check before reading notebook 05's round models: the file's stamp is
    the run this process writes for (MOESPEC_RUN_DIR)."""
    models = RoundModels.load(COMMITTED / "05_round_model.json")
    monkeypatch.setenv(paths.RUN_DIR_ENV, str(tmp_path / "run-a"))
    path = models.save(tmp_path / "05_round_model.json", run=run_identity.current().record())
    assert json.loads(path.read_text())["run"]["id"] == "run-a"
    plain = json.loads(models.save(tmp_path / "plain.json").read_text())
    assert {k: v for k, v in json.loads(path.read_text()).items() if k != "run"} == plain   # the stamp adds, only
    run_identity.check_of_this_run([run_identity.of_file(path)])
    monkeypatch.setenv(paths.RUN_DIR_ENV, str(tmp_path / "run-b"))
    with pytest.raises(InputError, match=r"05_round_model.json: field run.id: expected 'run-b' .*found 'run-a'"):
        run_identity.check_of_this_run([run_identity.of_file(path)])
    stamped = run_identity.stamp_frame(pd.DataFrame({"x": [1.5]}))
    assert stamped.columns.tolist() == ["x", *run_identity.COLUMNS] and stamped["stamp_run_id"].item() == "run-b"


# --- 2. every option selects something or is refused ---------------------------------------------------
BANDWIDTH = paths.reference_dir() / "paper1_table1_bandwidth.csv"
TABLE = ["--bandwidth", str(BANDWIDTH), "--engine", "llama.cpp CUDA", "--model", "OLMoE", "--free-draft"]


@pytest.mark.parametrize("argv, status, says", [
    ([str(COMMITTED), "-a", "0.7", "--dense-ratio", "3"], 1, ["--dense-ratio 3: has no effect", "round models"]),
    ([str(COMMITTED), "-a", "0.7", "--context", "d=999"], 1, ["--context 'd=999': expected one of the run's contexts",
                                                              "['chat', 'd=214', 'd=64']"]),
    ([str(COMMITTED), "-a", "0.7", "--state", "busy"], 1, ["--state 'busy': expected one of", "['quiet', 'loaded']"]),
    ([str(COMMITTED), "-a", "0.7", "--run-draft", "x"], 1, ["--run-draft 'x': expected one of the run's drafts"]),
    ([str(COMMITTED), "-a", "1.5"], 1, ["-a/--acceptance 1.5: expected an acceptance rate in [0, 1)"]),
    ([*TABLE, "-a", "0.7", "--allow-incomplete"], 1, ["--allow-incomplete", "no run status"]),
    ([*TABLE, "-a", "0.7", "--eps", "-1"], 1, ["--eps -1.0: expected", "[0, 1)"]),
    ([*TABLE, "-a", "0.7", "--format", "q9"], 1, ["--format 'q9': expected one of the storage formats"]),
    ([str(COMMITTED), "-a", "0.7", "--schema"], 2, ["--schema prints", "RUN, -a would select nothing"]),
    ([str(COMMITTED), "-a", "0.7", "--explain", "--json", "-"], 2, ["--explain prints the derivation",
                                                                    "--json - prints the JSON"]),
])
def test_advise_options_that_select_nothing_are_refused_by_name(argv, status, says, capsys):
    assert cli.main(["advise", *argv]) == status
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err and not out.strip(), err
    for part in says:
        assert part in lines[0], (part, lines[0])


def test_the_default_dense_ratio_given_with_round_models_is_refused_too(capsys):
    """Round models measured the dense bytes: --dense-ratio selects nothing there, its default value
    included; notebook 08 passes it only when its parameter is set."""
    assert cli.main(["advise", str(COMMITTED), "-a", "0.7", "--dense-ratio", "0.5"]) == 1
    assert "--dense-ratio 0.5: has no effect" in capsys.readouterr().err
    with pytest.raises(AdviceInputError, match="--dense-ratio 0.5: has no effect"):
        advice.advise(COMMITTED, [0.7], dense_ratio=0.5)


@pytest.mark.parametrize("kwargs, says", [
    (dict(executor="slurm", workers=3), "--workers 3: sizes the LocalCluster this sweep starts; it has no effect with "
                                        "--executor slurm"),
    (dict(scheduler="tcp://127.0.0.1:8786", workers=3), "--workers 3: .* no effect with --scheduler"),
    (dict(executor_options={"slurm_partition": "gpu"}), r"--executor-option \['slurm_partition'\]: .* --executor dask"),
    (dict(insecure=True), "--insecure allows a plain tcp:// --scheduler .* without --scheduler it has no effect"),
])
def test_sweep_options_that_select_nothing_are_refused(kwargs, says, tmp_path):
    with pytest.raises(sweep.SweepError, match=says):
        sweep.run_sweep({"jobs": [{"notebook": "04"}]}, out=tmp_path / "s", progress=False, **kwargs)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize("extra, says", [
    (["--format", "bf16"], "format (--format) 'bf16': gives the expert bytes w_l from the model config; it has no "
                           "effect without a config"),
    (["--format", "bf16", "--expert-bytes", "10", "--config", str(fx.FIXTURES / "config_small.json")],
     "no effect beside expert_bytes (--expert-bytes)"),
    (["--format", "q9", "--config", str(fx.FIXTURES / "config_small.json")], "format (--format) 'q9': expected one of"),
])
def test_import_routing_format_that_selects_nothing_is_refused(extra, says, tmp_path, capsys):
    out = tmp_path / "t.npz"
    assert cli.main(["import-routing", str(fx.FIXTURES / "vllm_full.jsonl"), "--engine", "vllm", "--num-experts", "16",
                     "--out", str(out), *extra]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and not out.exists()


# --- 4. one writer per output folder ----------------------------------------------------------------------
def _holder(folder: Path) -> subprocess.Popen:
    """Another process holding ``folder`` as moespec's commands do, until its stdin closes."""
    code = (f"import sys\nfrom pathlib import Path\nfrom moespec import runner\n"
            f"with runner.hold_folder(Path({str(folder)!r})):\n    print('held', flush=True)\n    sys.stdin.read()")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=paths.ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_import_into_a_held_folder_is_refused(tmp_path, capsys):
    out = tmp_path / "traces" / "t.npz"
    holder = _holder(out.parent)
    argv = ["import-routing", str(fx.FIXTURES / "vllm_full.jsonl"), "--engine", "vllm", "--num-experts", "16",
            "--out", str(out)]
    try:
        assert cli.main(argv) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"traces is held by a live run (pid {holder.pid} on " in err
        assert not out.exists()
    finally:
        holder.communicate("", timeout=30)
    assert cli.main(argv) == 0 and out.is_file()   # the holder gone, the import runs


def test_a_second_report_into_a_held_folder_is_refused(run, tmp_path, capsys):
    doc = tmp_path / "docs" / "page.md"
    doc.parent.mkdir()
    doc.write_text("# page\n")
    holder = _holder(doc.parent)
    try:
        assert cli.main(["report", str(run), "--files", str(doc)]) == 1
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"docs is held by a live run (pid {holder.pid} on " in err
    finally:
        holder.communicate("", timeout=30)
    assert cli.main(["report", str(run), "--files", str(doc)]) == 0


# --- 5. the remaining refusals name file, field, expected and found -----------------------------------------
def _rows(**change) -> pd.DataFrame:
    n = np.repeat([2, 3, 4, 5, 6, 7], 2)
    U = np.array([3, 3, 4, 5, 5, 6, 6, 7, 7, 8, 9, 9])   # distinct experts between m = 2 and n m, not collinear with n
    rows = pd.DataFrame({"model": "m", "kind": "chosen", "kernel": ["slot", "dedup"] * 6, "layer": 0, "n": n,
                         "m": 2, "U": U, "expert_bytes": 10.0, "t_median_s": 1e-4 * (1 + U + 0.3 * n)})
    for column, (i, value) in change.items():
        rows[column] = rows[column].astype(float)
        rows.loc[i, column] = value
    return rows


@pytest.mark.parametrize("change, says", [
    (dict(n=(4, 2.5)), "row 4, column 'n': expected a whole number >= 1 (a count); found 2.5"),
    (dict(layer=(1, 0.7)), "row 1, column 'layer': expected a whole number >= 0 (a layer index); found 0.7"),
])
def test_fit_layers_refuses_fractional_pass_sizes_and_layers(change, says):
    assert len(fit.fit_layers(_rows())) == 2
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        fit.fit_layers(_rows(**change))


@pytest.mark.parametrize("field, change", [
    ("models[0].draft.term.values_ms[1]: expected a number; found 'abc'",
     lambda m: m["draft"]["term"]["values_ms"].__setitem__(1, "abc")),
    ("models[0].draft.a_ms_per_token: expected a number or null; found 'abc'",
     lambda m: m["draft"].update(a_ms_per_token="abc")),
    ("models[0].verify.slot.runs[0]: expected an integer; found 2.5",
     lambda m: m["verify"]["slot"]["runs"].__setitem__(0, 2.5)),
])
def test_round_model_values_that_are_not_numbers_are_named(run, field, change):
    _edit_json(run / "05_round_model.json", lambda d: change(d["models"][0]))
    _refused(run, f"05_round_model.json: field {field}")


def test_a_round_model_file_without_models_is_refused(run):
    _edit_json(run / "05_round_model.json", lambda d: d.update(models=[]))
    _refused(run, "05_round_model.json: field models: expected a list of at least 1 round model; found []")
    with pytest.raises(ValueError, match=r"05_round_model.json: field models: expected a list of at least 1"):
        RoundModels.load(run / "05_round_model.json")   # what notebooks 06 and 07 read


def test_a_config_value_that_is_not_a_number_is_named(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**fx.SMALL_CONFIG, "n_routed_experts": "lots"}))
    with pytest.raises(ValueError, match=r"config.json: field n_routed_experts: expected a whole number; found 'lots'"):
        spec_from_config(path)
    path.write_text(json.dumps({**fx.SMALL_CONFIG, "num_hidden_layers": 2.5}))
    with pytest.raises(ValueError, match=r"field num_hidden_layers: expected a whole number; found 2.5"):
        spec_from_config(path)


def test_acceptance_counts_without_a_rejection_name_the_table_and_counts(tmp_path):
    path = tmp_path / "acc.csv"
    path.write_text("accepted,rejections\n40,0\n12,0\n")
    with pytest.raises(AdviceInputError, match=r"acc.csv: group 'acc.csv', column 'rejections': expected at least one "
                                               r"rejection .*found 52 accepted and 0 rejections"):
        advice.advise(COMMITTED, acceptance_table=path)


def test_a_tab_separated_table_is_named_as_such(tmp_path):
    path = tmp_path / "table1.tsv"
    path.write_text(BANDWIDTH.read_text().replace(",", "\t"))
    with pytest.raises(AdviceInputError, match=r"table1.tsv: header: expected comma-separated columns \(a CSV table\); "
                                               r"found one column holding tab characters"):
        advice.advise(bandwidth=path, engine="llama.cpp CUDA", model="OLMoE", acceptance=[0.7], free_draft=True)
