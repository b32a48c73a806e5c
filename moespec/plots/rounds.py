"""Figures of the round model (notebook 05): its terms per draft length, the two verify-time
protocols side by side, and every prediction against its measurement."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moespec.plots._layout import add_caption, legend_outside

TERMS_TEXT = ("Round model: V(k) = t_draft(k) + tau(k + 1) + h(k), each term measured in decode-loop rounds before "
              "the runs it predicts (t_draft: the draft's time per round, a_d k + b_d for a real draft; tau: the "
              "verify pass of k + 1 tokens; h: the host's work of a round). Bars: 95 % interval of V(k), the sum "
              "of its terms' intervals.")


def round_terms_figure(models: list, title: str = "") -> plt.Figure:
    """One panel per round model: its terms stacked per k (deduplicating kernel), the interval of
    V(k) as an error bar (:class:`moespec.predict.round_model.RoundModel`)."""
    fig, axes = plt.subplots(1, len(models), figsize=(3.6 * len(models), 3.6), squeeze=False)
    for ax, rm in zip(axes[0], models):
        k = np.arange(rm.kmax + 1)
        K = len(k)
        draft, tau, host = rm.draft.term.values_s[:K], rm.tau("dedup")[:K], rm.host.values_s[:K]
        ax.bar(k, 1e3 * tau, color="C0", label="tau(k + 1): verify pass")
        ax.bar(k, 1e3 * draft, bottom=1e3 * tau, color="C1", label="t_draft(k)")
        ax.bar(k, 1e3 * host, bottom=1e3 * (tau + draft), color="C2", label="h(k): host")
        V = rm.step_times("dedup")
        lo, hi = rm.step_interval("dedup")
        ax.errorbar(k, 1e3 * V, yerr=[1e3 * (V - lo), 1e3 * (hi - V)], fmt="none", ecolor="k", capsize=2)
        ax.set_title(textwrap.fill(f"{rm.context}, {rm.state}: {rm.draft.name}", 40), fontsize=8)
        ax.set_xlabel("draft length k")
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel("time per round (ms)")
    legend_outside(axes[0][-1])
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    add_caption(fig, TERMS_TEXT)
    return fig


def protocols_figure(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """The verify time tau_p(n) per depth as the shuffled grid timed it and as decode loops did
    (``table``: :func:`moespec.tables.rounds.protocol_table` rows), one panel per depth; lower row:
    grid minus loop (ms)."""
    depths = sorted(table["d"].unique())
    fig, axes = plt.subplots(2, len(depths), figsize=(4.6 * len(depths), 5.6), squeeze=False, sharex=True,
                             gridspec_kw={"height_ratios": [2, 1]})
    for j, d in enumerate(depths):
        g = table[table["d"] == d]
        for p, color in (("slot", "C0"), ("dedup", "C3")):
            h = g[g["kernel"] == p].sort_values("n")
            axes[0][j].plot(h["n"], h["tau_grid_ms"], color=color, ls="--", marker="s", mfc="white",
                            label=f"{p}: shuffled grid")
            axes[0][j].plot(h["n"], h["tau_loop_ms"], color=color, ls="-", marker="o", label=f"{p}: decode loop")
            axes[1][j].plot(h["n"], h["tau_grid_ms"] - h["tau_loop_ms"], color=color, marker="o", label=p)
        axes[0][j].set_title(f"context depth d = {d}", fontsize=9)
        axes[1][j].axhline(0, color="k", lw=0.8)
        for ax in axes[:, j]:
            ax.set_xlabel("tokens verified per pass n")
        for ax in axes[:, j]:
            ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("verify time (ms)")
    axes[1][0].set_ylabel("grid - loop (ms)")
    legend_outside(axes[0][-1])
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    add_caption(fig, "Grid: each pass timed after an unrelated pass or a 256 MiB read, cache cropped back (notebook 05, "
                     "section 2). Loop: the mean pass inside teacher-forced decode loops of the same n (round "
                     "calibration). Both at the same depth, same machine state.")
    return fig


def predictions_figure(oracle: pd.DataFrame | None, real: pd.DataFrame | None, tolerance: float = 0.05,
                       title: str = "") -> plt.Figure:
    """Every speedup the round model predicted against the one measured: oracle-draft cells
    (:func:`moespec.predict.speculative.oracle_predictions`) and real-draft points
    (:func:`moespec.predict.speculative.real_draft_predictions`), with the prediction's interval,
    the line of equality and the +-``tolerance`` band; marker by machine state."""
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 4.2), squeeze=False)
    markers = {"quiet": "o", "loaded": "^"}
    for ax, frame, meas, pred, lo, hi, name in (
            (axes[0][0], oracle, "speedup_meas", "speedup_hat", "speedup_lo", "speedup_hi", "oracle draft (d, k, a)"),
            (axes[0][1], real, "measured", "predicted", "predicted_lo", "predicted_hi", "real draft (cost, k)")):
        if frame is None or frame.empty:
            ax.set_axis_off()
            continue
        for state, g in frame.groupby("state"):
            ax.errorbar(g[meas], g[pred], yerr=[g[pred] - g[lo], g[hi] - g[pred]], fmt=markers.get(state, "s"),
                        ms=3.5, alpha=0.7, capsize=1.5, label=f"{state} machine")
        x = np.linspace(min(frame[meas].min(), frame[pred].min()) * 0.97,
                        max(frame[meas].max(), frame[pred].max()) * 1.03, 10)
        ax.plot(x, x, color="k", lw=0.8, label="predicted = measured")
        ax.fill_between(x, x * (1 - tolerance), x * (1 + tolerance), color="0.85", zorder=0,
                        label=f"within {100 * tolerance:.0f} %")
        ax.set_xlabel("measured speedup over plain decoding")
        ax.set_ylabel("predicted (round model)")
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    add_caption(fig, "Each point: a speedup the round model predicted before the run, against the run's measurement; "
                     "error bars: the prediction's 95 % interval from its terms' intervals (bound (21) per k).")
    return fig
