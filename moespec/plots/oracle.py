"""Figures of paper 2 for this machine: round scatter by K (Figure 1), draft time (Figure A6),
the Lmax sweep (Figure 2), delta space (Figure 3), the online policy against the oracle, and the
measured fixed-K rounds beside the oracle. Tables with a ``transitions`` column (surrogate |
greedy, :func:`moespec.oracle.analysis.analyse_transitions`) are drawn one line or panel per
transition model. Paper 2's published scalars appear only as labelled reference lines."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.patches import Patch

from moespec.plots._layout import add_caption

#: How each transition model is named in the figures.
TRANSITION_LABELS = {"surrogate": "surrogate transitions (paper 2: p = P_draft(reference token))",
                     "greedy": "greedy-exact transitions (p = 1 when the draft's argmax is the reference token)"}


def _by_transitions(table: pd.DataFrame):
    """(transition model, its rows) for a table with a ``transitions`` column; (None, table) without."""
    if "transitions" not in table.columns:
        return [(None, table)]
    return [(t, table[table.transitions == t]) for t in dict.fromkeys(table.transitions)]


def _transitions_caption(panels) -> str:
    """The caption's definition of each transition model drawn (``_by_transitions``' pairs)."""
    return " ".join(f"{t}: {TRANSITION_LABELS[t]}." for t, _ in panels if t)


def rounds_by_k_panels(rounds: pd.DataFrame, ks, draw, cols: int = 5, sharex: bool = False):
    """(fig, axes): one panel per K of ``ks`` with that K's rounds (T_T against Ubar_r) and
    ``draw(ax, K, rounds_of_K)`` adding the panel's lines and title; shared y axis, unused panels hidden."""
    cols = min(cols, len(ks))
    rws = int(np.ceil(len(ks) / cols))
    fig, axes = plt.subplots(rws, cols, figsize=(3.2 * cols, 2.8 * rws), squeeze=False, sharex=sharex, sharey=True)
    for ax, K in zip(axes.flat, ks):
        sub = rounds[rounds.K == K]
        ax.scatter(sub.ubar, sub.T_T_ms, s=3, alpha=0.3, label="one round")
        draw(ax, K, sub)
        ax.set_xlabel("expert union Ū_r (experts)")
    for ax in axes[:, 0]:
        ax.set_ylabel("verification time T_T (ms)")
    axes[0][0].legend(fontsize=6, loc="upper left")
    for ax in list(axes.flat)[len(ks):]:
        ax.set_visible(False)
    return fig, axes


