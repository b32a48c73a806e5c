"""Figures of the whole-model subject (notebook 05): where a decode step's time goes, and the
real-draft speedup against the draft's cost per token with the theory's prediction beside it."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def breakdown_figure(shares: pd.DataFrame, title: str = "") -> plt.Figure:
    """One bar per subject: the n = 1 decode step split into its expert operation and the rest,
    with one drafted token beside it (:func:`moespec.engine.breakdown.shares`). Where the table has
    each component's bytes (``<c>_share``, ``<c>_share_published``), a second panel sets each
    subject's split of a step's bytes beside the published model's."""
    with_bytes = "published" in shares.columns and shares["published"].notna().any()
    height = 1.9 + 0.6 * len(shares) + (0.4 if with_bytes else 0)
    fig, axes = plt.subplots(1, 2 if with_bytes else 1, figsize=(11.0 if with_bytes else 6.4, height), squeeze=False,
                             gridspec_kw={"width_ratios": [1.4, 1]} if with_bytes else None)
    ax = axes[0, 0]
    y = np.arange(len(shares))
    ax.barh(y, shares["experts_ms"], color="C3", label="expert operation (its kernels alone)")
    ax.barh(y, shares["step_ms"] - shares["experts_ms"], left=shares["experts_ms"], color="0.7",
            label="rest of the step (attention, routers, framework)")
    ax.barh(y + 0.38, shares["draft_token_ms"], height=0.25, color="C0", label="one drafted token")
    for i, r in enumerate(shares.itertuples()):
        ax.text(r.step_ms, i, f"  experts {100 * r.expert_share:.0f} %, draft {r.draft_ratio:.2f} of a step",
                va="center", fontsize=7)
    ax.set_yticks(y)
    ax.set_yticklabels(shares["subject"], fontsize=8)
    ax.set_ylim(-0.6, len(shares) - 0.2)
    ax.set_ylabel("subject")
    ax.set_xlabel("time at n = 1 (ms, median of interleaved repetitions)")
    ax.set_xlim(0, 1.6 * float(shares["step_ms"].max()))
    if with_bytes:
        _byte_share_panel(axes[0, 1], shares)
    if title:
        fig.suptitle(textwrap.fill(title, 130 if with_bytes else 90), fontsize=8)
    # the legend below the axes, in space of its own (it never covers the axis label)
    handles, labels = ax.get_legend_handles_labels()
    if with_bytes:
        more = axes[0, 1].get_legend_handles_labels()
        handles, labels = handles + more[0], labels + [f"bytes: {lab}" for lab in more[1]]
    fig.legend(handles, labels, fontsize=7, loc="lower center", ncol=4 if with_bytes else 2, frameon=False)
    fig.tight_layout(rect=(0, (0.75 if with_bytes else 0.5) / height, 1, 1))
    return fig


def _byte_share_panel(ax, shares: pd.DataFrame) -> None:
    """Stacked shares of a step's bytes per component: each subject, then the published model."""
    from moespec.engine.byte_shares import COMPONENTS

    rows = [(f"{r['subject']} (d = {int(r['bytes_depth'])})", [r[f"{c}_share"] for c in COMPONENTS])
            for _, r in shares.iterrows() if pd.notna(r.get("published"))]
    first = shares[shares["published"].notna()].iloc[0]
    rows.append((f"{first['published']} (its config, same layers)", [first[f"{c}_share_published"] for c in COMPONENTS]))
    colors = {"attention": "C1", "experts": "C3", "lm_head": "C2", "kv_cache": "C4", "other": "0.6"}
    for i, (label, values) in enumerate(rows):
        left = 0.0
        for c, v in zip(COMPONENTS, values):
            ax.barh(i, 100 * v, left=left, color=colors[c], label=c.replace("_", " ") if i == 0 else None)
            if v >= 0.06:
                ax.text(left + 50 * v, i, f"{100 * v:.1f}", ha="center", va="center", fontsize=6.5)
            left += 100 * v
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([textwrap.fill(lab, 28) for lab, _ in rows], fontsize=7)
    ax.set_xlim(0, 100)
    ax.set_xlabel("share of a step's bytes (%)")


def draft_cost_figure(pred: pd.DataFrame, ratios: pd.DataFrame, paper: dict | None = None,
                      title: str = "") -> plt.Figure:
    """Measured speedup over plain decoding (median and interquartile range over prompts) against
    the measured cost ratio c of a drafted token to a target step, one colour per k, with the
    theory's prediction G_a(k) V(0) / V(k) as a dashed line (:func:`moespec.engine.draftcost.predict_speedups`).
    ``paper``: ``{"paper1_k1": speedup, "paper2_ratio": c}`` drawn as labelled references (theirs)."""
    c = ratios.set_index("draft_cost")["cost_ratio"]
    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    for i, (k, g) in enumerate(pred.groupby("k")):
        g = g.sort_values("draft_cost")
        x = g["draft_cost"].map(c).to_numpy(float)
        color = plt.cm.viridis(i / max(1, pred["k"].nunique() - 1))
        ax.errorbar(x, g["measured"], yerr=[g["measured"] - g["measured_q25"], g["measured_q75"] - g["measured"]],
                    color=color, marker="o", ls="none", capsize=2, label=f"k = {k}: measured")
        ax.plot(x, g["predicted"], color=color, ls="--", lw=1)
    ax.plot([], [], color="0.3", ls="--", label="theory: G_a(k) V(0) / V(k)")
    if paper:
        if "paper2_ratio" in paper:
            ax.axvline(paper["paper2_ratio"], color="C1", ls=":", label="paper 2: EAGLE-3 draft token / target pass (theirs)")
        if "paper1_k1" in paper:
            ax.axhline(paper["paper1_k1"], color="C2", ls=":", label="paper 1: median speedup at k = 1, Qwen3-0.6B (theirs)")
    ax.axhline(1, color="k", lw=0.8)
    ax.set_xlim(0, 1.05 * max(float(c.max()), (paper or {}).get("paper2_ratio", 0.0)))   # the references in view
    ax.set_xlabel("cost ratio c: one drafted token / one target decode step (measured, same rounds)")
    ax.set_ylabel("speedup over plain decoding")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6.5, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=3)
    if title:
        ax.set_title(textwrap.fill(title, 90), fontsize=8)
    fig.tight_layout()
    return fig
