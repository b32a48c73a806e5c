"""Speculation under geometric acceptance (paper 1, Secs. 1, 3.2; Appendix B.1)."""

from __future__ import annotations

from fractions import Fraction as F

import numpy as np
import pytest

from moespec import theory as th
from theory_cases import acceptance, step_times

N = 2000


def test_expected_tokens_exact_and_vectorized():
    rng = np.random.default_rng(1)
    for _ in range(N):
        a, k = acceptance(rng), int(rng.integers(0, 12))
        assert th.expected_tokens(a, k) == sum(a ** j for j in range(k + 1))
    a = rng.random(1000)
    k = rng.integers(0, 20, 1000)
    np.testing.assert_allclose(th.expected_tokens(a, k), (1 - a ** (k + 1)) / (1 - a), rtol=1e-12)
    assert th.expected_tokens(F(1, 2), 3) == F(15, 8)


def test_jump_example():
    """V = (1, 2, 2): k*(1/2) = 0, k*(9/10) = 2 and never 1 (Appendix B.3, 'Jumps')."""
    V = [1, 2, 2]
    assert th.best_draft_length(V, F(1, 2)) == 0
    assert th.best_draft_length(V, F(9, 10)) == 2
    grid = [F(t, 1000) for t in range(1000)]
    assert 1 not in set(th.best_draft_length(V, np.array(grid, dtype=object)).tolist())


def test_best_draft_length_is_smallest_maximizer_exactly():
    rng = np.random.default_rng(2)
    for _ in range(N):
        V, a = step_times(rng), acceptance(rng, den=20)
        T = [sum(a ** j for j in range(k + 1)) / V[k] for k in range(len(V))]
        assert th.best_draft_length(V, a) == T.index(max(T))


def test_best_draft_length_vectorized_matches_scalar():
    rng = np.random.default_rng(3)
    for _ in range(50):
        V = [float(v) for v in step_times(rng, kmax=16)]
        a = rng.random(200)
        expected = [th.best_draft_length(V, float(x)) for x in a]
        assert th.best_draft_length(V, a).tolist() == expected


def test_speedup_condition_and_first_threshold():
    """(8) <=> T_a(k) > T_a(0) (B.2); k = 1: a > a0 (B.4); k* >= 1 iff some k is faster (B.3)."""
    rng = np.random.default_rng(4)
    for _ in range(N):
        V, a = step_times(rng), acceptance(rng)
        T = th.throughput(V, a)
        for k in range(1, len(V)):
            assert th.faster_than_plain(V, a, k) == (T[k] > T[0])
            assert th.speedup(V, a, k) == T[k] / T[0]
        a0 = th.first_threshold(V)
        assert (T[1] > T[0]) == (a > a0) and (T[1] == T[0]) == (a == a0)
        assert (th.best_draft_length(V, a) >= 1) == any(T[k] > T[0] for k in range(1, len(V)))


def test_speedup_vectorized():
    V = [1.0, 1.3, 1.7]
    a = np.array([0.1, 0.5, 0.9])
    np.testing.assert_allclose(th.speedup(V, a, 2), (1 + a + a * a) / 1.7)


@pytest.mark.parametrize("a", [-0.1, 1.0, 1.5, float("nan"), F(1, 1)])
def test_bad_acceptance(a):
    with pytest.raises(ValueError, match="acceptance"):
        th.best_draft_length([1, 2], a)
    with pytest.raises(ValueError, match="acceptance"):
        th.expected_tokens(a, 2)


@pytest.mark.parametrize("V, match", [([1, 0, 2], "positive"), ([1, -1], "positive"),
                                      ([[1, 2], [3, 4]], "1-D"), ([], "at least"),
                                      ([1, float("inf")], "finite")])
def test_bad_step_times(V, match):
    with pytest.raises(ValueError, match=match):
        th.throughput(V, 0.5)


def test_bad_draft_length():
    with pytest.raises(ValueError, match="draft length"):
        th.speedup([1, 2], 0.5, 2)
    with pytest.raises(TypeError, match="integer"):
        th.speedup([1, 2], 0.5, 1.0)
    with pytest.raises(ValueError, match="draft length"):
        th.faster_than_plain([1, 2], 0.5, 0)
