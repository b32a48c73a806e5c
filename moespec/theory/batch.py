"""Speculation at batch size B: a verify pass of B sequences x (k + 1) tokens (paper 1's step time
(5) and byte model (2)-(3) applied to the tokens of B different sequences; paper 2's per-pass union
Ubar, eq. (5), over the same tokens).

Definitions. B sequences decode together; each step drafts k tokens for every sequence and the
target verifies all of them in one pass of n = B(k + 1) tokens. Each sequence accepts its own
drafts, geometric at rate a, so each emits G_a(k) tokens per step on average (paper 1, Sec. 1).

Bytes of the pass (paper 1, Sec. 2, with the tokens of B sequences in place of one window):
* per-slot kernel: one expert read per slot, E_slot(B, k) = B (k + 1) m W;
* deduplicating kernel: one read per distinct expert of the pass, E_dedup(B, k) = sum_l w_l U_l(B, k + 1),
  where U_l(B, j) is the mean number of distinct experts that B windows of j consecutive tokens, one
  window from each of B sequences, select in layer l;
* read once per pass, whatever B: D (attention and dense weights, the LM head);
* per sequence: the key-value cache, kv(k) bytes for each sequence (each reads its own cache), so
  B kv(k) in all.

So the verify time of (5) at batch B is
    tau_p(B, k) = t0 + (D + B kv(k))/beta_D + E_p(B, k)/beta_p(B(k + 1)) + phi_p(B(k + 1)),
each bandwidth and fixed work read at the pass size it runs, n = B(k + 1), and the step time is
V(k, B) = tau_p(B, k) + h_B(k) with h_B the draft's and host's time per step at batch B. This has the
form of (5) entry by entry, so :class:`moespec.theory.VerifyTime` holds it: :func:`batch_verify_time`
returns a VerifyTime whose entry k (k = 0..kmax) is the pass of B(k + 1) tokens, dense bytes D and
"key-value" bytes B kv(k). At B = 1 its entries are those of the single-sequence VerifyTime at
n = k + 1, term for term, so every number below is today's single-sequence number at B = 1.

Every result of paper 1's Section 3 uses V only through V > 0 (Sec. 3.3), so it holds at each B with
V(k, B) in place of V(k): throughput T_a(k, B) = G_a(k)/V(k, B) per sequence and B G_a(k)/V(k, B) per
batch; the speedup over plain decoding at the same B, G_a(k) V(0, B)/V(k, B) (eq. (9)); condition
(8); k*(a, B), the smallest maximizer; and the bounds of Table 2, (17)-(21), whose proofs use the form
(5) and V > 0 only (Appendix C).

Union across sequences. When the B sequences are independent (separate requests) and each one's
window is a window of the routing process, an expert e of layer l is outside the pass's union with
probability (1 - p_{l,e}(j))^B, p_{l,e}(j) the probability that one window of j tokens selects e. So
U_l(B, j) = sum_e [1 - (1 - p_{l,e}(j))^B] (:func:`union_from_inclusion`). When the routing is, in
addition, exchangeable over experts (every expert equally likely; e.g. uniform routing),
p_{l,e}(j) = U_l(j)/N and U_l(B, j) = N [1 - (1 - U_l(j)/N)^B] (:func:`exchangeable_union`), which
at j = 1 and U(1) = m is MoESD's N(1 - q^B), q = 1 - m/N. As along one sequence (eq. (1)-(2)), the
cross-sequence reuse rho^x_l(b; j) = E|X_b ∩ (X_1 ∪ ... ∪ X_{b-1})| / U_l(j), the share of the b-th
sequence's window experts that an earlier sequence of the batch also selected, gives by linearity
U_l(B, j) = U_l(j) sum_{b=1}^B (1 - rho^x_l(b; j)) (:func:`cross_reuse`).
"""

from __future__ import annotations

import numpy as np

from ._checks import (as_array, check_acceptance, check_draft_length, check_positive, check_range, harmonize,
                      is_scalar, num, scalar_out)
from .bounds import faster_kernel_margin, kernels_agree, saving_bound, throughput_loss_bound, verify_time_bound
from .speculation import best_draft_length, faster_than_plain, speedup, throughput
from .steptime import VerifyTime, saving, slot_expert_bytes


