"""Figures of paper 2's Appendix A on this machine: by category (Figures A1, A3, A4), the pooled
model per K (Figure A5), robustness (Figure A7) and the binned residuals of A.9. Each takes the
table of :mod:`moespec.oracle.categories`, :mod:`moespec.oracle.budget` or
:mod:`moespec.oracle.robustness`; a category below the minimum is named in the caption, not drawn."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moespec.oracle import regression as R
from moespec.oracle.categories import POOL
from moespec.plots._layout import add_caption, legend_outside
from moespec.plots.oracle import rounds_by_k_panels

METRIC_LABELS = {"one_minus_r2": "1 - R²", "medape_pct": "MedAPE (%)", "mape_pct": "MAPE (%)",
                 "nmae_pct": "nMAE (% of mean T_T)", "nrmse_pct": "nRMSE (% of mean T_T)",
                 "p95ape_pct": "P95 APE (%)"}


def _included(table: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """The drawn rows (categories that met the minimum, then the pool) and a caption sentence
    naming the excluded ones with their reasons."""
    drawn = table[table.status == "included"]
    out = table[table.status == "excluded"]
    note = ("Not drawn (below the minimum): " + "; ".join(f"{c}: {r}" for c, r in zip(out.category, out.reason)) + "."
            if len(out) else "Every category met the minimum.")
    return drawn, note


def _height(rows: int, caption: str, width: int, per_row: float = 0.35) -> float:
    """A figure height with room for ``rows`` labelled rows and the wrapped caption."""
    return per_row * rows + 1.8 + 0.13 * (len(caption) // width + 1)


def _errorbars(ax, y, table, col, **kw):
    ax.errorbar(table[col], y, xerr=[table[col] - table[f"{col}_lo"], table[f"{col}_hi"] - table[col]],
                fmt="o", ms=4, capsize=2, **kw)


def _interval_rows(rows: pd.DataFrame, label_col: str, panels, reference, reference_label: str, mark_label: str,
                   height: float) -> plt.Figure:
    """One panel per (column, x label) of ``panels``: each row of ``rows`` as an estimate with its
    ``_lo``/``_hi`` interval, labelled by ``label_col``; ``reference`` (a row, or None) dashed."""
    fig, axes = plt.subplots(1, len(panels), figsize=(10.5, height), sharey=True, squeeze=False)
    y = np.arange(len(rows))[::-1]
    for ax, (col, xlabel) in zip(axes[0], panels):
        _errorbars(ax, y, rows, col, color="tab:blue", label=mark_label)
        if reference is not None:
            ax.axvline(reference[col], ls="--", color="gray", label=reference_label)
        ax.set_xlabel(xlabel)
    axes[0][0].set_yticks(y)
    axes[0][0].set_yticklabels(rows[label_col], fontsize=7)
    axes[0][0].set_ylabel(label_col)
    legend_outside(axes[0][-1])
    return fig


def fig_a1_r2_by_category(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure A1: out-of-sample R² of T_T ~ Ubar_r and of T_T ~ Ubar_r + L per category (95% t-interval
    across the GroupKFold folds), in Table A3's order, the full pool last."""
    drawn, note = _included(table)
    caption = ("Ū_r: distinct experts the round's verified tokens select, mean over MoE layers; L: context length. "
               "Bars: 95% t-interval across the five folds. " + note)
    fig, ax = plt.subplots(figsize=(7.5, _height(len(drawn), caption, 110)))
    y = np.arange(len(drawn))[::-1]
    _errorbars(ax, y + 0.15, drawn, "oos_r2_ubar", label="Ū_r alone")
    _errorbars(ax, y - 0.15, drawn, "oos_r2_ubar_L", label="Ū_r + L")
    ax.set_yticks(y)
    ax.set_yticklabels(drawn.category, fontsize=8)
    ax.set_xlabel("out-of-sample R² of verification time T_T (GroupKFold by generation)")
    ax.set_ylabel("category")
    legend_outside(ax)
    ax.set_title(title or "Factor importance by category (Figure A1, ours)", fontsize=9)
    add_caption(fig, caption, width=110)
    return fig


