"""Figure 1 of paper 1 (layer-mean reuse rho_hat(n) against n) and Figure 3, right panel (the
distinct share of the verified text against the reference text's)."""

from __future__ import annotations

from fractions import Fraction

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moespec.plots._layout import add_caption, legend_outside
from moespec.routing.published import PUBLISHED_LABEL


def figure1_reuse(curves: pd.DataFrame, published: pd.DataFrame | None = None,
                  title: str = "Layer-mean reuse of n consecutive tokens") -> plt.Figure:
    """rho_hat(n) per trace with its bootstrap band (``curves`` from
    :func:`moespec.tables.routing.reuse_curves`), the uniform-routing curve 1 - q^(n-1),
    q = 1 - m/N, dotted for each m/N present (paper 1, Sec. 2), and the paper's published layer
    means as labelled reference points (never our result)."""
    fig, ax = plt.subplots(figsize=(8, 7))
    colors = {}
    n_max = int(curves["n"].max())
    for i, (label, grp) in enumerate(curves.groupby("label", sort=False)):
        color = f"C{i % 10}"
        model = grp["model"].iloc[0]
        colors.setdefault(model, color)
        ax.plot(grp["n"], grp["rho"], "o-", color=color, ms=3, label=label)
        ax.fill_between(grp["n"], grp["rho_low"], grp["rho_high"], color=color, alpha=0.25, lw=0)
    n = np.arange(1, n_max + 1)
    shares = sorted({Fraction(int(m), int(N)) for m, N in zip(curves["m"], curves["N"])}, reverse=True)
    for j, share in enumerate(shares):
        q = 1 - float(share)
        ax.plot(n, 1 - q ** (n - 1), ":", color="0.3" if j == 0 else "0.6",
                label=f"independent uniform routing, m/N = {share}")
    if published is not None and not published.empty:
        for model, grp in published.groupby("model", sort=False):
            ax.plot(grp["n"], grp["rho"], "x", ms=9, mew=2, color=colors.get(model, "k"),
                    label=f"{PUBLISHED_LABEL}: {grp['paper_label'].iloc[0]}")
    ax.set_xlabel("n (consecutive tokens)")
    ax.set_ylabel(r"layer-mean $\hat\rho(n)$")
    ax.set_xlim(0.8, n_max + 0.2)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=10)
    # outside the axes: with recorded and synthetic traces the legend would hide the curves
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.12), ncol=1, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def figure3_right(shares: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure 3, right panel (paper 1): the distinct share U/(nm) of the windows the whole-model
    runs verified (y) against that of the reference windows of the same model (x), one point per
    (label, n) with its bootstrap interval on both axes (``shares`` from
    :func:`moespec.routing.distinct_share_against`). Dotted: equal; a point above it means the
    verified text repeated experts less often than the reference. Both axes lie between 1/n and 1."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    markers = "osD^vP*X"
    ns = sorted(shares["n"].unique())
    for i, (label, g) in enumerate(shares.groupby("label", sort=False)):
        color = f"C{i % 10}"
        for n, r in g.set_index("n").iterrows():
            ax.errorbar(r["share_reference"], r["share_text"],
                        xerr=[[r["share_reference"] - r["share_reference_low"]],
                              [r["share_reference_high"] - r["share_reference"]]],
                        yerr=[[r["share_text"] - r["share_text_low"]], [r["share_text_high"] - r["share_text"]]],
                        fmt=markers[ns.index(n) % len(markers)], color=color, ms=5, capsize=2, lw=0.8)
        ax.plot([], [], "o", color=color, label=label)
    for j, n in enumerate(ns):
        ax.plot([], [], markers[j % len(markers)], color="0.3", label=f"n = {n}")
    lo = min(1 / max(ns), float(shares[["share_reference_low", "share_text_low"]].min().min()))
    ax.plot([lo, 1], [lo, 1], ":", color="0.4", label="equal")
    ax.set_xlim(lo * 0.95, 1.02)
    ax.set_ylim(lo * 0.95, 1.02)
    ax.set_xlabel(f"U/(nm), {shares['reference'].iloc[0]}", fontsize=8)
    ax.set_ylabel("U/(nm), windows the runs verified")
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=7)
    ax.set_title(title or "Distinct share of verified text against the reference text", fontsize=9)
    docs = shares.groupby("label", sort=False)["text_docs"].first()
    add_caption(fig, "U: distinct experts a window of n tokens selects in a layer, layer mean; bars: 95 % "
                     "document-level bootstrap intervals over " + ", ".join(f"{d} documents ({lab})" for lab, d in docs.items())
                + f" and {int(shares['reference_docs'].iloc[0])} reference documents.", width=90)
    return fig


def union_share_figure(curves: pd.DataFrame, title: str = "") -> plt.Figure:
    """The union share U/N (layer mean: the share of a layer's N experts a verify pass reads) against
    the tokens of the pass, n, one panel per model (``curves`` from
    :func:`moespec.routing.union_share_curves`): one sequence's window of n consecutive tokens (B = 1,
    solid black) and B sequences x n/B tokens each (colours), with document-level bootstrap bands; the
    independent-uniform curve 1 - (1 - m/N)^n dotted. Where B sequences read more experts than one
    window of the same n, reuse along a sequence is not there to save bytes across sequences."""
    models = list(dict.fromkeys(curves["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models) + 1.8, 4.2), squeeze=False)
    Bs = sorted(curves["B"].unique())
    for ax, model in zip(axes[0], models):
        g = curves[curves["model"] == model]
        for i, B in enumerate(Bs):
            c = g[g["B"] == B]
            color = "k" if B == 1 else f"C{i % 10}"
            what = "one sequence, n consecutive tokens" if B == 1 else f"B = {B} sequences x n/B tokens"
            ax.plot(c["n"], c["share"], "-" if B == 1 else "o-", color=color, ms=3, lw=1.2, label=what)
            ax.fill_between(c["n"], c["share_low"], c["share_high"], color=color, alpha=0.2, lw=0)
        N, m = int(g["N"].iloc[0]), int(g["m"].iloc[0])
        n = np.arange(1, int(g["n"].max()) + 1)
        ax.plot(n, 1 - (1 - m / N) ** n, ":", color="0.5", label=f"independent uniform, m/N = {m}/{N}")
        ax.set_title(f"{model} (N = {N}, m = {m})", fontsize=9)
        ax.set_xlabel("n, tokens in the verify pass")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("union share U/N, layer mean")
    legend_outside(axes[0][-1], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    add_caption(fig, "U: distinct experts the pass's tokens select in a layer (B sequences independent, each a "
                     "window of consecutive tokens of the trace; moespec.routing.batch). Bands: 95 % "
                     "document-level bootstrap intervals.", width=120)
    return fig
