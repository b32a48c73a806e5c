"""Your own model, end to end: small random-weight checkpoints of every supported family
(moespec.zoo.checkpoints, built with transformers from tiny configs), their shape read from their
config.json, their routing recorded and timed at their shape, the README's "Your own model" commands
through notebooks 01, 02, 03, 05 and 08 and advise on one family, the same from an engine's routing
dump and the model's config.json, and every mismatch between a trace and a model refused by name
before a notebook starts."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moespec import advice, paths, progress, runner
from moespec.measure import expert_op
from moespec.model_shapes import get_spec
from moespec.routing import RoutingTrace, synthetic
from moespec.studies.whole_model import work_units
from moespec.zoo import checkpoints, sources
from conftest import notebook_text

pytestmark = pytest.mark.usefixtures("one_thread")
ENGINES = paths.ROOT / "tests" / "data" / "engines"
ENV = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
#: family -> (N, m, MoE layers, H, I, shared experts) of moespec.zoo.checkpoints' configs
SHAPES = {"olmoe": (16, 4, 4, 128, 64, 0), "qwen3_moe": (16, 4, 3, 128, 64, 0), "mixtral": (16, 4, 4, 128, 64, 0),
          "deepseek_v2": (16, 4, 3, 128, 64, 1), "gpt_oss": (16, 4, 4, 128, 64, 0)}


def _cli(cwd, *args, timeout=600):
    """``moespec ARGS`` run in ``cwd`` (advise writes advice.json where it runs: never the repository)."""
    return subprocess.run([sys.executable, "-m", "moespec.cli", *map(str, args)], capture_output=True, text=True,
                          env=ENV, timeout=timeout, cwd=cwd)


@pytest.mark.parametrize("family", sorted(checkpoints.FAMILIES))
def test_each_family_shape_routing_and_benchmark(family, tmp_path):
    """A checkpoint folder of each family: its shape from its config.json (the routed experts, the
    MoE layers, a shared expert), its routing recorded on WikiText with its own tokenizer at that
    shape, the quick benchmark timing that routing's windows at the shape (random weights, said
    so), and a trace of another shape refused by name."""
    folder = checkpoints.random_checkpoint(family, tmp_path / f"tiny-{family}")
    spec = get_spec(str(folder))
    assert (spec.num_experts, spec.top_k, spec.num_moe_layers, spec.hidden_size, spec.expert_intermediate,
            spec.num_shared_experts) == SHAPES[family]
    assert spec.name == f"tiny-{family}" and spec.source == str(folder / "config.json")
    trace = sources.record_checkpoint(str(folder), articles=2, max_tokens=24, progress=False)
    assert (trace.num_layers, trace.num_experts, trace.top_k) == (spec.num_moe_layers, 16, 4)
    assert trace.source == f"recorded: tiny-{family} on WikiText test"
    config = expert_op.profile_config("quick", str(folder), "f32", "torch", "cpu", 0)
    assert "random weights in f32 at this shape" in expert_op.describe_shape(config)
    rows = expert_op.load_rows(expert_op.run(config, out_dir=tmp_path / "bench", trace=trace, progress=False))
    windows = rows[rows["kind"] == "window"]
    assert set(windows["n"]) == set(range(1, 10)) and set(rows["N"]) == {16} and set(rows["m"]) == {4}
    assert expert_op.shape_columns(config) == {"N": 16, "m": 4, "L": spec.num_moe_layers}
    other = synthetic.uniform(1, 20, spec.num_moe_layers + 1, 16, 4, seed=0)
    with pytest.raises(ValueError, match=rf"expected the shape of tiny-{family}-shrunk \(L = {spec.num_moe_layers} "
                                         rf"MoE layers.*found L = {spec.num_moe_layers + 1}"):
        expert_op.run(config, out_dir=tmp_path / "bench", trace=other, progress=False)


def test_a_bad_model_or_a_trace_of_another_shape_is_refused_before_the_notebook_starts(tmp_path):
    nb = paths.notebooks_dir()
    four = synthetic.uniform(1, 20, 4, 64, 8, seed=0)
    four.save(tmp_path / "four.npz")
    (tmp_path / "empty").mkdir()
    (tmp_path / "gpt").mkdir()
    (tmp_path / "gpt" / "config.json").write_text('{"model_type": "gpt_oss"}')
    cases = [("02_expert_op_benchmark", {"model": "olmo"}, "parameter 'model': expected one of ['olmoe', 'qwen3', "
                                                          "'gpt-oss', 'deepseek-v2-lite'] or a config.json"),
             ("03_fits", {"model": str(tmp_path / "empty")}, "(a folder without a config.json)"),
             ("01_routing_reuse", {"model": "nothing-here"}, "(no such file or folder)"),
             ("05_whole_model", {"subject": {"model": str(tmp_path / "empty")}},
              "parameter 'subject.model': expected one of ['byte-faithful', 'byte-faithful-all', 'default', "
              "'replay'] or a checkpoint folder"),
             ("05_whole_model", {"subject": {"model": str(tmp_path / "gpt")}},
              "parameter 'subject.model': expected a checkpoint whose experts compute down(silu(gate x) * up x) "
              f"without biases; found '{tmp_path / 'gpt'}', whose experts have gate/up and down biases, interleaved "
              "gate/up columns and a clamped SwiGLU"),
             ("02_expert_op_benchmark", {"model": "olmoe", "trace_file": str(tmp_path / "four.npz")},
              "parameter 'trace_file': .*four.npz: ids \\(layers, L\\): expected the shape of model olmoe \\(L = 16"),
             ("01_routing_reuse", {"model": str(ENGINES / "config_olmoe.json"),
                                   "trace_file": str(tmp_path / "four.npz")},
              "expected the shape of model OLMoE-1B-7B-0125 \\(L = 16")]
    for name, params, message in cases:
        with pytest.raises(runner.ParameterError, match=message if "\\(" in message else re.escape(message)):
            runner.check_parameters(nb / f"{name}.ipynb", params)
    with pytest.raises(runner.NotebookError, match="model given twice"):
        runner.with_own_model({"model": "olmoe"}, {"model": "qwen3"}, "olmoe", None)
    assert runner.with_own_model({"subject": {}}, {"subject": {"draft_cost": 0.1}}, "/m", "/d") == {
        "subject": {"draft_cost": 0.1, "model": "/m", "draft": "/d"}}


@pytest.mark.notebook
def test_readme_commands_on_a_checkpoint_end_to_end(tmp_path):
    """The README's "Your own model" commands on a random-weight OLMoE checkpoint and a dense draft,
    quick profile: notebook 01 records and saves the checkpoint's routing into the run, 02 and 03 time
    its windows at its shape, 05 runs it with k = 1..8 and estimates the full profile's time, 08
    writes the run file, and advise answers from it naming the model, with one kernel decision."""
    made = subprocess.run([sys.executable, "-m", "moespec.zoo.checkpoints", "olmoe", tmp_path / "tiny"],
                          capture_output=True, text=True, env=ENV, timeout=300)
    assert made.returncode == 0, made.stderr
    run = tmp_path / "mine"
    out = _cli(tmp_path, "reproduce", "--profile", "quick", "--only", "01", "02", "03", "05", "08", "--model",
               tmp_path / "tiny" / "tiny-olmoe", "--draft", tmp_path / "tiny" / "tiny-draft", "--out", run)
    assert out.returncode == 0, out.stderr[-3000:]
    saved = run / "data" / "traces" / "checkpoint-tiny-olmoe-wikitext-test.npz"
    assert RoutingTrace.load(saved).model == str(tmp_path / "tiny" / "tiny-olmoe")
    assert "windows from: recorded: tiny-olmoe on WikiText test" in notebook_text(run / "02_expert_op_benchmark.ipynb")
    bw = pd.read_csv(run / "figures" / "03_bandwidth_all_models.csv")
    assert bw[bw.model == "tiny-olmoe-shrunk"][["N", "m", "L"]].drop_duplicates().values.tolist() == [[16, 4, 4]]
    tables = sorted((run / "figures").glob("*.csv"))
    assert len(tables) > 30
    for table in tables:            # every table of the run carries its identity
        assert set(pd.read_csv(table)["stamp_run_id"]) == {"mine"}, table.name
    for doc in sorted((run / "figures").glob("0[0-7]_*.json")):
        assert json.loads(doc.read_text())["run"]["id"] == "mine", doc.name
    pred = pd.read_csv(run / "figures" / "05_draft_cost_predictions.csv")
    assert sorted(set(pred.k)) == list(range(1, 9))
    text05 = notebook_text(run / "05_whole_model.ipynb")
    assert re.search(r"the full profile on tiny-olmoe \(f32 experts, float32\): about \d+ min", text05)
    assert "The quick profile runs tiny-olmoe" in "".join(json.loads((run / "05_whole_model.ipynb").read_text())[
        "cells"][-1]["outputs"][0]["data"]["text/markdown"])
    assert (run / "figures" / "moespec_run.json").is_file() and (run / "figures" / "REPORT.md").is_file()
    subject = json.loads((run / "figures" / "moespec_run.json").read_text())["subject"]
    assert subject["format"] == "f32"               # the kernels' format notebook 05 ran, for the settings
    assert "05_whole_model | " in out.stderr                      # what it was measuring, beside the notebook
    answer = _cli(tmp_path, "advise", run, "-a", "0.8")
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("moespec advise: tiny-olmoe (f32 experts, float32)")
    adv = advice.advise(run, [0.8])
    switch = adv["settings"][0]["kernel_switch"]["per_slot_up_to"]
    own = {"slot": None, "dedup": 1, "switch": None if adv["dedup"]["from_n"] is None else adv["dedup"]["from_n"] - 1}
    rec = adv["acceptance"][0]["recommended"]
    # plain decoding (k = 0) runs the per-slot kernel in every engine: the switch printed is the crossover's
    expected = own["switch"] if rec["k"] == 0 else own[rec["engine"]]
    assert switch == expected or "that engine is faster" in answer.stdout


@pytest.mark.notebook
def test_engine_dump_with_the_models_config_end_to_end(tmp_path):
    """A vLLM routing dump imported with the model's config.json (no weights): routing statistics,
    the benchmark at the config's shape on the dump's windows and the fits (notebook 03 measures the
    benchmark itself where notebook 02 did not run), the run file (moespec run-file), and advise."""
    trace = tmp_path / "olmoe_vllm.npz"
    made = _cli(tmp_path, "import-routing", ENGINES / "vllm_olmoe.jsonl", "--engine", "vllm", "--config",
                ENGINES / "config_olmoe.json", "--format", "bf16", "--out", trace, "--source", "fixture")
    assert made.returncode == 0, made.stderr
    run = tmp_path / "dump"
    out = _cli(tmp_path, "reproduce", "--profile", "quick", "--only", "01", "03", "--model",
               ENGINES / "config_olmoe.json", "-p", f"trace_file={trace}", "--out", run)
    assert out.returncode == 0, out.stderr[-3000:]
    assert _cli(tmp_path, "run-file", run).returncode == 0
    assert "fixture: rho_hat(2) = " in notebook_text(run / "01_routing_reuse.ipynb")
    assert "windows from: fixture" in notebook_text(run / "03_fits.ipynb")
    path = run / "figures" / "moespec_run.json"
    doc = json.loads(path.read_text())
    assert doc["expert_op_fits"]["shape"] == {"N": 64, "m": 8, "L": 16}
    advise = ("advise", run, "-a", "0.8", "--draft-fit", "0.5,0.2", "--trace", trace)
    if not doc["expert_op_fits"]["eps"] < 0.5:
        # the quick profile's few timings on a shared core can fit any bandwidth error: advise refuses such
        # fits, naming the field; the decision path is then checked with an error inside the bounds' range
        refused = _cli(tmp_path, *advise)
        assert refused.returncode != 0 and "expert_op_fits.eps: bandwidth error eps = " in refused.stderr
        doc["expert_op_fits"]["eps"] = 0.1
        path.write_text(json.dumps(doc))
    answer = _cli(tmp_path, *advise)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.startswith("moespec advise: OLMoE-1B-7B-0125 (16 MoE layers, m = 8)")
    four = tmp_path / "four.npz"
    synthetic.uniform(1, 20, 4, 64, 8, seed=0).save(four)
    refused = _cli(tmp_path, "advise", run, "-a", "0.8", "--draft-fit", "0.5,0.2", "--trace", four)
    assert refused.returncode == 1 and "expected the shape of OLMoE-1B-7B-0125" in refused.stderr


def test_advise_on_a_table_or_trace_of_a_model_that_is_no_preset(tmp_path):
    """A per-n bandwidth table of a checkpoint (notebook 02's, with its N, m, L) decides at that
    shape; a table without them at a given trace's own shape and bytes; a trace of another shape, or
    --model naming rows the table does not hold, is refused by name."""
    n = np.arange(1, 10)
    table = pd.DataFrame({"model": "tiny-olmoe-shrunk", "backend": "cpp", "fmt": "f32", "n": n,
                          "beta_slot_GBps": 10.0, "beta_dedup_GBps": 9.0 + 0.1 * n, "ubar": 1 / (1 + 0.05 * (n - 1)),
                          "expert_bytes": 1000.0, "N": 16, "m": 4, "L": 4})
    table.to_csv(tmp_path / "bw.csv", index=False)
    adv = advice.advise(bandwidth=tmp_path / "bw.csv", acceptance=[0.8], eps=0.05, free_draft=True)
    assert adv["subject"]["model"] == "tiny-olmoe-shrunk"
    trace = synthetic.uniform(2, 30, 4, 16, 4, seed=1)
    trace.expert_bytes[:] = 500.0
    trace.save(tmp_path / "t.npz")
    table.drop(columns=["N", "m", "L", "expert_bytes"]).to_csv(tmp_path / "bare.csv", index=False)
    bare = advice.advise(bandwidth=tmp_path / "bare.csv", acceptance=[0.8], eps=0.05, free_draft=True,
                         trace=tmp_path / "t.npz")
    assert any("the model's shape from the routing trace: L = 4 MoE layers, N = 16, m = 4" in a
               for a in bare["assumptions"])
    with pytest.raises(advice.AdviceInputError, match="not a preset and the table has no columns N, m, L"):
        advice.advise(bandwidth=tmp_path / "bare.csv", acceptance=[0.8], eps=0.05, free_draft=True)
    synthetic.uniform(2, 30, 3, 16, 4, seed=1).save(tmp_path / "three.npz")
    with pytest.raises(advice.AdviceInputError, match=r"expected the shape of tiny-olmoe-shrunk \(L = 4"):
        advice.advise(bandwidth=tmp_path / "bw.csv", acceptance=[0.8], eps=0.05, free_draft=True,
                      trace=tmp_path / "three.npz")
    with pytest.raises(advice.AdviceInputError, match=r"expected rows of --model 'olmoe'; found rows of "
                                                      r"\['tiny-olmoe-shrunk'\]"):
        advice.advise(bandwidth=tmp_path / "bw.csv", acceptance=[0.8], eps=0.05, free_draft=True, model="olmoe")


def test_progress_lines_reach_the_runner(tmp_path):
    """Inside a notebook's run, a bar of moespec.progress appends its line (first and last, and at
    most every INTERVAL seconds between) to logs/<notebook>.progress, and the runner hands the last
    line to what shows it; outside a run nothing is written."""
    shown = []
    with runner._progress_of(Path("05_whole_model.ipynb"), tmp_path, shown.append):
        bar = progress.tqdm(total=4, desc="expert op tiny", file=open(os.devnull, "w"))
        bar.update(2)
        bar.close()
        lines = (tmp_path / "logs" / "05_whole_model.progress").read_text().splitlines()
        assert [x.split(" [")[0] for x in lines] == ["expert op tiny: 0% 0/4", "expert op tiny: 50% 2/4"]
        deadline = 30
        while not shown and deadline:
            deadline -= 1
            __import__("time").sleep(0.2)
    assert shown == [lines[-1]] and progress.ENV not in os.environ
    progress.tqdm(total=1, file=open(os.devnull, "w")).close()          # no run: nothing written anywhere
    assert progress.last_line(tmp_path / "none") == ""


def test_full_estimate_scales_each_phase_by_its_work():
    """work_units of notebook 05: the quick profile's k = 1..8 and the full profile's sizes, phase by
    phase (a full run is more work in every phase)."""
    from moespec.notebook_profiles import DEFAULTS

    quick = {**DEFAULTS["05"]["quick"], "draft_costs": [0.0, 0.3]}
    full = {**DEFAULTS["05"]["full"], "a_values": [0.5, 0.8], "draft_costs": [0.0, 0.1, 0.2], "depths": [64, 200]}
    assert quick["real_ks"] == list(range(1, 9)) and quick["oracle_ks"] == list(range(9))
    q, f = work_units(quick), work_units(full)
    assert set(q) == set(f) == {"breakdown", "agreement", "verify_grid", "oracle_runs quiet", "real_draft quiet",
                                "oracle_runs loaded", "real_draft loaded"}
    assert q["verify_grid"] == 2 * 3 * 3 and f["verify_grid"] == 2 * 5 * 4
    # real draft, quiet: tokens x (test prompts x reps x (costs x ks + plain runs) + calibration turns x ...)
    assert q["real_draft quiet"] == 6 * (2 * 3 * (2 * 8 + 2) + 2 * (3 * 8 + 3))
    assert all(f[p] > q[p] for p in q)


def test_a_prompt_that_accepts_every_draft_is_data(tmp_path):
    """A measured acceptance of 1 (the median prompt accepted every draft) is read as data; the
    pooled rate decides (advise beside the runs works), and only a = 1 pooled too is refused."""
    import shutil
    from collections import namedtuple

    from moespec.advice.measured import against_runs, decision_rate
    from moespec.predict import run_file

    Row = namedtuple("Row", "state a a_pooled")
    assert decision_rate(Row("quiet", 0.7, 0.6), "r") == 0.7 and decision_rate(Row("quiet", 1.0, 0.9), "r") == 0.9
    with pytest.raises(advice.AdviceInputError, match="every draft of every prompt was accepted"):
        decision_rate(Row("quiet", 1.0, 1.0), "r")
    run = tmp_path / "run"
    run.mkdir()
    for f in paths.committed_figures_dir().iterdir():
        if f.suffix in (".csv", ".json"):
            shutil.copy(f, run / f.name)
    acc = pd.read_csv(run / "05_real_draft_acceptance.csv")
    pooled = float(acc.loc[acc.state == "quiet", "a_pooled"].iloc[0])
    acc.loc[acc.state == "quiet", "a"] = 1.0
    acc.to_csv(run / "05_real_draft_acceptance.csv", index=False)
    run_file.write_run_file(run)
    assert run_file.read_run_file(run).acceptance().set_index("state").loc["quiet", "a"] == 1.0
    table, regret, _ = against_runs(run)
    assert not table[table.state == "quiet"].empty
    assert f"geometric at the measured a = {pooled:.3f}" in set(regret[regret.state == "quiet"].acceptance)


@pytest.mark.parametrize("family", sorted(set(checkpoints.FAMILIES) - {"gpt_oss"}))
def test_the_breakdown_reads_each_familys_attention_projections(family, tmp_path):
    """The decode breakdown's attention component is every dense projection of every layer's
    attention, whatever the family names them (DeepSeek-V2's latent attention included): the
    captured projections hold exactly the bytes of the nn.Linear weights under ``self_attn``, and
    each got the input of a pass of the prompt's last token."""
    import torch
    from moespec.engine.breakdown import capture_dense_inputs
    from moespec.engine.subject import load_subject

    folder = checkpoints.random_checkpoint(family, tmp_path / f"tiny-{family}")
    draft = checkpoints.random_draft(tmp_path / "tiny-draft")
    sub = load_subject(str(folder), profile="quick", draft=str(draft))
    model = sub.engine.model
    linear = [m for layer in model.model.layers for m in layer.self_attn.modules() if isinstance(m, torch.nn.Linear)]
    sub.engine.prefill([1, 2, 3])
    captured = capture_dense_inputs(sub.engine, [4])["attention"]
    assert [id(m) for m, _ in captured] == [id(m) for m in linear]
    assert sum(m.weight.numel() for m, _ in captured) == sum(m.weight.numel() for m in linear) > 0
    assert all(x.shape[-1] == m.in_features for m, x in captured)
    if family == "deepseek_v2":
        assert {"kv_a_proj_with_mqa", "kv_b_proj", "o_proj"} <= {n.rsplit(".", 1)[-1] for n, m in
                                                               model.named_modules() if m in linear}