def pass_sizes(B: int, kmax: int) -> np.ndarray:
    """n = B(k + 1) for k = 0..kmax: the tokens of a verify pass of B sequences."""
    B = check_draft_length(B, name="B", min_k=1)
    kmax = check_draft_length(kmax, name="kmax")
    return B * np.arange(1, kmax + 2)


def batch_slot_bytes(m, W, B: int, kmax: int) -> np.ndarray:
    """E_slot(B, k) = B (k + 1) m W for k = 0..kmax: one expert read per slot of the B(k + 1) tokens
    (paper 1, Sec. 2), linear in the pass size B(k + 1). At B = 1, ``slot_expert_bytes(m, W, kmax+1)``."""
    n = pass_sizes(B, kmax)
    return slot_expert_bytes(m, W, int(n[-1]))[n - 1]


def batch_union_bytes(union, w=None) -> np.ndarray:
    """E_dedup(B, k) = sum_l w_l U_l(B, k + 1), k = 0..kmax, from ``union`` ``[L, kmax+1]`` (column k:
    the mean distinct experts U_l(B, k + 1) of B windows of k + 1 tokens from B sequences) and the
    expert bytes ``w`` of each layer (default 1: expert counts); f_l = 1 (paper 1, Sec. 2 and eq.
    (3), with the B sequences' tokens as the pass). Exact for exact input."""
    U = as_array(union, "union")
    if U.ndim == 1:
        U = U[None, :]
    if U.ndim != 2 or U.shape[1] < 1:
        raise ValueError(f"union: expected an array [L, kmax+1] (column k is U_l(B, k+1)); found shape {U.shape}")
    check_range(U, "union (distinct experts of a pass)", 0)
    w = as_array([1] * U.shape[0] if w is None else w, "w")
    if w.shape != (U.shape[0],):
        raise ValueError(f"w: expected one expert size per layer, shape ({U.shape[0]},); found {w.shape}")
    check_positive(w, "w (expert size w_l of each layer)")
    U, w = harmonize(U, w)
    return (w[:, None] * U).sum(axis=0)


def batch_byte_saving(m, W, B: int, union, w=None) -> np.ndarray:
    """E_slot(B, k) - E_dedup(B, k) = B (k + 1) m W - sum_l w_l U_l(B, k + 1), k = 0..kmax: the bytes the
    deduplicating kernel does not request on a pass of B sequences (paper 1, eq. (3), over the tokens of
    B sequences; ``union`` ``[L, kmax+1]`` as :func:`batch_union_bytes`, W = sum_l w_l)."""
    E = batch_union_bytes(union, w)
    slot = batch_slot_bytes(m, W, B, len(E) - 1)
    E, slot = harmonize(as_array(E, "E_dedup"), as_array(slot, "E_slot"))
    return slot - E


def batch_byte_share(m, W, B: int, union, w=None) -> np.ndarray:
    """ubar(B, k) = E_dedup(B, k) / E_slot(B, k), k = 0..kmax: the share of the per-slot bytes that the
    deduplicating kernel requests on a pass of B sequences (paper 1, Sec. 2; compare r(B(k + 1)) by (7))."""
    E = batch_union_bytes(union, w)
    slot = batch_slot_bytes(m, W, B, len(E) - 1)
    E, slot = harmonize(as_array(E, "E_dedup"), as_array(slot, "E_slot"))
    return E / slot


def exchangeable_union(U_window, N, B):
    """U(B, j) = N [1 - (1 - U(j)/N)^B]: the mean union of B independent windows when each window's
    expert set is exchangeable over the N experts (its law the same under any relabelling), so that
    P(e in X_b) = U(j)/N for every expert e (module docstring). ``U_window`` = U(j), scalar or array
    over j; B = 1 gives U(j). Exact for exact input."""
    check_positive(N, "N")
    check_range(U_window, "U_window (distinct experts of one window)", 0, float(N), high_open=False)
    B = check_draft_length(B, name="B", min_k=1)
    U = as_array(U_window, "U_window")
    N = num(N)
    out = N * (1 - (1 - U / N) ** B)
    return scalar_out(out, is_scalar(U_window))


