"""Round records (eq. 5) and the regressions (4), (A3), (A4), Table A2 on synthetic rounds with known coefficients."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from fakes import synthetic_rounds

from moespec.oracle import regression as R
from moespec.oracle.rounds import ubar, validate_rounds
from moespec.routing.stats import union_sizes

COEF = {"beta0": {m: 4.0 + 0.5 * m - (2.0 if m >= 5 else 0.0) for m in range(2, 12)},
        "alpha": {m: (0.08 if m <= 4 else 0.26) for m in range(2, 12)},
        "c": 1.1e-3, "draft_a": 0.46, "draft_b": 0.07}


@pytest.fixture(scope="module")
def rounds():
    return synthetic_rounds(COEF, ks=range(1, 11), generations_per_k=12, rounds_per_gen=30, seed=3)


def test_union_sizes_hand_case():
    ids = np.array([[[0, 1]], [[1, 2]], [[3, 0]], [[2, 3]]])      # [T=4, layers=1, topk=2]
    np.testing.assert_array_equal(union_sizes(ids, 4)[:, 0], [2, 3, 4, 4])
    two = np.stack([ids[:, 0], np.array([[5, 6], [5, 6], [5, 6], [7, 6]])], axis=1)   # 2 layers
    assert ubar(two, 8) == pytest.approx((4 + 3) / 2)
    with pytest.raises(ValueError, match="0..3"):
        union_sizes(ids + 1, 4)


def test_categorical_model_recovers_coefficients(rounds):
    fit = R.fit_categorical(rounds)
    tab = R.categorical_table(fit)
    for _, row in tab.iterrows():
        m = int(row.m)
        assert abs(row.alpha_ms_per_expert - COEF["alpha"][m]) < 4 * row.alpha_se + 1e-3
        assert abs(row.beta0_ms - COEF["beta0"][m]) < 4 * row.beta0_se + 0.02
    assert tab.c_ms_per_token.iloc[0] == pytest.approx(COEF["c"], abs=4 * tab.c_se.iloc[0])
    assert fit.r2 > 0.99 and fit.cv.mape_pct.mean() < 2.0


def test_draft_model_and_pooled_model(rounds):
    d = R.fit_draft(rounds)
    assert R.coefficient(d, "K")[0] == pytest.approx(0.46, abs=0.005)
    assert R.coefficient(d, "Intercept")[0] == pytest.approx(0.07, abs=0.01)
    pooled = R.fit_pooled(rounds)
    assert set(pooled.coef.term) == {"Intercept", "ubar", "L", "K"}
    # the pooled form cannot express the m = 4/5 break: worse out of sample than (4)
    assert pooled.cv.mape_pct.mean() > R.fit_categorical(rounds).cv.mape_pct.mean()


def test_per_k_fits_and_clustered_se(rounds):
    tab = R.fit_per_k(rounds)
    assert list(tab.K) == list(range(1, 11))
    assert np.allclose(tab.alpha_ms_per_expert, [COEF["alpha"][k + 1] for k in range(1, 11)], atol=0.01)
    # clustered se differ from the plain OLS se (rounds share a per-generation offset)
    import statsmodels.formula.api as smf
    sub = rounds[rounds.K == 6]
    plain = smf.ols(R.PER_K, data=sub).fit().bse["Intercept"]
    assert tab.set_index("K").beta0_se[6] != pytest.approx(plain, rel=0.05)


def test_groupkfold_never_splits_a_generation(rounds):
    folds = R.group_folds(rounds.gen_id, 5)
    seen = []
    for tr, te in folds:
        assert not set(rounds.gen_id.iloc[tr]) & set(rounds.gen_id.iloc[te])
        seen += list(set(rounds.gen_id.iloc[te]))
    assert sorted(seen) == sorted(rounds.gen_id.unique())    # each generation tested exactly once
    with pytest.raises(ValueError, match="at least 5 generations"):
        R.group_folds(["a", "a", "b"], 5)


def test_factor_importance_protocol(rounds):
    tab = R.factor_importance(rounds, factors=("ubar", "L", "m")).set_index("factor")
    assert tab.oos_r2.idxmax() == "ubar"
    assert tab.loc["ubar", "rmse_reduction_over_base_ms"] == 0
    assert tab.loc["m", "rmse_reduction_over_base_ms"] > 0     # m carries the alpha(m) break


def test_validate_rounds_rejects_bad_tables(rounds):
    with pytest.raises(ValueError, match="missing columns"):
        validate_rounds(rounds.drop(columns=["ubar"]))
    bad = rounds.copy()
    bad.loc[3, "m"] = 99
    with pytest.raises(ValueError, match="m must equal K \\+ 1"):
        validate_rounds(bad)
    bad = rounds.copy()
    bad.loc[0, "T_T_ms"] = -1.0
    with pytest.raises(ValueError, match="negative times"):
        validate_rounds(bad)
    bad = rounds.copy()
    bad.loc[0, "ubar"] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        validate_rounds(bad)


def test_stratified_group_folds_keep_generations_whole(rounds):
    folds = R.group_folds(rounds.gen_id, 5, strata=rounds.K)
    for tr, te in folds:
        assert not set(rounds.gen_id.iloc[tr]) & set(rounds.gen_id.iloc[te])
        assert set(rounds.K.iloc[tr]) == set(rounds.K)          # every K seen in training


def test_cost_model_fits_hold_a_negative_coefficient_at_zero(rounds):
    """The oracle's t_target and t_draft are least squares with every coefficient >= 0: equal to OLS
    where OLS is non-negative, else scipy's bounded least squares (an independent solver), with the
    term at 0 named; the resulting cost matrix is >= 0 everywhere."""
    from scipy.optimize import lsq_linear

    from moespec.oracle.analysis import cost_model_from_fits
    from moespec.oracle.cost import cost_matrix

    ok = R.fit_target_cost(rounds)
    assert ok.held_at_zero == {}
    plain = R.ols(R.UBAR_L, rounds).params
    assert R.coefficient(ok, "L")[0] == pytest.approx(plain["L"], rel=1e-12)
    # context that lowers the time: OLS gives c < 0, the constrained fit c = 0
    bent = rounds.assign(T_T_ms=rounds.T_T_ms - 0.01 * rounds.L + 6.0)
    assert R.ols(R.UBAR_L, bent).params["L"] < 0
    fit = R.fit_target_cost(bent)
    assert set(fit.held_at_zero) == {"L"} and fit.held_at_zero["L"] < 0
    X = np.column_stack([np.ones(len(bent)), bent.ubar, bent.L])
    expect = lsq_linear(X, bent.T_T_ms.to_numpy(), bounds=(0, np.inf), tol=1e-12).x
    got = [R.coefficient(fit, t)[0] for t in ("Intercept", "ubar", "L")]
    assert got == pytest.approx(expect, abs=1e-9)
    assert np.isnan(R.coefficient(fit, "L")[1]) and fit.formula == "T_T_ms ~ ubar"
    # a draft whose intercept OLS puts below 0
    slow = rounds.assign(T_D_ms=0.5 * rounds.K - 0.3)
    draft = R.fit_draft(slow)
    assert set(draft.held_at_zero) == {"Intercept"}
    assert R.coefficient(draft, "Intercept")[0] == 0.0 and R.coefficient(draft, "K")[0] > 0
    # a draft whose time falls with K (a free draft's noise): the slope held at 0, the mean left
    flat = rounds.assign(T_D_ms=0.05 - 0.001 * rounds.K)
    level = R.fit_draft(flat)
    assert set(level.held_at_zero) == {"K"} and level.formula == "T_D_ms ~ 1"
    assert R.coefficient(level, "Intercept")[0] == pytest.approx(flat.T_D_ms.mean(), rel=1e-12)
    model = cost_model_from_fits(fit, draft)
    U = np.full((3, 4, 5), 2.0)
    assert (cost_matrix(U, np.array([0.0, 10.0, 5000.0]), model) >= 0).all()
