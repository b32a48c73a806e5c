"""Paper 2's Appendix B on our text as notebook 07 writes it: the label counts, Figure B3's and
B5's tables, the B4 cases and the gallery (``07_tableB*``, ``07_figB*`` in the figures folder),
for both transition models; computed by :mod:`moespec.oracle.boundaries` and
:mod:`moespec.oracle.gallery`, drawn by :mod:`moespec.plots.oracle_boundaries`."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from moespec import io
from moespec.oracle import boundaries, gallery


def write_appendix_b(items, by_transitions: dict, tokenizer, fig_dir, subject: str, lmax: int,
                     n_boot: int = 999, seed: int = 0) -> dict:
    """Compute and write Appendix B for one cost model (``by_transitions``: transitions ->
    ``analysis.Paper2Analysis`` of ``items``). Returns ``{"written": [...], "summary": table}``
    or, when the inputs carry no tokens (replayed routing, or a file recorded before they were
    kept), ``{"written": [...], "reason": ...}`` with the reason written to ``07_tableB_status.json``."""
    from moespec.plots import oracle_boundaries as plots

    fig_dir = Path(fig_dir)
    written = []

    def table(name, df):
        written.append(io.write_dataframe(fig_dir / name, df.assign(subject=subject)).name)

    def figure(name, fig):
        written.append(io.save_figure(fig, fig_dir / name).name)

    without = [it for it in items if it.tokens is None or it.draft_chain is None]
    if without:
        try:
            without[0].require_tokens("Appendix B (the text of the reference)")
        except ValueError as exc:
            written.append(io.write_json(fig_dir / "07_tableB_status.json",
                                         {"computed": False, "reason": str(exc), "subject": subject}).name)
            return {"written": written, "reason": str(exc)}
    B = boundaries.appendix_b(items, by_transitions, tokenizer, n_boot=n_boot, seed=seed)
    written.append(io.write_json(fig_dir / "07_tableB_status.json", {
        "computed": True, "tokenizer": tokenizer is not None, "lmax": lmax, "n_boot": n_boot, "seed": seed,
        "responses": len(items), "decisions": sum(it.n for it in items), "subject": subject}).name)
    table("07_tableB_label_counts.csv", B.label_counts)
    table("07_tableB3_k_by_context.csv", B.b3)
    table("07_tableB5_new_experts.csv", B.b5)
    surrogate = {it.seq_id: it.p for it in items}
    cases = {t: gallery.b4_cases(a.changed, surrogate=surrogate) for t, a in by_transitions.items()}
    table("07_tableB4_cases.csv", pd.concat([c.assign(transitions=t) for t, c in cases.items()], ignore_index=True))
    picks = {t: gallery.gallery(B.decisions[t], lmax) for t in by_transitions}
    table("07_tableB_gallery.csv", pd.concat([p.assign(transitions=t) for t, p in picks.items()], ignore_index=True))
    figure("07_figB3_k_by_context.png", plots.fig_b3(B.b3, title=f"Figure B3 analogue (Lmax = {lmax}) — {subject}"))
    figure("07_figB5_new_experts.png", plots.fig_b5(B.b5, title=f"Figure B5 analogue — {subject}"))
    new = {it.seq_id: boundaries.new_experts(it.U, it.top_k)[:, :, it.lmax] for it in items}
    reasons = {t: a.ablation.get("reason", "") for t, a in by_transitions.items() if not a.ablation.get("defined", True)}
    figure("07_figB4_alpha0_cases.png", plots.fig_b4(B, cases, new, lmax, title=f"Figure B4 analogue — {subject}",
                                                   reasons=reasons))
    figure("07_figB_gallery.png", plots.fig_gallery(B, picks, lmax, title=f"Gallery (B1/B2/B6/B7 analogues, Lmax = {lmax}) "
                                                                      f"— {subject}"))
    summary = B.b3[["transitions", "label", "decisions", "responses", "share_k1", "share_k4plus", "mean_k"]]
    return {"written": written, "summary": summary, "label_counts": B.label_counts, "b5": B.b5,
            "b4_cases": {t: len(c) for t, c in cases.items()}, "gallery_cases": sum(len(p) for p in picks.values())}


def describe(result: dict) -> str:
    """A short account of :func:`write_appendix_b`'s result for the notebook: the files, the label
    counts, k* by context per transition model, and the B5 comparisons."""
    lines = [f"wrote {', '.join(result['written'])}"]
    if "reason" in result:
        return "\n".join(lines + [f"Appendix B not computed: {result['reason']}"])
    counts = result["label_counts"]
    lines.append("positions per context label: " + "; ".join(f"{r.label} {r.positions}" for r in counts.itertuples()))
    absent = [r.label for r in counts.itertuples() if r.positions == 0]
    if absent:
        lines.append(f"no such position in our text: {', '.join(absent)}")
    present = result["summary"][result["summary"].decisions > 0]
    lines.append(present.round(3).to_string(index=False))
    for r in result["b5"].itertuples():
        lines.append(f"B5 {r.comparison} [{r.transitions}]: " + (
            f"event {r.event:.2f} vs {r.other:.2f}, difference {r.difference:+.2f} [{r.difference_lo:+.2f}, "
            f"{r.difference_hi:+.2f}] ({r.events} events)" if r.events else r.note))
    lines.append("B4 cases drawn (alpha = 0 drafts k* + 1): " + "; ".join(f"{t} {n}" for t, n in result["b4_cases"].items())
                 + f"; gallery cases: {result['gallery_cases']}")
    return "\n".join(lines)