def union_from_inclusion(p, B):
    """U_l(B, j) = sum_e [1 - (1 - p_{l,e}(j))^B] from the inclusion probabilities ``p`` ``[..., N]``
    (p_{l,e}(j): the probability that one window of j tokens selects expert e), for B independent
    windows (module docstring). Sums over the last axis. B = 1 gives sum_e p_e = U_l(j)."""
    B = check_draft_length(B, name="B", min_k=1)
    P = as_array(p, "p")
    check_range(P, "p (inclusion probability)", 0, 1, high_open=False)
    return (1 - (1 - P) ** B).sum(axis=-1)


def cross_reuse(union_by_b):
    """rho^x(b; j) = 1 - (U(b, j) - U(b-1, j)) / U(1, j) for b = 1..B, with U(0, j) = 0: the share of the
    b-th sequence's window experts that an earlier sequence of the pass also selected. ``union_by_b``
    ``[B, ...]``: row b-1 is U(b, j). rho^x(1; j) = 0, and U(B, j) = U(1, j) sum_b (1 - rho^x(b; j))
    (module docstring; the analogue of eqs. (1)-(2) along the batch axis)."""
    U = as_array(union_by_b, "union_by_b")
    if U.ndim < 1 or U.shape[0] < 1:
        raise ValueError(f"union_by_b: expected rows U(1..B, j); found shape {U.shape}")
    check_positive(U[0], "union_by_b[0] (U(1, j))")
    prev = np.concatenate([U[:1] * 0, U[:-1]], axis=0)
    return 1 - (U - prev) / U[0]


def batch_verify_time(verify: VerifyTime, B: int, kmax: int, expert_bytes=None) -> VerifyTime:
    """The verify time of B sequences as a :class:`VerifyTime` indexed by k = 0..kmax: entry k is the
    pass of n = B(k + 1) tokens, tau_p(B, k) = t0 + (D + B kv(k))/beta_D + E_p(B, k)/beta_p(n) + phi_p(n)
    (module docstring; paper 1, eq. (5)).

    ``verify``: the kernel's single-sequence verify time for n = 1..n_max, n_max >= B(kmax + 1); its
    beta_p(n) and phi_p(n) are read at n = B(k + 1), its kv(k) (the cache bytes of one sequence's pass of
    k + 1 tokens, entry k of ``verify.kv``) is counted once per sequence, its D once per pass.
    ``expert_bytes``: E_p(B, k), k = 0..kmax; default ``verify.expert_bytes`` at n = B(k + 1), which is
    the per-slot kernel's B(k + 1) m W exactly, but for the deduplicating kernel the union of ONE
    sequence's window of B(k + 1) tokens: pass :func:`batch_union_bytes` of the B sequences' union.
    At B = 1 with the default bytes, entry k equals ``verify``'s entry at n = k + 1, term for term.
    """
    if not isinstance(verify, VerifyTime):
        raise TypeError(f"verify: expected a VerifyTime; found {type(verify).__name__}")
    n = pass_sizes(B, kmax)
    if n[-1] > verify.n_max:
        raise ValueError(f"verify: B = {B} sequences x (kmax + 1) = {kmax + 1} tokens need pass sizes up to "
                         f"n = {n[-1]}; the verify time covers n = 1..{verify.n_max}")
    E = verify.expert_bytes[n - 1] if expert_bytes is None else as_array(expert_bytes, "expert_bytes")
    if E.shape != (kmax + 1,):
        raise ValueError(f"expert_bytes: expected E_p(B, k) for k = 0..{kmax}, shape ({kmax + 1},); found {E.shape}")
    return VerifyTime(E, verify.bandwidth[n - 1], dense_bytes=verify.dense_bytes,
                      dense_bandwidth=verify.dense_bandwidth, kv=verify.kv[: kmax + 1] * B,
                      fixed=verify.fixed[n - 1], t0=verify.t0)


def batch_step_times(verify: VerifyTime, B: int, kmax: int, expert_bytes=None, h=None) -> np.ndarray:
    """V(k, B) = tau_p(B, k) + h_B(k) for k = 0..kmax (:func:`batch_verify_time`; ``h``: the draft's and
    host's time per step at batch B, default 0). At B = 1, ``verify.step_times(h)[:kmax+1]``."""
    return batch_verify_time(verify, B, kmax, expert_bytes).step_times(h)


