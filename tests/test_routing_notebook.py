"""Notebook 01 through papermill with its quick profile: files written, numbers printed, and a
recorded trace in data/traces/ picked up with no code change."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pandas as pd
import pytest

from moespec import paths
from moespec.routing import synthetic

LINE = re.compile(r"^(?P<src>.+): rho_hat\(2\) = (?P<r2>[\d.]+) \[(?P<r2lo>[\d.]+), (?P<r2hi>[\d.]+)\], "
                  r"rho_hat\(9\) = (?P<r9>[\d.]+) \[[\d.]+, [\d.]+\], ubar\(2\) = (?P<u2>[\d.]+), "
                  r"ubar\(8\) = (?P<u8>[\d.]+), uniform m/N = (?P<q>[\d.]+)$", re.M)

pytestmark = pytest.mark.notebook


def _published():
    df = pd.read_csv(paths.reference_dir() / "paper1_scalars.csv")
    return {(r.model_or_engine, r.quantity): r.value for r in df.itertuples()}


def test_notebook_01_quick(run_notebook, tmp_path, monkeypatch):
    # an empty data dir with the reference tables, and one "recorded" trace (synthetic stand-in)
    data = tmp_path / "data"
    shutil.copytree(paths.reference_dir(), data / "paper_reference")
    monkeypatch.setenv("MOESPEC_DATA", str(data))
    rec = synthetic.uniform(4, 120, 3, 16, 2, seed=3, source="stand-in recorded trace", model="tiny")
    rec.save(data / "traces" / "tiny.npz")

    (tmp_path / "run").mkdir()  # the fixture's papermill output folder (runner does not create it)
    _, figures, text = run_notebook("01_routing_reuse")
    assert (figures / "01_fig1_reuse.png").stat().st_size > 10_000
    table = pd.read_csv(figures / "01_table_reuse.csv")
    curves = pd.read_csv(figures / "01_fig1_reuse_data.csv")
    printed = {m["src"]: m for m in LINE.finditer(text)}
    assert set(printed) == {"synthetic OLMoE, calibrated to paper 1 rho(2) and rho(9)",
                            "synthetic Qwen3, calibrated to paper 1 rho(2) and rho(9)",
                            "synthetic gpt-oss, calibrated to paper 1 rho(2) and rho(9)",
                            "stand-in recorded trace"}
    pub = _published()
    for label, m in printed.items():
        row = table[table["source"] == label].iloc[0]
        # printed numbers are the table's
        for key, col in (("r2", "rho_hat_2"), ("r9", "rho_hat_9"), ("u2", "ubar_2"), ("u8", "ubar_8")):
            assert float(m[key]) == pytest.approx(row[col], abs=6e-5)
        assert float(m["r2lo"]) <= float(m["r2"]) <= float(m["r2hi"])
        # ubar(n) = 1 - (m/(nm)) sum rho: falls with n and sits below 1 wherever there is reuse
        assert 0 < row["ubar_8"] < row["ubar_2"] < 1
        # the curve at n = 2 is the table's rho_hat(2)
        c = curves[(curves["label"] == label) & (curves["n"] == 2)]
        assert c["rho"].iloc[0] == pytest.approx(row["rho_hat_2"])
        if label.startswith("synthetic"):
            paper = label.split()[1].rstrip(",")
            # calibrated: within sampling error of the quick profile's small traces
            assert row["rho_hat_2"] == pytest.approx(float(pub[(paper, "rho_layer_mean_n2")]), abs=0.03)
            assert row["rho_hat_9"] == pytest.approx(float(pub[(paper, "rho_layer_mean_n9")]), abs=0.04)
        else:
            # the recorded stand-in is uniform routing with m/N = 1/8: rho(2) near 1/8
            assert row["uniform_m_over_N"] == 0.125
            assert row["rho_hat_2"] == pytest.approx(0.125, abs=0.05)
    # published values appear only as rows labelled as the paper's, with no byte share
    pub_rows = table[table["source"].str.startswith("paper 1, published")]
    assert len(pub_rows) == 3 and pub_rows["ubar_2"].isna().all()
    assert "calibration targets (paper 1, published)" in text
