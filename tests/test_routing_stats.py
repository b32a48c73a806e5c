"""Reuse, union and byte statistics: exact values on paper 1's Appendix B patterns, the uniform
curve, identity (2), agreement with a plain-loop implementation, and the bootstrap."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from moespec.routing import RoutingTrace, bootstrap, byte_share, distinct_share, distinct_share_against, e_dedup, \
    e_slot, mean_union, resample_counts, reuse, rho_bar, synthetic
from routing_reference import reference_rho_bar, reference_stats

# Paper 1, App. B.2 ("No single threshold"): N = 3, L = 1, m = 1; rho(2), rho(3) by counting each
# pattern's cyclic windows by hand, rho_bar_1 and rho_bar_2 as printed in the paper's table.
PATTERNS = {  # pattern: (rho(2), rho(3), rho_bar_1, rho_bar_2)
    "01": (Fraction(0), Fraction(1), Fraction(0), Fraction(1, 2)),
    "00012": (Fraction(2, 5), Fraction(2, 5), Fraction(2, 5), Fraction(2, 5)),
    "00102": (Fraction(1, 5), Fraction(3, 5), Fraction(1, 5), Fraction(2, 5)),
}


@pytest.mark.parametrize("pattern", PATTERNS)
def test_periodic_patterns_exact(pattern):
    """A document of (period * K + n - 1) tokens holds every phase's window of n exactly K times,
    so the estimator equals the stationary value exactly."""
    period = len(pattern)
    for n, expected in ((2, PATTERNS[pattern][0]), (3, PATTERNS[pattern][1])):
        tr = synthetic.periodic(pattern, 1, period * 40 + n - 1, num_experts=3, seed=n)
        got = reuse(tr, n)[0, n - 1]
        assert Fraction(got).limit_denominator(1000) == expected, (pattern, n, got)
    # the same with m = 3 experts per symbol (N = 9): reuse is a share of m, so unchanged
    tr = synthetic.periodic(pattern, 1, period * 40 + 1, top_k=3, num_experts=9)
    assert Fraction(reuse(tr, 2)[0, 1]).limit_denominator(1000) == PATTERNS[pattern][0]


@pytest.mark.parametrize("pattern", PATTERNS)
def test_periodic_rho_bar_random_phase(pattern):
    """eq. (11) on random-phase traces: the paper's rho_bar_1, rho_bar_2 within finite-trace error."""
    tr = synthetic.periodic(pattern, 300, 101, num_experts=3, seed=7)
    rb = rho_bar(tr, 2)
    assert rb == pytest.approx([float(PATTERNS[pattern][2]), float(PATTERNS[pattern][3])], abs=0.01)


@pytest.mark.parametrize("N, m", [(64, 8), (32, 4), (256, 8)])
def test_uniform_routing_curve(N, m):
    """Independent uniform routing: rho(n) = 1 - q^(n-1), q = 1 - m/N (paper 1, Sec. 2)."""
    tr = synthetic.uniform(20, 1500, 4, N, m, seed=3)
    q = 1 - m / N
    expected = 1 - q ** np.arange(9)
    got = reuse(tr, 9).mean(axis=0)
    assert got[0] == 0
    assert got == pytest.approx(expected, abs=0.01)
    # U(n) = N (1 - q^n) (MoESpec, Huang et al. 2025)
    assert mean_union(tr, 9).mean(axis=0) == pytest.approx(N * (1 - q ** np.arange(1, 10)), rel=0.01)


@pytest.mark.parametrize("process", ["uniform", "sticky"])
def test_identity_2_union_from_reuse(process):
    """eq. (2): U(n) = m sum_{j<=n} (1 - rho(j)) on long stationary traces."""
    if process == "uniform":
        tr = synthetic.uniform(8, 4000, 3, 64, 8, seed=5)
    else:
        tr = synthetic.sticky(8, 4000, 3, 64, 8, keep=0.4, working_set=30, seed=5)
    m = tr.top_k
    U = mean_union(tr, 9)
    from_rho = m * np.cumsum(1 - reuse(tr, 9), axis=1)
    assert U == pytest.approx(from_rho, rel=2e-3)
    # eq. (3): E_slot - E_dedup = m sum_l w_l sum_j rho_l(j), here with w_l = 1
    gap = e_slot(tr, 9) - e_dedup(tr, 9)
    assert gap == pytest.approx(m * np.cumsum(reuse(tr, 9).sum(axis=0)), rel=5e-3)


def _random_trace(rng, N, m, L, lengths, w=None):
    docs = [np.stack([np.stack([rng.choice(N, m, replace=False) for _ in range(L)]) for _ in range(T)])
            for T in lengths]
    # add reuse so that intersections are not all empty: copy some previous token sets
    for d in docs:
        for t in range(1, d.shape[0]):
            if rng.random() < 0.4:
                d[t] = rng.permuted(d[t - 1], axis=-1)
    return RoutingTrace(docs, N, expert_bytes=w)


@pytest.mark.parametrize("N, m", [(8, 3), (64, 8), (70, 5), (200, 6), (256, 4)])
def test_agrees_with_plain_loop(N, m):
    rng = np.random.default_rng(N)
    lengths = [1, 3, 12, 7, 25, 2]
    w = rng.uniform(0.5, 3.0, size=3)
    tr = _random_trace(rng, N, m, 3, lengths, w)
    n_max = 9
    ref_rho, ref_union = reference_stats(tr.docs, m, n_max)
    assert reuse(tr, n_max) == pytest.approx(ref_rho, abs=1e-12)
    assert mean_union(tr, n_max) == pytest.approx(ref_union, abs=1e-12)
    assert e_dedup(tr, n_max) == pytest.approx(w @ ref_union)
    slot = m * np.arange(1, n_max + 1) * w.sum()
    assert e_slot(tr, n_max) == pytest.approx(slot)
    assert byte_share(tr, n_max) == pytest.approx(w @ ref_union / slot)
    assert rho_bar(tr, n_max - 1) == pytest.approx(reference_rho_bar(ref_rho, w, n_max - 1))
    # cached sums for a larger n_max give the same leading columns
    assert reuse(tr, 4) == pytest.approx(ref_rho[:, :4], abs=1e-12)


def test_windows_never_cross_documents():
    """Two documents, each constant but with different experts: no window may see both."""
    a = np.zeros((5, 1, 1), dtype=int)
    b = np.ones((5, 1, 1), dtype=int)
    tr = RoutingTrace([a, b], 2)
    assert reuse(tr, 5)[0].tolist() == [0, 1, 1, 1, 1]
    assert mean_union(tr, 5)[0].tolist() == [1, 1, 1, 1, 1]
    assert byte_share(tr, 3).tolist() == [1, 1 / 2, 1 / 3]


def test_n_beyond_every_document_is_nan():
    tr = RoutingTrace([np.array([[[0]], [[1]]])], 2)
    r = reuse(tr, 4)
    assert r[0, :2].tolist() == [0, 0] and np.isnan(r[0, 2:]).all()
    with pytest.raises(ValueError, match="n_max"):
        reuse(tr, 0)


def test_sticky_closed_form_and_calibration():
    keep, h = synthetic.calibrate_sticky(0.363, 64, 8, rho_n=0.762, n=9)
    assert keep == 0.363 and 16 <= h <= 64
    theory = synthetic.sticky_reuse(9, keep, 8, h)
    assert theory[1] == pytest.approx(0.363) and theory[8] == pytest.approx(0.762, abs=0.01)
    tr = synthetic.sticky(10, 3000, 2, 64, 8, keep=keep, working_set=h, seed=11)
    assert reuse(tr, 9).mean(axis=0) == pytest.approx(theory, abs=0.01)
    # with h = N and p = m/N the process has the uniform curve 1 - q^(n-1)
    assert synthetic.sticky_reuse(6, 8 / 64, 8, 64) == pytest.approx(1 - (7 / 8) ** np.arange(6))
    assert synthetic.calibrate_sticky(0.3, 64, 8) == (0.3, 64)
    with pytest.raises(ValueError, match="working_set"):
        synthetic.sticky(1, 10, 1, 64, 8, keep=0.3, working_set=10)
    with pytest.raises(ValueError, match="N >= 2m"):
        synthetic.calibrate_sticky(0.3, 10, 6)


def test_synthetic_is_seeded():
    a = synthetic.sticky(2, 50, 2, 16, 2, keep=0.5, seed=4)
    b = synthetic.sticky(2, 50, 2, 16, 2, keep=0.5, seed=4)
    c = synthetic.sticky(2, 50, 2, 16, 2, keep=0.5, seed=5)
    assert all(np.array_equal(x, y) for x, y in zip(a.docs, b.docs))
    assert not all(np.array_equal(x, y) for x, y in zip(a.docs, c.docs))
    u = synthetic.uniform(2, 30, 2, 16, 4, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(u.docs, synthetic.uniform(2, 30, 2, 16, 4, seed=1).docs))


def test_bootstrap_resamples_match_explicit_resampled_traces():
    rng = np.random.default_rng(0)
    w = np.array([1.0, 2.0, 4.0])
    tr = _random_trace(rng, 16, 3, 3, [4, 9, 6, 15, 3, 8], w)
    for stat, fn in (("reuse", lambda t: reuse(t, 6).mean(axis=0)),
                     ("union", lambda t: mean_union(t, 6).mean(axis=0)),
                     ("distinct_share", lambda t: distinct_share(t, 6)),
                     ("byte_share", lambda t: byte_share(t, 6)),
                     ("rho_bar", lambda t: rho_bar(t, 5))):
        bs = bootstrap(tr, 6, statistic=stat, resamples=5, seed=9)
        counts = resample_counts(tr.num_docs, 5, 9)
        for b in range(5):
            docs = [d for d, c in zip(tr.docs, counts[b]) for _ in range(c)]
            explicit = fn(RoutingTrace(docs, 16, expert_bytes=w))
            assert bs.samples[b] == pytest.approx(explicit, nan_ok=True), (stat, b)
        assert bs.estimate == pytest.approx(fn(tr))


def test_bootstrap_interval():
    tr = synthetic.sticky(30, 200, 2, 32, 4, keep=0.45, working_set=16, seed=2)
    bs = bootstrap(tr, 9, resamples=2000, seed=1)
    assert bs.samples.shape == (2000, 9)
    assert np.all(bs.low[1:] < bs.estimate[1:]) and np.all(bs.estimate[1:] < bs.high[1:])
    assert bs.low[0] == bs.high[0] == 0
    again = bootstrap(tr, 9, resamples=2000, seed=1)
    assert np.array_equal(bs.samples, again.samples)
    # the interval is the percentile interval of the samples
    assert bs.high[1] == pytest.approx(np.quantile(bs.samples[:, 1], 0.975))
    # with one document every resample is the trace itself: a zero-width interval
    one = bootstrap(tr.subset([0]), 3, resamples=50)
    assert np.allclose(one.low, one.estimate) and np.allclose(one.high, one.estimate)
    with pytest.raises(ValueError, match="unknown statistic"):
        bootstrap(tr, 3, statistic="nope")


def test_bitmasks_and_popcount_fallback():
    from moespec.routing import stats

    ids = np.array([[[0, 63, 64, 255]], [[1, 2, 3, 200]]])
    masks = stats.bitmasks(ids, 256)
    assert masks.shape == (4, 2, 1)
    assert masks[:, 0, 0].tolist() == [1 | (1 << 63), 1, 0, 1 << 63]
    assert stats._popcount(masks).tolist() == [[4], [4]]
    x = np.random.default_rng(0).integers(0, 2**63, size=1000, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    assert np.array_equal(stats._bitcount_table(x), [bin(int(v)).count("1") for v in x])


def test_reuse_by_layer_hand_case():
    """Layer 0 routes every token to the same experts (rho(n) = 1 for n >= 2); layer 1 moves to
    disjoint experts at every token (rho = 0): one row per layer with those values."""
    import numpy as np

    from moespec.routing import RoutingTrace
    from moespec.tables.routing import reuse_by_layer

    T, m = 12, 2
    doc = np.zeros((T, 2, m), dtype=np.int64)
    doc[:, 0] = [0, 1]
    doc[:, 1] = np.arange(T * m).reshape(T, m) % 24
    tr = RoutingTrace([doc], num_experts=24, source="hand")
    df = reuse_by_layer([tr])
    assert list(df["layer"]) == [0, 1] and list(df["source"]) == ["hand", "hand"]
    assert df["rho_hat_2"].tolist() == [1.0, 0.0] and df["rho_hat_9"].tolist() == [1.0, 0.0]


def _sets(*tokens):
    """One document of one layer: ``[T, 1, m]`` ids from per-token expert lists."""
    return np.array(tokens)[:, None, :]


def test_distinct_share_on_hand_cases():
    """U/(nm) (Figure 3 right): a document that repeats {0, 1} has U(n) = 2, share 2/(2n) = 1/n;
    one alternating {0, 1}, {2, 3} has U(2) = U(3) = 4, shares 1 and 4/6."""
    repeat = RoutingTrace([_sets([0, 1], [0, 1], [0, 1], [0, 1])] * 2, 4)
    alternate = RoutingTrace([_sets([0, 1], [2, 3], [0, 1], [2, 3])] * 2, 4, source="alternating")
    assert distinct_share(repeat, 3) == pytest.approx([1, 1 / 2, 1 / 3])
    assert distinct_share(alternate, 3) == pytest.approx([1, 1, 4 / 6])
    out = distinct_share_against({"repeats": repeat}, alternate, ns=(2, 3), resamples=50, seed=3)
    assert list(out["n"]) == [2, 3] and (out["label"] == "repeats").all()
    assert out["share_text"].to_numpy() == pytest.approx([1 / 2, 1 / 3])
    assert out["share_reference"].to_numpy() == pytest.approx([1, 4 / 6])
    assert out["difference"].to_numpy() == pytest.approx([-1 / 2, 1 / 3 - 4 / 6])
    # identical documents: every resample gives the same share, so each interval is the point
    for col in ("share_text", "share_reference", "difference"):
        assert out[f"{col}_low"].to_numpy() == pytest.approx(out[col].to_numpy())
        assert out[f"{col}_high"].to_numpy() == pytest.approx(out[col].to_numpy())
    assert out["lower_bound"].to_numpy() == pytest.approx([1 / 2, 1 / 3])
    with pytest.raises(ValueError, match="trace 'other': N = 8, m = 2; the reference .* has N = 4, m = 2"):
        distinct_share_against({"other": RoutingTrace([_sets([0, 1], [6, 7])], 8)}, alternate, ns=(2,))
    with pytest.raises(ValueError, match="trace 'short': its longest document has 2 tokens; n = 3"):
        distinct_share_against({"short": RoutingTrace([_sets([0, 1], [2, 3])], 4)}, alternate, ns=(2, 3))


def test_distinct_share_interval_is_the_bootstrap_of_its_samples():
    ref = synthetic.sticky(12, 80, 2, 32, 4, keep=0.3, working_set=16, seed=4)
    text = synthetic.sticky(10, 80, 2, 32, 4, keep=0.6, working_set=16, seed=5)
    out = distinct_share_against({"text": text}, ref, ns=(2, 4, 6, 8), resamples=400, seed=7)
    bs_ref = bootstrap(ref, 8, "distinct_share", resamples=400, seed=7)
    bs_txt = bootstrap(text, 8, "distinct_share", resamples=400, seed=8)
    for r in out.itertuples():
        assert r.share_reference_low == pytest.approx(bs_ref.low[r.n - 1])
        assert r.share_text_high == pytest.approx(bs_txt.high[r.n - 1])
        d = bs_txt.samples[:, r.n - 1] - bs_ref.samples[:, r.n - 1]
        assert r.difference_low == pytest.approx(np.quantile(d, 0.025))
        assert r.share_text_low < r.share_text < r.share_text_high
        assert 1 / r.n <= r.share_text <= 1
    # the stickier text repeats more experts: its share lies below the reference's at every n
    assert (out["difference_high"] < 0).all()
