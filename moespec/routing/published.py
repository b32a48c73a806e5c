"""Paper 1's published layer-mean reuse (Section 2), read through :mod:`moespec.paper_reference`.

These are the paper's measurements on its traces (WikiText-103 fit documents), never ours:
plots show them as labelled reference points, and the synthetic traces of notebook 01 use them
only as calibration targets, labelled as such.
"""

from __future__ import annotations

import re

import pandas as pd

from moespec import paper_reference
from moespec.model_shapes import PRESETS

#: Label for every published value drawn beside ours.
PUBLISHED_LABEL = "paper 1, published (their traces)"


def published_reuse() -> pd.DataFrame:
    """Rows (model, paper_label, n, rho, where) for the ``rho_layer_mean_n<k>`` scalars.

    ``model`` is the moespec preset name (e.g. "olmoe") whose ``paper_label`` matches.
    """
    path = paper_reference.FILES["paper1_scalars"]
    df = paper_reference.paper1_scalars()
    by_label = {spec.paper_label: name for name, spec in PRESETS.items()}
    rows = []
    for _, r in df.iterrows():
        match = re.fullmatch(r"rho_layer_mean_n(\d+)", str(r["quantity"]))
        if not match:
            continue
        label = str(r["model_or_engine"])
        if label not in by_label:
            raise ValueError(f"{path}: reuse row for unknown model {label!r}; known: {sorted(by_label)}")
        rows.append({"model": by_label[label], "paper_label": label, "n": int(match.group(1)),
                     "rho": float(r["value"]), "where": r["where"]})
    if not rows:
        raise ValueError(f"{path}: no rho_layer_mean_n<k> rows")
    return pd.DataFrame(rows)


def reuse_targets(model: str, published: pd.DataFrame | None = None) -> dict[int, float]:
    """{n: published layer-mean rho(n)} of one preset, e.g. {2: 0.363, 9: 0.762} for "olmoe"."""
    published = published_reuse() if published is None else published
    rows = published[published["model"] == model]
    if rows.empty:
        raise KeyError(f"no published reuse for model {model!r}; have {sorted(set(published['model']))}")
    return {int(n): float(r) for n, r in zip(rows["n"], rows["rho"])}
