"""The budget K as a model parameter (paper 2, Appendix A.7): the pooled model (A3) per K and its
transfer to a K it has not seen.

- ``pooled_by_k``: Figure A5, the pooled fit T_T = beta0 + alpha Ubar_r + c L + gamma K at each K's
  median L beside that K's own fit (Table A4), and the pooled fit's MAPE on each K's rounds.
- ``leave_one_k_out``: the pooled form refitted without one K and scored on that K's rounds.
A MAPE carries a 95% interval clustered by generation (the mean APE's standard error from an
intercept-only OLS with generation clusters, :func:`moespec.oracle.regression.ols`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import statsmodels.formula.api as smf

from . import regression as R
from .rounds import validate_rounds


def clustered_mape(df: pd.DataFrame, predicted) -> dict:
    """MAPE (%) of ``predicted`` against ``df.T_T_ms`` with a 95% interval clustered by generation."""
    ape = pd.DataFrame({"ape": 100 * np.abs(df.T_T_ms.to_numpy() - np.asarray(predicted)) / df.T_T_ms.to_numpy(),
                        "gen_id": df.gen_id.to_numpy()})
    mean = float(ape.ape.mean())
    if ape.gen_id.nunique() < 2:
        return {"mape_pct": mean, "mape_lo": float("nan"), "mape_hi": float("nan")}
    se = float(R.ols("ape ~ 1", ape).bse.iloc[0])
    return {"mape_pct": mean, "mape_lo": mean - 1.96 * se, "mape_hi": mean + 1.96 * se}


def pooled_by_k(rounds: pd.DataFrame, n_splits: int = 5) -> pd.DataFrame:
    """Figure A5's table: per K, the median L, the pooled (A3) line's and the per-K fit's
    coefficients at that L (intercept at the median L and slope in Ubar_r), and the pooled fit's
    MAPE on the K's rounds with its clustered interval."""
    rounds = validate_rounds(rounds[rounds.K >= 1])
    pooled = R.fit_pooled(rounds, n_splits)
    b0, alpha, c, gamma = (R.coefficient(pooled, t)[0] for t in ("Intercept", "ubar", "L", "K"))
    per_k = R.fit_per_k(rounds, n_splits).set_index("K")
    rows = []
    for k, sub in rounds.groupby("K"):
        L = float(sub.L.median())
        pk = per_k.loc[k]
        rows.append({"K": int(k), "rounds": len(sub), "generations": sub.gen_id.nunique(), "median_L": L,
                     "pooled_intercept_at_median_L_ms": b0 + c * L + gamma * k, "pooled_alpha": alpha,
                     "per_k_intercept_at_median_L_ms": pk.beta0_ms + pk.c_ms_per_token * L,
                     "per_k_alpha": pk.alpha_ms_per_expert,
                     **clustered_mape(sub, pooled_predict(pooled, sub))})
    return pd.DataFrame(rows)


def pooled_predict(fit: R.Fit, df: pd.DataFrame) -> np.ndarray:
    """(A3)'s prediction for the rounds ``df`` from a :class:`moespec.oracle.regression.Fit`."""
    b0, alpha, c, gamma = (R.coefficient(fit, t)[0] for t in ("Intercept", "ubar", "L", "K"))
    return (b0 + alpha * df.ubar + c * df.L + gamma * df.K).to_numpy()


def leave_one_k_out(rounds: pd.DataFrame, formula: str = R.POOLED) -> pd.DataFrame:
    """The pooled form ``formula`` fitted on every K but one and scored on the held-out K's rounds:
    one row per K (MAPE with clustered interval, MedAPE), and a last row ``K = "mean"`` with the
    average MAPE over the held-out Ks (paper 2's 5.2 %)."""
    rounds = validate_rounds(rounds[rounds.K >= 1])
    ks = sorted(rounds.K.unique())
    if len(ks) < 3:
        raise ValueError(f"rounds: leave-one-K-out of {formula!r} needs at least 3 values of K "
                         f"(the fit's K slope needs two in training); found {ks}")
    rows = []
    for k in ks:
        train, test = rounds[rounds.K != k], rounds[rounds.K == k]
        pred = np.asarray(smf.ols(formula, data=train).fit().predict(test))
        err = R._errors(test.T_T_ms.to_numpy(), pred)
        rows.append({"K": str(k), "rounds_held_out": len(test), "rounds_train": len(train),
                     **clustered_mape(test, pred), "medape_pct": err["medape_pct"]})
    table = pd.DataFrame(rows)
    mean = {"K": "mean", "rounds_held_out": int(table.rounds_held_out.sum()), "rounds_train": np.nan,
            "mape_pct": float(table.mape_pct.mean()), "mape_lo": np.nan, "mape_hi": np.nan,
            "medape_pct": float(table.medape_pct.mean())}
    return pd.concat([table, pd.DataFrame([mean])], ignore_index=True)
