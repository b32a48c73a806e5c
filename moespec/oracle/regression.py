"""The verification-cost and draft-time regressions of paper 2 (Section 3.3, Appendix A.5–A.8).

- ``fit_categorical``: eq. (4), T_T = beta0(m) + alpha(m) Ubar + c L, categorical in m, shared c.
- ``fit_per_k``: Table A4, T_T = beta0 + alpha Ubar + c L separately for each K.
- ``fit_pooled``: eq. (A3), T_T = beta0 + alpha Ubar + c L + gamma K.
- ``fit_draft``: eq. (A4), T_D = a K + b.
- ``fit_target_cost``: the oracle's t_target = beta0 + alpha Ubar + c L on all rounds.
The two fits that make the oracle's cost model (``fit_draft``, ``fit_target_cost``) are least squares
under the constraint that every coefficient is >= 0 (each is a time: a baseline, a time per unique
expert, per context token, per drafted token), so that no Cost(i, k, a) of eq. (8) can be negative
anywhere. Where ordinary OLS already gives non-negative coefficients the two coincide; a term held at
0 is named in ``Fit.held_at_zero`` with its unconstrained estimate.
OLS (statsmodels) with standard errors clustered by generation; out-of-sample R², RMSE, MAPE and
MedAPE from GroupKFold(5) by generation (scikit-learn), so no generation is split across folds.
``factor_importance`` follows Table A2's protocol.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf
from scipy import optimize, stats
from sklearn.model_selection import GroupKFold, StratifiedGroupKFold

from .rounds import validate_rounds

CATEGORICAL = "T_T_ms ~ 0 + C(m) + C(m):ubar + L"     # eq. (4)
PER_K = "T_T_ms ~ ubar + L"                            # Table A4 (within one K)
POOLED = "T_T_ms ~ ubar + L + K"                       # eq. (A3)
UBAR_L = "T_T_ms ~ ubar + L"                           # eq. (3) with the context term (A.9): the oracle's t_target


def group_folds(groups, n_splits: int = 5, strata=None):
    """GroupKFold splits ``[(train_idx, test_idx), ...]``; every group lies in exactly one test fold.

    With ``strata`` (e.g. K per round) the folds are StratifiedGroupKFold's: still whole generations
    per fold, but each K spread over the folds, so that a categorical model (eq. 4) sees every level
    of m in training even when there are few generations per K.
    """
    groups = np.asarray(groups)
    n_groups = len(np.unique(groups))
    if n_groups < n_splits:
        raise ValueError(f"GroupKFold({n_splits}) needs at least {n_splits} generations; got {n_groups}")
    if strata is None:
        return list(GroupKFold(n_splits=n_splits).split(np.zeros(len(groups)), groups=groups))
    return list(StratifiedGroupKFold(n_splits=n_splits).split(np.zeros(len(groups)), np.asarray(strata),
                                                               groups=groups))


def ols(formula: str, df: pd.DataFrame, cluster: str = "gen_id"):
    """OLS fit with standard errors clustered by ``cluster`` (statsmodels results object)."""
    groups = pd.factorize(df[cluster])[0]
    return smf.ols(formula, data=df).fit(cov_type="cluster", cov_kwds={"groups": groups})


#: Figure A4's six dimensionless metrics (columns of :func:`_errors`' result).
SIX_METRICS = ("one_minus_r2", "medape_pct", "mape_pct", "nmae_pct", "nrmse_pct", "p95ape_pct")


def _errors(y: np.ndarray, yhat: np.ndarray) -> dict:
    """R², RMSE and Figure A4's six dimensionless metrics of predictions ``yhat`` of ``y``:
    1 - R², MedAPE, MAPE, P95 APE (absolute percentage errors), nMAE and nRMSE (MAE and RMSE over
    the mean of ``y``, in %)."""
    resid = y - yhat
    ape = np.abs(resid) / np.abs(y)
    ss_tot = np.sum((y - y.mean()) ** 2)
    r2 = float(1 - np.sum(resid ** 2) / ss_tot) if ss_tot > 0 else float("nan")
    rmse = float(np.sqrt(np.mean(resid ** 2)))
    return {"r2": r2, "rmse_ms": rmse,
            "mape_pct": float(100 * ape.mean()), "medape_pct": float(100 * np.median(ape)),
            "one_minus_r2": 1 - r2, "nmae_pct": float(100 * np.mean(np.abs(resid)) / np.mean(y)),
            "nrmse_pct": float(100 * rmse / np.mean(y)), "p95ape_pct": float(100 * np.quantile(ape, 0.95))}


def cross_validate(formula: str, df: pd.DataFrame, n_splits: int = 5, group: str = "gen_id") -> pd.DataFrame:
    """Out-of-sample errors per GroupKFold fold (one row per fold: r2, rmse_ms, mape_pct, medape_pct)."""
    target = formula.split("~")[0].strip()
    rows = []
    strata = df["K"] if "C(m)" in formula else None
    for f, (tr, te) in enumerate(group_folds(df[group], n_splits, strata)):
        fit = smf.ols(formula, data=df.iloc[tr]).fit()
        test = df.iloc[te]
        if strata is not None:
            unseen = set(test["m"]) - set(df.iloc[tr]["m"])
            if unseen:
                raise ValueError(f"GroupKFold fold {f}: m = {sorted(unseen)} only in the held-out generations; "
                                 "record more generations per K")
        rows.append({"fold": f, "n_test": len(te),
                     **_errors(test[target].to_numpy(), np.asarray(fit.predict(test)))})
    return pd.DataFrame(rows)


def _ci(values, level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of a t-interval across folds (n - 1 degrees of freedom, as Table A2)."""
    v = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.5 + level / 2, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))
    return float(v.mean()), float(half)


