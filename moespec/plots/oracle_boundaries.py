"""Figures of paper 2's Appendix B on our text (:mod:`moespec.oracle.boundaries`,
:mod:`moespec.oracle.gallery`): k* by context (Figure B3), new experts at script changes and at
the first mismatch (Figure B5), the alpha = 0 cases (Figure B4) and the gallery (B1/B2/B6/B7), each
for both transition models where the oracle's decisions enter."""

from __future__ import annotations

import textwrap

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from moespec.plots._layout import add_caption

#: Cell colours of the token rows: a matched drafted token, the first mismatch, a step past k*.
COLORS = {"match": "#b7e1b0", "mismatch": "#f4a3a3", "past": "#e6e6e6", "target": "#dfe8f6"}


def _shown(text: str, width: int = 9) -> str:
    """A token's text for a cell: newline as ⏎, a leading space as ·, cut to ``width``."""
    s = text.replace("\n", "⏎").replace("\t", "⇥")
    s = "·" + s[1:] if s.startswith(" ") else s
    return s if len(s) <= width else s[:width - 1] + "…"


def fig_b3(b3: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure B3: per context label the shares of k* = 1 and k* >= 4 (left) and the mean k* (right),
    95% response-level clustered bootstrap intervals, one marker per transition model."""
    labels = list(dict.fromkeys(b3.label))
    trans = list(dict.fromkeys(b3.transitions))
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 0.45 * len(labels) + 2.2), sharey=True)
    y = np.arange(len(labels))
    off = np.linspace(-0.25, 0.25, 2 * len(trans))
    for n, t in enumerate(trans):
        d = b3[b3.transitions == t].set_index("label").reindex(labels)
        for m, (col, mark) in enumerate((("share_k1", "o"), ("share_k4plus", "s"))):
            o = off[2 * n + m]
            ax1.errorbar(d[col], y + o, xerr=[d[col] - d[f"{col}_lo"], d[f"{col}_hi"] - d[col]], fmt=mark,
                         capsize=2, label=f"{'k* = 1' if m == 0 else 'k* >= 4'}, {t}")
        ax2.errorbar(d.mean_k, y + off[2 * n], xerr=[d.mean_k - d.mean_k_lo, d.mean_k_hi - d.mean_k], fmt="o",
                     capsize=2, label=t)
    counts = b3[b3.transitions == trans[0]].set_index("label").reindex(labels)
    ax1.set_yticks(y, [f"{lab} ({int(c.decisions)} decisions, {int(c.responses)} responses)"
                       for lab, c in counts.iterrows()])
    ax1.invert_yaxis()
    ax1.set_xlabel("share of decisions")
    ax1.set_ylabel("context of the decision's first drafted token")
    ax2.set_xlabel("mean k*")
    ax1.legend(fontsize=7, loc="lower right")
    ax2.legend(fontsize=7)
    fig.suptitle(title or "Figure B3 analogue: the oracle's k* by local context")
    add_caption(fig, "Intervals: 95% clustered bootstrap over responses (reference sequences). A label without a "
                     "marker has no position in our text (0 decisions).")
    return fig


def fig_b5(b5: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure B5: new experts at the event (script change / first mismatch) beside the comparison
    (no script change aligned by step / the step before), with the difference, per row of ``b5``."""
    fig, ax = plt.subplots(figsize=(2.8 * len(b5) + 2, 4.5))
    x = np.arange(len(b5))
    for dx, (col, name) in zip((-0.2, 0.2), (("other", "comparison"), ("event", "event"))):
        v = b5[col].to_numpy(float)
        ax.bar(x + dx, np.nan_to_num(v), 0.4, yerr=[np.nan_to_num(v - b5[f"{col}_lo"]), np.nan_to_num(b5[f"{col}_hi"] - v)],
               capsize=3, label=name)
    for xi, (_, r) in zip(x, b5.iterrows()):
        text = (f"diff {r.difference:+.2f}\n[{r.difference_lo:+.2f}, {r.difference_hi:+.2f}]\n{int(r.events)} events"
                if np.isfinite(r.difference) else "not computed:\n" + textwrap.fill(str(r.get("note", "")), 30))
        ax.text(xi, ax.get_ylim()[1] * 0.02, text, ha="center", va="bottom", fontsize=7)
    ax.set_xticks(x, [textwrap.fill(f"{r.comparison} [{r.transitions}]", 32) for _, r in b5.iterrows()], fontsize=7)
    ax.set_ylabel("new experts per layer at the step")
    ax.set_xlabel("comparison [transition model]")
    ax.legend(fontsize=8)
    ax.set_title(title or "Figure B5 analogue: new experts at script change and at the first mismatch")
    add_caption(fig, "New experts at step j: growth of the layer-averaged union of the verification input from j to "
                     "j + 1 positions (moespec.oracle.boundaries.new_experts). Intervals: 95% clustered bootstrap "
                     "over responses.")
    return fig


def _token_rows(ax, target: list[str], draft: list[str], k: int, extra_mark: int | None = None):
    """Two rows of cells: the target's reference tokens (top) and the draft's greedy chain (bottom),
    coloured match / first mismatch / past k*; a vertical line after k* (and after ``extra_mark``)."""
    mismatch_seen = False
    for j, (t, d) in enumerate(zip(target, draft)):
        ax.text(j + 0.5, 1.5, _shown(t), ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="square,pad=0.25", fc=COLORS["target"] if j < k else COLORS["past"], ec="none"))
        if j >= k:
            kind = "past"
        elif not mismatch_seen and d != t:
            kind, mismatch_seen = "mismatch", True
        else:
            kind = "past" if mismatch_seen else "match"
        ax.text(j + 0.5, 0.5, _shown(d), ha="center", va="center", fontsize=7,
                bbox=dict(boxstyle="square,pad=0.25", fc=COLORS[kind], ec="none"))
    ax.axvline(k, color="k", lw=1.5)
    if extra_mark is not None:
        ax.axvline(extra_mark, color="tab:red", lw=1.2, ls="--")
    ax.set_xlim(0, len(target))
    ax.set_ylim(0, 2)
    ax.set_yticks([0.5, 1.5], ["draft", "target"], fontsize=7)
    ax.set_ylabel("tokens", fontsize=7)
    ax.set_xlabel("step j from the state (drafted token j)", fontsize=7)
    ax.set_xticks(np.arange(len(target)) + 0.5, [str(j + 1) for j in range(len(target))], fontsize=6)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)


