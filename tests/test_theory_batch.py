"""Theory at batch size B (moespec.theory.batch): B = 1 is the single-sequence theory exactly, hand
cases computed here, and properties (per-slot bytes linear in B(k + 1), union share non-decreasing in B)."""

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th
from tests import theory_cases as cases


def _verify(rng, n_max, exact=True):
    """A random VerifyTime over n = 1..n_max with every term of (5) non-zero."""
    if exact:
        E = [cases.frac(rng, 1, 9) * n for n in range(1, n_max + 1)]
        beta = [cases.frac(rng, 1, 5) for _ in range(n_max)]
        kv = [F(n - 1, 7) for n in range(1, n_max + 1)]
        phi = [cases.frac(rng, 0, 1) for _ in range(n_max)]
        return th.VerifyTime(E, beta, dense_bytes=F(3, 2), dense_bandwidth=F(5, 3), kv=kv, fixed=phi, t0=F(1, 9))
    E = rng.uniform(1, 9, n_max) * np.arange(1, n_max + 1)
    return th.VerifyTime(E, rng.uniform(1, 5, n_max), dense_bytes=1.5, dense_bandwidth=5 / 3,
                         kv=np.arange(n_max) / 7, fixed=rng.uniform(0, 1, n_max), t0=0.1)


@pytest.mark.parametrize("exact", [True, False])
def test_batch_one_is_the_single_sequence_theory_exactly(exact):
    rng = np.random.default_rng(5)
    for _ in range(40):
        kmax = int(rng.integers(1, 8))
        vt = _verify(rng, kmax + 1 + int(rng.integers(0, 4)), exact)
        h = [cases.frac(rng, 0, 1) for _ in range(kmax + 1)] if exact else rng.uniform(0, 1, kmax + 1)
        one = th.batch_verify_time(vt, 1, kmax)
        for name in ("tau", "memory_time", "expert_time", "dense_time"):
            assert list(getattr(one, name)()) == list(getattr(vt, name)()[: kmax + 1]), name
        V1 = th.batch_step_times(vt, 1, kmax, h=h)
        V = vt.step_times(np.concatenate([h, np.zeros(vt.n_max - kmax - 1, dtype=object if exact else float)])
                          if exact else np.concatenate([h, np.zeros(vt.n_max - kmax - 1)]))[: kmax + 1]
        assert list(V1) == list(V)
        a = cases.acceptance(rng) if exact else float(rng.uniform(0, 0.99))
        assert th.best_draft_lengths({1: V1}, a)[1] == th.best_draft_length(V, a)
        assert [th.batch_speedup(V1, a, k) for k in range(kmax + 1)] == [th.speedup(V, a, k) for k in range(kmax + 1)]
        per_seq, per_batch = th.batch_throughput(V1, a, 1)
        assert list(per_seq) == list(th.throughput(V, a)) == list(per_batch)
        assert list(th.batch_slot_bytes(3, F(7, 2), 1, kmax)) == list(th.slot_expert_bytes(3, F(7, 2), kmax + 1))


