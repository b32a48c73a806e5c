"""Reuse tables of paper 1, Section 2 / Figure 1: per-trace curves and the summary table."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from moespec.routing import RoutingTrace, bootstrap, reuse
from moespec.routing.published import PUBLISHED_LABEL


def reuse_curves(traces: Sequence[RoutingTrace], n_max: int = 9, resamples: int = 2000,
                 seed: int = 0, level: float = 0.95) -> pd.DataFrame:
    """Layer-mean rho_hat(n), n = 1..n_max, with document-bootstrap percentile bands, one row per
    (trace, n): label, model, m, N, n, rho, rho_low, rho_high, union, byte_share (Figure 1 data)."""
    rows = []
    for tr in traces:
        rho = bootstrap(tr, n_max, "reuse", resamples=resamples, seed=seed, level=level)
        uni = bootstrap(tr, n_max, "union", resamples=1, seed=seed).estimate
        share = bootstrap(tr, n_max, "byte_share", resamples=1, seed=seed).estimate
        for i in range(n_max):
            rows.append({"label": tr.label, "model": tr.model, "m": tr.top_k, "N": tr.num_experts,
                         "n": i + 1, "rho": rho.estimate[i], "rho_low": rho.low[i],
                         "rho_high": rho.high[i], "union": uni[i], "byte_share": share[i]})
    return pd.DataFrame(rows)


def reuse_table(traces: Sequence[RoutingTrace], resamples: int = 2000, seed: int = 0,
                level: float = 0.95, published: pd.DataFrame | None = None) -> pd.DataFrame:
    """rho_hat(2), rho_hat(9), ubar(2), ubar(8) per trace with bootstrap intervals (paper 1,
    Sec. 2), the uniform value m/N, and, if ``published`` (see :mod:`moespec.routing.published`)
    is given, the paper's layer means as extra rows whose ``source`` says they are the paper's."""
    rows = []
    for tr in traces:
        rho = bootstrap(tr, 9, "reuse", resamples=resamples, seed=seed, level=level)
        share = bootstrap(tr, 9, "byte_share", resamples=resamples, seed=seed, level=level)
        row = {"source": tr.label, "model": tr.model, "N": tr.num_experts, "m": tr.top_k,
               "L": tr.num_layers, "docs": tr.num_docs, "tokens": tr.num_tokens,
               "uniform_m_over_N": tr.top_k / tr.num_experts}
        for name, bs, n in (("rho_hat_2", rho, 2), ("rho_hat_9", rho, 9),
                            ("ubar_2", share, 2), ("ubar_8", share, 8)):
            row[name] = bs.estimate[n - 1]
            row[f"{name}_low"] = bs.low[n - 1]
            row[f"{name}_high"] = bs.high[n - 1]
        rows.append(row)
    if published is not None:
        for model, grp in published.groupby("model", sort=False):
            vals = dict(zip(grp["n"], grp["rho"]))
            rows.append({"source": f"{PUBLISHED_LABEL}: {grp['paper_label'].iloc[0]}", "model": model,
                         "rho_hat_2": vals.get(2, np.nan), "rho_hat_9": vals.get(9, np.nan)})
    df = pd.DataFrame(rows)
    counts = ["N", "m", "L", "docs", "tokens"]
    df[counts] = df[counts].astype("Int64")  # integers, empty on the published rows
    return df


def reuse_by_layer(traces: Sequence[RoutingTrace], ns: Sequence[int] = (2, 9)) -> pd.DataFrame:
    """rho_hat_l(n) of every traced layer of each trace (paper 1, App. D.2 estimator), one row per
    (source, layer): where along the depth a router reuses its experts."""
    rows = []
    for tr in traces:
        rho = reuse(tr, max(ns))
        layers = tr.meta.get("layer_indices") or list(range(tr.num_layers))
        for l in range(tr.num_layers):
            rows.append({"source": tr.label, "layer": int(layers[l]),
                         **{f"rho_hat_{n}": float(rho[l, n - 1]) for n in ns}})
    return pd.DataFrame(rows)
