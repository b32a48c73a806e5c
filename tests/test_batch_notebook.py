"""Notebook 09 on the quick profile: the predictions table with its columns, B = 1 rows and stamps,
the best-k and goals tables, the figures and the run's rows."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moespec.studies import batch_axis as BA
from moespec.validate.run_identity import COLUMNS

pytestmark = pytest.mark.notebook


def test_notebook_09_quick(run_notebook, tmp_path):
    """Notebook 09 on the quick profile: the predictions table with its columns, B = 1 rows, stamps,
    and the goals, figures and the closing summary."""
    _, figs, text = run_notebook("09_batch", backend="torch", out_dir=str(tmp_path / "batch"))
    pred = pd.read_csv(figs / "09_batch_predictions.csv")
    for col in ("state", "B", "k", "predicted", "measured", "rel_error", "union_ratio", "subject", *COLUMNS):
        assert col in pred.columns, col
    assert pred["stamp_run_id"].notna().all()
    P, _ = BA.run_sizes("quick")
    assert set(pred["state"]) == set(P["states"]) and sorted(set(pred["B"])) == P["batch_sizes"]
    one = pred[pred["B"] == 1]
    assert len(one) == len(P["states"]) * len(P["ks"])
    assert (one.loc[one.k == 0, ["predicted", "measured"]] == 1.0).all().all()
    assert np.allclose(pred["rel_error"], pred["predicted"] / pred["measured"] - 1)
    best = pd.read_csv(figs / "09_best_k.csv")
    assert len(best) == len(P["states"]) * len(P["batch_sizes"]) and set(COLUMNS) <= set(best.columns)
    goals = pd.read_csv(figs / "09_goals.csv")
    assert len(goals) == len(P["states"]) + len(best) and set(COLUMNS) <= set(goals.columns)
    for f in ("09_union_share.png", "09_batch_predictions.png", "09_schedule.png", "09_union_share.csv"):
        assert (figs / f).stat().st_size > 0, f
    runs = pd.read_csv(tmp_path / "batch" / "batch_runs.csv")
    assert len(runs) == P["reps"] * len(P["states"]) * len(P["batch_sizes"]) * len(P["ks"])
    assert json.loads((tmp_path / "batch" / "batch_run.json").read_text())["sizes"]["ks"] == P["ks"]
    assert "[quiet] predicted within 5 % at" in text and "notebook 05's B = 1 numbers: not in this run folder" in text

