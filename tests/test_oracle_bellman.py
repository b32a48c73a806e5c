"""Bellman oracle (paper 2, eq. 8), transitions P(a | k) (eq. 7) and policy evaluation."""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest

from moespec.oracle import acceptance_probs, bellman, evaluate_policy, fixed_policy, next_states, q_values


def reference_dp(q, cost):
    """Plain recursion with memo, P(a | k) computed term by term from eq. (7) (independent code)."""
    n, lmax = cost.shape[0], cost.shape[1]

    def pj(i, j):
        return q[i + j] if i + j < n else 0.0

    def prob(i, k, a):
        pr = 1.0
        for j in range(a):
            pr *= pj(i, j)
        return pr if a == k else pr * (1.0 - pj(i, a))

    @functools.lru_cache(maxsize=None)
    def dp(i):
        if i >= n:
            return 0.0, 0
        best, arg = math.inf, 0
        for k in range(1, lmax + 1):
            v = sum(prob(i, k, a) * (cost[i, k - 1, a] + dp(min(i + a + 1, n))[0]) for a in range(k + 1))
            if v < best - 1e-12:
                best, arg = v, k
        return best, arg

    return np.array([dp(i)[0] for i in range(n + 1)]), np.array([dp(i)[1] for i in range(n)])


@pytest.mark.parametrize("seed", range(25))
def test_bellman_matches_plain_recursion(seed):
    rng = np.random.default_rng(seed)
    n, lmax = int(rng.integers(1, 9)), int(rng.integers(1, 5))
    q = rng.uniform(0, 1, n)
    q[rng.random(n) < 0.2] = 1.0          # certain and impossible matches too
    q[rng.random(n) < 0.2] = 0.0
    cost = rng.uniform(0.1, 3.0, (n, lmax, lmax + 1))
    dp, pol = bellman(q, cost)
    ref_dp, ref_pol = reference_dp(q, cost)
    np.testing.assert_allclose(dp, ref_dp, rtol=1e-12, atol=1e-12)
    # ties may pick different k; the chosen k must attain the optimum
    Q = q_values(q, cost, dp)
    np.testing.assert_allclose(Q[np.arange(n), pol - 1], dp[:n], rtol=1e-12)
    np.testing.assert_allclose(Q[np.arange(n), ref_pol - 1], dp[:n], rtol=1e-12)
    assert evaluate_policy(q, cost, pol).cost == pytest.approx(dp[0], rel=1e-12)


def test_acceptance_probs_hand_case_and_normalisation():
    P = acceptance_probs(np.array([0.5, 0.8, 0.3]), 2)
    # state 0: p0 = 0.5, p1 = 0.8
    np.testing.assert_allclose(P[0, 0], [0.5, 0.5, 0.0])            # k = 1
    np.testing.assert_allclose(P[0, 1], [0.5, 0.5 * 0.2, 0.5 * 0.8])  # k = 2
    # state 2: p0 = 0.3, nothing past the end
    np.testing.assert_allclose(P[2, 1], [0.7, 0.3, 0.0])
    rng = np.random.default_rng(1)
    P = acceptance_probs(rng.uniform(0, 1, 50), 12)
    np.testing.assert_allclose(P.sum(axis=2), 1.0, rtol=1e-12)
    assert np.all(P >= 0)
    k = np.arange(1, 13)[:, None]
    a = np.arange(13)[None, :]
    assert np.all(P[:, np.broadcast_to(a > k, (12, 13))] == 0)


def test_transitions_never_pass_the_end():
    n, lmax = 7, 5
    nxt = next_states(n, lmax)
    assert nxt.max() == n and nxt.min() == 1
    P = acceptance_probs(np.ones(n), lmax)      # the draft always matches while there is a reference
    for i in range(n):
        # a can be at most N - i: no accepted token past the end of the reference
        assert np.all(P[i, :, n - i + 1:] == 0)


def test_certain_draft_hand_value():
    """p = 1, Cost = 1 per round: each round advances Lmax + 1 tokens -> dp[0] = ceil(N / (Lmax + 1))."""
    for n, lmax in [(10, 3), (12, 12), (1, 4), (25, 1)]:
        cost = np.ones((n, lmax, lmax + 1))
        dp, pol = bellman(np.ones(n), cost)
        assert dp[0] == pytest.approx(math.ceil(n / (lmax + 1)))
        v = evaluate_policy(np.ones(n), cost, pol)
        assert v.rounds == pytest.approx(math.ceil(n / (lmax + 1)))
        assert v.accepted + v.rounds >= n   # every reference token is produced


def test_fixed_k1_with_useless_draft_is_autoregressive():
    n = 9
    cost = np.full((n, 3, 4), 2.0)
    v = evaluate_policy(np.zeros(n), cost, fixed_policy(n, 1))
    assert v.cost == pytest.approx(2.0 * n) and v.rounds == pytest.approx(n) and v.accepted == 0


