"""Paper 1, Figures 2, 3 (right panel) and 7: effective bandwidth, distinct share, transfer."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from moespec.plots._layout import add_caption, legend_outside

#: Each kernel, named by the bytes its effective bandwidth counts (paper 1, Sec. 2).
KERNEL_STYLE = {"slot": dict(ls="-", marker="o", mfc=None,
                             label="per-slot kernel: bytes of every token's experts (n·m·b) / time"),
                "dedup": dict(ls="--", marker="o", mfc="white",
                              label="deduplicating kernel: bytes of the distinct experts (U·b) / time")}
#: The symbols of the bandwidth figures.
BYTES_TEXT = ("n: tokens in the pass; m: experts each token selects; b: bytes of one expert of the layer; U: distinct "
              "experts the n tokens select. Median and interquartile range over layers and windows of routing.")


def figure2_bandwidth(passes: pd.DataFrame, read_bw: dict | None = None, title: str = "") -> plt.Figure:
    """Effective bandwidth of each kernel against n, one panel per model: median and
    interquartile range over layers and windows of each pass's requested bytes over its time
    (``passes`` from :func:`moespec.fit.window_bandwidths`). ``read_bw``: {model: DataFrame (n,
    read_GBps)} of the machine's read bandwidth measured inside the interleaved groups of the same
    run (dotted; :func:`moespec.measure.expert_op.read_bandwidth` with ``by_n``)."""
    models = list(dict.fromkeys(passes["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models) + 4.0, 3.8), squeeze=False)
    for ax, model in zip(axes[0], models):
        g = passes[passes["model"] == model]
        for kernel, style in KERNEL_STYLE.items():
            q = g[g["kernel"] == kernel].groupby("n")["beta_GBps"].quantile([0.25, 0.5, 0.75]).unstack()
            if q.empty:
                continue
            ax.errorbar(q.index, q[0.5], yerr=[q[0.5] - q[0.25], q[0.75] - q[0.5]], color="C0" if kernel == "slot"
                        else "C3", capsize=2, ms=5, **{k: v for k, v in style.items() if v is not None})
        ref = (read_bw or {}).get(model)
        if ref is not None and len(ref):
            ax.plot(ref["n"], ref["read_GBps"], ":", marker="x", color="0.3",
                    label=f"read bandwidth, same groups (median {ref['read_GBps'].median():.1f} GB/s)")
        ax.set_title(f"model shape: {model}", fontsize=10)
        ax.set_xlabel("tokens per pass n")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("effective bandwidth (GB/s)")
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Effective bandwidth of the two expert kernels", fontsize=9)
    add_caption(fig, BYTES_TEXT, width=110)
    return fig


def figure3_distinct_share(shares: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure 3, right panel as far as it goes here: U/(n·m) of windows against n for each trace
    (``shares`` from :func:`moespec.tables.bandwidth.distinct_share`), between 1/n (every token
    repeats the first token's experts) and 1 (no expert repeats)."""
    fig, ax = plt.subplots(figsize=(5.5, 4))
    for i, (label, g) in enumerate(shares.groupby("label", sort=False)):
        ax.plot(g["n"], g["share"], "o-", color=f"C{i % 10}", label=label)
    n = np.arange(int(shares["n"].min()), int(shares["n"].max()) + 1)
    ax.plot(n, 1 / n, ":", color="0.4", label="1/n (full repetition)")
    ax.axhline(1.0, ls=":", color="0.6", label="1 (no repetition)")
    ax.set_xlabel("tokens per pass n")
    ax.set_ylabel("distinct share of expert selections U/(n·m)")
    ax.set_ylim(0, 1.05)
    ax.grid(alpha=0.3)
    legend_outside(ax, fontsize=6.5)
    ax.set_title(title or "Distinct share of windows of n consecutive tokens", fontsize=9)
    add_caption(fig, "U: distinct experts the n tokens of a window select in a layer; m: experts per token; "
                     "mean over windows and layers.", width=90)
    return fig


