"""moespec.predict.noise: the resampling keeps whole turns, a calibration without noise gives a
prediction without noise, a slow calibration turn shows as prediction noise, the counts and
notebook 05's goal row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec.predict import calibration as CAL
from moespec.predict import noise as NOISE
from moespec.predict import speculative as SP
from moespec.studies.goals import round_model_goals
from test_draftcost import _runs

TV = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3}
DRAFTS = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3)}


def _sweep(prompts: int = 4) -> pd.DataFrame:
    rows = _runs(0.6, TV, DRAFTS, h=0.5e-3, prompts=prompts, ks=(1, 2, 3))
    return pd.concat([rows, rows.assign(rep=1)], ignore_index=True)     # two repetitions: a measurement noise of 0


def _fit(rows):
    return CAL.from_draft_runs(rows, "synthetic", n_boot=20)


def _slow_turn(cal: pd.DataFrame) -> pd.DataFrame:
    """The calibration with turn 0's verify passes 10 % slow."""
    noisy = cal.copy()
    slow = (noisy["prompt"] == 0) & (noisy["k"] >= 1)
    noisy.loc[slow, "t_verify_mean_s"] *= 1.1
    noisy.loc[slow, "t_step_mean_s"] = noisy.loc[slow, ["t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s"]].sum(axis=1)
    return noisy


def test_resample_whole_turns():
    cal = _sweep()
    turns = NOISE.resample_calibration(cal.assign(t_verify_mean_s=cal["prompt"]), np.random.default_rng(1))
    assert len(turns) == len(cal) and turns["prompt"].nunique() == 4            # copies of a turn renumbered
    for _, g in turns.groupby("prompt"):                                         # every run of a drawn turn, together
        assert len(g) == len(cal) // 4 and g["t_verify_mean_s"].nunique() == 1


def test_no_noise_then_noise():
    cal, test = _sweep(), _sweep()[lambda f: f.dedup]
    pred = SP.real_draft_predictions(_fit(cal), test)
    quiet = NOISE.with_noise(pred, NOISE.prediction_se(cal, test, _fit, resamples=5))
    assert np.allclose(quiet["pred_rel_se"], 0, atol=1e-12) and np.allclose(quiet["noise_rel_sd"], 0, atol=1e-12)
    assert np.allclose(quiet["rel_error"], 0, atol=1e-9) and quiet["noise_p_outside"].eq(0).all()
    s = NOISE.noise_summary(quiet)
    assert (s["points"], s["outside"], s["expected_outside"], s["beyond_2sd"]) == (6, 0, 0.0, 0)
    # one turn of four 10 % slow: the fitted verify term is 2.5 % slow; resampling turns moves it by
    # 10 % times the spread of the share of slow turns drawn, sqrt(1/4 * 3/4 / 4) = 0.2165, so the
    # verify term's relative noise is about 2.2 % of the step's verify share
    noisy = _slow_turn(cal)
    se = NOISE.prediction_se(noisy, test, _fit, resamples=200, seed=3)
    shaken = NOISE.with_noise(SP.real_draft_predictions(_fit(noisy), test), se)
    assert (shaken["rel_error"] < 0).all() and (shaken["pred_rel_se"] > 0.005).all()
    assert (shaken["pred_rel_se"] < 0.1 * 0.2165 * 1.3).all()
    k1 = shaken[(shaken.k == 1) & (shaken.draft_cost == 0.0)].iloc[0]          # verify 14 of a 15 ms step at k = 1
    assert k1["pred_rel_se"] == pytest.approx(0.1 * 0.2165 * 14 / 15, rel=0.25)
    assert 0 <= NOISE.noise_summary(shaken)["expected_outside"] < 6
    with pytest.raises(ValueError, match="resamples"):
        NOISE.prediction_se(cal, test, _fit, resamples=1)
    with pytest.raises(ValueError, match=r"no prediction noise for \(draft cost, k\)"):
        NOISE.with_noise(pred, se.iloc[:-1])


def test_goal_row_and_phrase():
    cal, test = _sweep(), _sweep()[lambda f: f.dedup]
    noisy = _slow_turn(cal)
    pred = NOISE.with_noise(SP.real_draft_predictions(_fit(noisy), test),
                            NOISE.prediction_se(noisy, test, _fit, resamples=50, seed=1)).assign(state="quiet")
    plain = pd.DataFrame([{"state": "quiet", "context": "chat", "rel_error": 0.0}])
    goals = round_model_goals(plain, None, pred)
    row = goals[goals["goal"].str.startswith("real-draft prediction and measurement together resolve 5 %")].iloc[0]
    n = NOISE.noise_summary(pred)
    assert row["value"] == NOISE.prediction_noise_phrase(n) and bool(row["met"]) == (n["expected_outside"] < 0.5)
    assert f"about {n['expected_outside']:.1f} of 6 points" in row["value"]


def test_p_outside_hand_values():
    """P(|N(0, sd)| > tol): 0.3173 at sd = tol (one standard deviation), 0.0455 at sd = tol / 2, 0
    without noise; noise_summary's measurement-only count is the sum of it over the points."""
    assert SP.p_outside(0.05, 0.05) == pytest.approx(0.317311, abs=1e-6)
    assert SP.p_outside(0.025, 0.05) == pytest.approx(0.045500, abs=1e-6)
    assert SP.p_outside(0.0, 0.05) == 0.0
    f = pd.DataFrame({"k": [1, 2], "rel_error": [0.0, 0.06], "measured_rel_se": [0.05, 0.025],
                      "pred_rel_se": [0.0, 0.0], "noise_p_outside": [0.0, 0.0], "beyond_2sd": [False, True]})
    assert NOISE.noise_summary(f)["expected_outside_measurement_only"] == pytest.approx(0.317311 + 0.045500, abs=1e-5)
