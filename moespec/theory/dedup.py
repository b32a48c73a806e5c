"""Deduplicating engines: mean reuse, union bytes, the reuse threshold and the speedup
(paper 1, Sec. 3.4; Appendix B.2, eqs. (11)-(16), B.7-B.19).

``rho`` follows the routing contract: an array [L, n_max] whose column n-1 is rho_l(n), so
column 0 (rho_l(1)) is 0. ``w`` holds the bytes w_l of one expert of each layer, W = sum_l w_l.
The time form assumes f_l = 1 and h = 0, as the paper does for (13)-(15).
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

from ._checks import (as_array, check_acceptance, check_draft_length, check_finite, check_nonnegative,
                      check_positive, check_range, exact_or_float, harmonize, is_scalar, num, scalar_out)
from .polynomials import geometric_sum
from .steptime import VerifyTime


def _reuse_table(rho, w):
    R = as_array(rho, "rho")
    if R.ndim == 1:
        R = R[None, :]
    if R.ndim != 2 or R.shape[1] < 1:
        raise ValueError(f"rho: expected an array [L, n_max] (column n-1 is rho_l(n)); found shape {R.shape}")
    w = as_array([1] * R.shape[0] if w is None else w, "w")
    if w.shape != (R.shape[0],):
        raise ValueError(f"w: expected one expert size per layer, shape ({R.shape[0]},); found {w.shape}")
    check_positive(w, "w (expert size w_l of each layer)")
    check_range(R, "rho (reuse, a share of a token's experts)", 0, 1, high_open=False)
    if np.any(R[:, 0] != 0):
        raise ValueError("rho: column 0 is rho_l(1), which is 0 by definition (eq. 1); found non-zero")
    R, w = harmonize(R, w)
    return R, w


def rho_bar(rho, w=None):
    """rho_bar_k = (1/(k W)) sum_{j=2}^{k+1} sum_l w_l rho_l(j) for k = 1..n_max-1, the
    byte-weighted mean reuse of the k drafted tokens (paper 1, eq. (11)). Entry k-1 is rho_bar_k."""
    R, w = _reuse_table(rho, w)
    if R.shape[1] < 2:
        raise ValueError("rho: need rho_l(n) up to n >= 2 to form rho_bar_1")
    weighted = (w[:, None] * R[:, 1:]).sum(axis=0)             # sum_l w_l rho_l(j), j = 2..n_max
    k = as_array(list(range(1, R.shape[1])), "k") if R.dtype == object else np.arange(1, R.shape[1])
    return np.cumsum(weighted) / (k * w.sum())


def union_bytes(m, rho, w=None):
    """E_dedup(n) = m sum_l w_l sum_{j<=n} (1 - rho_l(j)) for n = 1..n_max, the expected union
    bytes of a pass (paper 1, eq. (2) and eq. B.7). Entry n-1 is E_dedup(n)."""
    R, w = _reuse_table(rho, w)
    return m * np.cumsum((w[:, None] * (1 - R)).sum(axis=0))


def dedup_bytes(m, W, k, rho_bar_k):
    """E_dedup(k+1) = m W + m W k (1 - rho_bar_k), the expert bytes of a pass of k+1 tokens on
    a deduplicating kernel (paper 1, eq. (12); eq. B.8)."""
    return m * W + m * W * k * (1 - rho_bar_k)


def _check_time_inputs(tau1, beta1, B_k, delta_D, beta_D, delta_phi):
    """The arguments of (14)/(15) beside a, k, m, W: tau(1), beta(1), B_k positive and finite;
    Delta D_k non-negative and finite (key-value bytes only grow with the pass), with a positive
    beta_D when it is non-zero; Delta phi_k finite (either sign)."""
    for name, value in (("tau1", tau1), ("beta1", beta1), ("B_k", B_k)):
        check_positive(value, name)
    check_nonnegative(delta_D, "delta_D")
    if delta_D != 0:
        if beta_D is None:
            raise ValueError("beta_D: a dense bandwidth in (0, inf) is needed when delta_D != 0; found None")
        check_positive(beta_D, "beta_D")
    check_finite(delta_phi, "delta_phi")


def _bracket(G, tau1, delta_D, beta_D, delta_phi):
    """Y = (G_a(k) - 1) tau(1) - Delta D_k / beta_D - Delta phi_k, the bracket of (14) (eq. B.12)."""
    dense = 0 if delta_D == 0 else delta_D / beta_D
    return (G - 1) * tau1 - dense - delta_phi


def reuse_threshold(a, k, m, W, tau1, beta1, B_k, delta_D=0, beta_D=None, delta_phi=0):
    """rho*_k(a) = 1 - (1/k) [ (B_k/(m W)) ((G_a(k) - 1) tau(1) - Delta D_k/beta_D - Delta phi_k)
    + B_k/beta(1) - 1 ], the least mean reuse rho_bar_k at which draft length k is faster than
    plain decoding on a deduplicating engine (paper 1, eq. (14), time form; eqs. B.12-B.14).

    Args: ``tau1`` = tau(1); ``beta1`` = beta(1); ``B_k`` = beta_dedup(k+1);
    ``delta_D`` = D(k+1) - D(1) = kv(k) - kv(0) at dense bandwidth ``beta_D``;
    ``delta_phi`` = phi_dedup(k+1) - phi(1). Vectorized in ``a``: exact (Fractions) when every
    input is exact, float64 as soon as one is a float.
    """
    check_positive(m, "m")
    check_positive(W, "W")
    _check_time_inputs(tau1, beta1, B_k, delta_D, beta_D, delta_phi)
    k = check_draft_length(k, min_k=1)
    arr, m, W, tau1, beta1, B_k, delta_D, beta_D, delta_phi = exact_or_float(
        check_acceptance(a), m, W, tau1, beta1, B_k, delta_D, beta_D, delta_phi)
    Y = _bracket(geometric_sum(arr, np.int64(k)), tau1, delta_D, beta_D, delta_phi)
    out = 1 - (B_k * Y / (m * W) + B_k / beta1 - 1) / k
    return scalar_out(out, is_scalar(a))


def reuse_threshold_from(verify: VerifyTime, a, k, m, W):
    """rho*_k(a) of eq. (14) with every input read off a deduplicating kernel's verify time (5):
    tau(1), beta(1) and B_k = beta_dedup(k+1), Delta D_k = kv(k) - kv(0), Delta phi_k."""
    k = check_draft_length(k, verify.n_max - 1, min_k=1)
    return reuse_threshold(a, k, m, W, verify.tau()[0], verify.bandwidth[0], verify.bandwidth[k],
                           delta_D=verify.kv[k] - verify.kv[0], beta_D=verify.dense_bandwidth,
                           delta_phi=verify.fixed[k] - verify.fixed[0])


def _kv_at(kv, k):
    """kv(k): 0 without a cache, ``kv[k]`` from a sequence (which must reach k), ``kv(k)`` from a
    function; a non-negative, finite byte count."""
    if kv is None:
        return 0
    if callable(kv):
        value = kv(k)
    else:
        if isinstance(kv, (str, bytes)) or not hasattr(kv, "__len__"):
            raise TypeError(f"kv: expected None, a sequence kv(0..k) or a function of k; found {kv!r}")
        if len(kv) <= k:
            raise ValueError(f"kv: needs the cache bytes kv(0..{k}) ({k + 1} values) for k = {k}; "
                             f"found {len(kv)}")
        value = kv[k]
    check_nonnegative(value, f"kv({k})")
    return value


def byte_threshold(a, k, m, W, D=0, kv=None):
    """rho*_k(a) = 1 - [ (G_a(k) - 1) V_dedup(0) - (kv(k) - kv(0)) ] / (m W k), with
    V_dedup(0) = D + m W + kv(0): the reuse threshold with one bandwidth for every byte and
    t0 = phi = 0 (paper 1, eq. (16); eq. B.16). ``kv`` is None (no cache bytes), a sequence
    indexed by k or a function of k. Vectorized in ``a``: exact (Fractions) when every input is
    exact, float64 as soon as one is a float."""
    check_positive(m, "m")
    check_positive(W, "W")
    check_nonnegative(D, "D")
    k = check_draft_length(k, min_k=1)
    arr, m, W, D, kv0, kvk = exact_or_float(check_acceptance(a), m, W, D, _kv_at(kv, 0), _kv_at(kv, k))
    G = geometric_sum(arr, np.int64(k))
    out = 1 - ((G - 1) * (D + m * W + kv0) - (kvk - kv0)) / (m * W * k)
    return scalar_out(out, is_scalar(a))


def byte_step_times(m, W, rho_bars, D=0, kv=None):
    """V_dedup(k) = D + E_dedup(k+1) + kv(k) for k = 0..kmax, the byte cost with one bandwidth
    (paper 1, Appendix B.2; E_dedup from eq. (12)). ``rho_bars`` = (rho_bar_1, ..., rho_bar_kmax)."""
    rb = as_array(rho_bars, "rho_bars")
    check_positive(m, "m")
    check_positive(W, "W")
    check_nonnegative(D, "D")
    m, W, D = num(m), num(W), num(D)
    E = [m * W] + [dedup_bytes(m, W, k, rb[k - 1]) for k in range(1, len(rb) + 1)]
    return as_array([D + E[k] + num(_kv_at(kv, k)) for k in range(len(E))], "V")


def periodic_reuse(pattern, n_max: int) -> list:
    """Exact reuse rho(n), n = 1..n_max, of periodic routing with one slot (m = 1): the token at
    position t selects expert ``pattern[t mod P]`` (any sequence of hashable symbols, e.g. "00102");
    rho(n) is the share of the P phases whose n-th token's expert one of the n - 1 tokens before it
    also selected (paper 1, eq. (1) on the infinite periodic sequence; App. B.2's "no single
    threshold" patterns). rho(1) = 0. Fractions."""
    P = len(pattern)
    if P < 1:
        raise ValueError("periodic_reuse: the pattern is empty")
    n_max = check_draft_length(n_max, name="n_max", min_k=1)
    out = [Fraction(0)]
    for n in range(2, n_max + 1):
        hits = sum(pattern[(t + n - 1) % P] in {pattern[(t + u) % P] for u in range(n - 1)} for t in range(P))
        out.append(Fraction(hits, P))
    return out


def faster_draft_lengths(rho_bars, thresholds):
    """The draft lengths k (1-based) with rho_bar_k > rho*_k(a): each is faster than plain
    decoding, and speculation gives a speedup at a iff the list is non-empty
    (paper 1, eq. B.14 with B.3)."""
    return [k for k, (rb, th) in enumerate(zip(rho_bars, thresholds), start=1) if rb > th]


def dedup_speedup(a, k, m, W, rho_bar_k, tau1, beta1, B_k, delta_D=0, beta_D=None, delta_phi=0):
    """T_a(k)/T_a(0) = G_a(k) V(0) / (V(0) + Delta D_k/beta_D + Delta phi_k + E_dedup(k+1)/B_k
    - m W/beta(1)) with V(0) = tau(1) and E_dedup(k+1) from (12) (paper 1, eq. (15)). Exact when
    every input is exact, float64 as soon as one is a float."""
    check_positive(m, "m")
    check_positive(W, "W")
    check_range(rho_bar_k, "rho_bar_k", 0, 1, high_open=False)
    _check_time_inputs(tau1, beta1, B_k, delta_D, beta_D, delta_phi)
    k = check_draft_length(k, min_k=1)
    arr, m, W, rho_bar_k, tau1, beta1, B_k, delta_D, beta_D, delta_phi = exact_or_float(
        check_acceptance(a), m, W, rho_bar_k, tau1, beta1, B_k, delta_D, beta_D, delta_phi)
    G = geometric_sum(arr, np.int64(k))
    dense = 0 if delta_D == 0 else delta_D / beta_D
    V_k = tau1 + dense + delta_phi + dedup_bytes(m, W, k, rho_bar_k) / B_k - m * W / beta1
    return scalar_out(G * tau1 / V_k, is_scalar(a))
