"""Figures of paper 2 for this machine: round scatter by K (Figure 1), draft time (Figure A6),
the Lmax sweep (Figure 2), delta space (Figure 3), and the online policy against the oracle.
Paper 2's published scalars appear only as labelled reference lines."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from moespec.plots._layout import add_caption


def fig_rounds_by_k(rounds: pd.DataFrame, per_k: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure 1 analogue: T_T against Ubar_r per K with the per-K fit at the median L."""
    ks = sorted(rounds.K.unique())
    cols = min(5, len(ks))
    rws = int(np.ceil(len(ks) / cols))
    fig, axes = plt.subplots(rws, cols, figsize=(3.2 * cols, 2.8 * rws), squeeze=False, sharey=True)
    coef = per_k.set_index("K")
    for ax, K in zip(axes.flat, ks):
        sub = rounds[rounds.K == K]
        ax.scatter(sub.ubar, sub.T_T_ms, s=3, alpha=0.3, label="one round")
        c = coef.loc[K]
        u = np.linspace(sub.ubar.min(), sub.ubar.max(), 20)
        ax.plot(u, c.beta0_ms + c.alpha_ms_per_expert * u + c.c_ms_per_token * sub.L.median(), "r-", lw=1,
                label="fit at the median context")
        ax.set_title(f"K={K}: alpha={c.alpha_ms_per_expert:.3g} ms/expert, R²={c.r2_in:.2f}", fontsize=8)
        ax.set_xlabel("expert union Ū_r (experts)")
    for ax in axes[:, 0]:
        ax.set_ylabel("verification time T_T (ms)")
    axes[0][0].legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(ks):]:
        ax.set_visible(False)
    fig.suptitle(title or "Verification time against the expert union, per K (ours)")
    add_caption(fig, "K: tokens drafted in the round (K + 1 verified); Ū_r: distinct experts the round's tokens "
                     "select, mean over layers; alpha: fitted verification time per distinct expert (paper 2, eq. (4)).")
    return fig


def fig_draft_time(rounds: pd.DataFrame, a: float, b: float, title: str = "") -> plt.Figure:
    """Figure A6 analogue: T_D per round against K with the fitted line T_D = a K + b."""
    fig, ax = plt.subplots(figsize=(4.5, 3.2))
    jitter = np.random.default_rng(0).uniform(-0.15, 0.15, len(rounds))
    ax.scatter(rounds.K + jitter, rounds.T_D_ms, s=3, alpha=0.3, label="one round (ours)")
    k = np.arange(rounds.K.min(), rounds.K.max() + 1)
    ax.plot(k, a * k + b, "r-", label=f"fit: T_D = {a:.3g} K + {b:.3g} ms")
    ax.set_xlabel("tokens drafted in the round K")
    ax.set_ylabel("draft time of the round T_D (ms)")
    ax.legend(fontsize=8)
    ax.set_title(title or "Draft time (A4)")
    fig.tight_layout()
    return fig


def fig_lmax_sweep(sweep: pd.DataFrame, paper: dict | None = None, title: str = "") -> plt.Figure:
    """Figure 2: the oracle's speedup, mean draft length and mean accepted length against Lmax.

    ``paper``: optional {"speedup", "mean_draft_length", "mean_accepted_length"} plateau values
    published by paper 2, drawn as dashed reference lines labelled as theirs."""
    cols = [("speedup", "oracle speedup over plain decoding"), ("mean_draft_length", "mean draft length k (tokens)"),
            ("mean_accepted_length", "mean accepted tokens per round")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4))
    for ax, (col, label) in zip(axes, cols):
        ax.plot(sweep.lmax, sweep[col], "o-", label="ours (this machine)")
        if paper and col in paper:
            ax.axhline(paper[col], ls="--", color="gray", label="paper 2 plateau, published (A100)")
        ax.set_xlabel("longest draft allowed Lmax (tokens)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle(title or "Limits of speculation: the oracle against its budget Lmax")
    add_caption(fig, "Oracle: the Bellman-optimal draft length at every position of the measured sequences, "
                     "with the measured costs (paper 2, Sec. 4); speedup = cost of plain decoding / oracle cost.")
    return fig


def fig_delta_space(points: pd.DataFrame, bound: dict, max_points: int = 20000, seed: int = 0,
                    title: str = "") -> plt.Figure:
    """Figure 3: dE[Cost] against dE[a] of rejected candidates, oracle's choice at the origin, and the
    boundary line whose slope is the 1st percentile of dC/dA in quadrant I."""
    pts = points.sample(min(max_points, len(points)), random_state=seed) if len(points) else points
    fig, ax = plt.subplots(figsize=(5.5, 4.5))
    sc = ax.scatter(pts.dA, pts.dC, c=pts.k - pts.k_opt, cmap="coolwarm", s=3, alpha=0.5)
    fig.colorbar(sc, ax=ax, label="draft length above the oracle's, k − k_opt")
    x = np.linspace(points.dA.min(), points.dA.max(), 10)
    s = bound["slope_ms_per_token"]
    ax.plot(x, s * x, "k--", lw=1, label=f"boundary, slope {s:.3g} ms/token (1st pct. of dC/dA, quadrant I)")
    ax.axhline(0, color="gray", lw=0.5)
    ax.axvline(0, color="gray", lw=0.5)
    ax.plot([0], [0], "k*", ms=10, label="oracle's choice")
    ax.set_xlabel("expected extra accepted tokens ΔE[a]")
    ax.set_ylabel("expected extra cost ΔE[Cost] (ms)")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title or "Delta space of rejected candidates (ours)")
    add_caption(fig, "Each point: a draft length k the oracle rejected at one position, placed by how many more "
                     "tokens and how much more time it would have cost than the oracle's choice k_opt.", width=90)
    return fig


def fig_online_policy(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """Held-out speedups: oracle bound, online early exit, fixed k; bars labelled with the share of
    the oracle's speedup."""
    fig, ax = plt.subplots(figsize=(8, 3.4))
    colors = ["black" if p.startswith("oracle") else "tab:red" if p.startswith("online") else "tab:blue"
              for p in table.policy]
    ax.bar(range(len(table)), table.speedup, color=colors)
    for i, (s, sh) in enumerate(zip(table.speedup, table.share_of_oracle)):
        ax.text(i, s, f"{100 * sh:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xticks(range(len(table)))
    ax.set_xticklabels(table.policy, rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("speedup over plain decoding")
    ax.set_xlabel("policy")
    ax.legend(handles=[Patch(color="black", label="oracle (an upper bound)"),
                       Patch(color="tab:red", label="online early exit"),
                       Patch(color="tab:blue", label="fixed draft length k")], fontsize=7, loc="upper right")
    ax.set_title(title or "Online early exit vs the oracle bound and fixed k (held-out sequences)")
    add_caption(fig, "Above each bar: the share of the oracle's speedup.", width=120)
    return fig
