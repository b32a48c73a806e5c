"""The answer of ``moespec advise`` as one figure (notebook 08): which expert kernel from which pass
size, and which draft length at each acceptance rate, with the error bands of paper 1's bounds."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np

from .decide import ENGINE_NAMES


def advice_figure(advice: dict, title: str = "") -> plt.Figure:
    """Left: the saving of deduplication S(n) = tau_slot(n) - tau_dedup(n) with its interval
    (bound (18), or the measured interval) and the crossover. Right: predicted speedup over plain
    decoding against the draft length k, per acceptance rate, for the recommended engine (solid)
    and the per-slot kernel (dotted), k* marked with the interval of bound (21)."""
    s, kd = advice["subject"], advice["dedup"]
    rows = kd["pass_sizes"]
    n = np.array([r["n"] for r in rows])
    S = np.array([r["saving_ms"] for r in rows])
    lo = np.array([r["saving_lo_ms"] for r in rows])
    hi = np.array([r["saving_hi_ms"] for r in rows])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 5.6))
    band = "band of bound (18) at eps" if "(18)" in kd["interval"] else kd["interval"]
    left.fill_between(n, lo, hi, color="C3", alpha=0.18, lw=0, label=f"interval of S(n): {band}")
    left.plot(n, S, "o-", color="C3", label="saving S(n) = verify time per-slot − deduplicating")
    left.axhline(0, color="0.4", lw=0.8)
    if kd["from_n"] is not None:
        left.axvline(kd["from_n"] - 0.5, color="k", ls="--", lw=1,
                     label=f"deduplication faster from n = {kd['from_n']} (guaranteed from "
                           f"{kd['guaranteed_from_n'] if kd['guaranteed_from_n'] is not None else 'none'})")
    left.set_xlabel("tokens verified in one pass, n")
    left.set_ylabel("time saved by deduplication (ms per pass)")
    left.set_title("Which expert kernel", fontsize=10)
    left.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)
    left.grid(alpha=0.3)
    for i, item in enumerate(advice["acceptance"]):
        color = f"C{i % 10}"
        rec = item["recommended"]
        eng = item["engines"][rec["engine"]]
        k = np.arange(len(eng["speedup_by_k"]))
        right.plot(k, eng["speedup_by_k"], "-", color=color,
                   label=("measured acceptance profile" if item.get("acceptance_model") == "profile"
                          else f"a = {item['a']:.2f} (geometric)") + f": {ENGINE_NAMES[rec['engine']]}")
        if rec["engine"] != "slot":
            right.plot(k, item["engines"]["slot"]["speedup_by_k"], ":", color=color)
        right.fill_between(k, eng["speedup_lo_by_k"], eng["speedup_hi_by_k"], color=color, alpha=0.12, lw=0)
        right.errorbar([rec["k"]], [rec["speedup"]], yerr=[[rec["speedup"] - rec["speedup_lo"]],
                                                           [rec["speedup_hi"] - rec["speedup"]]],
                       fmt="*", ms=12, color=color, capsize=3)
    right.plot([], [], "k*", ms=10, label="best draft length k*; shaded: the band of bound (21) at every k")
    right.plot([], [], "k:", label="per-slot kernel at every n (where not the recommended engine)")
    right.axhline(1, color="0.4", lw=0.8, ls="--", label="plain decoding (speedup 1)")
    right.set_xlabel("draft length k (tokens drafted per step)")
    right.set_ylabel("predicted speedup over plain decoding (x)")
    right.set_title("Which draft length", fontsize=10)
    right.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0, -0.16), frameon=False)
    right.grid(alpha=0.3)
    err = advice["error"]
    fig.suptitle(title or f"moespec advise: {s['model']}, {s['engine']} ({s['format']}); numbers from {s['from']}, "
                          f"{s['source']}; delta = {err['delta']:.3f}", fontsize=9)
    fig.text(0.01, 0.005, "Round model V(k) = t_draft(k) + tau(k + 1) + h(k); bands: bound (21) per k with delta_k "
                          "from "
                          "the terms' 95 % intervals (and eps, where a verify term is predicted from bandwidths). "
                          f"Draft: {advice['draft']['name']}; draft time per round k = 0..: "
                          f"{', '.join(f'{x:.2g}' for x in advice['draft_time_ms'])} ms; host: "
                          f"{', '.join(f'{x:.2g}' for x in advice['host_time_ms'])} ms.",
             fontsize=7, color="0.3")
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    return fig
