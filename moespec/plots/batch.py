"""Notebook 09's figures: the speedup over plain decoding at the same batch size, predicted by the
round model against measured, per B; and the draft length per batch size (the schedule) that the
prediction picks beside the one the runs measured best."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
from matplotlib.ticker import MaxNLocator
import numpy as np
import pandas as pd

from moespec.plots._layout import add_caption, legend_outside


def batch_predictions_figure(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """One panel per machine state: speedup over plain decoding at the same B against k, measured
    (points with the interquartile range of the per-repetition ratios) and predicted (lines), one
    colour per B. ``table``: :func:`moespec.studies.batch_axis.prediction_table` rows."""
    panels = list(table.groupby("state", sort=False))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.0 * len(panels) + 1.8, 4.2), squeeze=False)
    colors = {B: f"C{i % 10}" for i, B in enumerate(sorted(table["B"].unique()))}
    for ax, (state, g) in zip(axes[0], panels):
        for B, c in g.sort_values("k").groupby("B"):
            color = colors[B]
            ax.plot(c["k"], c["predicted"], "-", color=color, lw=1.2, label=f"B = {B}, predicted")
            err = np.vstack([c["measured"] - c["measured_q25"], c["measured_q75"] - c["measured"]]).clip(0)
            ax.errorbar(c["k"], c["measured"], yerr=err, fmt="o", color=color, ms=4, capsize=2,
                        label=f"B = {B}, measured")
        ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
        ax.set_title(f"{state} machine", fontsize=9)
        ax.set_xlabel("k, drafted tokens per sequence")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(textwrap.fill(title, 110), fontsize=9)
    axes[0][0].set_ylabel("speedup over plain decoding at the same B")
    legend_outside(axes[0][-1], fontsize=7)
    add_caption(fig, "Predicted: G(k) V(0, B) / V(k, B), the round terms timed at n = B(k + 1) in the same "
                     "interleaved run, G(k) at the runs' measured acceptance. Measured: median throughput per "
                     "sequence over the repetitions, over plain decoding's; bars: quartiles of the "
                     "per-repetition ratios.", width=120)
    return fig


def schedule_figure(best: pd.DataFrame, title: str = "") -> plt.Figure:
    """The draft length per batch size, per machine state: the predicted k*(B) (steps) and the
    measured best k (points). ``best``: :func:`moespec.studies.batch_axis.best_k_table` rows."""
    fig, ax = plt.subplots(figsize=(6.2, 3.8))
    for i, (state, g) in enumerate(best.groupby("state", sort=False)):
        g = g.sort_values("B")
        color = f"C{i % 10}"
        Bs = [*g["B"], 2 * g["B"].iloc[-1]]             # the last range drawn to twice its B: larger batches take its k
        ax.step(Bs, [*g["k_star_predicted"], g["k_star_predicted"].iloc[-1]], where="post", color=color, lw=1.4,
                label=f"{state}: predicted k*(B)")
        ax.plot(g["B"], g["k_best_measured"], "o", color=color, ms=6, mfc="none",
                label=f"{state}: measured best k")
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(best["B"].unique()))
    ax.get_xaxis().set_major_formatter(plt.ScalarFormatter())
    ax.set_xlabel("B, sequences decoded together")
    ax.set_ylabel("draft length k")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=7)
    if title:
        ax.set_title(textwrap.fill(title, 80), fontsize=8)
    add_caption(fig, "The schedule an engine takes per batch size (vLLM's num_speculative_tokens_per_batch_size, "
                     "SGLang's adaptive config): k*(B) from the round model, beside the k the runs measured fastest.",
                width=100)
    return fig
