"""Step time from bytes and effective bandwidths, and the two expert kernels (paper 1, Secs. 3.1
and 3.4; eqs. (5)-(7)).

A :class:`VerifyTime` holds, for pass sizes n = 1..n_max, one kernel's requested expert bytes
E_p(n), its effective bandwidth beta_p(n) and fixed work phi_p(n), with the bytes read once per
pass D(n) = D + kv(n-1) at the dense bandwidth beta_D and the time t0 outside memory reads.
Units are the caller's (bytes and bytes/s give seconds). Exact with Fractions.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Sequence

import numpy as np

from ._checks import (as_array, check_draft_length, check_nonnegative, check_positive, check_range,
                      check_step_times, exact_or_float, harmonize, is_exact, num)


def _vector(x, n_max: int, name: str, default=0) -> np.ndarray:
    if x is None:
        x = [default] * n_max
    arr = as_array(x, name)
    if arr.ndim != 1 or arr.shape[0] != n_max:
        raise ValueError(f"{name}: expected one value per pass size n = 1..{n_max} "
                         f"(shape ({n_max},)); found shape {arr.shape}")
    return arr


@dataclass(frozen=True)
class VerifyTime:
    """tau_p(n) = t0 + D(n)/beta_D + E_p(n)/beta_p(n) + phi_p(n), n = 1..n_max (paper 1, eq. (5)).

    Attributes:
        expert_bytes: E_p(n), n = 1..n_max (E_slot(n) = n m W; E_dedup(n) = sum_l f_l w_l U_l(n)).
        bandwidth: beta_p(n) > 0, the kernel's effective bandwidth at each pass size.
        dense_bytes: D, bytes read once per pass whatever the routing.
        dense_bandwidth: beta_D > 0; needed when any dense or key-value bytes are read.
        kv: kv(n-1), n = 1..n_max: key-value bytes of a pass of n tokens (default 0).
        fixed: phi_p(n) >= 0, fixed work such as launches (default 0).
        t0: time outside the memory reads (>= 0).
    """

    expert_bytes: Sequence
    bandwidth: Sequence
    dense_bytes: object = 0
    dense_bandwidth: object = None
    kv: Sequence | None = None
    fixed: Sequence | None = None
    t0: object = 0
    n_max: int = field(init=False)

    def __post_init__(self):
        E = as_array(self.expert_bytes, "expert_bytes")
        if E.ndim != 1 or E.shape[0] < 1:
            raise ValueError(f"expert_bytes: expected a 1-D vector E_p(1..n_max); found shape {E.shape}")
        n = E.shape[0]
        beta = _vector(self.bandwidth, n, "bandwidth")
        kv = _vector(self.kv, n, "kv")
        phi = _vector(self.fixed, n, "fixed")
        for name, value in (("expert_bytes", E), ("kv", kv), ("fixed", phi), ("dense_bytes", self.dense_bytes),
                            ("t0", self.t0)):
            check_nonnegative(value, name)
        check_positive(beta, "bandwidth (beta_p(n))")
        needs_dense = self.dense_bytes != 0 or np.any(kv != 0)
        if needs_dense and self.dense_bandwidth is None:
            raise ValueError("dense_bandwidth: a beta_D in (0, inf) is needed when dense_bytes or kv is non-zero; "
                             "found None")
        if self.dense_bandwidth is not None:
            check_positive(self.dense_bandwidth, "dense_bandwidth")
        object.__setattr__(self, "n_max", n)
        scalars = [x for x in (self.dense_bytes, self.dense_bandwidth, self.t0) if x is not None]
        arrays = [E, beta, kv, phi]
        if not (all(arr.dtype == object for arr in arrays) and is_exact(scalars)):
            # one float input makes everything float: no slow object arrays of floats
            arrays = [arr.astype(float) for arr in arrays]
            for name in ("dense_bytes", "dense_bandwidth", "t0"):
                value = getattr(self, name)
                object.__setattr__(self, name, None if value is None else float(value))
        else:
            for name in ("dense_bytes", "dense_bandwidth", "t0"):
                object.__setattr__(self, name, num(getattr(self, name)))
        for name, value in zip(("expert_bytes", "bandwidth", "kv", "fixed"), arrays):
            object.__setattr__(self, name, value)

    def dense_time(self) -> np.ndarray:
        """D(n)/beta_D for n = 1..n_max (zero when nothing is read once per pass)."""
        D_n = self.dense_bytes + self.kv
        if self.dense_bandwidth is None:
            return D_n * 0
        return D_n / self.dense_bandwidth

    def expert_time(self) -> np.ndarray:
        """M^e_p(n) = E_p(n)/beta_p(n), the expert part of tau_p(n) (paper 1, Sec. 3.5)."""
        return self.expert_bytes / self.bandwidth

    def memory_time(self) -> np.ndarray:
        """M_p(n) = D(n)/beta_D + E_p(n)/beta_p(n), the memory part of tau_p(n) (Sec. 3.5)."""
        return self.dense_time() + self.expert_time()

    def tau(self) -> np.ndarray:
        """tau_p(n) for n = 1..n_max (paper 1, eq. (5)); entry n-1 is tau_p(n)."""
        return self.t0 + self.memory_time() + self.fixed

    def step_times(self, h=None) -> np.ndarray:
        """V(k) = tau_p(k+1) + h(k) for k = 0..n_max-1 (paper 1, Sec. 3.1); ``h`` is the draft
        model's and host's time per step (default 0)."""
        V = self.tau()
        if h is not None:
            h = check_nonnegative(_vector(h, self.n_max, "h"), "h (draft and host time)")
            V, h = harmonize(V, h)
            V = V + h
        return check_step_times(V)

    def with_bandwidth_errors(self, e_expert=0, e_dense=0) -> "VerifyTime":
        """The estimate of Sec. 3.5: every bandwidth beta -> beta (1 + e), one e per pass size
        for the kernel (``e_expert``, scalar or per n) and one for beta_D (``e_dense``)."""
        e = np.broadcast_to(as_array(e_expert, "e_expert"), (self.n_max,))
        check_range(e, "e_expert", -1, low_open=True)
        e, beta = harmonize(np.array(e), self.bandwidth)
        dense = None if self.dense_bandwidth is None else self.dense_bandwidth * (1 + e_dense)
        return replace(self, bandwidth=beta * (1 + e), dense_bandwidth=dense)


def slot_expert_bytes(m, W, n_max: int) -> np.ndarray:
    """E_slot(n) = n m W for n = 1..n_max: one expert read per slot (paper 1, Sec. 2)."""
    n_max = check_draft_length(n_max, name="n_max", min_k=1)
    check_positive(m, "m")
    check_positive(W, "W")
    n, m, W = exact_or_float(list(range(1, n_max + 1)), m, W)
    return n * m * W


def saving(slot: VerifyTime, dedup: VerifyTime) -> np.ndarray:
    """S(n) = tau_slot(n) - tau_dedup(n) for n = 1..n_max (paper 1, Sec. 3.1)."""
    if slot.n_max != dedup.n_max:
        raise ValueError(f"saving: kernels cover different pass sizes ({slot.n_max} vs {dedup.n_max})")
    return slot.tau() - dedup.tau()


def saving_from_ratio(slot_expert_time, ubar, r):
    """S(n) = (E_slot(n)/beta_slot(n)) (1 - ubar(n)/r(n)) with f_l = 1 and equal fixed work
    (paper 1, eq. (6)). Arguments are scalars or arrays over n."""
    return slot_expert_time * (1 - ubar / r)


def byte_share(dedup_bytes, slot_bytes):
    """ubar(n) = E_dedup(n)/E_slot(n), the share of the per-slot bytes deduplication requests."""
    return dedup_bytes / slot_bytes


def bandwidth_ratio(beta_dedup, beta_slot):
    """r(n) = beta_dedup(n)/beta_slot(n) (paper 1, Sec. 2)."""
    return beta_dedup / beta_slot


def dedup_faster(ubar, r):
    """True where the deduplicating kernel is faster: ubar(n) < r(n) (paper 1, eq. (7);
    f_l = 1 and equal fixed work)."""
    return np.less(ubar, r)


def crossover(S: np.ndarray, n_from: int = 2) -> int | None:
    """Smallest n >= n_from from which the saving's point estimate stays positive through the
    last n (paper 1, Section 2); None when there is none. ``S[n-1]`` is S(n)."""
    S = np.asarray(S, float)
    n_last = len(S)
    best = None
    for n in range(n_last, n_from - 1, -1):
        if S[n - 1] > 0:
            best = n
        else:
            break
    return best


def crossover_distance(pred: int | None, meas: int | None, n_last: int) -> int:
    """|pred − meas| with 'none' counted as n_last + 1 (Table 8: a measured crossover at n = 9
    is within one of none)."""
    none = n_last + 1
    return abs((none if pred is None else pred) - (none if meas is None else meas))
