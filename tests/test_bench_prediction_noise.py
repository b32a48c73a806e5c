"""benchmarks/prediction_noise.py: the resampling keeps whole turns (or each cell's size), a
calibration without noise gives a prediction without noise, noise in the calibration shows as
prediction noise, and the counts."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bench_scripts import load_benchmark
from test_draftcost import _runs

pn = load_benchmark("prediction_noise")

TV = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3}
DRAFTS = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3)}


def _sweep(prompts: int = 4) -> pd.DataFrame:
    rows = _runs(0.6, TV, DRAFTS, h=0.5e-3, prompts=prompts, ks=(1, 2, 3))
    return pd.concat([rows, rows.assign(rep=1)], ignore_index=True)     # two repetitions: a measurement noise of 0


def test_resample_units():
    cal = _sweep()
    rng = np.random.default_rng(1)
    turns = pn.resample(cal, "turn", rng)
    assert len(turns) == len(cal) and turns["prompt"].nunique() <= 4
    for _, g in turns.groupby("prompt"):                                # every run of a drawn turn, together
        assert len(g) == len(cal) // 4
    runs = pn.resample(cal, "run", rng)
    sizes = lambda f: f.groupby(["draft_cost", "k", "dedup"], dropna=False).size()     # noqa: E731
    assert sizes(runs).equals(sizes(cal))
    with pytest.raises(ValueError, match="unit"):
        pn.resample(cal, "prompt", rng)


def test_no_noise_then_noise():
    cal, test = _sweep(), _sweep()[lambda f: f.dedup]
    quiet = pn.state_noise(cal, test, "quiet", resamples=5, unit="run")
    assert np.allclose(quiet["pred_rel_se"], 0, atol=1e-12) and np.allclose(quiet["meas_rel_se"], 0)
    assert np.allclose(quiet["rel_error"], 0, atol=1e-9) and quiet["p_outside"].eq(0).all()
    s = pn.summary(quiet)
    assert (s["points"], s["outside"], s["expected_outside"], s["beyond_2sd"]) == (6, 0, 0.0, 0)
    # the calibration's verify passes of turn 0 run 10 % slow: resampling turns moves the prediction
    noisy = cal.copy()
    slow = (noisy["prompt"] == 0) & (noisy["k"] >= 1)
    noisy.loc[slow, "t_verify_mean_s"] *= 1.1
    noisy.loc[slow, "t_step_mean_s"] = noisy.loc[slow, ["t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"]].sum(axis=1)
    shaken = pn.state_noise(noisy, test, "quiet", resamples=40, unit="turn", seed=3)
    assert (shaken["pred_rel_se"] > 0.003).all() and (shaken["rel_error"] < 0).all()
    assert 0 < pn.summary(shaken)["expected_outside"] < 6
    with pytest.raises(ValueError, match="resamples"):
        pn.state_noise(cal, test, "quiet", resamples=1)
