"""The training benchmark and the router-recipe script: their data-free parts on tiny models."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bench_scripts import load_benchmark
from moespec import zoo
from moespec.measure.timing import Timing

pytestmark = pytest.mark.usefixtures("one_thread")


def test_training_rows_speedup_is_the_ratio_of_medians():
    bench = load_benchmark("bench_training")
    timings = {"moe previous": Timing("moe previous", (4e9, 5e9, 6e9)),
               "moe current": Timing("moe current", (1e9, 1.25e9, 1.5e9)),
               "draft previous": Timing("draft previous", (2e9,)),
               "draft current": Timing("draft current", (0.5e9,))}
    df = bench.rows(timings, 2048).set_index("path")
    assert df.loc["moe current", "speedup_vs_previous"] == pytest.approx(5.0 / 1.25)
    assert df.loc["draft current", "speedup_vs_previous"] == pytest.approx(4.0)
    assert df.loc["moe previous", "speedup_vs_previous"] == pytest.approx(1.0)
    assert df.loc["moe current", "tokens_per_s"] == pytest.approx(2048 / 1.25)


def test_router_recipe_snapshot_on_a_tiny_moe():
    """Perplexity, reuse and load spread of a tiny random MoE: reuse within [0, 1] with layer
    values averaging to the mean, loads around the mean."""
    script = load_benchmark("router_recipes")
    model = zoo.tiny_moe(seed=3)
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, 256, 40) for _ in range(3)]
    snap = script.snapshot(model, docs, 50, docs)
    assert snap["ppl_token"] > 1 and 0 <= snap["rho2"] <= snap["rho9"] <= 1
    assert np.mean(snap["rho2_layers"]) == pytest.approx(snap["rho2"], abs=1e-4)
    assert snap["min_over_mean"] <= 1 <= snap["max_over_mean"] and snap["cv_max"] >= 0
    assert model.training  # the script keeps training after a snapshot
