"""``moespec report``: the run's REPORT.md and the README's and docs' result blocks are written from
files.

The first tests are the guards: every block of README.md, docs/*.md and figures/README.md rendered
from the committed ``figures/`` (and the committed records the markers name) must equal the
committed text, and ``figures/REPORT.md`` must be what the committed run's files give, so no number
in them can be typed by hand or go stale. README.md and docs/engine.md are held to a length a
reader finishes."""

from __future__ import annotations

import json
import re

import pandas as pd
import pytest

from moespec import cli, paths, report
from moespec.report import sections
from moespec.report.blocks import BLOCKS
from moespec.report.format import md_table, span
from moespec.report.run import ReportError, RunFiles


def test_committed_docs_match_the_committed_figures():
    diffs = report.check_files(paths.committed_figures_dir())
    assert not diffs, ("README/docs blocks or figures/REPORT.md differ from figures/ (run `moespec report figures`):\n"
                       + "\n".join(diffs.values())[:6000])


def test_committed_report_regenerates_identically_from_figures():
    run = RunFiles(paths.committed_figures_dir())
    committed = (paths.committed_figures_dir() / report.REPORT_NAME).read_text()
    assert sections.report_text(run) == committed
    ran = {nb["name"][:2] for nb in run.manifest.get("notebooks", [])}     # a section for every notebook it ran
    assert [f"## {s.notebook}." for s in sections.SECTIONS if s.notebook in ran] == re.findall(r"^## \d\d\.",
                                                                                             committed, re.M)


@pytest.mark.parametrize("page, limit", [("README.md", 25600), ("docs/engine.md", 40960)])
def test_front_door_and_engine_page_stay_short(page, limit):
    size = len((paths.ROOT / page).read_bytes())
    assert size <= limit, f"{page} is {size} bytes; at most {limit}"


def test_readme_cites_no_commit_as_a_past_run():
    """The README's blocks name their records by file; no block text carries a run's commit."""
    text = (paths.ROOT / "README.md").read_text()
    assert not re.search(r"\b(commit|published in|run of) [0-9a-f]{7,40}\b", text)
    assert "amendment" not in text.split("<!-- moespec-report:advise")[0]


def test_every_block_is_used_or_documented():
    """Each registered block appears in some document or in a section of the report (none is dead code)."""
    text = "".join(p.read_text() for p in report.doc_files())
    parts = {name for s in sections.SECTIONS for name, _ in s.parts}
    unused = [name for name in BLOCKS if f"moespec-report:{name}" not in text and name not in parts]
    assert not unused, f"blocks no document or report section uses: {unused}"


def test_the_package_reads_no_benchmark_results_it_was_not_given():
    """A block reads a committed record only at the path its marker names: no string of the report's
    code (docstrings aside) names a path under benchmarks/results."""
    import ast

    for src in (paths.ROOT / "moespec" / "report").glob("*.py"):
        tree = ast.parse(src.read_text())
        scopes = (ast.Module, ast.ClassDef, ast.FunctionDef)
        docs = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(n, scopes) and n.body
                and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        named = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and id(n) not in docs and "benchmarks/results" in n.value]
        assert not named, f"{src}: {named}"


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
    return "\n".join(f"text before\n<!-- moespec-report:{n}{(' ' + a) if a else ''} -->\nold\n"
                     f"<!-- /moespec-report:{n} -->"
                     for n, a in names_and_args) + "\nafter\n"


def test_blocks_render_exactly_from_a_hand_made_run(run_dir):
    run = RunFiles(run_dir)
    out = report.render_text(_doc(("goals", "notebook=05"), ("run-identity", "")), run)
    assert "Goals of notebook 05 (subject: toy), `05_goals.csv`: 1 of 2 met." in out
    assert "| speedup within 10 % | 3 of 4 points | all points | **not met** |" in out
    assert "| stop cost within one step | 0 steps apart | <= 1 step | met |" in out
    assert ("The `make reproduce` run of 2026-12-02 10:00 UTC (run folder `runs/20261202-100000-full`, profile full) "
            "on Test CPU, 4 logical CPUs, 8 GiB, no GPU, torch 2.13.0+cpu") in out
    assert "abcdef0" not in out
    assert "\nold\n" not in out and out.endswith("after\n") and out.count("text before") == 2
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
            "most 11.11 % (`02_discard_groups.csv`); the runs of notebook 03, minutes apart, read "
            "9.00–12.50 GB/s") in out
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
    pd.DataFrame([{"subject": "checkpoint", "step_ms": 3.0, "read_GBps": 6.0, "published": None,
                   "label": "tiny-olmoe (f32 experts, float32)"}]).to_csv(run_dir / "05_breakdown.csv", index=False)
    out = report.render_text(_doc(("breakdown-bytes", "")), RunFiles(run_dir))
    assert ("tiny-olmoe (f32 experts, float32): step 3.00 ms at n = 1, read 6.0 GB/s in the same run. The subject is "
            "not embedded in a published model, so no published byte shares are set beside it.") in out


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
    assert "The run of 2026-12-02 10:00:00 has no `06_goals.csv`: it predates the table" in out


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