def fig_rounds_by_k(rounds: pd.DataFrame, per_k: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure 1 analogue: T_T against Ubar_r per K with the per-K fit at the median L."""
    coef = per_k.set_index("K")

    def draw(ax, K, sub):
        c = coef.loc[K]
        u = np.linspace(sub.ubar.min(), sub.ubar.max(), 20)
        ax.plot(u, c.beta0_ms + c.alpha_ms_per_expert * u + c.c_ms_per_token * sub.L.median(), "r-", lw=1,
                label="fit at the median context")
        ax.set_title(f"K={K}: alpha={c.alpha_ms_per_expert:.3g} ms/expert, R²={c.r2_in:.2f}", fontsize=8)

    fig, _ = rounds_by_k_panels(rounds, sorted(rounds.K.unique()), draw)
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
    """Figure 2: the oracle's speedup, mean draft length and mean accepted length against Lmax, one
    line per transition model when ``sweep`` has a ``transitions`` column.

    ``paper``: optional {"speedup", "mean_draft_length", "mean_accepted_length"} plateau values
    published by paper 2, drawn as dashed reference lines labelled as theirs."""
    cols = [("speedup", "oracle speedup over plain decoding"), ("mean_draft_length", "mean draft length k (tokens)"),
            ("mean_accepted_length", "mean accepted tokens per round")]
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, (col, label) in zip(axes, cols):
        for t, rows in _by_transitions(sweep):
            ax.plot(rows.lmax, rows[col], "o-", ms=4, label=f"ours, {t}" if t else "ours (this machine)")
        if paper and col in paper:
            ax.axhline(paper[col], ls="--", color="gray", label="paper 2 plateau, published (A100)")
        ax.set_xlabel("longest draft allowed Lmax (tokens)")
        ax.set_ylabel(label)
        ax.legend(fontsize=7)
    fig.suptitle(title or "Limits of speculation: the oracle against its budget Lmax")
    add_caption(fig, "Oracle: the Bellman-optimal draft length at every position of the measured sequences, "
                     "with the measured costs (paper 2, Sec. 4); speedup = cost of plain decoding / oracle cost. "
                     + _transitions_caption(_by_transitions(sweep)))
    return fig


def fig_oracle_vs_measured(sweep: pd.DataFrame, measured: pd.DataFrame, fixed: pd.DataFrame | None = None,
                           title: str = "") -> plt.Figure:
    """The measured fixed-K rounds' speedups with their intervals
    (:func:`moespec.oracle.rounds.fixed_k_speedups`, against K) beside the oracle's Lmax curve for
    each transition model (against Lmax) and, with ``fixed`` (:func:`moespec.oracle.analysis.fixed_k_sweep`
    rows with a ``transitions`` column), each model's own fixed-k policies (against k)."""
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    m = measured[measured.K >= 1]
    ax.errorbar(m.K, m.speedup, yerr=[m.speedup - m.speedup_lo, m.speedup_hi - m.speedup], fmt="ks", ms=5,
                capsize=3, label="measured fixed-K rounds (95% bootstrap interval over generations)")
    for (t, rows), color in zip(_by_transitions(sweep), ("tab:blue", "tab:orange", "tab:green")):
        ax.plot(rows.lmax, rows.speedup, "o-", color=color, ms=4, label=f"oracle, {t or 'ours'}, against Lmax")
        if fixed is not None and t is not None:
            f = fixed[fixed.transitions == t]
            ax.plot(f.k, f.speedup, "x:", color=color, ms=5, label=f"model's fixed k, {t}")
    ax.axhline(1.0, color="gray", lw=0.5)
    ax.set_xlabel("draft length K (measured, model's fixed k) or longest draft allowed Lmax (oracle)")
    ax.set_ylabel("speedup over plain decoding")
    ax.legend(fontsize=7, loc="best")
    ax.set_title(textwrap.fill(title or "Measured fixed-K rounds beside the oracle under both transition models", 90),
                 fontsize=9)
    host = bool(measured.host_included.iloc[0]) if "host_included" in measured and len(measured) else False
    add_caption(fig, "Measured: tokens per round (accepted + 1) over T_T + T_D" + (" + host time" if host else "")
                + ", against the K = 0 rounds' time per token. Oracle and model's fixed k: the fitted cost model on "
                  "the oracle's reference sequences (their plain baseline is the fitted one). "
                + _transitions_caption(_by_transitions(sweep)), width=110)
    return fig


def fig_delta_space(points, bound: dict, max_points: int = 20000, seed: int = 0, title: str = "") -> plt.Figure:
    """Figure 3: dE[Cost] against dE[a] of rejected candidates, oracle's choice at the origin, and the
    boundary line whose slope is the 1st percentile of dC/dA in quadrant I. ``points`` and ``bound``
    of one analysis, or {transition model: points} and {transition model: bound}: one panel each."""
    panels = list(points.items()) if isinstance(points, dict) else [(None, points)]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), squeeze=False)
    for ax, (t, pts_t) in zip(axes[0], panels):
        b = bound[t] if t else bound
        pts = pts_t.sample(min(max_points, len(pts_t)), random_state=seed) if len(pts_t) else pts_t
        sc = ax.scatter(pts.dA, pts.dC, c=pts.k - pts.k_opt, cmap="coolwarm", s=3, alpha=0.5)
        fig.colorbar(sc, ax=ax, label="draft length above the oracle's, k − k_opt")
        x = np.linspace(pts_t.dA.min(), pts_t.dA.max(), 10)
        s = b["slope_ms_per_token"]
        ax.plot(x, s * x, "k--", lw=1, label=f"boundary, slope {s:.3g} ms/token ({b['slope_source']})")
        ax.axhline(0, color="gray", lw=0.5)
        ax.axvline(0, color="gray", lw=0.5)
        ax.plot([0], [0], "k*", ms=10, label="oracle's choice")
        ax.set_xlabel("expected extra accepted tokens ΔE[a]")
        ax.set_ylabel("expected extra cost ΔE[Cost] (ms)")
        ax.legend(fontsize=7, loc="upper left")
        if t:
            ax.set_title(f"{t} transitions", fontsize=9)
    fig.suptitle(title or "Delta space of rejected candidates (ours)")
    add_caption(fig, "Each point: a draft length k the oracle rejected at one position, placed by how many more "
                     "tokens and how much more time it would have cost than the oracle's choice k_opt. "
                + _transitions_caption(panels), width=90 * len(panels))
    return fig


def fig_online_policy(table: pd.DataFrame, title: str = "") -> plt.Figure:
    """Held-out speedups: oracle bound, online early exit, fixed k; bars labelled with the share of
    the oracle's speedup; one panel per transition model when ``table`` has a ``transitions`` column."""
    panels = _by_transitions(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 3.6), squeeze=False, sharey=True)
    for ax, (t, rows) in zip(axes[0], panels):
        colors = ["black" if p.startswith("oracle") else "tab:red" if p.startswith("online") else "tab:blue"
                  for p in rows.policy]
        ax.bar(range(len(rows)), rows.speedup, color=colors)
        for i, (s, sh) in enumerate(zip(rows.speedup, rows.share_of_oracle)):
            ax.text(i, s, f"{100 * sh:.0f}%", ha="center", va="bottom", fontsize=7)
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels(rows.policy, rotation=45, ha="right", fontsize=8)
        ax.set_xlabel("policy")
        if t:
            ax.set_title(f"{t} transitions", fontsize=9)
    axes[0][0].set_ylabel("speedup over plain decoding")
    axes[0][-1].legend(handles=[Patch(color="black", label="oracle (an upper bound)"),
                                Patch(color="tab:red", label="online early exit"),
                                Patch(color="tab:blue", label="fixed draft length k")], fontsize=7, loc="upper right")
    fig.suptitle(title or "Online early exit vs the oracle bound and fixed k (held-out sequences)")
    add_caption(fig, "Above each bar: the share of the oracle's speedup. "
                + _transitions_caption(panels), width=120 * len(panels))
    return fig
