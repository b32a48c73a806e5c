"""Staircase and step points (paper 1, Sec. 3.3; Appendix B.3, eqs. B.26-B.36)."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th
from theory_cases import acceptance, convex_step_times, step_times

GRID = np.arange(512) / 512                                       # brute-force scan of [0, 1)
EPS = 1e-9                                                        # >> bisection tolerance 1e-13


def test_ratio_monotone_B26():
    """G_x(k)/G_x(i) <= G_y(k)/G_y(i) for i < k, x <= y (eq. B.26), exactly."""
    rng = np.random.default_rng(10)
    for _ in range(2000):
        x, y = sorted((acceptance(rng), acceptance(rng)))
        i, k = sorted(rng.choice(9, 2, replace=False).tolist())
        G = th.expected_tokens
        assert G(x, k) * G(y, i) <= G(y, k) * G(x, i)


def test_staircase_monotone_B28():
    """a <= a' => k*(a) <= k*(a'): exactly on random pairs, and along a 512-point scan."""
    rng = np.random.default_rng(11)
    for _ in range(2000):
        V = step_times(rng)
        a, b = sorted((acceptance(rng), acceptance(rng)))
        assert th.best_draft_length(V, a) <= th.best_draft_length(V, b), (V, a, b)
        assert np.all(np.diff(th.best_draft_length([float(v) for v in V], GRID)) >= 0), V


def test_step_points_exact_against_scan_B31():
    """k*(a) >= j iff a > a_j (B.29-B.31): on a 512-point scan (points within 1e-9 of any
    alpha_{k,i} left out, where float ties could flip) and, exactly, just either side of a_j."""
    rng = np.random.default_rng(12)
    jumps = 0
    for _ in range(2000):
        V = step_times(rng)
        a = th.step_points(V)
        assert np.all(np.diff(a) >= 0) and np.all((a >= 0) & (a <= 1))
        alpha = th.pair_thresholds(V)
        alpha = alpha[np.isfinite(alpha)]
        far = np.min(np.abs(GRID[:, None] - alpha[None, :]), axis=1) > EPS
        k = th.best_draft_length([float(v) for v in V], GRID[far])
        for j in range(1, len(V)):
            assert np.array_equal(k >= j, GRID[far] > a[j - 1]), (V, j, a)
            if 0 < a[j - 1] < 1:      # exactly, with Fractions, either side of a_j
                hi, lo = F(a[j - 1] + EPS), F(a[j - 1] - EPS)
                assert th.best_draft_length(V, hi) >= j and th.best_draft_length(V, lo) < j
        jumps += bool(th.staircase(V).jumps)
    assert jumps > 20   # the random family does exercise jumps of more than one


def test_pair_thresholds_are_infima():
    """alpha_{k,i} = inf{a : T_a(k) > T_a(i)} (1 if empty), checked exactly either side."""
    rng = np.random.default_rng(13)
    for _ in range(300):
        V = step_times(rng)
        al = th.pair_thresholds(V)
        for k in range(1, len(V)):
            for i in range(k):
                x = al[k, i]
                T = lambda a: th.throughput(V, a)  # noqa: E731
                if x < 1 - EPS:
                    t = T(F(x + EPS))
                    assert t[k] > t[i]
                if x > EPS:
                    t = T(F(x - EPS))
                    assert not t[k] > t[i]


def test_staircase_object_matches_best_draft_length():
    rng = np.random.default_rng(14)
    for _ in range(1000):
        V = step_times(rng)
        st = th.staircase(V)
        a = rng.random(16)
        a = a[[min(abs(x - b) for b in st.breakpoints + (2.0,)) > EPS for x in a]]
        exact = np.array([th.best_draft_length(V, F(x)) for x in a])
        assert st(a).tolist() == exact.tolist()
        assert st(0.0) == th.best_draft_length(V, 0)
        assert list(st.values) == sorted(st.values)


def test_jump_example_staircase():
    st = th.staircase([1, 2, 2])
    assert st.values == (0, 2) and len(st.jumps) == 1
    assert st.breakpoints[0] == pytest.approx((5 ** 0.5 - 1) / 2, abs=1e-12)  # a^2 + a = 1
    assert st(0.5) == 0 and st(0.9) == 2


def test_convex_criterion_B35():
    """Under c_(i+1) >= a c_i: k*(a) >= j iff a^j V(j-1) > G_a(j-1) c_j (eq. (10), B.35)."""
    rng = np.random.default_rng(15)
    n = 0
    while n < 1500:
        V, a = step_times(rng), acceptance(rng, den=50)
        try:
            th.convex_hypothesis(V, a)
        except ValueError:
            continue
        n += 1
        k = th.best_draft_length(V, a)
        for j in range(1, len(V)):
            assert th.reaches_convex(V, a, j) == (k >= j), (V, a, j)


def test_convex_step_points_B36():
    rng = np.random.default_rng(16)
    for _ in range(1000):
        V = convex_step_times(rng)
        c = th.convex_step_points(V)
        np.testing.assert_allclose(c, th.step_points(V), atol=1e-12)
        assert c[0] == min(float(V[1] / V[0] - 1), 1.0)


def test_convex_shortcut_refuses_outside_hypothesis():
    with pytest.raises(ValueError, match="convex"):
        th.convex_step_points([1, 2, 2.5, 2.7])            # c = 1, 0.5, 0.2: concave
    with pytest.raises(ValueError, match=r"c_\(i\+1\) >= a c_i"):
        th.reaches_convex([1, 2, 2.1], 0.5, 1)            # c2 = 0.1 < 0.5 * 1
    assert th.reaches_convex([1, 2, 2.1], 0.05, 1) is False  # holds at a = 0.05
