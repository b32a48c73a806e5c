"""Error bounds of Table 2 and Appendix C (paper 1, Sec. 3.5; eqs. (17)-(21), C.1-C.7).

Each bandwidth of (5) is estimated as beta_hat = beta (1 + e) with |e| <= eps < 1, every other term
exact. For the draft length and the speedup, delta bounds the relative error of the whole predicted
step time: (1 - delta) V(k) <= V_hat(k) <= (1 + delta) V(k), 0 <= delta < 1.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import check_positive, check_step_times, check_unit_interval, harmonize, num
from .speculation import throughput


def _ratio(eps):
    eps = num(check_unit_interval(eps, "eps"))
    return eps / (1 - eps)


def verify_time_bound(eps, memory_time):
    """|tau_hat_p(n) - tau_p(n)| <= eps/(1-eps) M_p(n) <= eps/(1-eps) tau_p(n), with
    M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n) the memory part (paper 1, eq. (17); eq. C.1)."""
    return _ratio(eps) * memory_time


def saving_bound(eps, slot_expert_time, dedup_expert_time):
    """|S_hat(n) - S(n)| <= eps/(1-eps) (M^e_slot(n) + M^e_dedup(n)), the sum of the two kernels'
    expert times (paper 1, eq. (18); eq. C.2). Dense reads are shared and cancel."""
    return _ratio(eps) * (slot_expert_time + dedup_expert_time)


def saving_amplification(slot_expert_time, dedup_expert_time):
    """(M^e_slot + M^e_dedup)/|S|, with S = M^e_slot - M^e_dedup (f_l = 1, equal fixed work): the
    factor by which (18) turns a relative bandwidth error into a relative saving error (Sec. 3.5,
    Table 7). Infinite at the crossover."""
    total = slot_expert_time + dedup_expert_time
    gap = np.abs(slot_expert_time - dedup_expert_time)
    with np.errstate(divide="ignore"):
        return np.where(gap > 0, total / np.where(gap > 0, gap, 1), np.inf)


def faster_kernel_margin(eps) -> float:
    """ln((1 + eps)/(1 - eps)): the margin of (19) (paper 1, eq. (19); eq. C.3)."""
    eps = check_unit_interval(eps, "eps")
    return math.log((1 + eps) / (1 - eps))


def log_gap(ubar, r):
    """ln r(n) - ln ubar(n): positive where the deduplicating kernel is faster (paper 1, eq. (7)),
    the quantity bound (19) compares with ln((1+eps)/(1-eps))."""
    ubar = np.asarray(check_positive(np.asarray(ubar, dtype=float), "ubar"))
    r = np.asarray(check_positive(np.asarray(r, dtype=float), "r"))
    return np.log(r) - np.log(ubar)


def kernels_agree(ubar, r, eps):
    """True where the predicted and the true sides of (7) are guaranteed to agree:
    |ln r(n) - ln ubar(n)| > ln((1+eps)/(1-eps)) (paper 1, eq. (19); f_l = 1, equal fixed work).
    ``ubar`` and ``r`` are the true byte share and bandwidth ratio."""
    out = np.abs(log_gap(ubar, r)) > faster_kernel_margin(eps)
    return bool(out) if out.ndim == 0 else out


#: Verdicts of (19) on an interval of log gaps: :func:`margin_verdict`.
MARGIN_VERDICTS = ("holds", "fails", "within rounding")


def margin_verdict(gap_lo: float, gap_hi: float, eps) -> str:
    """(19) for a log gap ln r(n) - ln ubar(n) known only to lie in [gap_lo, gap_hi] (e.g. over a
    published table's rounding): "holds" when every gap there exceeds the margin
    ln((1+eps)/(1-eps)) in size (the predicted and true kernel order agree whatever the unrounded
    values), "fails" when none does, "within rounding" when the interval straddles the margin
    (paper 1, eq. (19))."""
    if not gap_lo <= gap_hi:
        raise ValueError(f"margin_verdict: need gap_lo <= gap_hi, found [{gap_lo}, {gap_hi}]")
    m = faster_kernel_margin(eps)
    if gap_lo > m or gap_hi < -m:
        return "holds"
    if -m <= gap_lo and gap_hi <= m:
        return "fails"
    return "within rounding"


def _delta(delta):
    return num(check_unit_interval(delta, "delta"))


def throughput_loss_bound(delta):
    """2 delta/(1 + delta): drafting k_hat* loses at most this share of the best throughput,
    T_a(k_hat*) >= (1-delta)/(1+delta) T_a(k*) (paper 1, eq. (20); eqs. C.4-C.5)."""
    d = _delta(delta)
    return 2 * d / (1 + d)


def separation_holds(V, a, delta) -> bool:
    """The separation condition of (20): (1+delta)/(1-delta) T_a(i) < T_a(k*) for every i != k*.
    When it holds, any V_hat within relative error delta has the same best draft length
    (paper 1, eq. (20); Appendix C, 'argmax agree')."""

    d = _delta(delta)
    T = throughput(V, a)
    if np.ndim(T) != 1:
        raise ValueError("separation_holds: pass one acceptance value a")
    best = int(np.argmax(T))
    others = np.delete(T, best)
    return bool(np.all((1 + d) / (1 - d) * others < T[best]))


def speedup_interval(delta):
    """((1-delta)/(1+delta), (1+delta)/(1-delta)): the predicted best speedup
    T_hat_a(k_hat*)/T_hat_a(0) over the true T_a(k*)/T_a(0) lies in this interval
    (paper 1, eq. (21); eq. C.6)."""
    d = _delta(delta)
    return (1 - d) / (1 + d), (1 + d) / (1 - d)


def speedup_interval_by_k(delta):
    """Per draft length, (lo[k], hi[k]) with lo[k] <= S(k)/S_hat(k) <= hi[k], where S(k) = E(k) V(0)/V(k)
    is the speedup of draft length k and S_hat its prediction from step times with relative errors
    (1 - delta_j) V(j) <= V_hat(j) <= (1 + delta_j) V(j) (``delta`` one value per k = 0..kmax):
    lo[k] = (1 - delta_k)/(1 + delta_0), hi[k] = (1 + delta_k)/(1 - delta_0). With one delta for
    every k this is bound (21)'s interval (paper 1, eq. (21); eq. C.6) for any k, not only the best;
    at k = 0 the ratio is exactly 1 (the same V(0) above and below). A delta of 1 or more (a step
    whose interval reaches down to half its point estimate or below, e.g. a calibration of one
    prompt) bounds the prediction from one side only: delta_k >= 1 leaves no lower bound on
    V_hat(k) / V(k) beyond its being positive, so lo[k] = 0; delta_0 >= 1 leaves no upper bound on
    V(0) / V_hat(0), so hi = inf for every k >= 1."""
    d = np.asarray(delta, dtype=float).reshape(-1)
    if d.size == 0 or np.any(~np.isfinite(d)) or np.any(d < 0):
        raise ValueError(f"delta: one finite value >= 0 per k needed; found {d.tolist()}")
    lo = np.maximum(1 - d, 0.0) / (1 + d[0])
    hi = (1 + d) / (1 - d[0]) if d[0] < 1 else np.full(d.shape, np.inf)
    lo[0] = hi[0] = 1.0
    return lo, hi


def delta_from_eps(eps):
    """delta = eps/(1-eps): the relative step-time error that bandwidth errors |e| <= eps alone
    can cause, with exact draft and host time (paper 1, Sec. 3.5; Appendix C, before C.7)."""
    eps = num(check_unit_interval(eps, "eps", upper=0.5))
    return eps / (1 - eps)


def speedup_factor_from_eps(eps):
    """(1+delta)/(1-delta) = 1/(1-2 eps) for delta = eps/(1-eps), eps < 1/2 (paper 1, eq. C.7);
    1.25 at eps = 0.1."""
    eps = num(check_unit_interval(eps, "eps", upper=0.5))
    return 1 / (1 - 2 * eps)


def relative_step_error(V_hat, V):
    """max_k |V_hat(k)/V(k) - 1|, the smallest delta with (1-delta)V <= V_hat <= (1+delta)V."""
    V_hat, V = harmonize(check_step_times(V_hat, "V_hat"), check_step_times(V, "V"))
    if V_hat.shape != V.shape:
        raise ValueError(f"V_hat and V differ in length: {V_hat.shape} vs {V.shape}")
    return max(abs(x / y - 1) for x, y in zip(V_hat, V))
