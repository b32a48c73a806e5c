"""Tables of paper 2 (Appendix A) for this machine, and paper 2's published scalars as labelled reference.

The regression numbers come from :mod:`moespec.oracle.regression` in the current run; the published
scalars are read from ``data/paper_reference/paper2_scalars.csv`` and only ever shown beside ours.
"""

from __future__ import annotations

import re

import pandas as pd

from moespec import paths

PAPER_LABEL = "paper 2, published (Qwen3-Coder-30B-A3B + EAGLE-3, A100)"


def model_comparison(fits) -> pd.DataFrame:
    """Table A6 analogue: one row per fitted model (in-sample R², GroupKFold R², RMSE, MAPE, MedAPE)."""
    return pd.DataFrame([f.summary() for f in fits])


def coefficients(fit) -> pd.DataFrame:
    """The coefficient table of one fit with clustered standard errors (eq. A3 / A4 style)."""
    return fit.coef.assign(model=fit.name)[["model", "term", "estimate", "se", "p"]]


def paper_scalars() -> pd.DataFrame:
    """Paper 2's published scalars as stored (quantity, value, where) — reference, never an input."""
    path = paths.reference_dir() / "paper2_scalars.csv"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: paper 2's published scalars are missing")
    df = pd.read_csv(path)
    missing = {"quantity", "value", "where"} - set(df.columns)
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")
    return df.assign(source=PAPER_LABEL)


def paper_value(quantity: str) -> str:
    """One published scalar as paper 2 states it (e.g. '0.9669-0.9991')."""
    df = paper_scalars().set_index("quantity")
    if quantity not in df.index:
        raise KeyError(f"paper2_scalars.csv has no quantity {quantity!r}")
    return str(df.loc[quantity, "value"])


def paper_number(quantity: str) -> float:
    """The leading number of one published scalar (e.g. 'about 2.8 (up to Lmax=12)' -> 2.8)."""
    value = paper_value(quantity)
    m = re.search(r"-?\d+(\.\d+)?(e-?\d+)?", value)
    if not m:
        raise ValueError(f"paper2_scalars.csv: {quantity!r} has no number: {value!r}")
    return float(m.group(0))


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
    from moespec.oracle.regression import coefficient

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
    ref = paper_scalars().set_index("quantity")
    rows = [{"quantity": q, "ours (this machine)": v,
             "paper 2, published (their hardware)": ref.loc[q, "value"] if q in ref.index else ""}
            for q, v in ours.items()]
    return pd.DataFrame(rows)
