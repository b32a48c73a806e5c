"""Paper 2's robustness checks of the cost model (Appendix A.9, Table A7 / Figure A7).

On the largest-K subsample, T_T = beta0 + alpha Ubar_r + c L (Table A4's per-K model) estimated by:
OLS with clustered 95% intervals (:func:`moespec.oracle.regression.ols`); a clustered bootstrap
over generations (percentile interval); Huber regression (statsmodels RLM, HuberT); OLS after
trimming the share of rounds with the largest absolute OLS residual; separate OLS fits on the two
halves of the run (generations in recording order: the first half of the generations as they first
appear in the rounds, then the rest); and leave-one-category-out (the range across the refits).
Also the Breusch-Pagan test, mean residuals binned by L, KV occupancy and position within the
generation, and A.9's ladder of nested specifications on all speculative rounds.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import patsy
import statsmodels.api as sm
import statsmodels.formula.api as smf
from statsmodels.stats.diagnostic import het_breuschpagan

from . import regression as R
from .categories import largest_k
from .rounds import validate_rounds

MODEL = R.PER_K
TERMS = ("ubar", "L")      # alpha, c
N_BOOT = 999
TRIM_SHARE = 0.01
#: Eq. (4) with an intercept (the same fitted values as ``regression.CATEGORICAL``): the
#: Breusch-Pagan test needs a constant among the regressors.
CATEGORICAL_WITH_CONSTANT = "T_T_ms ~ C(m) + C(m):ubar + L"

#: A.9's ladder of nested specifications (name, formula).
LADDER = [("Ubar", "T_T_ms ~ ubar"), ("Ubar + L", R.UBAR_L), ("+ linear m", "T_T_ms ~ ubar + L + m"),
          ("+ mL, m Ubar", "T_T_ms ~ ubar + L + m + m:L + m:ubar"),
          ("+ E_max (umax)", "T_T_ms ~ ubar + L + m + m:L + m:ubar + umax"),
          ("categorical budget (4)", R.CATEGORICAL)]


def largest_k_rounds(rounds: pd.DataFrame) -> pd.DataFrame:
    """The rounds at the largest speculative K (paper 2's K = 8 subsample)."""
    rounds = validate_rounds(rounds)
    return rounds[rounds.K == largest_k(rounds)].reset_index(drop=True)


def cluster_bootstrap(df: pd.DataFrame, formula: str = MODEL, n_boot: int = N_BOOT, seed: int = 0,
                      cluster: str = "gen_id") -> pd.DataFrame:
    """OLS coefficients of ``formula`` on ``n_boot`` resamples of whole clusters (drawn with
    replacement, as many as there are); one row per resample, one column per term."""
    y, X = patsy.dmatrices(formula, df, return_type="dataframe")
    codes, _ = pd.factorize(df[cluster])
    members = [np.flatnonzero(codes == g) for g in range(codes.max() + 1)]
    rng = np.random.default_rng(seed)
    Xv, yv = X.to_numpy(), y.to_numpy()[:, 0]
    out = np.empty((n_boot, Xv.shape[1]))
    for b in range(n_boot):
        idx = np.concatenate([members[g] for g in rng.integers(0, len(members), len(members))])
        out[b] = np.linalg.lstsq(Xv[idx], yv[idx], rcond=None)[0]
    return pd.DataFrame(out, columns=X.columns)


def huber(df: pd.DataFrame, formula: str = MODEL):
    """Huber M-estimate (statsmodels RLM with the HuberT norm, t = 1.345, MAD scale)."""
    return smf.rlm(formula, data=df, M=sm.robust.norms.HuberT()).fit()


def trimmed(df: pd.DataFrame, formula: str = MODEL, share: float = TRIM_SHARE) -> pd.DataFrame:
    """The rounds left after dropping ceil(share x n) rounds with the largest absolute OLS residual."""
    resid = np.abs(smf.ols(formula, data=df).fit().resid.to_numpy())
    drop = int(np.ceil(share * len(df)))
    keep = np.sort(np.argsort(resid, kind="stable")[:len(df) - drop])
    return df.iloc[keep]


def run_halves(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The rounds of the first half of the generations (in the order they first appear) and of the rest."""
    order = list(dict.fromkeys(df.gen_id))
    first = set(order[:(len(order) + 1) // 2])
    mask = df.gen_id.isin(first)
    return df[mask], df[~mask]


def _row(method: str, sub: pd.DataFrame, est, lo=None, hi=None, interval: str = "") -> dict:
    row = {"method": method, "rounds": len(sub), "generations": sub.gen_id.nunique(), "interval": interval}
    for name, term in zip(("alpha_ms_per_expert", "c_ms_per_token"), TERMS):
        row |= {name: float(est[term]),
                f"{name}_lo": float(lo[term]) if lo is not None else np.nan,
                f"{name}_hi": float(hi[term]) if hi is not None else np.nan}
    return row


def robustness_table(rounds: pd.DataFrame, n_boot: int = N_BOOT, seed: int = 0,
                     trim_share: float = TRIM_SHARE) -> pd.DataFrame:
    """Table A7: alpha and c of the per-K model on the largest-K subsample under each estimator."""
    df = largest_k_rounds(rounds)
    if df.gen_id.nunique() < 4:
        raise ValueError(f"rounds at K = {largest_k(rounds)}: {df.gen_id.nunique()} generations; the run halves "
                         "and the clustered bootstrap need at least 4")
    base = R.ols(MODEL, df)
    ci = base.conf_int()
    rows = [_row("OLS (clustered 95% CI)", df, base.params, ci[0], ci[1], "clustered se, normal")]
    boot = cluster_bootstrap(df, MODEL, n_boot, seed)
    rows.append(_row(f"clustered bootstrap ({n_boot} generation resamples, seed {seed})", df, boot.mean(),
                     boot.quantile(0.025), boot.quantile(0.975), "bootstrap percentile"))
    hub = huber(df)
    ci = hub.conf_int()
    rows.append(_row("Huber (RLM, HuberT)", df, hub.params, ci[0], ci[1], "RLM se, normal"))
    kept = trimmed(df, MODEL, trim_share)
    trim = R.ols(MODEL, kept)
    ci = trim.conf_int()
    rows.append(_row(f"trimmed {100 * trim_share:g}% by absolute residual", kept, trim.params, ci[0], ci[1],
                     "clustered se, normal"))
    for name, half in zip(("first half of the generations", "second half of the generations"), run_halves(df)):
        fit = R.ols(MODEL, half)
        ci = fit.conf_int()
        rows.append(_row(f"run half: {name}", half, fit.params, ci[0], ci[1], "clustered se, normal"))
    cats = sorted(df.category.unique())
    if len(cats) >= 2:
        refits = pd.DataFrame([R.ols(MODEL, df[df.category != c]).params for c in cats])
        rows.append(_row(f"leave one category out ({len(cats)} refits)", df, refits.mean(), refits.min(),
                         refits.max(), "range across refits"))
    return pd.DataFrame(rows).assign(K=largest_k(rounds))


def breusch_pagan(df: pd.DataFrame, formula: str = MODEL) -> dict:
    """Breusch-Pagan test of the OLS residuals of ``formula`` on its regressors (statsmodels'
    ``het_breuschpagan``, Koenker's studentized form: LM = n R² of the squared residuals on the
    regressors). ``formula`` needs an intercept (statsmodels' requirement)."""
    fit = smf.ols(formula, data=df).fit()
    lm, lm_p, f, f_p = het_breuschpagan(fit.resid, fit.model.exog)
    return {"lm": float(lm), "lm_p": float(lm_p), "f": float(f), "f_p": float(f_p), "rounds": int(fit.nobs)}


def binned_residuals(df: pd.DataFrame, formula: str = MODEL, by=("L", "kv_use", "round_idx"),
                     bins: int = 5) -> pd.DataFrame:
    """Mean OLS residual of ``formula`` in quantile bins of each column of ``by`` (at most ``bins``
    bins; ties merge bins), with a 95% interval clustered by generation (NaN for a bin with fewer
    than two generations)."""
    resid = df.assign(resid=smf.ols(formula, data=df).fit().resid.to_numpy())
    rows = []
    for col in by:
        codes = pd.qcut(resid[col].rank(method="first"), min(bins, len(resid)), labels=False)
        for b, g in resid.groupby(codes):
            mean = float(g.resid.mean())
            se = float(R.ols("resid ~ 1", g).bse.iloc[0]) if g.gen_id.nunique() >= 2 else np.nan
            rows.append({"by": col, "bin": int(b), "lo_value": float(g[col].min()), "hi_value": float(g[col].max()),
                         "rounds": len(g), "mean_resid_ms": mean, "lo": mean - 1.96 * se, "hi": mean + 1.96 * se})
    return pd.DataFrame(rows)


def specification_ladder(rounds: pd.DataFrame, n_splits: int = 5) -> pd.DataFrame:
    """A.9's nested specifications on the speculative rounds: in-sample R² and GroupKFold MAPE
    (mean and 95% t-interval across folds) of each."""
    rounds = validate_rounds(rounds[rounds.K >= 1])
    rows = []
    for name, formula in LADDER:
        cv = R.cross_validate(formula, rounds, n_splits)
        mape, half = R._ci(cv.mape_pct)
        rows.append({"specification": name, "formula": formula, "r2_in": float(smf.ols(formula, rounds).fit().rsquared),
                     "cv_mape_pct": mape, "cv_mape_lo": mape - half, "cv_mape_hi": mape + half,
                     "cv_rmse_ms": float(cv.rmse_ms.mean())})
    return pd.DataFrame(rows)