@dataclass
class Fit:
    """A fitted model: coefficient table (estimate, clustered se), in-sample and out-of-sample errors."""
    name: str
    formula: str
    coef: pd.DataFrame      # columns: term, estimate, se, p
    n: int
    clusters: int
    r2: float
    cv: pd.DataFrame        # per-fold out-of-sample errors
    held_at_zero: dict[str, float] = field(default_factory=dict)   # term -> its unconstrained OLS estimate

    def summary(self) -> dict:
        out = {"model": self.name, "n": self.n, "clusters": self.clusters, "r2_in": self.r2}
        for col in ("r2", "rmse_ms", "mape_pct", "medape_pct"):
            out[f"cv_{col}"] = float(self.cv[col].mean())
        return out


def _fit(name: str, formula: str, df: pd.DataFrame, n_splits: int, res=None) -> Fit:
    """``formula`` fitted on ``df`` (``res``: its :func:`ols` results where the caller has them)."""
    res = ols(formula, df) if res is None else res
    coef = pd.DataFrame({"term": res.params.index, "estimate": res.params.values,
                         "se": res.bse.values, "p": res.pvalues.values})
    return Fit(name, formula, coef, int(res.nobs), int(df["gen_id"].nunique()), float(res.rsquared),
               cross_validate(formula, df, n_splits))


def _formula(target: str, terms: list[str]) -> str:
    regressors = [t for t in terms if t != "Intercept"]
    if not regressors:
        return f"{target} ~ 1"
    return f"{target} ~ {'' if 'Intercept' in terms else '0 + '}{' + '.join(regressors)}"


def _fit_nonnegative(name: str, target: str, regressors: list[str], df: pd.DataFrame, n_splits: int) -> Fit:
    """Least squares of ``target`` on an intercept and ``regressors`` with every coefficient >= 0
    (scipy's NNLS). The constrained optimum is the OLS fit on the terms it leaves free (its KKT
    conditions), so that fit supplies the clustered standard errors and the GroupKFold errors; the
    terms at 0 are listed with estimate 0, se and p NaN."""
    terms = ["Intercept", *regressors]
    ols_all = ols(_formula(target, terms), df)
    if (ols_all.params >= 0).all():
        return _fit(name, _formula(target, terms), df, n_splits, ols_all)
    X = np.column_stack([np.ones(len(df)), *(df[r].to_numpy(float) for r in regressors)])
    solution, _ = optimize.nnls(X, df[target].to_numpy(float))
    free = [t for t, v in zip(terms, solution) if v > 0]
    if not free:
        raise ValueError(f"{name}: no coefficient of {target} ~ {' + '.join(regressors)} is positive under the "
                         "constraint that each is >= 0 (the rounds do not determine a time)")
    fit = _fit(name, _formula(target, free), df, n_splits)
    held = {t: float(ols_all.params[t]) for t in terms if t not in free}
    at_zero = pd.DataFrame({"term": list(held), "estimate": 0.0, "se": np.nan, "p": np.nan})
    coef = pd.concat([fit.coef, at_zero], ignore_index=True).set_index("term").loc[terms].reset_index()
    fit.coef, fit.held_at_zero = coef, held
    return fit


