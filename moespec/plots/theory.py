"""Figures of the step-time theory (paper 1, Sec. 3; Appendices B-C): staircases k*(a) with their
step points, reuse thresholds rho*_k(a), and the error bounds of Table 2. Inputs are computed in
the current run by :mod:`moespec.theory`; labels say whose numbers they are built from."""

from __future__ import annotations

from typing import Mapping

import matplotlib.pyplot as plt
import numpy as np

from moespec.plots._layout import add_caption
from moespec.theory import Staircase


def _stairs(ax, st: Staircase, **style):
    """Draw k*(a) on [0, 1) as a step line, left-continuous as (B.31) makes it."""
    xs = [0.0, *st.breakpoints, 1.0]
    ys = list(st.values)
    ax.stairs(ys, xs, baseline=None, **style)
    for b in st.breakpoints:
        ax.plot([b], [ys[xs.index(b) - 1]], "o", ms=3, mfc="white", color=style.get("color"))


def fig_staircases(step_times: Mapping[str, Mapping[str, np.ndarray]],
                   staircases: Mapping[str, Mapping[str, Staircase]], title: str = "") -> plt.Figure:
    """One column per panel name: top, the step time V(k)/V(0) against k; bottom, the staircase
    k*(a) against the acceptance a, open circles at the step points (paper 1, Sec. 3.3)."""
    panels = list(staircases)
    fig, axes = plt.subplots(2, len(panels), figsize=(4.4 * len(panels), 6.4), squeeze=False)
    for col, panel in enumerate(panels):
        top, bottom = axes[0][col], axes[1][col]
        for i, (label, st) in enumerate(staircases[panel].items()):
            V = np.asarray(step_times[panel][label], dtype=float)
            color = f"C{i % 10}"
            top.plot(np.arange(len(V)), V / V[0], "o-", ms=3, color=color, label=label)
            _stairs(bottom, st, color=color, lw=1.4, label=label)
        top.set_title(panel, fontsize=9)
        top.set_xlabel("draft length k")
        top.set_ylabel("V(k) / V(0)")
        bottom.set_xlabel("acceptance rate a")
        bottom.set_ylabel("best draft length k*(a)")
        bottom.set_xlim(0, 1)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
        top.legend(fontsize=6, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def fig_thresholds(a: np.ndarray, curves: Mapping[int, Mapping[str, np.ndarray]],
                   marks: Mapping[int, Mapping[str, float]] | None = None, title: str = "") -> plt.Figure:
    """rho*_k(a) against a, one panel per k, one line per label (e.g. per D); draft length k is
    faster than plain decoding where the mean reuse rho_bar_k lies above its line (eq. B.14).
    ``marks`` draws a horizontal line at a given rho_bar_k per label."""
    ks = list(curves)
    fig, axes = plt.subplots(1, len(ks), figsize=(3.6 * len(ks), 3.4), squeeze=False, sharey=True)
    for ax, k in zip(axes[0], ks):
        for i, (label, y) in enumerate(curves[k].items()):
            ax.plot(a, y, color=f"C{i % 10}", lw=1.3, label=label)
            rb = (marks or {}).get(k, {}).get(label)
            if rb is not None:
                ax.axhline(rb, color=f"C{i % 10}", ls=":", lw=1)
        ax.set_title(f"k = {k}", fontsize=9)
        ax.set_xlabel("acceptance rate a")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlim(0, 1)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("reuse threshold rho*_k(a)")
    axes[0][0].legend(fontsize=6, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def fig_error_bounds(eps: np.ndarray, bounds: Mapping[str, np.ndarray], engine_eps: Mapping[str, float],
                     savings: Mapping[str, tuple], margins: Mapping[str, tuple], title: str = "") -> plt.Figure:
    """Left: the bounds of Table 2 against the bandwidth error eps (delta = eps/(1-eps), throughput
    lost 2 delta/(1+delta), speedup factor (1+delta)/(1-delta) - 1), with each engine's eps.
    Middle: saving S(n) with the band of (18), per label: (n, S, half-width).
    Right: ln r(n) - ln ubar(n) against the margin of (19), per label: (n, gap, margin)."""
    fig, (ax0, ax1, ax2) = plt.subplots(1, 3, figsize=(13.5, 3.8))
    for name, y in bounds.items():
        ax0.plot(eps, y, lw=1.4, label=name)
    for i, (engine, e) in enumerate(engine_eps.items()):
        ax0.axvline(e, color="0.4", ls=":", lw=1)
        ax0.text(e, 0.97 - 0.08 * i, f" {engine}", fontsize=6, transform=ax0.get_xaxis_transform())
    ax0.set_xlabel("relative bandwidth error eps")
    ax0.set_ylabel("bound (share)")
    ax0.set_title("bounds of Table 2 against eps", fontsize=9)
    ax0.set_xlim(eps.min(), eps.max())
    ax0.legend(fontsize=6)
    for i, (label, (n, S, half)) in enumerate(savings.items()):
        color = f"C{i % 10}"
        ax1.plot(n, S, "o-", ms=3, color=color, label=label)
        ax1.fill_between(n, S - half, S + half, color=color, alpha=0.15, lw=0)
    ax1.axhline(0, color="0.3", lw=0.8)
    ax1.set_xlabel("tokens per pass n")
    ax1.set_ylabel("saving S(n) (ms), band of (18)")
    ax1.set_title("saving of deduplication, band of (18)", fontsize=9)
    ax1.legend(fontsize=6)
    for i, (label, (n, gap, margin)) in enumerate(margins.items()):
        color = f"C{i % 10}"
        ax2.plot(n, gap, "o-", ms=3, color=color, label=label)
        ax2.fill_between(n, -margin, margin, color=color, alpha=0.08, lw=0)
    ax2.axhline(0, color="0.3", lw=0.8)
    ax2.set_xlabel("tokens per pass n")
    ax2.set_ylabel("ln r(n) - ln ubar(n); shaded: margin of (19)")
    ax2.set_title("which kernel is faster, margin of (19)", fontsize=9)
    ax2.legend(fontsize=6)
    for ax in (ax0, ax1, ax2):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Error bounds of paper 1, Table 2", fontsize=9)
    add_caption(fig, "eps: relative error of the effective bandwidths; delta = eps/(1-eps): relative error of the step "
                     "time; S(n): saving of deduplication; r(n): bandwidth ratio deduplicating / per-slot; ubar(n): "
                     "share of the per-slot bytes the deduplicating kernel reads; dotted verticals: each engine's "
                     "published eps (paper 1, their hardware).")
    return fig