def _token_legend(fig, alpha0: bool = False):
    handles = [Patch(fc=COLORS["target"], label="target token within k*"),
               Patch(fc=COLORS["match"], label="drafted token matches"),
               Patch(fc=COLORS["mismatch"], label="first mismatch"),
               Patch(fc=COLORS["past"], label="past k* or past the mismatch"), Line2D([], [], color="k", label="k*")]
    if alpha0:
        handles.append(Line2D([], [], color="tab:red", ls="--", label="k at alpha = 0"))
    fig.legend(handles=handles, loc="upper right", fontsize=7, ncol=len(handles), bbox_to_anchor=(1, 0.995))


def _window(B, seq_id: str, i: int, lmax: int):
    texts = B.texts[seq_id]
    target = [texts[i + j] if i + j < len(texts) else "" for j in range(lmax)]
    return target, B.draft_texts[seq_id][i][:lmax]


def fig_gallery(B, picks: dict, lmax: int, title: str = "") -> plt.Figure:
    """The gallery (Figures B1/B2/B6/B7 analogues): ``picks`` transitions -> table of
    :func:`moespec.oracle.gallery.gallery`; one panel per case with its rule, k* and a_mode."""
    cases = [(t, r) for t, table in picks.items() for _, r in table.iterrows()]
    fig, axes = plt.subplots(max(len(cases), 1), 1, figsize=(1.0 * lmax + 2, 1.25 * max(len(cases), 1) + 1),
                             squeeze=False)
    for ax, (t, r) in zip(axes[:, 0], cases):
        target, draft = _window(B, r.seq_id, int(r.i), lmax)
        _token_rows(ax, target, draft, int(r.k))
        ax.set_title(f"{r.rule} [{t}] — response {r.seq_id} ({r.category}), position {int(r.i)}: k* = {int(r.k)}, "
                     f"a_mode = {int(r.a_mode)}, first mismatch at step {int(r.first_mismatch) or '-'}, "
                     f"context '{r.label}', next '{r.label_next}'", fontsize=7, loc="left")
    if not cases:
        axes[0, 0].text(0.5, 0.5, "no decision satisfies any selection rule", ha="center", transform=axes[0, 0].transAxes)
        axes[0, 0].axis("off")
    fig.suptitle(title or "Gallery (Figures B1/B2/B6/B7 analogues), selected by moespec.oracle.gallery's rules",
                 x=0.01, ha="left")
    _token_legend(fig)
    add_caption(fig, "Top: the target's reference tokens; bottom: the draft's greedy chain from the same state. Green: "
                     "matched drafted token; red: first mismatch; grey: past k* (black line) or past the mismatch. "
                     "· is a leading space, ⏎ a newline. a_mode: the modal accepted count under the panel's transitions.")
    return fig


