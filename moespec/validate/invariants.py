"""What the theory needs of its inputs, checked where they enter (paper 1, Section 2).

* The byte share of a pass of n tokens, ubar(n) = E_dedup(n) / E_slot(n) (eq. (3)), lies in
  [1/n, 1]: the pass reads at least one token's m distinct experts (all n tokens chose the same
  ones) and at most its n m slots; ubar(1) = 1, a token's m experts being distinct.
* A routing trace used with a model has that model's shape: L MoE layers, N experts, m per token.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .errors import InputError
from .tables import check_rows

#: Rounding a table may carry (published values have two decimals, ubar(1) = 1.00).
TOLERANCE = 1e-6


def byte_share_bounds(n) -> tuple[np.ndarray, np.ndarray]:
    """(1/n, 1): the range of ubar(n)."""
    n = np.asarray(n, dtype=float)
    return 1.0 / n, np.ones_like(n)


def check_byte_share_rows(df: pd.DataFrame, path, n_column: str | None, ubar_column: str, n=None,
                          error: type[InputError] = InputError) -> None:
    """Refuse the first row of ``df`` (read from ``path``) whose ``ubar_column`` is outside
    [1/n, 1] or, at n = 1, not 1; n from ``n_column`` (or the fixed ``n`` of a column like
    ``n2_ubar``)."""
    ubar = pd.to_numeric(df[ubar_column], errors="coerce").to_numpy(float)
    ns = df[n_column].to_numpy(float) if n_column else np.full(len(df), float(n))
    lo, hi = byte_share_bounds(ns)
    bad = ~((ubar >= lo - TOLERANCE) & (ubar <= hi + TOLERANCE))
    bad |= (ns == 1) & (np.abs(ubar - 1) > TOLERANCE)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        expected = ("ubar(1) = 1 (a token's m experts are distinct)" if ns[i] == 1 else
                    f"1/n <= ubar(n) <= 1 at n = {ns[i]:g}, i.e. in [{lo[i]:.4g}, 1] (eq. (3): a pass reads at least "
                    "one token's experts and at most its n m slots)")
        check_rows(df, path, bad, f"column {ubar_column!r}", expected, ubar, error)


def check_byte_share(ubar, where: str, field: str = "ubar", error: type[InputError] = InputError) -> np.ndarray:
    """``ubar[n-1]`` for n = 1, 2, ... checked as :func:`check_byte_share_rows` does."""
    ubar = np.asarray(ubar, dtype=float)
    df = pd.DataFrame({"n": np.arange(1, len(ubar) + 1), field: ubar})
    check_byte_share_rows(df, where, "n", field, error=error)
    return ubar


def check_trace_shape(trace, spec, model: str, where: str | None = None,
                      error: type[InputError] = InputError) -> None:
    """Refuse a routing trace whose L, N or m differ from ``spec`` (a
    :class:`moespec.model_shapes.MoESpec`, the model named ``model`` that the trace is used for)."""
    where = where or str(getattr(trace, "path", None) or "the routing trace")
    found = {"L": trace.num_layers, "N": trace.num_experts, "m": trace.top_k}
    expected = {"L": spec.num_moe_layers, "N": spec.num_experts, "m": spec.top_k}
    off = [k for k in found if found[k] != expected[k]]
    if off:
        fields = {"L": "ids (layers, L)", "N": "meta.num_experts (N)", "m": "ids (experts per token, m)"}
        shape = lambda d: f"L = {d['L']} MoE layers, N = {d['N']} experts, m = {d['m']} per token"  # noqa: E731
        raise error(f"{where}: {', '.join(fields[k] for k in off)}: expected the shape of {model} ({shape(expected)}); "
                    f"found {shape(found)}: a trace of another model. Give a trace recorded from {model}, or "
                    "name the model the trace is of (its config.json or checkpoint folder)", where=where,
                    field=fields[off[0]],
                    expected=expected, found=found)