def test_hand_case_two_sequences():
    """m = 2, W = 3 (one layer), D = 10, kv(k) = k + 1 per sequence, beta_D = 2, every expert bandwidth 1 at
    n <= 4 and 2 beyond, no fixed work, t0 = 0; B = 2, kmax = 2 (pass sizes 2, 4, 6)."""
    n_max = 6
    vt = th.VerifyTime(th.slot_expert_bytes(2, 3, n_max), [1, 1, 1, 1, 2, 2], dense_bytes=10, dense_bandwidth=2,
                       kv=[1, 2, 3, 4, 5, 6])
    slot = th.batch_verify_time(vt, 2, 2)
    # E_slot(2, k) = 2 (k+1) 2 3 = 12, 24, 36; at n = 6 the bandwidth is 2: 36/2 = 18
    assert list(slot.expert_bytes) == [12, 24, 36]
    # dense: (10 + 2 kv(k))/2, kv(0..2) = 1, 2, 3 (entry k of kv): 6, 7, 8
    assert list(slot.dense_time()) == [6, 7, 8]
    assert list(slot.tau()) == [6 + 12, 7 + 24, 8 + 18]
    # deduplicating: the two sequences' windows name U(2, k+1) = 3, 5, 6 distinct experts
    E_dedup = th.batch_union_bytes([[3, 5, 6]], [3])
    assert list(E_dedup) == [9, 15, 18]
    dedup = th.batch_verify_time(vt, 2, 2, expert_bytes=E_dedup)
    assert list(dedup.tau()) == [6 + 9, 7 + 15, 8 + 9]
    assert list(th.saving(slot, dedup)) == [3, 9, 9]
    # bytes saved, eq. (3) over two sequences: B(k+1) m W - W U = 12 - 9, 24 - 15, 36 - 18; share 3/4, 5/8, 1/2
    assert list(th.batch_byte_saving(2, 3, 2, [[3, 5, 6]], [3])) == [3, 9, 18]
    assert list(th.batch_byte_share(2, 3, 2, [[3, 5, 6]], [3])) == [F(3, 4), F(5, 8), F(1, 2)]
    # at a = 1/2: G = 1, 3/2, 7/4; per-slot V = 18, 31, 26 -> T = 1/18, 3/62, 7/104: k* = 2
    a = F(1, 2)
    assert th.best_draft_lengths({2: slot.step_times()}, a) == {2: 2}
    per_seq, per_batch = th.batch_throughput(slot.step_times(), a, 2)
    assert list(per_seq) == [F(1, 18), F(3, 62), F(7, 104)]
    assert list(per_batch) == [F(2, 18), F(6, 62), F(14, 104)]
    assert th.batch_speedup(slot.step_times(), a, 2) == F(7, 4) * 18 / 26


def test_stops_paying_by_hand():
    """V(., B): speculation pays at B = 1 and 2, not from B = 4 on (a = 1/2: one draft pays iff
    V(1) < 3/2 V(0), two iff V(2) < 7/4 V(0))."""
    V = {1: [1, F(6, 5), F(13, 10)], 2: [2, F(29, 10), 4], 4: [4, 6, 7], 8: [8, 12, 14]}
    a = F(1, 2)
    assert th.best_draft_lengths(V, a) == {1: 2, 2: 1, 4: 0, 8: 0}
    assert [th.speculation_pays(V[B], a) for B in (1, 2, 4, 8)] == [True, True, False, False]
    assert th.stops_paying(V, a) == 4
    assert th.stops_paying({1: V[1], 2: V[2]}, a) is None
    # pays again at the largest B: no batch size beyond which it stops
    assert th.stops_paying({**V, 16: [16, 17, 18]}, a) is None


def test_exchangeable_union_by_hand_and_uniform_formula():
    # N = 4, one window of U(j) = 2 experts, B = 2: 4 (1 - (1/2)^2) = 3
    assert th.exchangeable_union(2, 4, 2) == 3
    # MoESD's N(1 - q^B), q = 1 - m/N, at j = 1 (U(1) = m)
    N, m = 64, 8
    for B in range(1, 10):
        assert th.exchangeable_union(m, N, B) == N * (1 - (1 - F(m, N)) ** B)
    assert th.exchangeable_union(5, 9, 1) == 5
    # inclusion form with equal p_e = U/N is the exchangeable form
    p = np.full(16, F(3, 16), dtype=object)
    assert th.union_from_inclusion(p, 3) == th.exchangeable_union(3, 16, 3)
    # unequal popularity never unions more (convexity of (1 - p)^B)
    rng = np.random.default_rng(2)
    for _ in range(200):
        P = rng.uniform(0, 1, 12)
        B = int(rng.integers(1, 9))
        assert th.union_from_inclusion(P, B) <= th.exchangeable_union(P.sum(), 12, B) + 1e-12


