"""The papers' reference tables (moespec.paper_reference) and the reference measurements
(data/reference_measurements): each read as recorded, an edited copy refused with one line."""

from __future__ import annotations

import json
import shutil

import pandas as pd
import pytest

from moespec import paper_reference as PR
from moespec import paths
from moespec.tables import bandwidth


@pytest.fixture
def data_copy(tmp_path, monkeypatch):
    """A copy of data/paper_reference and data/reference_measurements that the test may edit."""
    for name in ("paper_reference", "reference_measurements"):
        shutil.copytree(paths.data_dir() / name, tmp_path / name)
    monkeypatch.setenv("MOESPEC_DATA", str(tmp_path))
    return tmp_path


def test_every_reference_file_reads_as_transcribed():
    for name, file in PR.FILES.items():
        df = PR.read(name)
        assert len(df) == len(pd.read_csv(paths.reference_dir() / file)) > 0, name
    t1 = PR.table1()
    assert len(t1) == 8 and t1.loc[0, "engine"] == "llama.cpp CUDA" and t1.loc[0, "n2_beta_slot_GBps"] == 618
    assert t1.loc[2, "reread_cost"] == "" and t1.loc[0, "reread_cost"] == "0.18-0.22"
    assert (PR.paper1_table("table3_predictions").source == PR.PAPER1_LABEL).all()
    assert PR.paper1_epsilon() == {"llama.cpp CUDA": 0.054, "llama.cpp Metal": 0.031, "MLX-LM": 0.148}
    assert PR.paper1_scalar("real_draft_median_speedup_k1") == 0.877
    assert PR.paper1_scalar("epsilon", "MLX-LM") == 0.148
    assert PR.paper2_value("in_sample_R2_per_K") == "0.9669-0.9991"
    assert PR.paper2_number("context_coef_ms_per_token") == 1.1e-3
    assert (PR.paper2_scalars().source == PR.PAPER2_LABEL).all()
    with pytest.raises(KeyError, match="expected one row 'epsilon', found 3"):
        PR.paper1_scalar("epsilon")
    with pytest.raises(KeyError, match="no quantity 'nothing'"):
        PR.paper2_value("nothing")


@pytest.mark.parametrize("name", sorted(PR.FILES))
def test_an_edited_reference_file_is_refused(data_copy, name):
    where = data_copy / "paper_reference" / PR.FILES[name]
    where.write_text(where.read_text().replace("0.", "0.0", 1))
    with pytest.raises(PR.ReferenceFileError) as exc:
        PR.read(name)
    line = str(exc.value)
    assert "\n" not in line and str(where) in line and "digests.json" in line and "sha256 expected" in line


def test_a_missing_reference_file_is_refused(data_copy):
    (data_copy / "paper_reference" / PR.FILES["paper2_scalars"]).unlink()
    with pytest.raises(PR.ReferenceFileError, match="paper2_scalars.csv: the papers' reference file is missing"):
        PR.paper2_value("pooled_eq4_R2")


def _readers():
    from moespec.engine.draftcost import paper_references
    from moespec.routing.published import published_reuse
    from moespec.tables import oracle, predictions, theory

    return {"paper1_scalars": [paper_references, theory.published_epsilon, published_reuse],
            "table1_bandwidth": [bandwidth.published_table1, PR.read_table1],
            "table7_error": [lambda: predictions.table7({}, "engine", "model")],
            "paper2_scalars": [lambda: oracle.ours_vs_paper({"pooled_eq4_R2": "0.9"})]}


def test_the_readers_read_through_the_checked_module(data_copy):
    """Tables, theory, routing and the engine's references read the papers' files only through
    moespec.paper_reference: an edit reaches every one of them as the same refusal."""
    from moespec.engine.draftcost import paper_references

    assert paper_references() == {"paper1_k1": 0.877, "paper2_ratio": pytest.approx(0.0768715458047, rel=1e-12)}
    for name, readers in _readers().items():
        where = data_copy / "paper_reference" / PR.FILES[name]
        original = where.read_bytes()
        for read in readers:
            read()
        where.write_bytes(original + b"\n")
        for read in readers:
            with pytest.raises(PR.ReferenceFileError, match=PR.FILES[name]):
                read()
        where.write_bytes(original)


# --- reference measurements ----------------------------------------------------------------------------------
def test_reference_measurements_match_their_manifest():
    manifest = json.loads((paths.data_dir() / "reference_measurements" / "MANIFEST.json").read_text())
    for entry in manifest["measurements"]:
        assert {"name", "path", "origin", "machine", "files"} <= set(entry)
        assert {"benchmark", "run"} <= set(entry["origin"]) and entry["origin"]["run"] in entry["path"]
        where = bandwidth.reference_measurement(entry["name"])
        assert where.exists() and not str(where).startswith(str(paths.ROOT / "benchmarks"))
    rows, path = bandwidth.load_breadth_run()
    assert path.stem == "20261203T183234Z" and {"cpp", "ggml"} <= set(rows.backend)
    (label, decision), = bandwidth.load_engine_fit_runs().items()
    assert label.endswith("run 20261203T201055-olmoe-ggml-f32-1ec41f63") and len(decision.kept) > 0


def test_an_edited_reference_measurement_is_refused(data_copy):
    rows = data_copy / "reference_measurements" / "engine_fits" / "20261203T201055-olmoe-ggml-f32-1ec41f63" / "rows.csv"
    rows.write_text(rows.read_text() + "\n")
    with pytest.raises(ValueError) as exc:
        bandwidth.load_engine_fit_runs()
    line = str(exc.value)
    assert "\n" not in line and str(rows) in line and "MANIFEST.json" in line and "engine_fit_ggml_olmoe_f32" in line
    with pytest.raises(KeyError, match="no measurement 'nothing'"):
        bandwidth.reference_measurement("nothing")
