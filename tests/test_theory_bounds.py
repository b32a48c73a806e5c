"""Error bounds of Table 2 (paper 1, Sec. 3.5; Appendix C) against brute-force perturbations of
every bandwidth within +-eps, and of every step time within +-delta."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th

N = 1500
SLACK = 1 + 1e-12          # float rounding only


def kernel_pair(rng, n_max, ratio=None):
    """Per-slot and deduplicating verify times (5) sharing t0, dense reads and fixed work
    (f_l = 1, equal fixed work), with random bandwidths; ``ratio`` forces ubar/r at every n >= 2."""
    m, W = int(rng.integers(1, 9)), rng.uniform(0.5, 3)
    n = np.arange(1, n_max + 1)
    E_slot = n * m * W
    ubar = np.concatenate([[1.0], rng.uniform(1 / n[1:], 1.0)])
    b_slot = rng.uniform(0.5, 5, n_max)
    r = np.concatenate([[1.0], rng.uniform(0.2, 1.2, n_max - 1)]) if ratio is None \
        else np.concatenate([[1.0], ubar[1:] / ratio[: n_max - 1]])
    common = dict(dense_bytes=rng.uniform(0, 10), dense_bandwidth=rng.uniform(0.5, 5),
                  kv=np.sort(rng.uniform(0, 2, n_max)), fixed=rng.uniform(0, 1, n_max),
                  t0=rng.uniform(0, 1))
    return (th.VerifyTime(E_slot, b_slot, **common),
            th.VerifyTime(E_slot * ubar, b_slot * r, **common), ubar, r)


def errors(rng, eps, size):
    """Relative bandwidth errors in [-eps, eps]: uniform, or at the corners."""
    if rng.random() < 0.5:
        return rng.uniform(-eps, eps, size)
    return rng.choice([-eps, eps], size)


def test_verify_time_17():
    rng = np.random.default_rng(30)
    for _ in range(N):
        eps, n_max = rng.uniform(0, 0.6), int(rng.integers(2, 10))
        slot, dedup, _, _ = kernel_pair(rng, n_max)
        for vt in (slot, dedup):
            hat = vt.with_bandwidth_errors(errors(rng, eps, n_max), errors(rng, eps, 1)[0])
            bound = th.verify_time_bound(eps, vt.memory_time())
            assert np.all(np.abs(hat.tau() - vt.tau()) <= bound * SLACK)
            assert np.all(bound <= th.verify_time_bound(eps, vt.tau()) * SLACK)
            # tight: every bandwidth low by eps moves each memory term by exactly eps/(1-eps)
            worst = vt.with_bandwidth_errors(-eps, -eps)
            np.testing.assert_allclose(worst.tau() - vt.tau(), bound, rtol=1e-9)


def test_saving_18():
    rng = np.random.default_rng(31)
    for _ in range(N):
        eps, n_max = rng.uniform(0, 0.6), int(rng.integers(2, 10))
        slot, dedup, _, _ = kernel_pair(rng, n_max)
        e_dense = errors(rng, eps, 1)[0]          # one estimate of beta_D, shared (Appendix C)
        S_hat = th.saving(slot.with_bandwidth_errors(errors(rng, eps, n_max), e_dense),
                          dedup.with_bandwidth_errors(errors(rng, eps, n_max), e_dense))
        bound = th.saving_bound(eps, slot.expert_time(), dedup.expert_time())
        assert np.all(np.abs(S_hat - th.saving(slot, dedup)) <= bound * SLACK)
        # (6): with f_l = 1 and equal fixed work the saving is M^e_slot (1 - ubar/r)


def test_saving_6_and_7():
    rng = np.random.default_rng(32)
    for _ in range(N):
        slot, dedup, ubar, r = kernel_pair(rng, int(rng.integers(2, 10)))
        S = th.saving(slot, dedup)
        np.testing.assert_allclose(S, th.saving_from_ratio(slot.expert_time(), ubar, r),
                                   rtol=1e-9, atol=1e-12)
        faster = th.dedup_faster(ubar, r)
        assert np.array_equal(faster[1:], S[1:] > 0)


def test_faster_kernel_19():
    rng = np.random.default_rng(33)
    agreed = flipped = 0
    for _ in range(N):
        eps, n_max = rng.uniform(0.01, 0.4), int(rng.integers(2, 10))
        margin = th.faster_kernel_margin(eps)
        # ubar/r = exp(+-margin (1 +- 0.05)): just inside or just outside the margin
        ratio = np.exp(rng.choice([-1, 1], n_max) * margin * rng.uniform(0.95, 1.05, n_max))
        slot, dedup, ubar, r = kernel_pair(rng, n_max, ratio)
        S = th.saving(slot, dedup)[1:]
        agree = th.kernels_agree(ubar, r, eps)[1:]
        for _ in range(4):
            e_dense = errors(rng, eps, 1)[0]
            S_hat = th.saving(slot.with_bandwidth_errors(errors(rng, eps, n_max), e_dense),
                              dedup.with_bandwidth_errors(errors(rng, eps, n_max), e_dense))[1:]
            assert np.all(np.sign(S_hat[agree]) == np.sign(S[agree]))
        agreed += int(agree.sum())
        # tight: outside the margin the worst corner reverses (or ties) the predicted sign
        worst_s = np.where(S > 0, eps, -eps)       # slot faster than it is when dedup wins
        worst = th.saving(slot.with_bandwidth_errors(np.concatenate([[0], worst_s])),
                          dedup.with_bandwidth_errors(np.concatenate([[0], -worst_s])))[1:]
        assert np.all(np.sign(worst[~agree]) != np.sign(S[~agree]))
        flipped += int((~agree).sum())
    assert agreed > 1000 and flipped > 1000


def step_pair(rng, eps):
    """True step times V(k) = tau_dedup(k+1) + h(k) and their estimate from bandwidths off by <= eps."""
    n_max = int(rng.integers(2, 10))
    _, dedup, _, _ = kernel_pair(rng, n_max)
    h = rng.uniform(0, 0.5, n_max) * (rng.random() < 0.5)
    hat = dedup.with_bandwidth_errors(errors(rng, eps, n_max), errors(rng, eps, 1)[0])
    return dedup.step_times(h), hat.step_times(h)


def check_20_21(V, V_hat, delta, a):
    T, T_hat = th.throughput(V, a), th.throughput(V_hat, a)
    k, k_hat = int(np.argmax(T)), int(np.argmax(T_hat))
    assert 1 - T[k_hat] / T[k] <= th.throughput_loss_bound(delta) * SLACK           # (20)
    if th.separation_holds(V, a, delta):
        assert k_hat == k                                                          # (20)
    lo, hi = th.speedup_interval(delta)
    ratio = (T_hat[k_hat] / T_hat[0]) / (T[k] / T[0])
    assert lo / SLACK <= ratio <= hi * SLACK                                       # (21)
    return k_hat == k


def test_draft_length_and_speedup_from_bandwidth_errors_20_21_C7():
    rng = np.random.default_rng(34)
    for _ in range(N):
        eps = rng.uniform(0, 0.45)
        V, V_hat = step_pair(rng, eps)
        delta = th.delta_from_eps(eps)                                             # (C.7)
        assert th.relative_step_error(V_hat, V) <= delta * SLACK
        for a in rng.random(5):
            check_20_21(V, V_hat, delta, a)


def test_draft_length_and_speedup_from_step_errors_20_21():
    rng = np.random.default_rng(35)
    separated = 0
    for _ in range(N):
        kmax, delta = int(rng.integers(1, 9)), rng.uniform(0, 0.5)
        V = np.cumsum(rng.uniform(0.05, 1, kmax + 1))
        for a in rng.random(4):
            u = rng.choice([-delta, delta], kmax + 1) if rng.random() < 0.5 \
                else rng.uniform(-delta, delta, kmax + 1)
            check_20_21(V, V * (1 + u), delta, a)
            separated += th.separation_holds(V, a, delta)
    assert separated > 100


def test_throughput_loss_bound_is_tight():
    """V = (1, x) with T(1) just above (1-delta)/(1+delta) T(0): the worst estimate picks k = 1 and
    loses almost exactly 2 delta/(1+delta)."""
    for delta in (0.05, 0.2, 0.4):
        a, eta = 0.5, 1e-9
        x = (1 + a) * (1 + delta) / ((1 - delta) * (1 + eta))
        V, V_hat = np.array([1.0, x]), np.array([1 + delta, x * (1 - delta)])
        T, T_hat = th.throughput(V, a), th.throughput(V_hat, a)
        assert np.argmax(T) == 0 and np.argmax(T_hat) == 1
        assert 1 - T[1] / T[0] == pytest.approx(th.throughput_loss_bound(delta), abs=1e-8)


def test_C7_exact():
    rng = np.random.default_rng(36)
    assert th.speedup_factor_from_eps(F(1, 10)) == F(5, 4)
    for _ in range(N):
        eps = F(int(rng.integers(0, 500)), 1000)
        d = th.delta_from_eps(eps)
        lo, hi = th.speedup_interval(d)
        assert hi == th.speedup_factor_from_eps(eps) == 1 / (1 - 2 * eps) and lo == 1 / hi
        assert th.throughput_loss_bound(d) == 2 * d / (1 + d)


@pytest.mark.parametrize("call", [lambda: th.verify_time_bound(1.0, 1.0),
                                  lambda: th.saving_bound(-0.1, 1.0, 1.0),
                                  lambda: th.delta_from_eps(0.5),
                                  lambda: th.speedup_interval(1.0),
                                  lambda: th.kernels_agree(0.5, 0.6, 1.2)])
def test_bad_error_bounds(call):
    with pytest.raises(ValueError, match=r"must lie in \[0"):
        call()


def test_log_gap_is_what_bound_19_compares():
    ubar, r = np.array([0.5, 0.9, 1.0]), np.array([1.0, 0.9, 0.5])
    np.testing.assert_allclose(th.log_gap(ubar, r), [np.log(2), 0.0, -np.log(2)])
    np.testing.assert_array_equal(th.kernels_agree(ubar, r, 0.1), np.abs(th.log_gap(ubar, r)) > th.faster_kernel_margin(0.1))
    with pytest.raises(ValueError):
        th.log_gap([0.0], [1.0])