def figure7_transfer(tr: pd.DataFrame, ns=(2, 4, 6, 8), title: str = "") -> plt.Figure:
    """Figure 7: bandwidth of a held-out model predicted from the other models (fit of log beta
    linear in log n and log b, :func:`moespec.fit.transfer`) against the one measured on it, at
    ``ns``. Left: each kernel's bandwidth (filled: per-slot; open: deduplicating), log scale.
    Right: the ratio r(n). Dotted: equal."""
    tr = tr[tr["n"].isin(list(ns))]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
    for i, (model, g) in enumerate(tr.groupby("model", sort=False)):
        c = f"C{i % 10}"
        left.plot(g["beta_slot_meas"], g["beta_slot_pred"], "o", color=c, label=f"{model} per-slot")
        left.plot(g["beta_dedup_meas"], g["beta_dedup_pred"], "o", mfc="white", color=c, label=f"{model} dedup")
        right.plot(g["r_meas"], g["r_pred"], "o", color=c, label=model)
    vals = tr[["beta_slot_meas", "beta_slot_pred", "beta_dedup_meas", "beta_dedup_pred"]].to_numpy(float)
    lo, hi = np.nanmin(vals) / 1.3, np.nanmax(vals) * 1.3
    left.plot([lo, hi], [lo, hi], ":", color="0.4")
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("effective bandwidth measured on the model (GB/s)")
    left.set_ylabel("predicted from the other models (GB/s)")
    left.set_title(f"effective bandwidth of each kernel at n = {', '.join(map(str, ns))}", fontsize=9)
    left.legend(fontsize=6.5)
    rv = tr[["r_meas", "r_pred"]].to_numpy(float)
    rlo, rhi = min(0.0, np.nanmin(rv)), max(1.0, np.nanmax(rv)) * 1.05
    right.plot([rlo, rhi], [rlo, rhi], ":", color="0.4")
    right.set_xlabel("measured r(n)")
    right.set_ylabel("predicted r(n)")
    right.set_title("bandwidth ratio r(n) = deduplicating / per-slot", fontsize=9)
    right.legend(fontsize=7, title="held-out model", title_fontsize=7)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Transfer of the bandwidth to a held-out model", fontsize=9)
    add_caption(fig, "Each held-out model's bandwidths predicted by a fit of log bandwidth linear in log n and "
                     "log b (b: bytes of one expert) on the other models; dotted: prediction = measurement.", width=120)
    return fig


#: Colours of the storage formats in the breadth grid.
FORMAT_COLOR = {"f32": "C0", "bf16": "C2", "int8_b32": "C3"}


def figure2_grid(bw: pd.DataFrame, title: str = "") -> plt.Figure:
    """Figure 2 in paper 1's grid: one row of panels per engine, one column per model; in each,
    each kernel's effective bandwidth over the read bandwidth of the same rounds against n, one
    colour per format (``bw`` from :func:`moespec.tables.bandwidth.breadth_bandwidths`)."""
    engines, models = list(dict.fromkeys(bw["engine"])), list(dict.fromkeys(bw["model"]))
    fig, axes = plt.subplots(len(engines), len(models), figsize=(3.6 * len(models) + 4.0, 3.2 * len(engines)),
                             squeeze=False, sharey=True)
    for i, engine in enumerate(engines):
        for j, model in enumerate(models):
            ax = axes[i][j]
            g = bw[(bw.engine == engine) & (bw.model == model)]
            for fmt, f in g.groupby("fmt", sort=False):
                for kernel, col in (("slot", "slot_over_read"), ("dedup", "dedup_over_read")):
                    style = {k: v for k, v in KERNEL_STYLE[kernel].items() if k != "label" and v is not None}
                    ax.plot(f["n"], f[col], color=FORMAT_COLOR.get(fmt, "0.3"), ms=4, **style,
                            label=f"{fmt}, {kernel}")
            ax.axhline(1.0, color="0.4", ls=":", lw=1)
            ax.set_title(f"{model}" if i == 0 else "", fontsize=10)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"{engine.split(' (')[0]}\neffective / read bandwidth", fontsize=9)
            ax.set_xlabel("tokens per pass n")
    axes[0][0].set_ylim(0, 1.15)
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Figure 2 at paper 1's breadth: engines x models, every format", fontsize=9)
    add_caption(fig, BYTES_TEXT.split(" Median")[0] + " Median over the run's rounds of each kernel's effective "
                "bandwidth over the same round's read bandwidth (dotted: 1); solid per-slot, dashed deduplicating.",
                width=130)
    return fig
