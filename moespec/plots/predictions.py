"""Paper 1, Figures 4, 5 and 6 for this engine, and the whole-model run figures of notebook 05
(verify time, oracle acceptance, real draft)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import pandas as pd

from moespec.plots._layout import add_caption, legend_outside

#: The versions of the prediction chain (22), each named by what it puts into (22).
VERSION_STYLE = {"prediction": dict(color="C3", ls="-", marker="o",
                                    label="prediction: fits (4)/(E.1) at the union bytes of WikiText windows"),
                 "text": dict(color="C1", ls="-.", marker="^",
                              label="prediction at the routing of the text the runs verified"),
                 "measured-time": dict(color="0.45", ls="--", marker="s",
                                       label="measured-time version: each window's measured operation time in (22)"),
                 "calibrated": dict(color="C2", ls=":", marker="D",
                                    label="calibrated version: measured-time + measured growth outside the experts")}
#: Definitions the whole-model figures share.
VERSIONS_TEXT = ("Versions of the chain (22): prediction = fits (4)/(E.1) at the union bytes of WikiText windows; "
                 "measured-time = each window's measured operation time; calibrated = measured-time plus the "
                 "measured growth with n of the time outside the expert operation.")
EPS_TEXT = ("eps: the engine's bandwidth error, the larger of the two kernels' median |relative error| of the fitted "
            "operation time on routing windows the fits did not see (paper 1, Sec. 4).")
SAVING_TEXT = ("S(n): saving of deduplication, verify time with it off minus on, for a pass of n tokens; "
               "band of bound (18): +- eps/(1-eps) (M_slot(n) + M_dedup(n)), M the predicted expert times; "
               "d: context depth (tokens already in the cache).")


def verify_time_figure(summary: pd.DataFrame, title: str = "") -> plt.Figure:
    """Measured whole-model verify time tau_p(n), deduplication off and on, one panel per depth,
    median and 95% bootstrap interval; right axis: the saving S(n) (notebook 05)."""
    depths = sorted(summary["d"].unique())
    fig, axes = plt.subplots(1, len(depths), figsize=(4.6 * len(depths), 3.6), squeeze=False)
    for ax, d in zip(axes[0], depths):
        g = summary[summary["d"] == d].sort_values("n")
        for p, color, label in (("slot", "C0", "dedup off (per-slot)"), ("dedup", "C3", "dedup on")):
            mid = g[f"tau_{p}_s"] * 1e3
            ax.errorbar(g["n"], mid, yerr=[mid - g[f"tau_{p}_lo_s"] * 1e3, g[f"tau_{p}_hi_s"] * 1e3 - mid],
                        color=color, marker="o", mfc="white" if p == "dedup" else color, capsize=2, label=label)
        ax.set_title(f"context depth d = {d} tokens", fontsize=10)
        ax.set_xlabel("tokens verified per pass n")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("verify time per pass (ms)")
    axes[0][0].legend(fontsize=8, title="median, 95% interval", title_fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def oracle_figure(cells: pd.DataFrame, title: str = "") -> plt.Figure:
    """Oracle draft: tokens per step against G_a(k), and realized acceptance against a (each point
    one (d, k, a) cell of :func:`moespec.tables.predictions.oracle_cells`, pooled over prompts and
    repetitions)."""

    cells = cells.rename(columns={"tokens_per_step": "tps"})
    drafted = cells[cells["k"] > 0]
    real_a = drafted["realized_a"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    sc = ax1.scatter(cells["G"], cells["tps"], c=cells["k"], cmap="viridis", s=14)
    top = cells["G"].max() * 1.05
    ax1.plot([1, top], [1, top], ls=":", color="0.3", label="equal")
    ax1.set_xlabel("G_a(k) = 1 + a + ... + a^k")
    ax1.set_ylabel("tokens per step, measured")
    fig.colorbar(sc, ax=ax1, label="draft length k")
    ax1.legend(fontsize=8)
    ax2.scatter(drafted["a"], real_a, c=drafted["k"], cmap="viridis", s=14)
    ax2.plot([0, 1], [0, 1], ls=":", color="0.3")
    ax2.fill_between([0, 1], [-0.04, 0.96], [0.04, 1.04], color="0.85", alpha=0.6, lw=0, label="within 0.04")
    ax2.set_xlabel("oracle acceptance a")
    ax2.set_ylabel("realized acceptance")
    ax2.legend(fontsize=8)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig


def real_draft_figure(real: pd.DataFrame, paper: dict | None = None, title: str = "") -> plt.Figure:
    """Real draft model (Appendix D.3 analogue): speedup over plain decoding against k, median and
    interquartile range over prompts; ``paper``: {k: published median speedup} drawn as labelled
    reference (their engine and models)."""
    q = real[real["k"] > 0].groupby("k")["speedup"].quantile([0.25, 0.5, 0.75]).unstack()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.errorbar(q.index, q[0.5], yerr=[q[0.5] - q[0.25], q[0.75] - q[0.5]], marker="o", capsize=2,
                color="C0", label="this engine: median, IQR over prompts")
    if paper:
        ks = sorted(paper)
        ax.plot(ks, [paper[k] for k in ks], "x", color="k", ms=8,
                label="paper 1, published median (Qwen3-30B-A3B + Qwen3-0.6B, llama.cpp Metal)")
    ax.axhline(1, ls=":", color="0.3")
    ax.set_xlabel("draft length k")
    ax.set_ylabel("speedup over plain decoding")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    if title:
        ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def figure4_saving(curves: pd.DataFrame, metrics: dict, band_version: str = "prediction",
                   dashed: str = "measured-time", title: str = "") -> plt.Figure:
    """Figure 4: the saving S(n), measured with its 95% interval (black), ``band_version`` (red) with
    the band of bound (18) at the engine's eps, and the ``dashed`` version; each panel's title counts
    the measured points inside the band. ``metrics``: {(version, d): predict.evaluate(...)}."""
    depths = sorted(curves["d"].unique())
    fig, axes = plt.subplots(1, len(depths), figsize=(4.6 * len(depths) + 3.2, 3.8), squeeze=False)
    for ax, d in zip(axes[0], depths):
        g = curves[(curves["d"] == d) & (curves["n"] >= 2)]
        m = g[g["version"] == "measured"]
        ax.errorbar(m["n"], m["S_ms"], yerr=[m["S_ms"] - m["S_lo_ms"], m["S_hi_ms"] - m["S_ms"]], color="k",
                    marker="o", ls="none", capsize=2, label="measured S(n), 95% bootstrap interval")
        b = g[g["version"] == band_version]
        st = VERSION_STYLE[band_version]
        ax.plot(b["n"], b["S_ms"], color=st["color"], marker="o", label=st["label"])
        ax.fill_between(b["n"], b["S_ms"] - b["band_ms"], b["S_ms"] + b["band_ms"], color=st["color"], alpha=0.15,
                        lw=0, label="band of bound (18) at the engine's eps")
        if dashed and dashed != band_version:
            v = g[g["version"] == dashed]
            ax.plot(v["n"], v["S_ms"], color=VERSION_STYLE[dashed]["color"], ls="--", label=VERSION_STYLE[dashed]["label"])
        ax.axhline(0, color="0.5", lw=0.8)
        met = metrics.get((band_version, d))
        inside = f"; {met['in_band']} of {met['band_points']} measured points inside the band" if met else ""
        ax.set_title(f"context depth d = {d}{inside}", fontsize=9)
        ax.set_xlabel("tokens verified per pass n")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("saving of deduplication S(n) (ms)")
    legend_outside(axes[0][-1])
    fig.suptitle(title or "Saving of deduplication: predicted against measured", fontsize=9)
    add_caption(fig, f"{SAVING_TEXT} {EPS_TEXT}")
    return fig


def figure5_kstar(metrics: dict, versions=("measured-time", "calibrated", "prediction"), title: str = "") -> plt.Figure:
    """Figure 5: left, predicted against measured k* (measured-time version; area grows with the
    number of acceptance values); middle, largest share of throughput lost by drafting k̂* against
    bound (20); right, largest relative error of the predicted best speedup against bound (21).
    One point per (version, depth); filled: measured-time, open: the others."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    ax = axes[0]
    first = versions[0]
    pairs = {}
    for (v, d), m in metrics.items():
        if v != first:
            continue
        for kh, km in zip(m["k_hat"], m["k_meas"]):
            pairs[(km, kh)] = pairs.get((km, kh), 0) + 1
    if pairs:
        xs, ys, cnt = zip(*[(km, kh, c) for (km, kh), c in pairs.items()])
        ax.scatter(xs, ys, s=[30 * c for c in cnt], color="C0", alpha=0.7,
                   label=f"{first} version (area: number of acceptance values)")
    kmax = 8
    ax.plot([0, kmax], [0, kmax], ls=":", color="0.3", label="exact")
    ax.fill_between([0, kmax], [-1, kmax - 1], [1, kmax + 1], color="0.85", alpha=0.5, lw=0, label="within one")
    ax.set_xlabel("measured best draft length k* (speculative runs)")
    ax.set_ylabel("predicted best draft length k̂*")
    ax.set_title("best draft length k*", fontsize=9)
    ax.legend(fontsize=7)
    for ax, key, bound, label in ((axes[1], "loss_V", "loss_bound20", "largest share of throughput lost at k̂*"),
                                  (axes[2], "speedup_err", "speedup_bound21", "largest relative error of the best speedup")):
        top = 0.0
        for i, v in enumerate(versions):
            pts = [(m[bound], m[key], d) for (vv, d), m in metrics.items() if vv == v]
            if not pts:
                continue
            x, y, ds = zip(*pts)
            ax.scatter(x, y, marker="os^D"[i % 4], facecolors=f"C{i}" if i == 0 else "none", edgecolors=f"C{i}",
                       label=f"{v}", zorder=3)
            top = max(top, max(x), max(y))
        top = top * 1.1 or 1
        ax.plot([0, top], [0, top], color="k", lw=1, label="error = bound")
        ax.fill_between([0, top], [0, 0], [0, top], color="0.9", lw=0, label="inside the bound", zorder=0)
        ax.set_xlabel("bound (20): 2δ/(1+δ)" if key == "loss_V" else "bound (21): (1+δ)/(1−δ) − 1")
        ax.set_ylabel(label)
        ax.set_title("bound (20): throughput lost" if key == "loss_V" else "bound (21): best speedup", fontsize=9)
        ax.legend(fontsize=7, title="one point per depth", title_fontsize=7)
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(title or "Best draft length and the bounds (20), (21)", fontsize=9)
    add_caption(fig, "δ: largest relative error of the predicted step time V̂(k) = τ̂_dedup(k+1) + h(k) against the "
                     "measured one (h: measured time per step outside the verify pass). " + VERSIONS_TEXT)
    return fig