def batch_throughput(V, a, B: int):
    """(per sequence, per batch) throughput at batch B: G_a(k)/V(k, B) and B G_a(k)/V(k, B),
    k = 0..kmax, for the step times ``V`` = V(., B) (paper 1, Sec. 1, each of the B sequences emitting
    G_a(k) tokens per step)."""
    B = check_draft_length(B, name="B", min_k=1)
    T = throughput(V, a)
    return T, T * B


def batch_speedup(V, a, k):
    """G_a(k) V(0, B)/V(k, B): draft length k against plain decoding at the same batch size (paper 1,
    eq. (9) with V(., B)); per sequence and per batch alike, since B cancels."""
    return speedup(V, a, k)


def best_draft_lengths(V_by_B: dict, a) -> dict:
    """k*(a, B) for each batch size: ``V_by_B`` maps B to V(., B); the smallest maximizer of
    T_a(., B) (paper 1, Sec. 1). ``a`` may be an array."""
    return {B: best_draft_length(V, a) for B, V in sorted(V_by_B.items())}


def speculation_pays(V, a) -> bool:
    """True when some k >= 1 beats plain decoding at this batch size: condition (8) for some k
    (paper 1, eq. (8); eq. B.3: a speedup iff k*(a) >= 1)."""
    V = as_array(V, "V")
    check_acceptance(a)
    return any(faster_than_plain(V, a, k) for k in range(1, len(V)))


def stops_paying(V_by_B: dict, a):
    """The batch size beyond which speculation stops paying: the smallest B of ``V_by_B`` from which,
    at every larger B given, no draft length beats plain decoding (condition (8) fails for every
    k >= 1, i.e. k*(a, B) = 0); None when speculation pays at the largest B given."""
    if not V_by_B:
        raise ValueError("V_by_B: give the step times of at least one batch size")
    first = None
    for B in sorted(V_by_B, reverse=True):
        if speculation_pays(V_by_B[B], a):
            break
        first = B
    return first


def batch_error_bounds(slot: VerifyTime, dedup: VerifyTime, eps, ubar=None, r=None) -> dict:
    """Table 2's bounds for the verify passes of one batch size (entries k = 0..kmax, pass sizes
    B(k + 1); :func:`batch_verify_time` of each kernel): ``verify_17`` per kernel, eps/(1-eps) M_p
    (eq. (17)); ``saving_18``, eps/(1-eps)(M^e_slot + M^e_dedup) (eq. (18)); ``margin_19``,
    ln((1+eps)/(1-eps)), and where the byte share ``ubar`` = E_dedup(B, k)/E_slot(B, k) and the
    bandwidth ratio ``r`` at B(k + 1) are given, ``kernels_agree_19`` (eq. (19)); ``delta`` = eps/(1-eps)
    and ``loss_20`` = 2 delta/(1 + delta) (eqs. (20), C.7; bandwidth errors alone). The proofs use the
    form (5) only, which V(k, B) has (module docstring)."""
    if slot.n_max != dedup.n_max:
        raise ValueError(f"batch_error_bounds: kernels cover different draft lengths ({slot.n_max} vs {dedup.n_max})")
    delta = num(eps) / (1 - num(eps))
    out = {"verify_17": {"slot": verify_time_bound(eps, slot.memory_time()),
                         "dedup": verify_time_bound(eps, dedup.memory_time())},
           "saving": saving(slot, dedup),
           "saving_18": saving_bound(eps, slot.expert_time(), dedup.expert_time()),
           "margin_19": faster_kernel_margin(eps), "delta": delta,
           "loss_20": throughput_loss_bound(delta) if delta < 1 else None}
    if ubar is not None and r is not None:
        out["kernels_agree_19"] = kernels_agree(ubar, r, eps)
    return out


__all__ = ["pass_sizes", "batch_slot_bytes", "batch_union_bytes", "batch_byte_saving", "batch_byte_share",
           "exchangeable_union", "union_from_inclusion",
           "cross_reuse", "batch_verify_time", "batch_step_times", "batch_throughput", "batch_speedup",
           "best_draft_lengths", "speculation_pays", "stops_paying", "batch_error_bounds"]
