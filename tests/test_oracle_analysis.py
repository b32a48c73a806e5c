"""Delta space, the alpha = 0 ablation, the Lmax sweep, the online policy and per-kernel costs on synthetic inputs."""

from __future__ import annotations

import numpy as np
import pytest

from moespec.oracle import analysis as A
from moespec.oracle.bellman import bellman, evaluate_policy
from moespec.oracle.cost import CostModel, KernelCostModel, cost_matrix
from moespec.oracle.delta import delta_points, quadrant_counts
from moespec.oracle.junk import load_inputs, save_inputs, synthetic_inputs
from moespec.oracle.policy import EarlyExitPolicy

MODEL = CostModel(draft_a=0.46, draft_b=0.07, beta0=6.0, alpha=0.25, c=1.1e-3)


@pytest.fixture(scope="module")
def items():
    return [synthetic_inputs(n=120, lmax=8, seed=s, seq_id=f"s{s}") for s in range(6)]


def test_oracle_bounds_every_policy(items):
    train, test = A.split_sequences(items, seed=1)
    assert not {i.seq_id for i in train} & {i.seq_id for i in test}
    df, info = A.online_evaluation(train, test, MODEL)
    assert df.speedup.iloc[0] == df.speedup.max()          # the oracle is an upper bound
    assert info["oracle"] >= info["online"] and info["oracle"] >= info["fixed_best_hindsight"]
    assert info["fixed_best_hindsight"] >= info["fixed_best_train"]


def test_lmax_sweep_is_monotone(items):
    sw = A.lmax_sweep(items, MODEL, range(1, 9))
    assert np.all(np.diff(sw.speedup) >= -1e-12)            # a larger action set never hurts
    assert sw.mean_accepted_length.iloc[0] <= 1.0 and np.all(sw.mean_draft_length <= sw.lmax)


def test_monotone_costs_leave_quadrants_II_and_IV_empty(items):
    solved = [A.solve(it, MODEL) for it in items]
    pts, quad, bound = A.delta_space(solved)
    assert quad["II"] == 0 and quad["IV"] == 0 and quad["I"] > 0
    assert bound["q1_below_line"] <= 0.011 * bound["n_q1"] + 1


def test_quadrant_check_can_fail():
    """A cost that falls with k (negative draft cost) puts candidates in quadrant IV."""
    it = synthetic_inputs(n=60, lmax=6, seed=0)
    bad = CostModel(draft_a=-2.0, draft_b=10.0, beta0=6.0, alpha=0.0, c=0.0)
    cost = cost_matrix(it.U, it.L_prefix, bad)
    _, pol = bellman(it.p, cost)
    pol[:] = 1                                            # pretend the choice is k = 1
    quad = quadrant_counts(delta_points(it.p, cost, pol))
    assert quad["IV"] > 0


def test_alpha0_ablation(items):
    changed, s = A.alpha0_ablation(items, MODEL)
    assert s["share_changed"] > 0 and s["mean_shift"] > 0    # without the expert term it drafts longer
    assert s["speedup_alpha0_policy_full_cost"] <= s["speedup_full"] + 1e-12
    # each change is optimal for its own objective: the full cost prefers k_full, alpha = 0 prefers k_alpha0
    assert (changed.dQ_full_ms >= -1e-9).all() and (changed.dQ_alpha0_ms <= 1e-9).all()
    assert (changed.dU_experts[changed.k_alpha0 > changed.k_full] > 0).all()
    none, s0 = A.alpha0_ablation(items, MODEL.without_experts())
    assert s0["changed"] == 0 and len(none) == 0


def test_alpha0_ablation_is_undefined_when_the_remaining_terms_are_not_a_time(items):
    """A fit whose intercept is below zero (all of a pass in the expert term) has no alpha = 0 problem:
    the ablation says so instead of re-solving with negative pass times; the full model still solves."""
    fit = CostModel(draft_a=0.28, draft_b=0.1, beta0=-1.0, alpha=0.95, c=1e-4)
    changed, s = A.alpha0_ablation(items, fit)
    assert s["defined"] is False and len(changed) == 0 and np.isnan(s["share_changed"])
    worst = 0.28 + 0.1 - 1.0 + 1e-4 * min(float(np.min(it.L_prefix)) for it in items)   # k = 1 at the shortest prefix
    assert f"negative pass time ({worst:.4g} ms; beta0 = -1 ms)" in s["reason"]
    assert s["speedup_full"] == A.totals(*zip(*[(r.value, r.cost_ar) for r in (A.solve(it, fit) for it in items)]))[
        "speedup"]
    assert A.alpha0_ablation(items, MODEL)[1]["defined"] is True
    assert len(A.analyse(items, fit, items[:3], items[3:], 8).selected) == 0      # the analysis goes on


def test_early_exit_decisions():
    pol = EarlyExitPolicy(slope=1.0, marginal_cost=np.array([0.5, 0.5, 0.5]))
    q = np.array([[1.0, 1.0, 1.0, 1.0], [1.0, 0.4, 1.0, 1.0], [0.9, 0.9, 0.9, 0.9], [0.2, 1, 1, 1]])
    # gains: prod q_0..q_k; continue while 0.5 / gain <= 1, i.e. gain >= 0.5
    np.testing.assert_array_equal(pol.decide(q), [4, 1, 4, 1])
    assert np.all(EarlyExitPolicy(np.inf, np.ones(3)).decide(np.full((2, 4), 0.5)) == 4)
    assert np.all(EarlyExitPolicy(-1.0, np.ones(3)).decide(np.ones((2, 4))) == 1)


def test_kernel_cost_models(items):
    it = items[0]
    slot = KernelCostModel(0.46, 0.07, 6.0, 1e-3, layers=4, expert_bytes=1e5, top_k=8, bandwidth=1e7, kernel="slot")
    dedup = KernelCostModel(0.46, 0.07, 6.0, 1e-3, layers=4, expert_bytes=1e5, top_k=8, bandwidth=1e7, kernel="dedup")
    cs = cost_matrix(it.U, it.L_prefix, slot)
    # the per-slot kernel reads (k+1) * top_k slots whatever the routing: cost independent of a
    for k in range(1, it.lmax + 1):
        assert np.allclose(cs[:, k - 1, :k + 1], cs[:, k - 1, :1])
    cd = cost_matrix(it.U, it.L_prefix, dedup)
    assert np.nanmax(cd - cs) <= 1e-9                       # U <= (k+1) top_k: dedup never reads more
    tab, diff = A.compare_cost_models(items[:2], {"slot": slot, "dedup": dedup})
    assert list(tab.cost_model) == ["slot", "dedup"] and 0 <= diff.share_k_differs.iloc[0] <= 1
    with pytest.raises(ValueError, match="kernel"):
        KernelCostModel(0, 0, 0, 0, 1, 1, 1, 1, "tiled")


def test_inputs_roundtrip(tmp_path, items):
    save_inputs(items[:2], tmp_path / "x.npz")
    back = load_inputs(tmp_path / "x.npz")
    assert [b.seq_id for b in back] == ["s0", "s1"]
    np.testing.assert_array_equal(back[1].U, items[1].U)
    assert evaluate_policy(back[0].p, cost_matrix(back[0].U, back[0].L_prefix, MODEL),
                           np.ones(back[0].n, dtype=int)).cost > 0