def test_cross_reuse_by_hand():
    U = [4, 6, 7]  # U(1), U(2), U(3)
    rho = th.cross_reuse(U)
    assert list(rho) == [0, F(1, 2), F(3, 4)]
    assert U[-1] == U[0] * sum(1 - r for r in rho)


def test_properties():
    rng = np.random.default_rng(11)
    for _ in range(100):
        m, W, kmax = int(rng.integers(1, 9)), cases.frac(rng, 1, 5), int(rng.integers(0, 8))
        for B in (1, 2, 3, 8):
            E = th.batch_slot_bytes(m, W, B, kmax)
            n = th.pass_sizes(B, kmax)
            assert list(E) == [x * m * W for x in n]                 # linear in B(k + 1)
        # union share U(B, j)/N non-decreasing in B, and at most min(B U(j), N)
        N = int(rng.integers(2, 129))
        U1 = cases.frac(rng, 0, 1) * N
        shares = [th.exchangeable_union(U1, N, B) / N for B in range(1, 17)]
        assert all(x <= y for x, y in zip(shares, shares[1:]))
        assert all(th.exchangeable_union(U1, N, B) <= min(B * U1, N) for B in range(1, 17))
    # a per-slot step of B sequences costs the per-slot bytes of one pass of B(k+1) tokens
    vt = _verify(np.random.default_rng(0), 24)
    b = th.batch_verify_time(vt, 3, 7)
    assert list(b.expert_bytes) == list(vt.expert_bytes[[3 * (k + 1) - 1 for k in range(8)]])
    assert list(b.kv) == [3 * x for x in vt.kv[:8]]


def test_bounds_at_each_batch_size():
    n_max = 18
    vt_s = th.VerifyTime(th.slot_expert_bytes(2, 3, n_max), np.linspace(2, 1, n_max), dense_bytes=4.0,
                         dense_bandwidth=2.0)
    for B in (1, 2, 3):
        slot = th.batch_verify_time(vt_s, B, 5)
        E_d = slot.expert_bytes * 0.6
        dedup = th.batch_verify_time(vt_s, B, 5, expert_bytes=E_d)
        out = th.batch_error_bounds(slot, dedup, 0.1, ubar=np.full(6, 0.6), r=np.full(6, 0.5))
        assert np.allclose(out["verify_17"]["slot"], slot.memory_time() / 9)
        assert np.allclose(out["saving_18"], (slot.expert_time() + dedup.expert_time()) / 9)
        assert not out["kernels_agree_19"].any()      # |ln 0.5 - ln 0.6| = 0.18 < ln(11/9) = 0.20
        assert out["delta"] == pytest.approx(1 / 9) and out["loss_20"] == pytest.approx(0.2)
        # perturbing every bandwidth within +-eps keeps each tau inside (17)
        for e in (-0.1, 0.1):
            hat = slot.with_bandwidth_errors(e, e)
            assert np.all(np.abs(hat.tau() - slot.tau()) <= out["verify_17"]["slot"] + 1e-12)


def test_refusals():
    vt = th.VerifyTime([1, 2, 3], [1, 1, 1])
    with pytest.raises(ValueError, match="pass sizes up to n = 4"):
        th.batch_verify_time(vt, 2, 1)
    with pytest.raises(ValueError, match="B: draft length must be an integer"):
        th.pass_sizes(0, 3)
    with pytest.raises(ValueError, match=r"expert_bytes: expected E_p\(B, k\) for k = 0..1"):
        th.batch_verify_time(th.VerifyTime([1, 2, 3, 4], [1, 1, 1, 1]), 2, 1, expert_bytes=[1, 2, 3])
    with pytest.raises(ValueError, match="union"):
        th.batch_union_bytes([[-1, 2]])
    with pytest.raises(ValueError, match="U_window"):
        th.exchangeable_union(5, 4, 2)
    with pytest.raises(ValueError, match="V_by_B"):
        th.stops_paying({}, 0.5)
