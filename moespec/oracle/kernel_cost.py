"""Inputs of paper 1's per-kernel cost for the oracle (beyond paper 2): the per-slot and the
deduplicating kernel's effective bandwidths, from the expert-operation benchmark when it has run
(``moespec.measure.expert_op`` rows of the run, ``paths.expert_op_dir()``, Table 1's definition via
``moespec.fit.bandwidth_table`` on the rows the discard rule of ``moespec.measure.discard`` keeps), otherwise assumed values the caller passes and labels as such.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moespec import paths
from moespec import fit
from moespec.measure import discard
from moespec.measure.expert_op import load_rows

from .cost import CostModel, KernelCostModel


def bench_bandwidths(prefer=("default", "olmoe"), folder: Path | None = None) -> dict | None:
    """Median over n of beta_slot and beta_dedup (GB/s) of the newest benchmark run of the first
    model in ``prefer`` that has one; None when no run is on disk."""

    folder = Path(folder) if folder else paths.expert_op_dir()
    runs = sorted(p for p in folder.glob("*") if (p / "rows.csv").is_file()) if folder.is_dir() else []
    for model in prefer:
        mine = [r for r in runs if f"-{model}-" in r.name]
        for run in reversed(mine):
            try:
                bw = fit.bandwidth_table(discard.apply_rule(load_rows(run), source=str(run / "rows.csv")).kept)
            except (ValueError, KeyError):
                continue   # an unfinished run, or one the discard rule empties: try an older one
            return {"slot_GBps": float(np.median(bw.beta_slot_GBps)), "dedup_GBps": float(np.median(bw.beta_dedup_GBps)),
                    "source": f"benchmark run {run.name} (model {model}), median over n = "
                              f"{int(bw.n.min())}..{int(bw.n.max())}"}
    return None


def kernel_models(base: CostModel, layers: int, expert_bytes: float, top_k: int, slot_GBps: float,
                  dedup_GBps: float) -> dict:
    """The per-slot and deduplicating cost models that keep ``base``'s draft, beta0 and context terms
    and replace alpha * U by the bytes each kernel reads over its bandwidth (GB/s -> bytes per ms)."""
    common = dict(draft_a=base.draft_a, draft_b=base.draft_b, beta0=base.beta0, c=base.c, layers=int(layers),
                  expert_bytes=float(expert_bytes), top_k=int(top_k))
    return {"per-slot kernel": KernelCostModel(**common, bandwidth=slot_GBps * 1e6, kernel="slot", label="slot"),
            "dedup kernel": KernelCostModel(**common, bandwidth=dedup_GBps * 1e6, kernel="dedup", label="dedup")}
