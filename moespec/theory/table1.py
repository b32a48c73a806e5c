"""Verify times (5) from a Table-1 row: each kernel's effective bandwidth and the byte share ubar
at pass sizes n = 2 and n = 8 (paper 1, Table 1), for the notebook's staircases and bands.

Table 1 gives two pass sizes only, so values at n = 1..n_max are modelled, and the model is
stated here: each bandwidth is linear in n through its n = 2 and n = 8 values (extrapolated to
n = 1 and n > 8); the new-expert share of the j-th token decays geometrically,
1 - rho(j) = s q^(j-2) for j >= 2, with s = 2 ubar(2) - 1 and q fitted so that ubar(8) matches,
which by (2) gives ubar(n) = (1 + sum_{j=2}^n (1 - rho(j)))/n. The one-token pass runs the
per-slot kernel on either engine (Sec. 3.1), so beta(1) is the per-slot value.
"""

from __future__ import annotations

import numpy as np

from .polynomials import bisect_increasing
from .steptime import VerifyTime, slot_expert_bytes


def interpolate_bandwidth(beta2: float, beta8: float, n_max: int = 9) -> np.ndarray:
    """beta(n), n = 1..n_max, linear in n through beta(2) and beta(8); ValueError if not positive."""
    n = np.arange(1, n_max + 1, dtype=float)
    beta = beta2 + (beta8 - beta2) * (n - 2) / 6
    if np.any(beta <= 0):
        raise ValueError(f"interpolate_bandwidth: the line through beta(2)={beta2}, beta(8)={beta8} "
                         f"is not positive on n = 1..{n_max}")
    return beta


def reuse_from_byte_share(ubar2: float, ubar8: float, n_max: int = 9) -> np.ndarray:
    """rho(n), n = 1..n_max (rho(1) = 0), of the geometric new-expert model fitted to ubar(2) and
    ubar(8) (module docstring; eq. (2) links rho and ubar)."""
    s = 2 * ubar2 - 1                      # 1 - rho(2), from ubar(2) = (1 + (1 - rho(2)))/2
    target = 8 * ubar8 - 1                 # sum_{j=2}^8 (1 - rho(j)) = s (1 + q + ... + q^6)
    if not 0 < s <= 1:
        raise ValueError(f"ubar(2) = {ubar2} must lie in (1/2, 1] (one token reads m experts)")
    if not s < target <= 7 * s:
        raise ValueError(f"ubar(8) = {ubar8} is outside what a geometric decay from ubar(2) = {ubar2} "
                         f"allows: need {(1 + s) / 8:.4f} < ubar(8) <= {(1 + 7 * s) / 8:.4f}")
    if target == 7 * s:
        q = 1.0
    else:
        q = float(bisect_increasing(lambda x: s * sum(x ** t for t in range(7)),
                                    np.array(target), lo=0.0, hi=1.0))
    j = np.arange(1, n_max + 1)
    return np.where(j == 1, 0.0, 1 - s * q ** np.maximum(j - 2, 0))


def verify_times_from_bandwidths(beta_slot, beta_dedup, ubar, m, W, dense_bytes=0.0,
                                 dense_bandwidth=None):
    """(per-slot VerifyTime, deduplicating VerifyTime) for n = 1..n_max from each kernel's
    effective bandwidth beta_p(n) and the byte share ubar(n) (eq. (5) with t0 = phi = 0).

    E_slot(n) = n m W and E_dedup(n) = ubar(n) E_slot(n) (f_l = 1, Sec. 2); the one-token pass runs
    the per-slot kernel on either engine (Sec. 3.1), so beta_dedup(1) is replaced by beta_slot(1).
    Bandwidths are effective (they include the operation's fixed work, as in Table 1); units are
    the caller's (bytes and bytes per unit time).
    """
    beta_slot = np.asarray(beta_slot, dtype=float)
    beta_dedup = np.array(beta_dedup, dtype=float)
    ubar = np.asarray(ubar, dtype=float)
    n_max = beta_slot.shape[0]
    if beta_dedup.shape != (n_max,) or ubar.shape != (n_max,):
        raise ValueError(f"beta_slot, beta_dedup and ubar need one value per n = 1..{n_max}; found "
                         f"shapes {beta_slot.shape}, {beta_dedup.shape}, {ubar.shape}")
    if np.any(~np.isfinite(ubar)) or np.any(ubar <= 0) or np.any(ubar > 1):
        raise ValueError(f"ubar(n) must lie in (0, 1]; found {list(ubar)}")
    beta_dedup[0] = beta_slot[0]           # n = 1 runs the per-slot kernel either way
    E_slot = slot_expert_bytes(float(m), float(W), n_max).astype(float)
    common = dict(dense_bytes=dense_bytes, dense_bandwidth=dense_bandwidth)
    return VerifyTime(E_slot, beta_slot, **common), VerifyTime(E_slot * ubar, beta_dedup, **common)


def table1_verify_times(beta_slot2, beta_slot8, beta_dedup2, beta_dedup8, ubar2, ubar8, m, W,
                        dense_bytes=0.0, dense_bandwidth=None, n_max: int = 9):
    """(per-slot VerifyTime, deduplicating VerifyTime, rho) for n = 1..n_max from one Table-1 row.

    E_slot(n) = n m W; E_dedup(n) = n m W ubar(n) (f_l = 1); t0 = phi = 0 (Table 1's bandwidths
    already include the operation's fixed work). Bandwidths in bytes per unit time of the caller.
    """
    rho = reuse_from_byte_share(ubar2, ubar8, n_max)
    n = np.arange(1, n_max + 1)
    ubar = np.cumsum(1 - rho) / n
    slot, dedup = verify_times_from_bandwidths(
        interpolate_bandwidth(beta_slot2, beta_slot8, n_max),
        interpolate_bandwidth(beta_dedup2, beta_dedup8, n_max), ubar, m, W,
        dense_bytes=dense_bytes, dense_bandwidth=dense_bandwidth)
    return slot, dedup, rho
