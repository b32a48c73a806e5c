"""Tables of paper 2 (Appendix A) for this machine, with paper 2's published scalars beside ours.

The regression numbers come from :mod:`moespec.oracle.regression` in the current run; the published
scalars (:func:`moespec.paper_reference.paper2_scalars`) are only ever shown beside ours.
"""

from __future__ import annotations

import pandas as pd

from moespec.oracle.regression import coefficient
from moespec.paper_reference import paper2_scalars

#: The column of paper 2's published value in :func:`ours_vs_paper`.
THEIRS = "paper 2, published (their hardware)"


def model_comparison(fits) -> pd.DataFrame:
    """Table A6 analogue: one row per fitted model (in-sample R², GroupKFold R², RMSE, MAPE, MedAPE)."""
    return pd.DataFrame([f.summary() for f in fits])


def coefficients(fit) -> pd.DataFrame:
    """The coefficient table of one fit with clustered standard errors (eq. A3 / A4 style)."""
    return fit.coef.assign(model=fit.name)[["model", "term", "estimate", "se", "p"]]


def _span(values, fmt: str) -> str:
    return f"{format(min(values), fmt)}-{format(max(values), fmt)}"


def paper2_comparison_values(fits, sweeps: dict, lmax: int) -> dict:
    """Our value of every quantity of ``paper2_scalars.csv`` that the run measures, like for like:
    per-K fits (Table A4: in-sample R² and GroupKFold MAPE of each K's fit, as paper 2's Section 3.5
    ranges) beside per-K, and the fits pooled over K (eq. (4)'s categorical form, (A3), (A4)) beside
    paper 2's full-pool values (Appendix A.7-A.9), and the oracle's Lmax plateau per transition model
    (the surrogate's rows under paper 2's names; the greedy-exact ones with ``_greedy``, which the
    paper has no value for). ``fits``: :class:`moespec.oracle.regression.RoundFits`; ``sweeps``:
    transition model -> Lmax sweep (:func:`moespec.oracle.analysis.lmax_sweep`)."""
    per_k = fits.per_k
    small, large = per_k[per_k.m <= 4].alpha_ms_per_expert, per_k[per_k.m >= 5].alpha_ms_per_expert
    a_d, b_d = coefficient(fits.draft, "K")[0], coefficient(fits.draft, "Intercept")[0]
    ours = {"alpha_ms_per_expert_m_le_4": _span(small, ".4g") if len(small) else "",
            "alpha_ms_per_expert_m_ge_5": _span(large, ".4g") if len(large) else "",
            "pooled_alpha": f"{coefficient(fits.pooled, 'ubar')[0]:.4g}",
            "pooled_c": f"{coefficient(fits.pooled, 'L')[0]:.3g}",
            "pooled_gamma_per_K": f"{coefficient(fits.pooled, 'K')[0]:.3g}",
            "pooled_beta0_ms": f"{coefficient(fits.pooled, 'Intercept')[0]:.4g}",
            "draft_time_ms": f"{a_d:.3g}*K + {b_d:.3g}", "rounds": str(fits.rounds),
            "in_sample_R2_per_K": _span(per_k.r2_in, ".4f"),
            "oos_MAPE_per_K_pct": _span(per_k.cv_mape_pct, ".2f"),
            "pooled_eq4_R2": f"{fits.categorical.r2:.4f}",
            "pooled_eq4_cv_MAPE_pct": f"{fits.categorical.cv.mape_pct.mean():.2f}",
            "pooled_A3_R2": f"{fits.pooled.r2:.4f}",
            "draft_A4_R2": f"{fits.draft.r2:.3f}"}
    for t, sweep in sweeps.items():
        tail = "" if t == "surrogate" else f"_{t}"
        ours |= {f"oracle_speedup_plateau{tail}": f"{sweep.speedup.iloc[-1]:.3f}x at Lmax={lmax}",
                 f"oracle_mean_accepted_length{tail}": f"{sweep.mean_accepted_length.iloc[-1]:.2f}",
                 f"oracle_mean_draft_length{tail}": f"{sweep.mean_draft_length.iloc[-1]:.2f}"}
    return ours


def ours_vs_paper(ours: dict) -> pd.DataFrame:
    """Side-by-side rows: our measured value and paper 2's published one (labelled), per quantity."""
    ref = paper2_scalars().set_index("quantity")
    rows = [{"quantity": q, "ours (this machine)": v,
             THEIRS: ref.loc[q, "value"] if q in ref.index else ""}
            for q, v in ours.items()]
    return pd.DataFrame(rows)