def fit_categorical(df: pd.DataFrame, n_splits: int = 5) -> Fit:
    """Eq. (4) with free beta0(m), alpha(m) and a shared c; clustered se; GroupKFold CV."""
    return _fit("categorical (4)", CATEGORICAL, validate_rounds(df), n_splits)


def categorical_table(fit: Fit) -> pd.DataFrame:
    """Eq. (4) coefficients as one row per m: beta0, alpha with clustered se, and the shared c."""
    c = fit.coef.set_index("term")
    ms = sorted(int(t[5:-1]) for t in c.index if t.startswith("C(m)[") and ":" not in t)
    rows = [{"m": m, "K": m - 1,
             "beta0_ms": c.loc[f"C(m)[{m}]", "estimate"], "beta0_se": c.loc[f"C(m)[{m}]", "se"],
             "alpha_ms_per_expert": c.loc[f"C(m)[{m}]:ubar", "estimate"],
             "alpha_se": c.loc[f"C(m)[{m}]:ubar", "se"],
             "c_ms_per_token": c.loc["L", "estimate"], "c_se": c.loc["L", "se"]} for m in ms]
    return pd.DataFrame(rows)


def fit_per_k(df: pd.DataFrame, n_splits: int = 5) -> pd.DataFrame:
    """Table A4: T_T = beta0 + alpha Ubar + c L fitted separately for each K (clustered se, CV)."""
    df = validate_rounds(df)
    rows = []
    for K, sub in df.groupby("K"):
        f = _fit(f"K={K}", PER_K, sub, n_splits)
        c = f.coef.set_index("term")
        rows.append({"K": int(K), "m": int(K) + 1, "n": f.n, "generations": f.clusters,
                     "beta0_ms": c.loc["Intercept", "estimate"], "beta0_se": c.loc["Intercept", "se"],
                     "alpha_ms_per_expert": c.loc["ubar", "estimate"], "alpha_se": c.loc["ubar", "se"],
                     "c_ms_per_token": c.loc["L", "estimate"], "c_se": c.loc["L", "se"],
                     "r2_in": f.r2,
                     "cv_r2": float(f.cv.r2.mean()), "cv_mape_pct": float(f.cv.mape_pct.mean()),
                     "cv_medape_pct": float(f.cv.medape_pct.mean())})
    return pd.DataFrame(rows)


def fit_pooled(df: pd.DataFrame, n_splits: int = 5) -> Fit:
    """Eq. (A3): one model for all K with a linear budget coefficient gamma."""
    return _fit("pooled (A3)", POOLED, validate_rounds(df), n_splits)


def fit_draft(df: pd.DataFrame, n_splits: int = 5) -> Fit:
    """Eq. (A4): T_D = a K + b with a, b >= 0 (:func:`_fit_nonnegative`)."""
    return _fit_nonnegative("draft (A4)", "T_D_ms", ["K"], validate_rounds(df), n_splits)


def fit_target_cost(df: pd.DataFrame, n_splits: int = 5) -> Fit:
    """The oracle's t_target(U, L) = beta0 + alpha U + c L on all rounds (one alpha, Section 4.2),
    with beta0, alpha, c >= 0 (:func:`_fit_nonnegative`)."""
    return _fit_nonnegative("Ubar + L (oracle t_target)", "T_T_ms", ["ubar", "L"], validate_rounds(df), n_splits)


def coefficient(fit: Fit, term: str) -> tuple[float, float]:
    """(estimate, clustered se) of one term."""
    row = fit.coef.set_index("term").loc[term]
    return float(row["estimate"]), float(row["se"])


FACTORS = {"ubar": "ubar", "L": "L", "m": "m", "kv_use": "kv_use", "umax": "umax",
           "round_idx": "round_idx"}


