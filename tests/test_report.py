"""``moespec report``: the README's and docs' result blocks are written from a run's files.

The first test is the guard of issue 18: every block of README.md, docs/*.md and figures/README.md
rendered from the committed ``figures/`` (and the committed benchmark results) must equal the
committed text, so no number in a block can be typed by hand or go stale."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from moespec import cli, paths, report
from moespec.report.blocks import BLOCKS, span
from moespec.report.run import ReportError, RunFiles


def test_committed_docs_match_the_committed_figures():
    diffs = report.check_files(paths.committed_figures_dir())
    assert not diffs, ("README/docs blocks differ from figures/ (run `moespec report figures`):\n"
                       + "\n".join(diffs.values())[:6000])


def test_every_block_is_used_or_documented():
    """Each registered block appears in some document (none is dead code)."""
    text = "".join(p.read_text() for p in report.doc_files())
    unused = [name for name in BLOCKS if f"moespec-report:{name}" not in text]
    assert not unused, f"blocks no document uses: {unused}"


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "figs"
    folder.mkdir()
    (folder / "MANIFEST.json").write_text(json.dumps({
        "started": "2026-12-02T10:00:00", "git_commit": "abcdef0123", "profile": "full", "publish": True,
        "hardware": {"cpu": {"cpu_model": "Test CPU", "logical_cpus": 4, "MemTotal": "8388608 kB"}, "gpus": []},
        "versions": {"torch": "2.13.0+cpu"}, "run_dir": "/x/runs/20261202-100000-full",
        "notebooks": [{"name": "00_default_models", "wall_s": 61.2}, {"name": "05_whole_model", "wall_s": 119.9}]}))
    (folder / "05_goals.csv").write_text(
        "goal,value,target,met,subject\n"
        "speedup within 10 %,3 of 4 points,all points,False,toy\n"
        "stop cost within one step,0 steps apart,<= 1 step,True,toy\n")
    (folder / "00_quality.csv").write_text("quantity,value,goal,met\nppl,157.3312,<= 150,False\n")
    return folder


def _doc(*names_and_args):
    return "\n".join(f"text before\n<!-- moespec-report:{n}{(' ' + a) if a else ''} -->\nold\n<!-- /moespec-report:{n} -->"
                     for n, a in names_and_args) + "\nafter\n"


def test_blocks_render_exactly_from_a_hand_made_run(run_dir):
    run = RunFiles(run_dir)
    out = report.render_text(_doc(("goals", "notebook=05"), ("notebook-times", ""), ("run-identity", "")), run)
    assert "Goals of notebook 05 (subject: toy), `05_goals.csv`: 1 of 2 met." in out
    assert "| speedup within 10 % | 3 of 4 points | all points | **not met** |" in out
    assert "| stop cost within one step | 0 steps apart | <= 1 step | met |" in out
    assert "00 61 s, 05 120 s; 3.0 min in all." in out
    assert ("The `make reproduce` run of 2026-12-02 10:00 UTC (run folder `runs/20261202-100000-full`, commit "
            "abcdef0, profile full) on Test CPU, 4 logical CPUs, 8 GiB, no GPU, torch 2.13.0+cpu") in out
    assert "\nold\n" not in out and out.endswith("after\n") and out.count("text before") == 3
    assert report.render_text(out, run) == out          # idempotent


def test_discard_rule_and_fit_variant_blocks_render_exactly(run_dir):
    (run_dir / "02_discard_groups.csv").write_text(
        "run_id,layer,n,read_GBps,run_median_GBps,departure,timed_rows,discard_reason,discarded,group\n"
        "r,0,0,10.0,9.0,0.1111,10,read +11.1% from the run's median,True,0\nr,8,0,8.0,9.0,-0.1111,10,"
        "read -11.1% from the run's median,True,11\nr,16,0,9.0,9.0,0.0,10,,False,22\n")
    counts = "table,groups_kept,groups_discarded,rows_kept,rows_discarded,share\n"
    (run_dir / "02_discard_rule.csv").write_text(counts + "Table 1,1,2,10,20,0.05\n")
    (run_dir / "03_discard_rule.csv").write_text(counts + "fits,1,2,10,20,0.05\nFigure 7 transfer,4,2,42,20,0.05\n")
    (run_dir / "03_bandwidth_all_models.csv").write_text(
        "model,n,read_GBps\nolmoe,2,9.0\nolmoe,4,9.0\nqwen3,2,12.5\n")
    coefs = "rows,fit,layer,kernel,t_op,c_u,c_re,c_g,c_t\n"
    (run_dir / "03_fit_variants.csv").write_text(
        coefs + "kept,nonnegative,0,slot,0.0,1e-11,0.0,,\nkept,nonnegative,0,dedup,2e-4,,,1e-11,1e-4\n"
        "kept,unconstrained,0,slot,-3e-4,1.1e-11,-1e-13,,\nkept,unconstrained,0,dedup,2e-4,,,1e-11,1e-4\n")
    (run_dir / "03_epsilon_variants.csv").write_text(
        "backend,eps_slot,eps_dedup,eps_engine,fit,rows\ncpp,0.02,0.01,0.02,nonnegative,kept\n"
        "cpp,0.015,0.01,0.015,unconstrained,kept\n")
    out = report.render_text(_doc(("discard-rule", ""), ("fit-variants", "")), RunFiles(run_dir))
    assert ("Share 5 %. Notebook 02's 3 group(s) read 8.00–10.00 GB/s, departing from their run's median by at "
            "most 11.11 % (`02_discard_groups.csv`); the runs of notebook 03, minutes apart, read 9.00–12.50 GB/s") in out
    assert "| Table 1 | 1 | 2 | 10 | 20 |\n| fits | 1 | 2 | 10 | 20 |\n| Figure 7 transfer | 4 | 2 | 42 | 20 |" in out
    assert "| nonnegative | kept | 0.000–0.200 | 2 | 0 | 0.0200, 0.0100, 0.0200 |" in out
    assert "| unconstrained | kept | -0.300–0.200 | 0 | 2 | 0.0150, 0.0100, 0.0150 |" in out


def test_breakdown_goals_judge_each_target(run_dir):
    (run_dir / "05_breakdown.csv").write_text(
        "subject,step_ms,experts_ms,expert_share,draft_ratio,read_GBps,peak_memory_GiB\n"
        "byte-faithful,10,6.5,0.65,0.108,37.17,4.31\nsmall,1,0.1,0.1,0.05,36.0,17\n")
    out = report.render_text(_doc(("breakdown-goals", "")), RunFiles(run_dir))
    assert ("read 37.2, 36.0 GB/s): byte-faithful: expert share 0.65 (>= 0.6: met); draft ratio 0.108 (<= 0.1: "
            "**not met**); peak memory GiB 4.31 (<= 16: met); small: expert share 0.1 (>= 0.6: **not met**); "
            "draft ratio 0.05 (<= 0.1: met); peak memory GiB 17 (<= 16: **not met**).") in out


def test_breakdown_bytes_renders_each_component(run_dir):
    parts = {"attention": (2.0, 20.0, 0.2, 0.25), "experts": (5.0, 60.0, 0.6, 0.6), "lm_head": (1.0, 10.0, 0.1, 0.1),
             "kv_cache": (None, 5.0, 0.05, 0.04), "other": (None, 5.0, 0.05, 0.01)}
    row = {"subject": "bfa", "step_ms": 10.0, "read_GBps": 15.0, "published": "OLMoE", "bytes_depth": 64}
    for c, (ms, mb, share, pub) in parts.items():
        row.update({f"{c}_MB": mb, f"{c}_share": share, f"{c}_share_published": pub})
        if ms is not None:
            row.update({f"{c}_ms": ms, f"{c}_GBps": mb / ms})
    pd.DataFrame([row]).to_csv(run_dir / "05_breakdown.csv", index=False)
    out = report.render_text(_doc(("breakdown-bytes", "")), RunFiles(run_dir))
    assert "cache depth 64; the published model OLMoE at the subject's layers" in out
    assert "| bfa | attention | 2.00 | 20.00 | 10.0 | 0.200 | 0.250 | 0.800 |" in out
    assert "| bfa | kv cache | n/a | 5.00 | n/a | 0.050 | 0.040 | 1.250 |" in out
    assert "bfa: step 10.00 ms at n = 1, read 15.0 GB/s in the same run." in out
    pd.DataFrame([{"subject": "old", "step_ms": 1.0}]).to_csv(run_dir / "05_breakdown.csv", index=False)
    with pytest.raises(ReportError, match="no byte columns"):
        report.render_text(_doc(("breakdown-bytes", "")), RunFiles(run_dir))


def test_generic_table_renders_whatever_the_csv_holds(run_dir):
    out = report.render_text(_doc(("table", "file=00_quality.csv")), RunFiles(run_dir))
    assert "| quantity | value | goal | met |\n| --- | --- | --- | --- |\n| ppl | 157.331 | <= 150 | False |" in out
    with pytest.raises(ReportError, match=r"00_quality.csv has no columns \['ppl_token'\]"):
        report.render_text(_doc(("table", "file=00_quality.csv columns=ppl_token")), RunFiles(run_dir))


def test_a_missing_file_fails_naming_it_and_the_block(run_dir):
    with pytest.raises(ReportError, match=r"doc.md:2 \(block 'goals'\): .*06_goals.csv is missing"):
        report.render_text(_doc(("goals", "notebook=06")), RunFiles(run_dir), "doc.md")
    with pytest.raises(ReportError, match=r"07_rounds_summary.csv is missing"):
        report.render_text(_doc(("oracle", "")), RunFiles(run_dir))


def test_if_present_states_the_absence(run_dir):
    out = report.render_text(_doc(("goals", "notebook=06 if-present")), RunFiles(run_dir))
    assert "has no `06_goals.csv`: it predates the table" in out and "commit abcdef0" in out


@pytest.mark.parametrize("text, message", [
    ("<!-- moespec-report:nosuch -->\n<!-- /moespec-report:nosuch -->\n", "unknown block"),
    ("<!-- moespec-report:goals notebook=05 -->\nno end\n", "no closing marker"),
    ("x\n<!-- /moespec-report:goals -->\n", "closing marker of block 'goals' without its opening one"),
    ("<!-- moespec-report:table file=a.csv -->\n<!-- moespec-report:goals notebook=05 -->\n"
     "<!-- /moespec-report:goals -->\n<!-- /moespec-report:table -->\n", "blocks do not nest"),
    ("<!-- moespec-report:goals notebook05 -->\n<!-- /moespec-report:goals -->\n", "neither key=value"),
])
def test_bad_markers_are_refused(run_dir, text, message):
    with pytest.raises(ReportError, match=message):
        report.render_text(text, RunFiles(run_dir))


def test_run_folder_layouts(tmp_path, run_dir):
    with pytest.raises(ReportError, match="does not exist"):
        RunFiles(tmp_path / "nope")
    nested = tmp_path / "runs" / "r1"
    (nested / "figures").mkdir(parents=True)
    (nested / "manifest.json").write_text(json.dumps({"started": "2026-12-02T11:00:00"}))
    run = RunFiles(nested)
    assert run.tables == nested / "figures" and run.manifest["started"].startswith("2026-12-02T11")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ReportError, match="no manifest.json or MANIFEST.json"):
        RunFiles(empty).manifest


def test_update_and_check_files_through_the_cli(run_dir, tmp_path, capsys):
    doc = tmp_path / "doc.md"
    doc.write_text(_doc(("goals", "notebook=05")))
    assert cli.main(["report", str(run_dir), "--check", "--files", str(doc)]) == 1
    assert "1 file(s) differ" in capsys.readouterr().out
    assert cli.main(["report", str(run_dir), "--files", str(doc)]) == 0
    assert "1 of 2 met" in doc.read_text()
    assert cli.main(["report", str(run_dir), "--check", "--files", str(doc)]) == 0
    bad = tmp_path / "bad.md"
    bad.write_text(_doc(("goals", "notebook=07")))
    before = doc.read_text()
    doc.write_text(before.replace("1 of 2 met", "9 of 9 met"))
    assert cli.main(["report", str(run_dir), "--files", str(doc), str(bad)]) == 1
    assert "07_goals.csv is missing" in capsys.readouterr().err
    assert "9 of 9 met" in doc.read_text()                  # an error anywhere writes nothing


def test_span_and_formatting():
    assert span([0.9761, 0.9863]) == "0.976–0.986"
    assert span([0.95, 0.9504]) == "0.950"
    assert span([float("nan")]) == "n/a"


def test_old_module_names_are_gone():
    """moespec.bench and moespec.models were aliases of moespec.measure and moespec.model_shapes;
    nothing outside the project used them, and they are removed (issue 24)."""
    import importlib

    for name in ("moespec.models", "moespec.bench"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


def test_round_predictions_state_the_measurement_against_itself(run_dir):
    """The real draft's repetitions (rep0, rep1) of one point: 1.3 and 1.2, standard error 4.0 %, a
    perfect prediction outside 5 % with probability 0.21 (tests/test_draftcost.py's hand case)."""
    (run_dir / "05_oracle_predictions.csv").write_text(
        "d,k,a,state,speedup_rel_error,speedup_inside\n64,1,0.8,quiet,0.01,True\n")
    (run_dir / "05_draft_cost_predictions.csv").write_text(
        "draft_cost,k,state,measured,predicted,rel_error,rel_error_geometric,rep0,rep1\n0.0,1,quiet,1.25,1.25,0.0,0.0,1.3,1.2\n")
    out = report.render_text(_doc(("round-predictions", "")), RunFiles(run_dir))
    assert ("the measurement against itself: its 2 repetitions differ by more than 5 % at 1 of 1 points, standard "
            "error of a point about 4.0 %, so a perfect prediction would fall outside 5 % at about 0.2 of 1 by that "
            "noise alone (1 repetitions per prompt would bring that under one half)") in out
    assert "against its calibration" not in out
    # with the prediction's own noise (moespec.predict.noise): 3 % from the calibration, 4 % from the
    # repetitions, 5 % together, so a perfect prediction falls outside 5 % with probability 0.317
    (run_dir / "05_draft_cost_predictions.csv").write_text(
        "draft_cost,k,state,measured,predicted,rel_error,rel_error_geometric,rep0,rep1,measured_rel_se,pred_rel_se,"
        "noise_rel_sd,noise_p_outside,beyond_2sd\n0.0,1,quiet,1.25,1.25,0.0,0.0,1.3,1.2,0.04,0.03,0.05,0.3173,False\n")
    out = report.render_text(_doc(("round-predictions", "")), RunFiles(run_dir))
    assert ("the prediction against its calibration: standard error of a point's prediction 3.0 % (median; its "
            "measurement's 4.0 %), so a perfect prediction would fall outside 5 % at about 0.3 of 1 points by the two "
            "noises (0.2 by the measurement's alone); 0 are outside, and 0 errors lie beyond two standard deviations "
            "of that noise") in out
    (run_dir / "05_draft_cost_predictions.csv").write_text(
        "draft_cost,k,state,measured,predicted,rel_error,rel_error_geometric\n0.0,1,quiet,1.25,1.25,0.0,0.0\n")
    assert "against itself" not in report.render_text(_doc(("round-predictions", "")), RunFiles(run_dir))


def _round_predictions(run_dir, columns: str, rows: list) -> str:
    """The round-predictions block over one quiet oracle cell and real-draft points at k = 1, 2
    (measured 1.2, 1.3, predicted alike), ``rows`` giving each point's rel_error and ``columns``."""
    (run_dir / "05_oracle_predictions.csv").write_text(
        "d,k,a,state,speedup_rel_error,speedup_inside\n64,1,0.8,quiet,0.01,True\n")
    lines = [f"0.0,{k},quiet,{m},{m},{r.split(',', 1)[0]},0.0,{r.split(',', 1)[1]}"
             for k, m, r in zip((1, 2), (1.2, 1.3), rows)]
    (run_dir / "05_draft_cost_predictions.csv").write_text(
        f"draft_cost,k,state,measured,predicted,rel_error,rel_error_geometric,{columns}\n" + "\n".join(lines) + "\n")
    return report.render_text(_doc(("round-predictions", "")), RunFiles(run_dir))


def test_round_predictions_state_the_routing_term(run_dir):
    """Routed real-draft predictions: the block names the cost of one distinct pair, the prompts'
    and the calibration's pairs per pass at the longest k, and the unrouted score beside (one of two
    points within 5 % at the calibration's mean routing: errors 3 % and -8 %)."""
    out = _round_predictions(run_dir, "rel_error_unrouted,ms_per_distinct_expert,distinct_test,distinct_calibration",
                             ["0.0,0.03,0.38,57.0,56.5", "0.0,-0.08,0.38,80.25,76.0"])
    assert ("the scored prediction puts each prompt's verify pass at its own routing (one distinct (expert, layer) "
            "pair 0.380 ms; at k = 2 the test prompts' median pass reads 80.2 pairs, the calibration's mean pass "
            "76.0); at the calibration's mean routing instead: within 5 % at 1, largest 8.0 %") in out


def test_round_predictions_state_the_runs_as_measured(run_dir):
    """A run with the machine adjustment (amendment of 2026-12-06 d): the block scores the adjusted
    runs and says the score against the runs as measured (errors 2 % and -6 %: one of two within
    5 %) and with the verify terms at the runs' read on the runs as measured."""
    out = _round_predictions(run_dir, "rel_error_as_measured,rel_error_at_runs_read_as_measured,read_GBps_runs,"
                                      "read_GBps_model", ["0.01,0.02,0.01,14.5,15.25", "-0.03,-0.06,0.07,14.5,15.25"])
    assert "real draft within 5 % at 2 of 2 (draft cost, k) points (largest |error| 3.0 %" in out
    assert ("against the runs as measured (no machine adjustment): within 5 % at 1, largest 6.0 %; with the verify "
            "terms at the runs' read (14.50 GB/s, calibration 15.25, runs as measured): within 5 % at 1, largest "
            "7.0 %") in out
