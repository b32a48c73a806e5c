"""Figures of the embedded default models (notebook 00): training curves and expert load."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd


def training_curves(history: pd.DataFrame) -> plt.Figure:
    """Language-model loss (nats/token) against training tokens, one line per model, and the
    MoE's load-balancing loss on a second panel (``history``: model, tokens, lm_loss, aux_loss)."""
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, grp in history.groupby("model", sort=False):
        ax.plot(grp["tokens"], grp["lm_loss"], label=name)
        if (grp["aux_loss"] > 0).any():
            ax2.plot(grp["tokens"], grp["aux_loss"], label=name)
    ax.set_xlabel("training tokens")
    ax.set_ylabel("next-token loss (nats)")
    ax.set_title("training loss (WikiText-2 train)", fontsize=10)
    ax.legend(fontsize=8)
    ax2.set_xlabel("training tokens")
    ax2.set_ylabel("load-balancing loss")
    ax2.set_title("router load-balancing loss (balanced: = m)", fontsize=10)
    for a in (ax, ax2):
        a.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def expert_load(load: np.ndarray, title: str) -> plt.Figure:
    """Share of routed slots per expert, sorted, one line per layer (``load`` [L, N]), beside
    the balanced share 1/N."""
    L, N = load.shape
    fig, ax = plt.subplots(figsize=(6, 3.8))
    for layer in range(L):
        ax.plot(np.arange(1, N + 1), np.sort(load[layer])[::-1], label=f"layer {layer}")
    ax.axhline(1 / N, color="0.3", ls=":", label=f"balanced, 1/N = 1/{N}")
    ax.set_xlabel("expert rank (most used first)")
    ax.set_ylabel("share of routed slots")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig
