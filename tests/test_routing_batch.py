"""Routing statistics over the tokens of B sequences (moespec.routing.batch): hand cases computed here,
B = 1 equal to the single-sequence estimator to the last bit, a Monte Carlo check of the union of B
independent windows, any trace (synthetic, imported from an engine), the bootstrap over documents."""

from fractions import Fraction as F

import engine_fixtures as fx
import numpy as np
import pytest

from moespec import theory as th
from moespec.routing import (RoutingTrace, batch_bootstrap, batch_byte_share, batch_reuse, batch_union, byte_share,
                             bootstrap, import_jsonl, inclusion_sums, mean_union, synthetic, union_share,
                             union_share_curves)


def _hand():
    """N = 3, m = 1, one layer: document A routes 0, 1, 0; document B routes 2, 2."""
    docs = [np.array([0, 1, 0])[:, None, None], np.array([2, 2])[:, None, None]]
    return RoutingTrace(docs, num_experts=3, expert_bytes=[1.0])


def test_hand_case():
    tr = _hand()
    s = inclusion_sums(tr, 3)
    # j = 1: 5 windows; expert 0 in 2, 1 in 1, 2 in 2.  j = 2: A's [0,1], [1,0] and B's [2,2].  j = 3: A only.
    assert s.counts[:, 0].sum(axis=0).T.tolist() == [[2, 1, 2], [2, 2, 1], [1, 1, 0]]
    assert s.windows.sum(axis=0).tolist() == [5, 3, 1]
    # U(2, j) = sum_e 1 - (1 - p_e)^2, computed exactly
    p = [[F(2, 5), F(1, 5), F(2, 5)], [F(2, 3), F(2, 3), F(1, 3)], [F(1), F(1), F(0)]]
    U2 = [sum(1 - (1 - x) ** 2 for x in row) for row in p]
    assert U2 == [F(41, 25), F(7, 3), 2]
    assert batch_union(tr, 2, 3)[0] == pytest.approx([float(u) for u in U2], abs=1e-15)
    assert batch_union(tr, 1, 3)[0].tolist() == [1.0, 5 / 3, 2.0]
    # cross-sequence reuse of the second sequence: 1 - (U(2) - U(1))/U(1)
    assert batch_reuse(tr, 2, 3)[1] == pytest.approx([F(9, 25), F(3, 5), 1.0], abs=1e-15)
    assert batch_reuse(tr, 2, 3)[0].tolist() == [0.0, 0.0, 0.0]
    # byte share ubar(2, j) = U(2, j)/(2 j m W), union share U(2, j)/N
    assert batch_byte_share(tr, 2, 3) == pytest.approx([float(U2[j] / (2 * (j + 1))) for j in range(3)], abs=1e-15)
    assert union_share(tr, 2, 3) == pytest.approx([float(u / 3) for u in U2], abs=1e-15)


def test_batch_one_is_the_single_sequence_estimator_to_the_bit():
    for tr in (synthetic.sticky(7, 40, 3, 32, 4, keep=0.6, working_set=12, seed=3),
               synthetic.uniform(3, [5, 30, 12], 2, 16, 2), _hand()):
        assert np.array_equal(batch_union(tr, 1, 9), mean_union(tr, 9), equal_nan=True)
        assert np.array_equal(batch_byte_share(tr, 1, 9), byte_share(tr, 9), equal_nan=True)
        a, b = batch_bootstrap(tr, 1, 6, "union", 50, seed=4), bootstrap(tr, 6, "union", 50, seed=4)
        assert np.allclose(a.samples, b.samples, equal_nan=True, rtol=1e-12)


def test_union_of_independent_windows_against_sampling():
    """B windows drawn independently and uniformly from the pooled windows: the sampled mean union
    agrees with sum_e 1 - (1 - p_e)^B."""
    tr = synthetic.sticky(5, 60, 2, 24, 3, keep=0.5, working_set=10, seed=8)
    rng = np.random.default_rng(0)
    j, B, draws = 3, 4, 40000
    starts = [(d, s) for d, doc in enumerate(tr.docs) for s in range(len(doc) - j + 1)]
    pick = rng.integers(0, len(starts), (draws, B))
    sizes = np.zeros((draws, tr.num_layers))
    for i, row in enumerate(pick):
        for layer in range(tr.num_layers):
            sizes[i, layer] = len({int(e) for w in row for e in tr.docs[starts[w][0]][starts[w][1]:
                                                                                  starts[w][1] + j, layer].ravel()})
    se = sizes.std(axis=0) / np.sqrt(draws)
    assert np.all(np.abs(sizes.mean(axis=0) - batch_union(tr, B, j)[:, j - 1]) < 4 * se)


def test_properties_and_uniform_routing():
    tr = synthetic.uniform(20, 80, 2, 16, 2, seed=1)
    shares = np.array([union_share(tr, B, 6) for B in (1, 2, 3, 4, 8, 16)])
    assert np.all(np.diff(shares, axis=0) >= 0) and np.all(np.diff(shares, axis=1) >= 0)
    # popular experts union less than exchangeable routing of the same window union (convexity)
    st = synthetic.sticky(10, 50, 2, 32, 4, keep=0.7, working_set=8, seed=2)
    for B in (2, 4, 8):
        assert np.all(batch_union(st, B, 5) <= th.exchangeable_union(mean_union(st, 5), 32, B) + 1e-9)
    # uniform routing: U(B, 1) close to N(1 - q^B), q = 1 - m/N
    for B in (2, 4):
        assert batch_union(tr, B, 1)[:, 0] == pytest.approx(16 * (1 - (1 - 2 / 16) ** B), rel=0.03)


def test_an_imported_engine_trace():
    tr = import_jsonl(fx.FIXTURES / "sglang_chat.jsonl", "sglang", num_layers=4, top_k=4, num_experts=16)
    U = batch_union(tr, 3, 2)
    assert U.shape == (tr.num_layers, 2) and np.all(U[:, 0] >= mean_union(tr, 2)[:, 0])
    assert np.array_equal(batch_union(tr, 1, 2), mean_union(tr, 2), equal_nan=True)


def test_bootstrap_and_curves():
    tr = synthetic.sticky(12, 40, 2, 32, 4, keep=0.6, working_set=12, seed=5)
    boot = batch_bootstrap(tr, 4, 5, "byte_share", resamples=300, seed=1)
    assert np.all(boot.low < boot.high) and boot.samples.shape == (300, 5)
    # a resample repeats documents, whose windows share experts: its union sits below the estimate's
    assert np.all(boot.samples.mean(axis=0) < boot.estimate)
    assert np.array_equal(boot.estimate, batch_byte_share(tr, 4, 5))
    df = union_share_curves([tr, synthetic.uniform(6, 30, 2, 16, 2)], batch_sizes=(2, 4), n_max=12, resamples=50)
    one = df[(df.label == tr.label) & (df.B == 1)]
    assert one.n.tolist() == list(range(1, 13)) and np.allclose(one.share, union_share(tr, 1, 12))
    four = df[(df.label == tr.label) & (df.B == 4)]
    assert four.n.tolist() == [4, 8, 12] and np.allclose(four.share, union_share(tr, 4, 3))
    # at the same n, B sequences read at least as many experts as one window (less reuse across sequences)
    assert np.all(four.share.to_numpy() >= one.set_index("n").loc[[4, 8, 12], "share"].to_numpy() - 1e-12)


def test_refusals():
    tr = _hand()
    with pytest.raises(ValueError, match="B: expected a batch size"):
        batch_union(tr, 0, 3)
    with pytest.raises(ValueError, match="n_max"):
        batch_union(tr, 2, 0)
    with pytest.raises(ValueError, match="statistic"):
        batch_bootstrap(tr, 2, 3, "nope")
