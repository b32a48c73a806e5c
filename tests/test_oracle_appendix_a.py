"""Paper 2's Appendix A analyses (moespec.oracle.categories, budget, robustness) on hand cases and
synthetic rounds with known laws: each estimator against an independent computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.formula.api as smf
from fakes import synthetic_rounds

from moespec.oracle import budget, categories, robustness
from moespec.oracle import regression as R
from moespec.tables import oracle_appendix_a as tables
from moespec.paper_reference import PAPER2_LABEL as PAPER_LABEL

COEF = {"beta0": {m: 4.0 + 0.5 * m for m in range(2, 8)}, "alpha": {m: 0.08 if m <= 3 else 0.26 for m in range(2, 8)},
        "c": 1.1e-3, "draft_a": 0.46, "draft_b": 0.07}


def with_categories(rounds: pd.DataFrame, names) -> pd.DataFrame:
    """Each generation's category by its index within K (synthetic_rounds' g), cycling over ``names``."""
    g = rounds.gen_id.str.extract(r"-g(\d+)$")[0].astype(int)
    return rounds.assign(category=[names[i % len(names)] for i in g])


@pytest.fixture(scope="module")
def rounds():
    # 24 generations per K over categories a, b (12 each), c (the rest, none); every K 1..6
    return with_categories(synthetic_rounds(COEF, ks=range(1, 7), generations_per_k=24, rounds_per_gen=8, seed=5),
                           ["a", "b"])


# --- clustered standard errors, Huber, trimming, bootstrap --------------------------------------------------
def test_clustered_se_is_the_sandwich_formula():
    rng = np.random.default_rng(0)
    G, per = 9, 7
    df = pd.DataFrame({"gen_id": np.repeat([f"g{i}" for i in range(G)], per), "x": rng.normal(size=G * per),
                       "z": rng.uniform(0, 5, G * per)})
    df["y"] = 1 + 2 * df.x - 0.5 * df.z + np.repeat(rng.normal(size=G), per) + rng.normal(size=G * per)
    X = np.column_stack([np.ones(len(df)), df.x, df.z])
    bread = np.linalg.inv(X.T @ X)
    u = df.y.to_numpy() - X @ (bread @ X.T @ df.y.to_numpy())
    meat = sum(np.outer(X[g].T @ u[g], X[g].T @ u[g]) for g in [np.flatnonzero(df.gen_id == f"g{i}") for i in range(G)])
    n, k = X.shape
    V = G / (G - 1) * (n - 1) / (n - k) * bread @ meat @ bread
    np.testing.assert_allclose(R.ols("y ~ x + z", df).bse.to_numpy(), np.sqrt(np.diag(V)), rtol=1e-10)


def hand_huber(X, y, t=1.345, iters=200):
    """IRLS with Huber weights and the MAD scale of the residuals (about 0), from OLS."""
    beta = np.linalg.lstsq(X, y, rcond=None)[0]
    for _ in range(iters):
        r = y - X @ beta
        s = np.median(np.abs(r)) / 0.6744897501960817
        z = np.abs(r / s)
        w = np.where(z <= t, 1.0, t / np.maximum(z, 1e-300))
        beta = np.linalg.solve(X.T @ (w[:, None] * X), X.T @ (w * y))
    return beta


def test_huber_against_a_hand_irls_and_against_ols_under_outliers():
    rng = np.random.default_rng(1)
    df = pd.DataFrame({"ubar": rng.uniform(8, 40, 60), "L": rng.integers(20, 300, 60).astype(float)})
    df["T_T_ms"] = 3 + 0.25 * df.ubar + 0.002 * df.L + rng.normal(0, 0.1, 60)
    df.loc[:4, "T_T_ms"] += 20.0                       # five gross outliers
    X = np.column_stack([np.ones(60), df.ubar, df.L])
    fit = robustness.huber(df)
    np.testing.assert_allclose(fit.params.to_numpy(), hand_huber(X, df.T_T_ms.to_numpy()), rtol=1e-6)
    ols = smf.ols(robustness.MODEL, df).fit().params
    assert abs(fit.params["Intercept"] - 3) < 0.1 < abs(ols["Intercept"] - 3)     # the outliers pull OLS, not Huber


def test_trimming_drops_the_largest_residuals_only():
    x = np.arange(200, dtype=float)
    df = pd.DataFrame({"ubar": x, "L": (x * 7) % 13, "T_T_ms": 1 + 2 * x + 0.5 * ((x * 7) % 13)})
    df.loc[17, "T_T_ms"] += 500.0
    df.loc[120, "T_T_ms"] -= 300.0
    kept = robustness.trimmed(df, share=0.01)          # ceil(0.01 x 200) = 2 rounds dropped
    assert len(kept) == 198 and {17, 120}.isdisjoint(kept.index)
    assert list(robustness.trimmed(df, share=0.005).index) == [i for i in range(200) if i != 17]
    params = R.ols(robustness.MODEL, kept.assign(gen_id=kept.index % 10)).params
    np.testing.assert_allclose(params[["Intercept", "ubar", "L"]], [1, 2, 0.5], atol=1e-9)


def test_cluster_bootstrap_of_a_mean_on_a_hand_case():
    # y ~ 1 on equal clusters: each resample's estimate is the mean of the drawn clusters' means
    means = np.array([1.0, 2.0, 4.0, 8.0, 16.0])
    df = pd.DataFrame({"gen_id": np.repeat(list("abcde"), 3), "T_T_ms": np.repeat(means, 3) + np.tile([-1, 0, 1], 5)})
    boot = robustness.cluster_bootstrap(df, "T_T_ms ~ 1", n_boot=999, seed=7)
    rng = np.random.default_rng(7)
    expected = [means[rng.integers(0, 5, 5)].mean() for _ in range(999)]
    np.testing.assert_allclose(boot.Intercept.to_numpy(), expected, rtol=1e-12)
    lo, hi = np.quantile(expected, [0.025, 0.975])
    assert boot.Intercept.quantile(0.025) == pytest.approx(lo) and boot.Intercept.quantile(0.975) == pytest.approx(hi)
    assert 1.0 <= lo < means.mean() < hi <= 16.0


def test_robustness_table_on_an_exact_law_agrees_everywhere(rounds):
    exact = rounds.assign(T_T_ms=2 + 0.3 * rounds.ubar + 1e-3 * rounds.L)
    table = robustness.robustness_table(exact, n_boot=50)
    assert table.K.iloc[0] == 6 and len(table) == 7        # OLS, bootstrap, Huber, trimmed, 2 halves, LOCO
    np.testing.assert_allclose(table[["alpha_ms_per_expert", "alpha_ms_per_expert_lo", "alpha_ms_per_expert_hi"]],
                               0.3, atol=1e-8)
    np.testing.assert_allclose(table.c_ms_per_token, 1e-3, atol=1e-9)
    halves = table[table.method.str.startswith("run half")]
    assert list(halves.generations) == [12, 12] and halves.rounds.sum() == (exact.K == 6).sum()


def test_run_halves_follow_the_generations_recording_order():
    df = pd.DataFrame({"gen_id": ["g3", "g3", "g1", "g2", "g1", "g0"]})
    first, second = robustness.run_halves(df)
    assert list(first.gen_id) == ["g3", "g3", "g1", "g1"] and list(second.gen_id) == ["g2", "g0"]


def test_breusch_pagan_separates_homoscedastic_from_heteroscedastic_noise():
    rng = np.random.default_rng(2)
    n = 2000
    df = pd.DataFrame({"ubar": rng.uniform(8, 40, n), "L": rng.uniform(20, 300, n)})
    base = 3 + 0.25 * df.ubar + 0.001 * df.L
    homo = robustness.breusch_pagan(df.assign(T_T_ms=base + rng.normal(0, 0.2, n)))
    hetero = robustness.breusch_pagan(df.assign(T_T_ms=base + rng.normal(0, 1, n) * 0.02 * df.ubar))
    assert homo["lm_p"] > 0.01 and hetero["lm_p"] < 1e-10
    # LM = n R² of the squared residuals on the regressors (Breusch and Pagan's Koenker form)
    y = df.assign(T_T_ms=base + rng.normal(0, 1, n) * 0.02 * df.ubar)
    X = np.column_stack([np.ones(n), y.ubar, y.L])
    e2 = (y.T_T_ms.to_numpy() - X @ np.linalg.lstsq(X, y.T_T_ms.to_numpy(), rcond=None)[0]) ** 2
    fitted = X @ np.linalg.lstsq(X, e2, rcond=None)[0]
    r2 = 1 - np.sum((e2 - fitted) ** 2) / np.sum((e2 - e2.mean()) ** 2)
    assert robustness.breusch_pagan(y)["lm"] == pytest.approx(n * r2, rel=1e-9)


def test_binned_residuals_are_flat_for_a_correct_model(rounds):
    top = robustness.largest_k_rounds(rounds)
    bins = robustness.binned_residuals(top)
    assert set(bins.by) == {"L", "kv_use", "round_idx"} and (bins.groupby("by").rounds.sum() == len(top)).all()
    assert ((bins.lo <= 0) & (0 <= bins.hi)).mean() >= 0.8      # 95% intervals around a zero-mean residual


# --- the six metrics, the category minimum, by-category tables ----------------------------------------------
def test_six_metrics_on_a_hand_case():
    y, yhat = np.array([10.0, 20.0, 40.0, 50.0]), np.array([11.0, 18.0, 40.0, 55.0])
    e = R._errors(y, yhat)
    assert e["mape_pct"] == pytest.approx(100 * (0.1 + 0.1 + 0 + 0.1) / 4)
    assert e["medape_pct"] == pytest.approx(10.0) and e["p95ape_pct"] == pytest.approx(10.0)
    assert e["nmae_pct"] == pytest.approx(100 * 2.0 / 30.0)
    assert e["nrmse_pct"] == pytest.approx(100 * np.sqrt(30 / 4) / 30)
    assert e["one_minus_r2"] == pytest.approx(30 / 1000)


def test_category_minimum_names_the_excluded_and_why(rounds):
    # category c: 3 generations at K = 1 only; b loses its K = 6 generations but one
    thin = rounds.copy()
    thin.loc[(thin.category == "a") & (thin.K == 1) & thin.gen_id.str.match(r".*-g(0|2|4)$"), "category"] = "c"
    drop = thin.index[(thin.category == "b") & (thin.K == 6) & ~thin.gen_id.str.endswith("-g1")]
    thin = thin.drop(drop)
    included, excluded = categories.category_minimum(thin, 10, 2)
    assert included == ["a"]
    reasons = excluded.set_index("category").reason
    assert reasons["c"].startswith("3 generations, fewer than the minimum 10") and "K = 2 (0)" in reasons["c"]
    assert reasons["b"] == "fewer than 2 generations at K = 6 (1)"
    a5 = categories.model_by_category(thin)
    assert list(a5.category) == ["a", categories.POOL, "b", "c"]
    assert list(a5.status) == ["included", "included", "excluded", "excluded"]
    assert a5.alpha_ms_per_expert.iloc[2:].isna().all() and a5.reason.iloc[2:].tolist() == [reasons["b"], reasons["c"]]
    a3 = categories.factor_importance_by_category(thin)       # no per-K minimum: b is in, c is not
    assert set(a3.category[a3.status == "included"]) == {"a", "b", categories.POOL}
    assert a3.reason[a3.category == "c"].iloc[0] == "3 generations, fewer than the minimum 10"


def test_model_by_category_recovers_the_law_with_intervals(rounds):
    a5 = categories.model_by_category(rounds)
    inc = a5[a5.status == "included"]
    assert list(inc.K) == [6, 6, 6] and list(inc.generations_at_K) == [12, 12, 24]
    assert ((inc.alpha_ms_per_expert_lo < 0.26) & (0.26 < inc.alpha_ms_per_expert_hi)).all()
    for metric in R.SIX_METRICS:
        assert (inc[f"cv_{metric}_lo"] <= inc[f"cv_{metric}"]).all() and (inc[f"cv_{metric}"] <= inc[f"cv_{metric}_hi"]).all()
    a3 = categories.factor_importance_by_category(rounds)
    assert a3.category.iloc[-1] == categories.POOL and a3.oos_r2_ubar.iloc[0] >= a3.oos_r2_ubar.iloc[1]


# --- the pooled form per K and leave-one-K-out --------------------------------------------------------------
def test_leave_one_k_out_of_an_exact_linear_law_is_exact(rounds):
    exact = rounds.assign(T_T_ms=5 + 0.3 * rounds.ubar + 1e-3 * rounds.L + 0.5 * rounds.K)
    loko = budget.leave_one_k_out(exact)
    assert list(loko.K) == ["1", "2", "3", "4", "5", "6", "mean"]
    assert loko.mape_pct.max() < 1e-8
    per_k = budget.pooled_by_k(exact)
    assert per_k.mape_pct.max() < 1e-8
    np.testing.assert_allclose(per_k.pooled_intercept_at_median_L_ms, 5 + 1e-3 * per_k.median_L + 0.5 * per_k.K)
    np.testing.assert_allclose(per_k.per_k_intercept_at_median_L_ms, per_k.pooled_intercept_at_median_L_ms, atol=1e-6)


def test_leave_one_k_out_sees_the_regime_change(rounds):
    # the synthetic law's slope jumps at m = 4: a pooled linear K misses the held-out ends
    loko = budget.leave_one_k_out(rounds).set_index("K")
    assert loko.loc["1", "mape_pct"] > 1.0 and loko.loc["mean", "mape_pct"] == pytest.approx(
        loko.mape_pct.drop("mean").mean())
    assert (loko.drop("mean").mape_lo < loko.drop("mean").mape_pct).all()
    with pytest.raises(ValueError, match="at least 3 values of K"):
        budget.leave_one_k_out(rounds[rounds.K <= 2])


# --- paper 2's values beside ours ---------------------------------------------------------------------------
def test_tables_show_paper_values_labelled_as_theirs(rounds):
    a7 = tables.table_a7(robustness.robustness_table(rounds, n_boot=20))
    theirs = a7[a7.source == PAPER_LABEL]
    assert len(theirs) == 1 and theirs.alpha_ms_per_expert.iloc[0] == "0.2642-0.2650"
    assert (a7.source[:-1] == tables.OURS).all()
    a1 = tables.table_a1(rounds)
    assert a1.median_L.iloc[-1] == "586-606" and a1.rounds.dtype == "Int64"
    loko = tables.table_leave_one_k_out(budget.leave_one_k_out(rounds))
    assert loko[loko.source == PAPER_LABEL].mape_pct.tolist() == ["12.7", "15.1", "5.2"]


def test_a_category_whose_fit_fails_is_excluded_with_the_error(rounds, monkeypatch):
    real = R.fit_categorical

    def fails_for_b(df, n_splits=5):
        if set(df.category) == {"b"}:
            raise np.linalg.LinAlgError("Singular matrix")
        return real(df, n_splits)

    monkeypatch.setattr(R, "fit_categorical", fails_for_b)
    a5 = categories.model_by_category(rounds).set_index("category")
    assert a5.loc["b", "status"] == "excluded" and a5.loc["b", "reason"] == "the fit failed: LinAlgError: Singular matrix"
    assert a5.loc["a", "status"] == "included" and a5.loc[categories.POOL, "status"] == "included"