def figure6_verify(curves: pd.DataFrame, versions=("measured-time", "calibrated", "prediction"),
                   title: str = "", scores: pd.DataFrame | None = None, rules_commit: str | None = None) -> plt.Figure:
    """Figure 6 analogue: the pre-registered versions against measurement. Top row: the saving with
    the band of (18) around the measured-time version (the version written before the speculative
    runs). Middle row: verify time with deduplication on, measured and per version. Bottom (when
    ``scores``, :func:`moespec.predict.score`, is given): every pre-registered rule with its value
    and verdict per version and depth, and whether each version meets all of them."""
    depths = sorted(curves["d"].unique())
    nrows = 3 if scores is not None else 2
    fig = plt.figure(figsize=(4.6 * len(depths) + 4.2, 6.6 + (3.4 if scores is not None else 0)))
    grid = fig.add_gridspec(nrows, len(depths), height_ratios=[1, 1, 1][:nrows])
    axes = [[fig.add_subplot(grid[r, j]) for j in range(len(depths))] for r in range(2)]
    for j, d in enumerate(depths):
        g = curves[curves["d"] == d]
        m = g[g["version"] == "measured"]
        ax = axes[0][j]
        m2 = m[m["n"] >= 2]
        ax.errorbar(m2["n"], m2["S_ms"], yerr=[m2["S_ms"] - m2["S_lo_ms"], m2["S_hi_ms"] - m2["S_ms"]], color="k",
                    marker="o", ls="none", capsize=2, label="measured S(n), 95% interval")
        b = g[(g["version"] == versions[0]) & (g["n"] >= 2)]
        ax.plot(b["n"], b["S_ms"], color="0.45", ls="--", label=VERSION_STYLE[versions[0]]["label"])
        ax.fill_between(b["n"], b["S_ms"] - b["band_ms"], b["S_ms"] + b["band_ms"], color="0.6", alpha=0.25, lw=0,
                        label="band of bound (18) at the engine's eps")
        ax.axhline(0, color="0.5", lw=0.8)
        ax.set_title(f"context depth d = {d} tokens", fontsize=10)
        ax.set_xlabel("tokens verified per pass n")
        ax.set_ylabel("saving of deduplication S(n) (ms)")
        ax.grid(alpha=0.3)
        ax = axes[1][j]
        ax.plot(m["n"], m["tau_dedup_ms"], color="k", marker="o", label="measured, deduplication on")
        for v in versions:
            c = g[g["version"] == v]
            if not c.empty:
                st = VERSION_STYLE[v]
                ax.plot(c["n"], c["tau_dedup_ms"], color=st["color"], ls=st["ls"], marker=st["marker"], ms=3,
                        label=st["label"])
        ax.set_xlabel("tokens verified per pass n")
        ax.set_ylabel("verify time, deduplication on (ms)")
        ax.grid(alpha=0.3)
    legend_outside(axes[0][-1])
    legend_outside(axes[1][-1])
    if scores is not None:
        _rules_table(fig.add_subplot(grid[2, :]), scores, depths, rules_commit)
    fig.suptitle(title or "The pre-registered versions against the measurement", fontsize=9)
    add_caption(fig, f"{SAVING_TEXT} {EPS_TEXT} {VERSIONS_TEXT}")
    return fig


