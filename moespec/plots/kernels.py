"""The expert kernels' effective bandwidth as a share of the machine's read bandwidth, per format
(issue 4's benchmark, ``benchmarks/bench_kernels.py``; paper 1, Section 2: beta = requested bytes /
time, per-slot on n·m·b, deduplicating on U·b)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

#: (kernel, backend) -> label and style; ggml's MUL_MAT_ID is a deduplicating kernel.
SERIES = {("slot", "cpp"): dict(label="moespec per-slot, on n·m·b", color="C0", ls="-", marker="o"),
          ("dedup", "cpp"): dict(label="moespec dedup, on U·b", color="C3", ls="--", marker="o", mfc="white"),
          ("dedup", "ggml"): dict(label="ggml MUL_MAT_ID (dedup), on U·b", color="C2", ls="-.", marker="s"),
          ("slot", "torch"): dict(label="torch per-expert F.linear (per-slot)", color="0.4", ls="", marker="x")}


def kernel_share_figure(rows: pd.DataFrame, model: str, title: str = "") -> plt.Figure:
    """One panel per format for ``model``: each kernel's beta over the read bandwidth of the same
    rounds against n (median over rounds, interquartile range as bars), with 1 (the 1 GiB read) and
    the share a ``torch.sum`` over one n = 1 pass's bytes reached (dotted). ``rows``: the benchmark's
    CSV rows (columns model, fmt, kernel, backend, n, beta_over_read[_q25, _q75], read_GBps,
    layer_read_over_read)."""
    g = rows[rows["model"] == model]
    if g.empty:
        raise ValueError(f"no rows for model {model!r}; models present: {sorted(set(rows['model']))}")
    fmts = list(dict.fromkeys(g["fmt"]))
    fig, axes = plt.subplots(1, len(fmts), figsize=(4.3 * len(fmts), 3.7), squeeze=False, sharey=True)
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
        ax.set_title(f"{fmt}, read {f['read_GBps'].iloc[0]:.1f} GB/s", fontsize=9)
        ax.set_xlabel("tokens per pass n")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("effective bandwidth / read bandwidth")
    axes[0][0].set_ylim(0, 1.1)
    axes[0][0].legend(fontsize=6.5, loc="lower left")
    fig.suptitle(title or f"{model}: expert kernels on this CPU (one interleaved run per format)", fontsize=9)
    fig.tight_layout()
    return fig