def factor_importance(df: pd.DataFrame, factors=tuple(FACTORS), base: str = "ubar",
                      n_splits: int = 5) -> pd.DataFrame:
    """Table A2's protocol: standalone OOS R² / RMSE of T_T ~ factor (mean, 95% t-interval over the
    GroupKFold folds), and the paired RMSE reduction of T_T ~ base + factor over T_T ~ base."""
    df = validate_rounds(df)
    base_cv = cross_validate(f"T_T_ms ~ {base}", df, n_splits)
    rows = []
    for f in factors:
        alone = cross_validate(f"T_T_ms ~ {f}", df, n_splits)
        r2, r2_h = _ci(alone.r2)
        rmse, rmse_h = _ci(alone.rmse_ms)
        row = {"factor": f, "oos_r2": r2, "oos_r2_ci": r2_h, "oos_rmse_ms": rmse, "oos_rmse_ci": rmse_h}
        if f != base:
            both = cross_validate(f"T_T_ms ~ {base} + {f}", df, n_splits)
            d, d_h = _ci(base_cv.rmse_ms.to_numpy() - both.rmse_ms.to_numpy())
            row.update({"rmse_reduction_over_base_ms": d, "rmse_reduction_ci": d_h})
        else:
            row.update({"rmse_reduction_over_base_ms": 0.0, "rmse_reduction_ci": 0.0})
        rows.append(row)
    return pd.DataFrame(rows)


@dataclass
class RoundFits:
    """Paper 2's regressions on one set of rounds (all, or one bandwidth regime): Table A4 per K,
    eq. (4), (A3), the oracle's t_target, (A4) and Table A2's factors."""
    label: str
    rounds: int
    per_k: pd.DataFrame
    categorical: Fit
    pooled: Fit
    target_cost: Fit
    draft: Fit
    factors: pd.DataFrame

    def summary(self) -> dict:
        """The headline numbers: eq. (4)'s in-sample R2 and GroupKFold MAPE, per-K ranges, (A3), (A4)."""
        return {"rows": self.label, "rounds": self.rounds, "eq4_r2_in": self.categorical.r2,
                "eq4_cv_mape_pct": float(self.categorical.cv.mape_pct.mean()),
                "per_k_r2_min": float(self.per_k.r2_in.min()), "per_k_r2_max": float(self.per_k.r2_in.max()),
                "per_k_cv_mape_min": float(self.per_k.cv_mape_pct.min()),
                "per_k_cv_mape_max": float(self.per_k.cv_mape_pct.max()),
                "pooled_alpha": coefficient(self.pooled, "ubar")[0], "pooled_gamma": coefficient(self.pooled, "K")[0],
                "pooled_c": coefficient(self.pooled, "L")[0], "pooled_beta0": coefficient(self.pooled, "Intercept")[0],
                "target_alpha": coefficient(self.target_cost, "ubar")[0],
                "target_r2_in": self.target_cost.r2,
                "draft_a_ms": coefficient(self.draft, "K")[0], "draft_b_ms": coefficient(self.draft, "Intercept")[0]}


def fit_rounds(rounds: pd.DataFrame, label: str = "all rows", n_splits: int = 5) -> RoundFits:
    """Every regression of paper 2 on ``rounds``: the speculative rounds (K >= 1) for Table A4,
    eq. (4), (A3), (A4) and Table A2; all rounds (K = 0 too) for the oracle's t_target."""
    spec = rounds[rounds.K >= 1]
    few = {int(K): int(g.gen_id.nunique()) for K, g in spec.groupby("K") if g.gen_id.nunique() < n_splits or len(g) <= 4}
    if spec.empty or few:
        raise ValueError(f"{label}: too few rounds to fit (generations per K below {n_splits} or 4 rounds or fewer: "
                         f"{few or 'no speculative rounds'})")
    try:
        return RoundFits(label, int(len(spec)), fit_per_k(spec, n_splits), fit_categorical(spec, n_splits),
                         fit_pooled(spec, n_splits), fit_target_cost(rounds, n_splits), fit_draft(spec, n_splits),
                         factor_importance(spec, n_splits=n_splits))
    except (ZeroDivisionError, np.linalg.LinAlgError) as exc:   # as many parameters as rounds somewhere
        raise ValueError(f"{label}: the rounds do not determine the regressions ({type(exc).__name__}: {exc})") from None