def test_span_and_formatting():
    assert span([0.9761, 0.9863]) == "0.976–0.986"
    assert span([0.95, 0.9504]) == "0.950"
    assert span([float("nan")]) == "n/a"
    assert md_table(["goal", "value"], [["within 5 %", "largest |error| 6.3 %"]]).endswith(
        "| within 5 % | largest \\|error\\| 6.3 % |")          # a pipe in a cell does not split it


def test_old_module_names_are_gone():
    """moespec.bench and moespec.models were aliases of moespec.measure and moespec.model_shapes;
    nothing outside the project used them, and they are removed."""
    import importlib

    for name in ("moespec.models", "moespec.bench"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


# --- the run's report ------------------------------------------------------------------------------
def test_report_has_a_section_per_notebook_and_names_what_a_run_lacks(run_dir):
    """A run of notebooks 00 and 05 (hand-made files): its header, a section for each notebook it
    has files of and none for the others, its parts rendered exactly, a part whose file is missing
    named as missing, and the figures and tables listed."""
    (run_dir / "05_breakdown.png").write_bytes(b"png")
    text = sections.report_text(RunFiles(run_dir))
    assert text.startswith("# Report of the run runs/20261202-100000-full\n")
    assert ("The `make reproduce` run started 2026-12-02 10:00 UTC on Test CPU, 4 logical CPUs, 8 GiB, no GPU, torch "
            "2.13.0+cpu, profile full, commit abcdef0") in text
    assert "| `00_default_models` | 1.0 |\n| `05_whole_model` | 2.0 |\n| all | 3.0 |" in text
    assert re.findall(r"^## .*$", text, re.M) == ["## 00. Embedded models and routing sources",
                                                  "## 05. The whole model: the round model and the speculative runs"]
    assert "| ppl | 157.331 | <= 150 | False |" in text                   # 00_quality.csv as it is
    assert "*(This run has no `00_perplexity.csv`.)*" in text
    assert "Goals of notebook 05 (subject: toy), `05_goals.csv`: 1 of 2 met." in text
    assert "*(This run has no `05_round_terms.csv`, `05_plain_step.csv`.)*" in text
    assert "Figures: [`05_breakdown.png`](05_breakdown.png)." in text
    assert "Tables: `05_goals.csv`." in text


def test_write_report_writes_it_beside_the_figures_and_check_sees_it_stale(run_dir, tmp_path, monkeypatch):
    path = report.write_report(run_dir)
    assert path == run_dir / "REPORT.md" and path.read_text() == sections.report_text(RunFiles(run_dir))
    monkeypatch.setattr("moespec.report.render.doc_files", lambda: [])    # no repository document
    assert report.check_files(run_dir) == {}
    path.write_text("stale\n")
    assert list(report.check_files(run_dir)) == [path]
    assert report.check_files(run_dir, files=[]) == {}                  # --files: those files only
    assert report.update_files(run_dir) == [path] and path.read_text() == sections.report_text(RunFiles(run_dir))
    nested = tmp_path / "runs" / "r1"
    (nested / "figures").mkdir(parents=True)
    (nested / "manifest.json").write_text(json.dumps({"started": "2026-12-02T11:00:00", "profile": "quick",
                                                      "notebooks": [{"name": "05_whole_model", "wall_s": 6.0}]}))
    (nested / "figures" / "05_goals.csv").write_text((run_dir / "05_goals.csv").read_text())
    assert report.write_run_report(nested) == nested / "figures" / "REPORT.md"
    assert "Goals of notebook 05" in (nested / "figures" / "REPORT.md").read_text()


def test_a_report_that_cannot_be_written_says_why_in_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"status": "failed", "failed": "05_whole_model",
                                                   "started": "2026-12-02T10:00:00"}))
    assert report.write_run_report(run) is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "REPORT.md not written" in err[0] and "failed" in err[0]


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
    assert not (run_dir / "REPORT.md").exists()             # --files: the report is not among them


