"""An acceptance profile as text (``moespec acceptance``): p_i with intervals, the conditional
rates, G(k), the mean acceptance length, the distance from the best geometric fit, the rule beyond
K, and what the reader should know about the source."""

from __future__ import annotations

import numpy as np

from .profile import AcceptanceProfile, geometric_G


def _iv(lo, hi) -> str:
    return f"[{lo:.3f}, {hi:.3f}]"


def format_profile(prof: AcceptanceProfile, extra_k: int = 2) -> str:
    """The profile on one screen; ``extra_k`` extrapolated draft lengths shown beyond K."""
    out = [f"moespec acceptance: {prof.source} ({prof.engine})", f"  files: {', '.join(prof.files)}"]
    if prof.counts is None:
        if prof.scalar is not None:
            out.append(f"  mean acceptance length {prof.mean_acceptance_length:.3f}; no per-position profile; "
                       f"geometric a = {prof.scalar:.3f} stands in for one")
            return "\n".join(out + [f"  note: {n}" for n in prof.notes])
        else:
            G = prof.measured_G()
            out.append("  k   G(k) measured at draft length k")
            out += [f"  {k:<3d} {G[k]:.3f}" for k in range(1, G.size)]
        a, dist = prof.geometric_fit()
        out.append(f"  best geometric fit: a = {a:.3f}; G_a(k) differs from G(k) by up to {100 * dist:.1f} %")
        return "\n".join(out + [f"  note: {n}" for n in prof.notes])
    p_lo, p_hi = prof.p_interval()
    G, (G_lo, G_hi) = prof.G(), prof.G_interval()
    cond = prof.conditional
    out.append(f"  verify steps {prof.counts.steps:g}; K = {prof.K}; intervals 95 % over verify steps (p: Wilson)")
    out.append(f"  {'i':>3}  {'p_i':>6}  {'interval':<16}  {'c_i':>6}  {'G(i)':>6}  {'interval':<16}")
    for i in range(prof.K):
        c = "   -  " if np.isnan(cond[i]) else f"{cond[i]:6.3f}"
        out.append(f"  {i + 1:>3}  {prof.p[i]:6.3f}  {_iv(p_lo[i], p_hi[i]):<16}  {c}  {G[i + 1]:6.3f}  "
                   f"{_iv(G_lo[i], G_hi[i]):<16}")
    out.append(f"  mean acceptance length G({prof.K}) = {prof.mean_acceptance_length:.3f} {_iv(G_lo[-1], G_hi[-1])} "
               "(tokens per verify step, bonus included)")
    if prof.prompts:
        med, boot = prof.median_prompt_G(), prof.bootstrap()
        line = f"  per prompt: {len(prof.prompts)} prompts"
        if med is not None:
            line += f"; the median prompt's G({prof.K}) = {med[-1]:.3f}"
        if boot is not None:
            line += (f"; bootstrap over prompts ({boot['resamples']}): pooled G({prof.K}) "
                     f"{_iv(boot['pooled'][0][-1], boot['pooled'][1][-1])}, median prompt's "
                     f"{_iv(boot['median_prompt'][0][-1], boot['median_prompt'][1][-1])}")
        out.append(line)
    if prof.at_k:
        meas = "  G(k) measured by the runs at draft length k: " + ", ".join(
            f"{k}: {run.counts.G()[k]:.3f}" for k, run in sorted(prof.at_k.items()))
        out.append(meas)
    a, dist = prof.geometric_fit()
    Ga = geometric_G(a, prof.K)
    worst = int(np.argmax(np.abs(Ga[1:] / G[1:] - 1))) + 1
    out.append(f"  best geometric fit: a = {a:.3f}; G_a(k) differs from G(k) by up to {100 * dist:.1f} % (k = {worst})")
    if extra_k:
        far = prof.G(prof.K + extra_k)
        c = np.nan_to_num(cond[-1])
        out.append(f"  k > {prof.K}: extrapolated, the last conditional rate {c:.3f} held: " + ", ".join(
            f"G({k}) = {far[k]:.3f}" for k in range(prof.K + 1, prof.K + extra_k + 1)))
    return "\n".join(out + [f"  note: {n}" for n in prof.notes])