def fig_b4(B, cases: dict, new_experts: dict, lmax: int, title: str = "", reasons: dict | None = None) -> plt.Figure:
    """Figure B4: positions where alpha = 0 drafts k* + 1 (``cases``: transitions -> table of
    :func:`moespec.oracle.gallery.b4_cases`), each with its tokens, k* (black line), the alpha = 0
    length (red dashed), the Q differences and the new experts per step along the reference
    (``new_experts``: seq_id -> [N, Lmax] array)."""
    rows = [(t, r) for t, table in cases.items() for _, r in table.iterrows()]
    fig, axes = plt.subplots(max(len(rows), 1), 1, figsize=(1.0 * lmax + 2, 1.45 * max(len(rows), 1) + 1),
                             squeeze=False)
    for ax, (t, r) in zip(axes[:, 0], rows):
        i, k = int(r.i), int(r.k_full)
        target, draft = _window(B, r.seq_id, i, lmax)
        _token_rows(ax, target, draft, k, extra_mark=int(r.k_alpha0))
        ne = new_experts[r.seq_id][i]
        ax.set_xticks(np.arange(lmax) + 0.5, [f"{j + 1}\n+{v:.1f}" if np.isfinite(v) else f"{j + 1}" for j, v in
                                              enumerate(ne[:lmax])], fontsize=6)
        p_added = getattr(r, "p_added_surrogate", r.p_added)
        ax.set_title(f"[{t}] response {r.seq_id}, position {i}: k* = {k} -> {int(r.k_alpha0)} at alpha = 0; surrogate "
                     f"p(added token) = {p_added:.3f}; Q(k*+1) - Q(k*) = {r.dQ_full_ms:+.4f} ms (full), {r.dQ_alpha0_ms:+.4f} ms "
                     f"(alpha = 0); E[extra experts] {r.dU_experts:+.2f}", fontsize=7, loc="left")
    if not rows:
        why = "; ".join(f"{t}: {w}" for t, w in (reasons or {}).items() if w) or "no position where alpha = 0 drafts k* + 1"
        axes[0, 0].text(0.5, 0.5, why, ha="center", wrap=True, transform=axes[0, 0].transAxes, fontsize=8)
        axes[0, 0].axis("off")
    fig.suptitle(title or "Figure B4 analogue: where the expert cost shifts the boundary (alpha = 0 ablation)",
                 x=0.01, ha="left")
    _token_legend(fig, alpha0=True)
    none = [t for t, table in cases.items() if not len(table)]
    add_caption(fig, "Cases chosen by moespec.oracle.gallery.b4_cases (highest surrogate probability of the added token, "
                     "one per response). Under each step: its number and the new experts per layer along the reference."
                + "".join(f" {t} transitions: no position where alpha = 0 drafts exactly k* + 1"
                          + (f" ({(reasons or {}).get(t)})" if (reasons or {}).get(t) else "") + "." for t in none))
    return fig