def _rules_table(ax, scores: pd.DataFrame, depths, rules_commit: str | None) -> None:
    """The pre-registered rules as a table: one row per rule, one column per (version, depth) with
    the rule's value and verdict (green: holds, red: fails), and a last row: all rules hold."""
    versions = list(dict.fromkeys(scores["version"]))
    rules = list(dict.fromkeys(scores["rule"]))
    cols = [(v, d) for v in versions for d in depths]
    cells, colors = [], []
    for rule in rules:
        row, crow = [], []
        for v, d in cols:
            hit = scores[(scores["version"] == v) & (scores["rule"] == rule)]
            text = str(hit[f"d{d}"].iloc[0]) if len(hit) and f"d{d}" in hit else "-"
            row.append(text)
            crow.append("#d9f0d3" if text.endswith("holds") else "#f4cccc" if text.endswith("fails") else "white")
        cells.append(row)
        colors.append(crow)
    verdict = [("meets all" if bool(scores.loc[scores["version"] == v, "holds_all"].all()) else "does not meet all")
               for v, _ in cols]
    cells.append(verdict)
    colors.append(["#d9f0d3" if t == "meets all" else "#f4cccc" for t in verdict])
    wrapped = [r if len(r) <= 60 else r[:57] + "..." for r in rules] + ["verdict: every rule at every depth"]
    ax.axis("off")
    table = ax.table(cellText=cells, cellColours=colors, rowLabels=wrapped,
                     colLabels=[f"{v}\nd = {d}" for v, d in cols], cellLoc="center", bbox=[0.3, 0, 0.7, 1])
    table.auto_set_font_size(False)
    table.set_fontsize(6.5)
    when = f" (rules committed in {rules_commit[:7]}, before the speculative runs)" if rules_commit else ""
    ax.set_title(f"Pre-registered scoring rules, value and verdict per version and depth{when}", fontsize=9)
