"""The expert kernels' effective bandwidth as a share of the machine's read bandwidth, per format
(``benchmarks/bench_kernels.py``; paper 1, Section 2: beta = requested bytes / time, per-slot on
n·m·b, deduplicating on U·b)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moespec.plots._layout import add_caption

#: (kernel, backend) -> label and style; ggml's MUL_MAT_ID is a deduplicating kernel.
SERIES = {("slot", "cpp"): dict(label="moespec per-slot: every token's expert bytes (n·m·b) / time", color="C0",
                                ls="-", marker="o"),
          ("dedup", "cpp"): dict(label="moespec dedup: distinct experts' bytes (U·b) / time", color="C3", ls="--",
                                 marker="o", mfc="white"),
          ("dedup", "ggml"): dict(label="ggml MUL_MAT_ID (dedup): distinct experts' bytes (U·b) / time", color="C2",
                                  ls="-.", marker="s"),
          ("slot", "torch"): dict(label="torch per-expert F.linear (per-slot)", color="0.4", ls="", marker="x")}


def _format_panels(rows: pd.DataFrame, model: str, height: float):
    """``model``'s rows (``ValueError`` naming the models present when there are none), its formats
    in order of appearance, and a figure with one panel per format (shared y axis)."""
    g = rows[rows["model"] == model]
    if g.empty:
        raise ValueError(f"no rows for model {model!r}; models present: {sorted(set(rows['model']))}")
    fmts = list(dict.fromkeys(g["fmt"]))
    fig, axes = plt.subplots(1, len(fmts), figsize=(4.3 * len(fmts), height), squeeze=False, sharey=True)
    return g, fmts, fig, axes


def kernel_share_figure(rows: pd.DataFrame, model: str, title: str = "") -> plt.Figure:
    """One panel per format for ``model``: each kernel's beta over the read of the same rounds (the
    read ceiling where the run has ``read_probe``, else its ``torch.sum``) against n (median over
    rounds, interquartile range as bars), with 1 (the reference read) and the share a ``torch.sum``
    over one n = 1 pass's bytes reached (dotted); a red ring on each share flagged above 1 beyond its
    spread (column ``above_read``) and a note of the causes under the panels. ``rows``: the benchmark's
    CSV rows (columns model, fmt, kernel, backend, n, beta_over_read[_q25, _q75], read_GBps,
    layer_read_over_read[, read_probe, above_read, above_read_cause])."""
    g, fmts, fig, axes = _format_panels(rows, model, height=3.7)
    causes = set()
    for ax, fmt in zip(axes[0], fmts):
        f = g[g["fmt"] == fmt]
        for (kernel, backend), style in SERIES.items():
            s = f[(f["kernel"] == kernel) & (f["backend"] == backend)].sort_values("n")
            if s.empty:
                continue
            ax.errorbar(s["n"], s["beta_over_read"], yerr=[s["beta_over_read"] - s["beta_over_read_q25"],
                                                          s["beta_over_read_q75"] - s["beta_over_read"]],
                        capsize=2, ms=4, **style)
        ax.axhline(1.0, color="0.5", lw=0.8)
        layer = f["layer_read_over_read"].iloc[0]
        ax.axhline(layer, color="0.5", ls=":", lw=1, label=f"torch.sum over one n = 1 pass ({layer:.2f})")
        if "above_read" in f:
            hit = f[f["above_read"].fillna(False).astype(bool)]
            if len(hit):
                ax.plot(hit["n"], hit["beta_over_read"], ls="none", marker="o", ms=11, mfc="none", mec="red",
                        mew=1.5, label="share above 1 beyond its spread (not a result)")
                causes |= set(hit["above_read_cause"].astype(str))
        read = f"read ceiling ({f['read_probe'].iloc[0]})" if "read_probe" in f else "read"
        ax.set_title(f"{fmt}, {read} {f['read_GBps'].iloc[0]:.1f} GB/s", fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("effective bandwidth / read bandwidth")
    axes[0][0].set_ylim(0, max(1.1, float(g["beta_over_read"].max()) * 1.04))
    axes[0][0].legend(fontsize=6.5, loc="lower left")
    fig.suptitle(title or f"{model}: expert kernels on this CPU (one interleaved run per format)", fontsize=9)
    if causes:
        add_caption(fig, "Red rings: a share of the read ceiling above 1 beyond its spread (lower quartile of the "
                         f"paired ratio above 1); likely cause: {'; '.join(sorted(causes))}.", width=150)
    else:
        fig.tight_layout()
    return fig


#: stage -> (label, color) for :func:`call_stages_figure`, in stacking order: the work items at the
#: bottom, the per-call fixed stages above them (greys, and red for the return)
STAGE_STYLE = {"work": ("work items (weight stream)", "C0"), "python_in": ("Python + pybind11 in", "0.8"),
               "setup": ("set-up (checks, groups, items)", "0.6"), "wake": ("helper wake-up", "0.4"),
               "combine": ("step 4 (combine)", "0.2"), "python_out": ("pybind11 + Python out", "C3")}


def call_stages_figure(rows: pd.DataFrame, model: str, title: str = "") -> plt.Figure:
    """One panel per format: the stages of a cold call (median microseconds per stage, as a share
    of their sum) against n, with the call's and the work stage's effective bandwidth over the
    read bandwidth written above each bar. ``rows``: ``benchmarks/bench_call_stages.py``'s CSV rows
    (columns model, fmt, n, ``<stage>_us`` for the stages of :data:`STAGE_STYLE`,
    total_over_read, work_over_read, read_GBps)."""
    g, fmts, fig, axes = _format_panels(rows, model, height=3.9)
    for ax, fmt in zip(axes[0], fmts):
        f = g[g["fmt"] == fmt].sort_values("n")
        us = f[[f"{k}_us" for k in STAGE_STYLE]].to_numpy(dtype=float)
        share = us / us.sum(axis=1, keepdims=True)
        pos = range(len(f))
        bottom = share[:, 0] * 0
        for j, (label, color) in enumerate(STAGE_STYLE.values()):
            ax.bar(pos, share[:, j], bottom=bottom, color=color, label=label, width=0.7)
            bottom = bottom + share[:, j]
        for p, (tot, work) in zip(pos, zip(f["total_over_read"], f["work_over_read"])):
            ax.text(p, 1.01, f"{tot:.2f}\n{work:.2f}", ha="center", va="bottom", fontsize=6.5)
        ax.set_xticks(list(pos), [str(n) for n in f["n"]])
        ax.set_ylim(0.85, 1.07)
        ax.set_title(f"{fmt}, read {f['read_GBps'].iloc[0]:.1f} GB/s\n(above: call / read, work stage / read)", fontsize=8)
        ax.set_xlabel("tokens per pass n")
    axes[0][0].set_ylabel("share of the call's time (axis from 0.85)")
    axes[0][0].legend(fontsize=6, loc="lower left", framealpha=0.9)
    fig.suptitle(title or f"{model}: where a cold dedup call's time goes (C++ kernels, this CPU)", fontsize=9)
    fig.tight_layout()
    return fig