def fig_a3_alpha_by_category(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure A3: alpha at the largest K per category with its 95% interval (clustered se) and the
    held-out MAPE with its interval; the full pool's estimate dashed."""
    drawn, note = _included(table)
    cats, pool = drawn[drawn.category != POOL], drawn[drawn.category == POOL]
    k = int(drawn.K.iloc[0]) if len(drawn) else "max"
    caption = (f"Model T_T ~ Ū_r x C(K) + L within each category; alpha: the slope at K = {k}, interval estimate "
               "+- 1.96 clustered se (by generation); MAPE: GroupKFold(5) by generation, 95% t-interval across "
               "folds. " + note)
    fig = _interval_rows(cats, "category", [("alpha_ms_per_expert", "alpha (ms per distinct expert)"),
                                            ("cv_mape_pct", "held-out MAPE (%)")],
                         pool.iloc[0] if len(pool) else None, "full pool", "category (95% interval)",
                         _height(len(drawn), caption, 140))
    fig.suptitle(title or f"Eq. (4) by category: alpha at K = {k} and held-out error (Figure A3, ours)", fontsize=9)
    add_caption(fig, caption, width=140)
    return fig


def fig_a4_metrics_by_category(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure A4: the six dimensionless held-out metrics per category with 95% t-intervals across folds."""
    drawn, note = _included(table)
    caption = ("Held-out generations, GroupKFold(5); APE: |measured - predicted| / measured T_T; nMAE and nRMSE over "
               "the mean measured T_T. Bars: 95% t-interval across the folds. " + note)
    fig, axes = plt.subplots(2, 3, figsize=(12, _height(2 * len(drawn), caption, 160, per_row=0.25) + 1), sharey=True)
    y = np.arange(len(drawn))[::-1]
    for ax, metric in zip(axes.flat, R.SIX_METRICS):
        _errorbars(ax, y, drawn, f"cv_{metric}", color="tab:blue", label="held-out mean (95% t-interval)")
        ax.set_xlabel(METRIC_LABELS[metric], fontsize=8)
    for ax in axes[:, 0]:
        ax.set_yticks(y)
        ax.set_yticklabels(drawn.category, fontsize=7)
        ax.set_ylabel("category")
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Six held-out quality metrics of eq. (4) by category (Figure A4, ours)", fontsize=9)
    add_caption(fig, caption, width=160)
    return fig


def fig_a5_pooled_vs_per_k(rounds: pd.DataFrame, per_k: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure A5: per K, the rounds, the pooled model (A3) at the K's median L (red) and the per-K
    fit (gray dashed) at the same L; the pooled fit's MAPE on the K in the panel's title."""
    rows = per_k.set_index("K")

    def draw(ax, K, sub):
        row = rows.loc[K]
        u = np.linspace(sub.ubar.min(), sub.ubar.max(), 20)
        ax.plot(u, row.pooled_intercept_at_median_L_ms + row.pooled_alpha * u, "r-", lw=1, label="pooled (A3)")
        ax.plot(u, row.per_k_intercept_at_median_L_ms + row.per_k_alpha * u, "--", color="0.4", lw=1,
                label="this K's own fit")
        ax.set_title(f"K={int(K)}: pooled MAPE {row.mape_pct:.2g}% [{row.mape_lo:.2g}, {row.mape_hi:.2g}]", fontsize=8)

    fig, _ = rounds_by_k_panels(rounds, list(rows.index), draw, cols=4, sharex=True)
    fig.suptitle(title or "The pooled model with a linear K beside the per-K fits (Figure A5, ours)", fontsize=9)
    add_caption(fig, "Pooled (A3): T_T = beta0 + alpha Ū_r + c L + gamma K on every K, drawn at each K's median L; "
                     "the per-K fit: T_T = beta0 + alpha Ū_r + c L on that K alone (Table A4). MAPE of the pooled "
                     "fit on the K's rounds, 95% interval clustered by generation.", width=160)
    return fig


def fig_a7_robustness(robust: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure A7: alpha and c at the largest K under each robustness check with its interval (or the
    range across refits); the baseline OLS estimate dashed."""
    fig = _interval_rows(robust, "method", [("alpha_ms_per_expert", "alpha (ms per distinct expert)"),
                                            ("c_ms_per_token", "c (ms per context token)")],
                         robust.iloc[0], "OLS estimate", "estimate (95% interval or range)", 0.4 * len(robust) + 1.8)
    fig.suptitle(title or f"Cost-model coefficients under robustness checks, K = {int(robust.K.iloc[0])} "
                          "(Figure A7, ours)", fontsize=9)
    add_caption(fig, "Model T_T = beta0 + alpha Ū_r + c L on the largest-K rounds. Bars: 95% intervals (clustered "
                     "se; bootstrap percentile; RLM se); leave-one-category-out: the range across the refits. Run "
                     "halves: the generations in recording order, first half and the rest.", width=150)
    return fig


def fig_binned_residuals(bins: pd.DataFrame, title: str = "") -> plt.Figure:
    """A.9's residual check: mean OLS residual per quantile bin of L, KV occupancy and position within
    the generation, with 95% intervals clustered by generation."""
    labels = {"L": "context length L (tokens)", "kv_use": "KV-cache occupancy (share)",
              "round_idx": "position within the generation (round)"}
    panels = list(dict.fromkeys(bins.by))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.2), squeeze=False, sharey=True)
    for ax, col in zip(axes[0], panels):
        b = bins[bins.by == col]
        x = (b.lo_value + b.hi_value) / 2
        ax.errorbar(x, b.mean_resid_ms, yerr=[b.mean_resid_ms - b.lo, b.hi - b.mean_resid_ms], fmt="o-", ms=4,
                    capsize=2, label="mean residual of the bin (95% interval)")
        ax.axhline(0, color="gray", lw=0.5)
        ax.set_xlabel(labels.get(col, col))
    axes[0][0].set_ylabel("mean residual of T_T (ms)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title or "Residuals of the largest-K model, binned (A.9, ours)", fontsize=9)
    add_caption(fig, "Residuals of T_T = beta0 + alpha Ū_r + c L (OLS) in quantile bins (x: the bin's middle); "
                     "bars: 95% interval clustered by generation.", width=130)
    return fig
