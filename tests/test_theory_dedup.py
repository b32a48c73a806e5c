"""Deduplicating engines (paper 1, Sec. 3.4; Appendix B.2): union bytes, the reuse threshold in
time form (14) and byte form (16), the speedup (15), monotonicity, more reuse, no single threshold."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th
from theory_cases import acceptance, frac

N = 2000


def reuse_table(rng, L, n_max):
    """rho_l(n) as exact Fractions in [0, 1], column 0 = rho_l(1) = 0."""
    R = np.empty((L, n_max), dtype=object)
    for l in range(L):
        R[l, 0] = F(0)
        for n in range(1, n_max):
            R[l, n] = F(int(rng.integers(0, 41)), 40)
    return R


def periodic_reuse(pattern, n_max):
    """rho(n), n = 1..n_max, of one expert per token (m = 1) repeating ``pattern`` from a
    uniformly random phase (stationary): the share of phases at which the n-th token's expert
    already appeared among the n - 1 before it (eq. 1)."""
    P = len(pattern)
    s = lambda t: pattern[t % P]  # noqa: E731
    return [F(0)] + [F(sum(s(t + n - 1) in {s(t + u) for u in range(n - 1)} for t in range(P)), P)
                     for n in range(2, n_max + 1)]


def time_instance(rng, k):
    """A random deduplicating verify time (5), f_l = 1, n = 1..k+1, and its m, W, rho_bar_k."""
    m, W = int(rng.integers(1, 9)), frac(rng, 1, 5)
    rb = F(int(rng.integers(0, 101)), 100)
    E = [m * W] + [th.dedup_bytes(m, W, j, rb) for j in range(1, k + 1)]
    vt = th.VerifyTime(E, [frac(rng, 1, 6) for _ in range(k + 1)],
                       dense_bytes=frac(rng, 0, 5), dense_bandwidth=frac(rng, 1, 6),
                       kv=sorted(frac(rng, 0, 2) for _ in range(k + 1)),
                       fixed=[frac(rng, 0, 1) for _ in range(k + 1)], t0=frac(rng, 0, 1))
    return vt, m, W, rb


def test_union_bytes_B7_equals_12():
    rng = np.random.default_rng(20)
    for _ in range(N // 2):
        L, n_max = int(rng.integers(1, 4)), int(rng.integers(2, 8))
        R, w, m = reuse_table(rng, L, n_max), [frac(rng, 1, 4) for _ in range(L)], int(rng.integers(1, 9))
        E, rb, W = th.union_bytes(m, R, w), th.rho_bar(R, w), sum(w)
        assert E[0] == m * W
        for k in range(1, n_max):
            assert E[k] == th.dedup_bytes(m, W, k, rb[k - 1])          # (12) = (B.7) at n = k+1
            assert E[k] >= m * W > 0                                   # (B.9)


def test_threshold_identity_B13_and_equivalence_B14():
    rng = np.random.default_rng(21)
    seen = set()
    for _ in range(N):
        k = int(rng.integers(1, 6))
        vt, m, W, rb = time_instance(rng, k)
        a = acceptance(rng)
        V = vt.step_times()
        star = th.reuse_threshold_from(vt, a, k, m, W)
        G = th.expected_tokens(a, k)
        B = vt.bandwidth[k]
        assert V[k] - V[0] - (G - 1) * V[0] == m * W * k / B * (star - rb)        # (B.13)
        T = th.throughput(V, a)
        assert (T[k] > T[0]) == (rb > star)                                    # (B.14)
        assert th.speedup(V, a, k) == th.dedup_speedup(                        # (15)
            a, k, m, W, rb, vt.tau()[0], vt.bandwidth[0], B, delta_D=vt.kv[k] - vt.kv[0],
            beta_D=vt.dense_bandwidth, delta_phi=vt.fixed[k] - vt.fixed[0])
        seen.add(bool(rb > star))
    assert seen == {True, False}


def test_byte_form_B16_is_one_bandwidth_time_form():
    rng = np.random.default_rng(22)
    for _ in range(N):
        k, a = int(rng.integers(1, 7)), acceptance(rng)
        m, W, D, beta = int(rng.integers(1, 9)), frac(rng, 1, 5), frac(rng, 0, 10), frac(rng, 1, 9)
        kv = sorted(frac(rng, 0, 3) for _ in range(k + 1))
        tau1 = (D + kv[0] + m * W) / beta
        time_form = th.reuse_threshold(a, k, m, W, tau1, beta, beta, delta_D=kv[k] - kv[0], beta_D=beta)
        assert time_form == th.byte_threshold(a, k, m, W, D=D, kv=kv)


def test_threshold_falls_in_a_and_D_B19():
    rng = np.random.default_rng(23)
    for _ in range(N):
        k = int(rng.integers(1, 6))
        vt, m, W, _ = time_instance(rng, k)
        a, b = sorted((acceptance(rng), acceptance(rng)))
        ra, rb_ = th.reuse_threshold_from(vt, a, k, m, W), th.reuse_threshold_from(vt, b, k, m, W)
        Bk, tau1 = vt.bandwidth[k], vt.tau()[0]
        Ga, Gb = th.expected_tokens(a, k), th.expected_tokens(b, k)
        assert ra - rb_ == Bk * tau1 / (m * W * k) * (Gb - Ga)              # (B.19), first
        assert (ra > rb_) == (a < b)
        dD = frac(rng, 0, 5)
        vt2 = th.VerifyTime(vt.expert_bytes, vt.bandwidth, dense_bytes=vt.dense_bytes + dD,
                            dense_bandwidth=vt.dense_bandwidth, kv=vt.kv, fixed=vt.fixed, t0=vt.t0)
        r2 = th.reuse_threshold_from(vt2, a, k, m, W)
        assert ra - r2 == Bk * (Ga - 1) / (m * W * k) * dD / vt.dense_bandwidth   # (B.19), second
        assert (r2 < ra) == (a > 0 and dD > 0)
        # byte form: falls in D for a > 0
        assert (th.byte_threshold(a, k, m, W, D=dD) < th.byte_threshold(a, k, m, W)) == (a > 0 and dD > 0)


def test_more_reuse_never_hurts_B20_B21():
    rng = np.random.default_rng(24)
    helped = 0
    for _ in range(N // 2):
        L, kmax = int(rng.integers(1, 3)), int(rng.integers(1, 5))
        R = reuse_table(rng, L, kmax + 1)
        R2 = R.copy()
        for l in range(L):
            for n in range(1, kmax + 1):
                R2[l, n] = R[l, n] + (1 - R[l, n]) * F(int(rng.integers(0, 5)), 4)
        w, m = [frac(rng, 1, 4) for _ in range(L)], int(rng.integers(1, 5))
        beta = [frac(rng, 1, 6) for _ in range(kmax + 1)]
        common = dict(dense_bytes=frac(rng, 0, 5), dense_bandwidth=frac(rng, 1, 6),
                      fixed=[frac(rng, 0, 1) for _ in range(kmax + 1)])
        V = th.VerifyTime(th.union_bytes(m, R, w), beta, **common).step_times()
        V2 = th.VerifyTime(th.union_bytes(m, R2, w), beta, **common).step_times()
        rb, rb2 = th.rho_bar(R, w), th.rho_bar(R2, w)
        assert V2[0] == V[0] and all(x <= y for x, y in zip(rb, rb2))            # (B.20)
        assert all(x <= y for x, y in zip(V2, V))                                # (B.15)
        a = acceptance(rng)
        if th.best_draft_length(V, a) >= 1:                                      # (B.21)
            assert th.best_draft_length(V2, a) >= 1
            helped += 1
        for k in range(1, kmax + 1):
            assert th.speedup(V2, a, k) >= th.speedup(V, a, k)
    assert helped > 50


def test_no_single_threshold_table():
    """Appendix B.2: N = 3, L = 1, m = 1, w = 1, D = 0, kv = 0, kmax = 2, a = 13/20."""
    a = F(13, 20)
    thresholds = [th.byte_threshold(a, k, 1, 1) for k in (1, 2)]
    assert thresholds == [F(7, 20), F(371, 800)]
    table = {"01": ([0, F(1, 2)], [2]), "00012": ([F(2, 5), F(2, 5)], [1]),
             "00102": ([F(1, 5), F(2, 5)], [])}
    for pattern, (rho_bars, faster) in table.items():
        rho = periodic_reuse([int(c) for c in pattern], 3)
        rb = th.rho_bar(np.array([rho], dtype=object))
        assert list(rb) == rho_bars, pattern
        assert th.faster_draft_lengths(rb, thresholds) == faster, pattern
        V = th.byte_step_times(1, 1, rb)                   # the byte cost, one bandwidth
        assert th.best_draft_length(V, a) >= 1 if faster else th.best_draft_length(V, a) == 0
        assert V.tolist() == th.union_bytes(1, np.array([rho], dtype=object)).tolist()
    # no rule "rho_bar_k > c" decides: 01 speeds up with a lower rho_bar_1 than 00102, which does
    # not; 00012 speeds up with the same rho_bar_2 as 00102.
    assert table["01"][0][0] < table["00102"][0][0] and table["00012"][0][1] == table["00102"][0][1]


def test_jump_example_from_alternating_routing():
    rho = periodic_reuse([0, 1], 3)
    V = th.union_bytes(1, np.array([rho], dtype=object))
    assert V.tolist() == [1, 2, 2]
    assert th.best_draft_length(V, F(1, 2)) == 0 and th.best_draft_length(V, F(9, 10)) == 2


def test_bad_inputs():
    with pytest.raises(ValueError, match="rho_l\\(1\\)"):
        th.rho_bar([[F(1, 2), 0]])
    with pytest.raises(ValueError, match="one expert size per layer"):
        th.rho_bar([[0, F(1, 2)]], w=[1, 2])
    with pytest.raises(ValueError, match="\\[0, 1\\]"):
        th.union_bytes(1, [[0, F(3, 2)]])
    with pytest.raises(ValueError, match="draft length"):
        th.byte_threshold(0.5, 0, 1, 1)
    with pytest.raises(ValueError, match="beta_D"):
        th.reuse_threshold(0.5, 1, 1, 1, tau1=1, beta1=1, B_k=1, delta_D=1)
    with pytest.raises(ValueError, match="acceptance"):
        th.byte_threshold(1.0, 1, 1, 1)
    with pytest.raises(ValueError, match="positive"):
        th.reuse_threshold(0.5, 1, 0, 1, tau1=1, beta1=1, B_k=1)
    with pytest.raises(ValueError, match="pass size"):
        th.VerifyTime([1, 2], [1])
    with pytest.raises(ValueError, match="dense_bandwidth"):
        th.VerifyTime([1, 2], [1, 1], dense_bytes=3)


def test_periodic_reuse_exact_and_against_the_trace_statistics():
    """App. B.2's patterns exactly, and the same rho(n) as moespec.routing.stats.reuse on a long
    trace of the periodic routing (an independent computation, windows over one document)."""
    from fractions import Fraction as Fr

    from moespec.routing import RoutingTrace, reuse

    assert th.periodic_reuse("01", 3) == [0, 0, 1]
    assert th.periodic_reuse("00012", 3) == [0, Fr(2, 5), Fr(2, 5)]
    assert th.periodic_reuse("00102", 4) == [0, Fr(1, 5), Fr(3, 5), Fr(3, 5)]
    for pattern in ("01", "00012", "00102", "0123012"):
        ids = np.array([int(pattern[t % len(pattern)]) for t in range(len(pattern) * 400)])
        trace = RoutingTrace([ids.reshape(-1, 1, 1)], num_experts=4)
        np.testing.assert_allclose(reuse(trace, 5)[0], [float(x) for x in th.periodic_reuse(pattern, 5)], atol=0.01)
    with pytest.raises(ValueError, match="empty"):
        th.periodic_reuse("", 3)
