"""Delta space of the oracle's rejected candidates (paper 2, Section 5.2, Figure 3).

At every state i the oracle chooses k_opt; each other k is a rejected candidate with
    dA = E[a]_k - E[a]_{k_opt},   dC = E[Cost]_k - E[Cost]_{k_opt}
(E over P(a | k) of the sequence-conditioned model, E[Cost] in ms). The paper reports that
quadrants II (dA < 0, dC > 0) and IV (dA > 0, dC < 0) are empty and that the clouds in I and III
are bounded by one line through the origin whose slope is the 1st percentile of dC / dA (under the
greedy-exact 0/1 transitions quadrant I can be empty; ``boundary_slope`` says what it takes then).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .bellman import expected_accepted, expected_cost
from .transitions import acceptance_probs


def delta_points(p, cost, policy) -> pd.DataFrame:
    """One row per rejected candidate (state i, k != k_opt): columns i, k, k_opt, dA, dC."""
    cost = np.asarray(cost, dtype=float)
    n, lmax = cost.shape[0], cost.shape[1]
    policy = np.asarray(policy)
    P = acceptance_probs(p, lmax)
    EA, EC = expected_accepted(P), expected_cost(P, cost)
    rows = np.arange(n)
    dA = EA - EA[rows, policy - 1][:, None]
    dC = EC - EC[rows, policy - 1][:, None]
    ii, kk = np.nonzero(np.arange(1, lmax + 1)[None, :] != policy[:, None])
    return pd.DataFrame({"i": ii, "k": kk + 1, "k_opt": policy[ii], "dA": dA[ii, kk], "dC": dC[ii, kk]})


def quadrant_counts(points: pd.DataFrame, tol: float = 1e-12) -> dict:
    """Counts of rejected candidates per quadrant (I: dA>0,dC>0; II: dA<0,dC>0; III: dA<0,dC<0;
    IV: dA>0,dC<0) and on the axes (|dA| or |dC| <= tol)."""
    dA, dC = points["dA"].to_numpy(), points["dC"].to_numpy()
    pos_a, neg_a, pos_c, neg_c = dA > tol, dA < -tol, dC > tol, dC < -tol
    return {"I": int(np.sum(pos_a & pos_c)), "II": int(np.sum(neg_a & pos_c)),
            "III": int(np.sum(neg_a & neg_c)), "IV": int(np.sum(pos_a & neg_c)),
            "axis": int(np.sum(~((pos_a | neg_a) & (pos_c | neg_c))))}


def boundary_slope(points: pd.DataFrame, percentile: float = 1.0, tol: float = 1e-12) -> dict:
    """The boundary line of Figure 3: slope = ``percentile``-th percentile of dC/dA over quadrant I
    (longer candidates, the risk zone). Also reports how many quadrant-III candidates (shorter, the
    caution zone) lie below the line (dC < slope * dA, i.e. cross it) and the largest dC/dA there.

    Quadrant I is empty when no longer candidate would have gained tokens: under 0/1 transitions
    (the greedy-exact model) an oracle that drafts exactly the run of tokens that will be accepted
    leaves every longer candidate on the axis dA = 0. The line is then taken as the steepest one the
    oracle's choices support, the largest dC/dA of quadrant III (what it paid at most per token); with
    quadrant III empty too (no rejected candidate changes the expected accepted tokens), slope 0:
    no extra draft token was ever worth its cost. ``slope_source`` says which applied."""
    dA, dC = points["dA"].to_numpy(), points["dC"].to_numpy()
    q1 = (dA > tol) & (dC > tol)
    q3 = (dA < -tol) & (dC < -tol)
    ratio1, ratio3 = dC[q1] / dA[q1], dC[q3] / dA[q3]
    if q1.any():
        slope, source = float(np.percentile(ratio1, percentile)), f"quadrant I, {percentile:g}th percentile of dC/dA"
    elif q3.any():
        slope, source = float(ratio3.max()), "quadrant I empty: the largest dC/dA of quadrant III"
    else:
        slope, source = 0.0, "quadrants I and III empty: no rejected candidate changes E[a]; slope 0"
    return {"slope_ms_per_token": slope, "slope_source": source, "n_q1": int(q1.sum()), "n_q3": int(q3.sum()),
            "q1_below_line": int(np.sum(dC[q1] < slope * dA[q1])),
            "q3_crossing_line": int(np.sum(dC[q3] < slope * dA[q3])),
            "q3_max_ratio": float(ratio3.max()) if q3.any() else float("nan"),
            "q1_min_ratio": float(ratio1.min()) if q1.any() else float("nan")}
