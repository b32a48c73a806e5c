"""``moespec report``: the README's and docs' result blocks are written from a run's files.

The first test is the guard of issue 18: every block of README.md, docs/*.md and figures/README.md
rendered from the committed ``figures/`` (and the committed benchmark results) must equal the
committed text, so no number in a block can be typed by hand or go stale."""

from __future__ import annotations

import json
import warnings

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


def test_breakdown_goals_judge_each_target(run_dir):
    (run_dir / "05_breakdown.csv").write_text(
        "subject,step_ms,experts_ms,expert_share,draft_ratio,read_GBps,peak_memory_GiB\n"
        "byte-faithful,10,6.5,0.65,0.108,37.17,4.31\nsmall,1,0.1,0.1,0.05,36.0,17\n")
    out = report.render_text(_doc(("breakdown-goals", "")), RunFiles(run_dir))
    assert ("read 37.2, 36.0 GB/s): byte-faithful: expert share 0.65 (>= 0.6: met); draft ratio 0.108 (<= 0.1: "
            "**not met**); peak memory GiB 4.31 (<= 16: met); small: expert share 0.1 (>= 0.6: **not met**); "
            "draft ratio 0.05 (<= 0.1: met); peak memory GiB 17 (<= 16: **not met**).") in out


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


def test_old_module_names_still_import_with_a_warning():
    import importlib
    import sys

    for name in ("moespec.models", "moespec.bench"):
        sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        models = importlib.import_module("moespec.models")
        bench = importlib.import_module("moespec.bench")
        from moespec.bench import expert_op, timing  # noqa: F401
    from moespec import measure, model_shapes
    assert models is model_shapes and bench is measure and timing is measure.timing
    assert sum(issubclass(w.category, DeprecationWarning) for w in caught) >= 2