def test_dp_accepts_per_state_window_p():
    rng = np.random.default_rng(3)
    q = rng.uniform(0, 1, 6)
    cost = rng.uniform(0, 1, (6, 3, 4))
    from moespec.oracle import confidence_windows

    np.testing.assert_allclose(bellman(confidence_windows(q, 3), cost)[0], bellman(q, cost)[0])


@pytest.mark.parametrize("p, cost, match", [
    (np.array([0.5, 1.2]), np.ones((2, 2, 3)), r"\[0, 1\]"),
    (np.array([0.5, -0.1]), np.ones((2, 2, 3)), r"\[0, 1\]"),
    (np.array([0.5, np.nan]), np.ones((2, 2, 3)), "NaN"),
    (np.array([0.5, 0.5]), -np.ones((2, 2, 3)), "negative cost"),
    (np.array([0.5, 0.5]), np.ones((2, 2, 2)), r"\[N, Lmax, Lmax \+ 1\]"),
    (np.array([0.5, 0.5, 0.5]), np.ones((2, 2, 3)), "states"),
    (np.ones((2, 2, 2)), np.ones((2, 2, 3)), "shape"),
    (np.ones((2, 3)), np.ones((2, 2, 3)), "lmax"),
])
def test_bad_inputs_rejected(p, cost, match):
    with pytest.raises(ValueError, match=match):
        bellman(p, cost)


def test_unused_cost_entries_may_be_nan_but_used_ones_may_not():
    cost = np.ones((3, 2, 3))
    cost[:, 0, 2] = np.nan                     # a = 2 > k = 1: unused
    bellman(np.full(3, 0.5), cost)
    cost[1, 1, 2] = np.nan                     # a = k = 2: used
    with pytest.raises(ValueError, match="finite"):
        bellman(np.full(3, 0.5), cost)


def test_bad_policy_rejected():
    with pytest.raises(ValueError, match=r"draft lengths must be integers in \[1, 2\]; found 3 at state 1"):
        evaluate_policy(np.full(3, 0.5), np.ones((3, 2, 3)), np.array([1, 3, 1]))
    with pytest.raises(ValueError, match=r"integers in \[1, 2\]; found dtype float64"):
        evaluate_policy(np.full(3, 0.5), np.ones((3, 2, 3)), np.array([1.0, 2.0, 1.0]))
    with pytest.raises(ValueError, match="shape"):
        evaluate_policy(np.full(3, 0.5), np.ones((3, 2, 3)), np.array([1, 1]))


def test_empty_sequence_costs_nothing():
    """N = 0 states: the oracle's dp is [0], and any policy (the empty one) has zero totals and
    undefined (NaN) mean lengths, instead of numpy's zero-size reduction error."""
    p, cost = np.zeros(0), np.zeros((0, 3, 4))
    dp, policy = bellman(p, cost)
    assert dp.tolist() == [0.0] and policy.shape == (0,)
    for pol in (np.zeros(0, dtype=np.int64), fixed_policy(0, 2)):
        value = evaluate_policy(p, cost, pol)
        assert (value.cost, value.rounds, value.drafted, value.accepted) == (0.0, 0.0, 0.0, 0.0)
        assert math.isnan(value.mean_draft_length) and math.isnan(value.mean_accepted_length)


def test_compiled_and_numpy_backward_agree():
    from moespec.oracle.bellman import _backward, _backward_py
    from moespec.oracle import confidence_windows

    rng = np.random.default_rng(7)
    q = rng.uniform(0, 1, 500)
    cost = rng.uniform(0.0, 2.0, (500, 6, 7))
    a, b = _backward(confidence_windows(q, 6), cost), _backward_py(confidence_windows(q, 6), cost)
    np.testing.assert_allclose(a[0], b[0], rtol=1e-12)
    assert np.mean(a[1] == b[1]) > 0.99          # only exact ties may resolve differently


def test_negative_cost_has_its_own_error_class():
    """Notebook 07 skips a non-headline cost model that predicts a negative time (NegativeCostError), and
    only that: a NaN cost stays a plain ValueError."""
    from moespec.oracle.bellman import NegativeCostError, bellman

    cost = np.ones((2, 2, 3))
    cost[1, 0, 0] = -0.26
    with pytest.raises(NegativeCostError, match=r"negative cost -0.26 at \(i, k-1, a\) = \(1, 0, 0\)"):
        bellman(np.array([0.5, 0.5]), cost)
    cost[1, 0, 0] = np.nan
    with pytest.raises(ValueError, match="must be finite") as info:
        bellman(np.array([0.5, 0.5]), cost)
    assert not isinstance(info.value, NegativeCostError)
