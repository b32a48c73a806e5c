"""The regret sizing (moespec.advice.measured.regret_sizing): hand cases where the answer is known,
its response to the spread and to more prompts, the refusal of a shape it cannot use, and the
script on the committed run."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec import paths
from moespec.advice.measured import regret_sizing, run_regret_sizing

SPEED = pd.Series([1.10, 1.30, 1.20], index=[1, 2, 3])


def test_no_spread_resolves_the_goal_at_any_size():
    reps = np.repeat(SPEED.to_numpy()[:, None], 3, axis=1)
    t = regret_sizing(SPEED, reps, k=2, reps=(2, 5), prompt_factors=(1,), trials=20, resamples=200)
    assert list(t["regret_hi_median"]) == [0.0, 0.0] and list(t["share_resolved"]) == [1.0, 1.0]
    assert list(t["rep_spread"]) == [0.0, 0.0]


def test_the_spread_is_the_pooled_spread_of_the_repetitions_and_prompts_shrink_it():
    reps = np.array([[1.0, 1.2], [1.3, 1.3], [1.2, 1.4]])      # variances 0.02, 0, 0.02: pooled sqrt(0.04 / 3)
    t = regret_sizing(SPEED, reps, k=2, reps=(3,), prompt_factors=(1, 4), trials=5, resamples=50)
    assert t["rep_spread"].tolist() == pytest.approx([np.sqrt(0.04 / 3), np.sqrt(0.04 / 3) / 2], rel=1e-12)


def test_a_large_spread_leaves_the_goal_unresolved_and_more_prompts_help():
    reps = np.array([[1.0, 1.2, 1.1], [1.2, 1.4, 1.3], [1.1, 1.3, 1.2]])   # spread 0.1 against a 0.1 gap
    t = regret_sizing(SPEED, reps, k=2, reps=(3,), prompt_factors=(1, 100), trials=60, resamples=300)
    few, many = t.iloc[0], t.iloc[1]
    assert few["share_resolved"] < 0.5 and few["regret_hi_median"] > 0.02
    assert many["share_resolved"] == 1.0 and many["regret_hi_median"] == 0.0


def test_a_shape_it_cannot_use_is_refused():
    with pytest.raises(ValueError, match=r"by_rep: expected one row per k of speedup \(3\) and at least two "
                                         r"repetitions; found shape \(3, 1\)"):
        regret_sizing(SPEED, np.ones((3, 1)), k=2)


def test_the_committed_run_per_state():
    t = run_regret_sizing(paths.committed_figures_dir(), reps=(3,), prompt_factors=(1,), trials=10, resamples=100)
    assert set(t["state"]) == {"quiet", "loaded"} and set(t["best_k"]) == {7}
    assert (t["rep_spread"] > 0).all() and t["share_resolved"].between(0, 1).all()
