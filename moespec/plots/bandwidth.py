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


#: How a share of the read ceiling above 1 beyond the probe's spread is marked (issue 58's check).
FLAG_STYLE = dict(ls="none", marker="o", ms=13, mfc="none", mec="red", mew=1.5)
FLAG_LABEL = "share of the read ceiling above 1 beyond the probe's spread (not a result: see the note)"


def _flag_note(flags: list[tuple[str, int, str]]) -> str:
    """The caption's note on the flagged points ``(model, n, 'kernel: cause; ...')``."""
    if not flags:
        return ""
    causes = sorted({c.split(": ", 1)[-1] for _, _, text in flags for c in text.split("; ")})
    where = ", ".join(f"{m} n = {n}" for m, n, _ in flags[:6])
    where += f" and {len(flags) - 6} more" if len(flags) > 6 else ""
    return (f" Red rings: a kernel's share of the read ceiling is above 1 beyond the probe's spread ({where}); "
            f"likely cause: {'; '.join(causes)}.")


def figure2_bandwidth(passes: pd.DataFrame, read_bw: dict | None = None, title: str = "") -> plt.Figure:
    """Effective bandwidth of each kernel against n, one panel per model: median and
    interquartile range over layers and windows of each pass's requested bytes over its time
    (``passes`` from :func:`moespec.fit.window_bandwidths`). ``read_bw``: {model: DataFrame (n,
    read_GBps[, read_probe, sum_GBps, above_read, above_read_cause])} of the read measured inside the
    interleaved groups of the same run (:func:`moespec.tables.bandwidth.bandwidth_by_n`): the read
    ceiling (dotted), the ``torch.sum`` read (dash-dotted, where it differs from the ceiling), and a red
    ring on each kernel's point whose share of the ceiling is flagged above 1, with a caption note."""
    models = list(dict.fromkeys(passes["model"]))
    fig, axes = plt.subplots(1, len(models), figsize=(4.2 * len(models) + 4.0, 3.8), squeeze=False)
    flags = []
    for ax, model in zip(axes[0], models):
        g = passes[passes["model"] == model]
        medians = {}
        for kernel, style in KERNEL_STYLE.items():
            q = g[g["kernel"] == kernel].groupby("n")["beta_GBps"].quantile([0.25, 0.5, 0.75]).unstack()
            if q.empty:
                continue
            medians[kernel] = q[0.5]
            ax.errorbar(q.index, q[0.5], yerr=[q[0.5] - q[0.25], q[0.75] - q[0.5]], color="C0" if kernel == "slot"
                        else "C3", capsize=2, ms=5, **{k: v for k, v in style.items() if v is not None})
        ref = (read_bw or {}).get(model)
        if ref is not None and len(ref):
            probe = str(ref["read_probe"].iloc[0]) if "read_probe" in ref else "torch.sum"
            name = "read bandwidth (torch.sum)" if probe == "torch.sum" else f"read ceiling ({probe})"
            ax.plot(ref["n"], ref["read_GBps"], ":", marker="x", color="0.3",
                    label=f"{name}, same groups (median {ref['read_GBps'].median():.1f} GB/s)")
            if "sum_GBps" in ref and probe != "torch.sum":
                ax.plot(ref["n"], ref["sum_GBps"], "-.", color="0.6", lw=1,
                        label=f"torch.sum read, same groups (median {ref['sum_GBps'].median():.1f} GB/s)")
            marked = ref[ref["above_read"].fillna("").astype(str) != ""] if "above_read" in ref else []
            pts = [(n, medians[k][n]) for n, ks in (zip(marked["n"], marked["above_read"]) if len(marked) else [])
                   for k in str(ks).split(",") if k in medians and n in medians[k].index]
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], label=FLAG_LABEL, **FLAG_STYLE)
                flags += [(model, int(r.n), str(r.above_read_cause)) for r in marked.itertuples()]
        ax.set_title(f"model shape: {model}", fontsize=10)
        ax.set_xlabel("tokens per pass n")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("effective bandwidth (GB/s)")
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Effective bandwidth of the two expert kernels", fontsize=9)
    add_caption(fig, BYTES_TEXT + _flag_note(flags), width=110)
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
    flagged = []
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
                    if f"{kernel}_above_read" in f:
                        hit = f[f[f"{kernel}_above_read"].fillna(False).astype(bool)]
                        if len(hit):
                            ax.plot(hit["n"], hit[col], ms=9, **{k: v for k, v in FLAG_STYLE.items() if k != "ms"},
                                    label=None if flagged else FLAG_LABEL)
                            flagged += [(f"{engine.split(' (')[0]} {model} {fmt} {kernel}", int(n),
                                         str(c)) for n, c in zip(hit["n"], hit[f"{kernel}_above_read_cause"])]
            ax.axhline(1.0, color="0.4", ls=":", lw=1)
            ax.set_title(f"{model}" if i == 0 else "", fontsize=10)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(f"{engine.split(' (')[0]}\neffective / read bandwidth", fontsize=9)
            ax.set_xlabel("tokens per pass n")
    top = pd.to_numeric(bw[["slot_over_read", "dedup_over_read"]].stack(), errors="coerce").max()
    axes[0][0].set_ylim(0, max(1.15, float(top) * 1.04 if np.isfinite(top) else 1.15))
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Figure 2 at paper 1's breadth: engines x models, every format", fontsize=9)
    add_caption(fig, BYTES_TEXT.split(" Median")[0] + " Median over the run's rounds of each kernel's effective "
                "bandwidth over the same round's read bandwidth (dotted: 1); solid per-slot, dashed deduplicating."
                + _flag_note(flagged), width=130)
    return fig