# --- notebook 05's parts ----------------------------------------------------------------------------
def _predictions(run_dir, rows: list[str], columns: str = "") -> str:
    """The real-draft part over hand-made points (state, draft cost, k, measured, rel_error, inside)."""
    head = "state,draft_cost,k,measured,rel_error,inside" + (f",{columns}" if columns else "")
    (run_dir / "05_draft_cost_predictions.csv").write_text(head + "\n" + "\n".join(rows) + "\n")
    return report.render_text(_doc(("real-draft", "")), RunFiles(run_dir))


def test_real_draft_part_counts_each_state_exactly(run_dir):
    """Quiet: errors +1 %, -6 %, +2 % (two of three within 5 %, largest 6.0 %, mean -1.0 %), the best
    measured point 1.4 at cost 0, k = 2; loaded: one point."""
    out = _predictions(run_dir, ["quiet,0.0,1,1.2,0.01,True", "quiet,0.0,2,1.4,-0.06,False",
                                 "quiet,0.1,1,1.1,0.02,True", "loaded,0.0,1,1.3,0.03,True"])
    assert "| quiet | 3 | 2 | 6.0 % | -1.0 % | 2 | n/a | 1.400 (cost 0, k = 2) | n/a | n/a |" in out
    assert "| loaded | 1 | 1 | 3.0 % | +3.0 % | 1 | n/a | 1.300 (cost 0, k = 1) | n/a | n/a |" in out


def test_real_draft_part_states_the_noise_and_diagnostics(run_dir):
    """Two points with the noise columns (P outside 0.2 and 0.1: 0.3 expected; prediction se 1 % and
    3 %: median 2.0 %) and the diagnostics (geometric errors 10 % and -20 %; step-time errors 1 % and 6 %)."""
    out = _predictions(run_dir, ["quiet,0.0,1,1.2,0.01,True,0.2,0.01,0.02,True,0.1,0.01",
                                 "quiet,0.0,2,1.3,0.02,True,0.1,0.03,0.04,False,-0.2,0.06"],
                       "noise_p_outside,pred_rel_se,measured_rel_se,beyond_2sd,rel_error_geometric,"
                       "rel_error_measured_steps")
    assert ("| quiet | 2 | 2 | 2.0 % | +1.5 % | 2 | 0.3 (prediction se 2.0 %, measurement se 3.0 %; 1 beyond 2 sd) "
            "| 1.300 (cost 0, k = 2) | 20.0 % | 1 |") in out


def test_oracle_grid_part_counts_cells_with_k_of_one_or_more(run_dir):
    (run_dir / "05_oracle_predictions.csv").write_text(
        "d,k,a,state,speedup_rel_error,speedup_inside,speedup_rel_error_realized\n"
        "64,0,0.8,quiet,0.3,False,0.3\n64,1,0.8,quiet,0.01,True,0.02\n64,2,0.8,quiet,-0.07,False,0.06\n")
    out = report.render_text(_doc(("oracle-grid", "")), RunFiles(run_dir))
    assert "| quiet | 2 | 1 | 7.0 % | 1 | 1, largest 6.0 % |" in out


def test_draft_stop_part_and_round_model_draft_form(run_dir):
    (run_dir / "05_draft_cost_stop.json").write_text(json.dumps(
        {"grid": [0.0, 0.2], "best_measured": [1.3, 0.9], "best_predicted": [1.25, 0.95],
         "stop_cost_measured": 0.2, "stop_cost_predicted": 0.2}))
    out = report.render_text(_doc(("draft-stop", "")), RunFiles(run_dir))
    assert "stops paying from cost 0.2 measured and 0.2 predicted" in out
    assert "| 0 | 1.300 | 1.250 |\n| 0.2 | 0.900 | 0.950 |" in out
    row = pd.Series({"draft_a_ms": 0.5, "draft_b_ms": 0.75, "draft_one_token_ms": -0.25, "draft_catch_up_ms": 0.125})
    assert sections._draft_form(row) == "0.500 k + 0.750 - 0.250 [k = 1] + 0.125 s"
