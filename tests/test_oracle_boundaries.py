"""Appendix B on our text: the boundary classifier on labelled snippets, the clustered bootstrap and
the new-experts formula on hand cases, the gallery's and B4's selection rules (exact picks), and the
oracle inputs' optional token arrays through the npz."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from moespec.oracle import analysis as A
from moespec.oracle import boundaries as B
from moespec.oracle import gallery as G
from moespec.oracle.cost import CostModel
from moespec.oracle.junk import load_inputs, save_inputs, synthetic_inputs


def labels_of(texts):
    return dict(zip(range(len(texts)), B.classify(texts)))


def test_sentence_end_and_start():
    lab = B.classify(["The", " cat", " sat", ".", " It", " ran"])
    assert lab == ["prose vocabulary", "prose vocabulary", "prose vocabulary", "sentence boundary",
                   "sentence boundary", "prose vocabulary"]


def test_newline_and_wikitext_heading():
    texts = ["word", "\n", " =", " =", " History", " =", " =", "\n", " The", " war"]
    lab = B.classify(texts)
    assert lab[1] == "paragraph / heading"                              # a newline
    assert lab[2:8] == ["paragraph / heading"] * 6                       # the heading line and its newline
    assert lab[8:] == ["prose vocabulary"] * 2                           # prose again, a prose line before


def test_number_with_wikitext_markup_and_unk():
    lab = B.classify([" the", " 1990", " @-@", "91", " season", " of", " <unk>", "."])
    assert lab == ["prose vocabulary", "markup / formula", "markup / formula", "markup / formula",
                   "prose vocabulary", "prose vocabulary", "prose vocabulary", "sentence boundary"]


def test_code_line_and_code_prose_transition():
    texts = ["Text", " here", ".", "\n", "def", " f", "():", "\n", "    return", " 1", "\n", "Done", " now"]
    lab = B.classify(texts)
    assert lab[4] == "code-prose transition"            # first token of a code line after a prose line
    assert lab[5:7] == ["code formatting"] * 2
    assert lab[7] == "paragraph / heading"
    assert lab[8:10] == ["code formatting"] * 2          # indented line: code, the number inside code is code
    assert lab[11] == "code-prose transition"            # back to prose
    assert lab[12] == "prose vocabulary"


def test_script_change_and_word_continuation():
    lab = B.classify([" the", " word", " сло", "во", " and", " un", "believ", "able"])
    assert lab == ["prose vocabulary", "prose vocabulary", "script change", "word continuation", "script change",
                   "prose vocabulary", "word continuation", "word continuation"]
    assert B.script_of("ж") == "CYRILLIC" and B.script_of("a") == "LATIN" and B.script_of("1") is None


def test_first_mismatch_from_the_greedy_indicator():
    g = np.array([1, 1, 0, 1, 0.0])
    assert B.first_mismatch(g, 0, 4) == 3 and B.first_mismatch(g, 0, 2) == 0
    assert B.first_mismatch(g, 3, 4) == 2 and B.first_mismatch(g, 4, 1) == 1
    assert B.first_mismatch(np.ones(3), 1, 5) == 0                       # past the end nothing counts


def test_clustered_mean_hand_case():
    # response A: [1, 1], response B: [3, 3, 3, 3]; resamples AA -> 1, BB -> 3, AB/BA -> 14/6
    r = B.clustered_mean([1, 1, 3, 3, 3, 3], ["A", "A", "B", "B", "B", "B"], n_boot=999, seed=0)
    assert r["estimate"] == pytest.approx(14 / 6) and (r["n"], r["responses"]) == (6, 2)
    assert (r["lo"], r["hi"]) == (1.0, 3.0)
    W = B.cluster_weights(2, 999, 0)
    assert (W.sum(1) == 2).all() and set(np.unique(W)) <= {0, 1, 2}
    one = B.clustered_mean([2.0, 4.0], ["A", "A"])
    assert one["estimate"] == one["lo"] == one["hi"] == 3.0
    empty = B.clustered_mean([], [])
    assert empty["n"] == 0 and np.isnan(empty["estimate"])


def test_aligned_difference_weights_the_comparison_by_the_events_steps():
    r = B.aligned_difference([10, 20], [1, 2], ["A", "A"], [4, 6, 8, 100], [1, 1, 2, 3], ["A"] * 4)
    # comparison: step 1 mean 5, step 2 mean 8, each weighted 1/2 (step 3 has no event)
    assert (r["event"], r["other"], r["difference"]) == (15.0, 6.5, 8.5)
    assert r["difference_lo"] == r["difference_hi"] == 8.5                # one response: no spread
    none = B.aligned_difference([], [], [], [1.0], [1], ["A"])
    assert none["events"] == 0 and np.isnan(none["difference"])


def test_new_experts_formula_on_a_hand_built_union():
    n, lmax, top_k = 3, 2, 2
    U = np.full((n, lmax, lmax + 1), np.nan)
    # state 0: V(1, a) = 3.5, 3.0 (a = 0, 1); V(2, a) = 5.0, 4.5, 4.0 (a = 0, 1, 2)
    U[0, 0, :2] = [3.5, 3.0]
    U[0, 1, :] = [5.0, 4.5, 4.0]
    U[1:] = U[0]
    new = B.new_experts(U, top_k)
    assert new.shape == (n, lmax, lmax + 1)
    assert new[0, 0].tolist() == [1.5, 1.0, 1.0]           # step 1: V(1, min(a, 1)) - top_k
    assert new[0, 1].tolist() == [1.5, 1.5, 1.0]           # step 2: V(2, a) - V(1, min(a, 1))
    assert new[1].tolist() == new[0].tolist()
    assert new[2, 0].tolist() == [1.5, 1.0, 1.0] and np.isnan(new[2, 1]).all()   # i + j > N: past the reference


def decisions_table():
    return pd.DataFrame([
        # seq, i, k, all_matched, label_next, p_drafted, p_more, first_mismatch, new_at_mismatch
        ("a", 0, 4, True, "sentence boundary", 0.50, np.nan, 0, np.nan),
        ("a", 1, 4, True, "prose vocabulary", 0.90, np.nan, 0, np.nan),
        ("b", 0, 4, True, "prose vocabulary", 0.70, np.nan, 0, np.nan),
        ("b", 3, 3, True, "paragraph / heading", 0.95, 0.90, 0, np.nan),
        ("c", 0, 2, False, "sentence boundary", 0.20, 0.10, 2, 0.5),
        ("c", 5, 3, False, None, 0.30, 0.20, 3, 1.5),
        ("d", 2, 3, False, None, 0.10, 0.05, 2, 0.5),
        ("d", 4, 1, True, "sentence boundary", 0.99, 0.97, 0, np.nan),
    ], columns=["seq_id", "i", "k", "all_matched", "label_next", "p_drafted", "p_more", "first_mismatch",
                "new_at_mismatch"])


def picks(df):
    return list(zip(df.seq_id, df.i))


def test_gallery_rules_exact_picks():
    t = decisions_table()
    assert picks(G.full_matches(t, lmax=4)) == [("a", 1), ("b", 0)]          # one per response, likeliest
    assert picks(G.stops_before_boundary(t)) == [("a", 0), ("b", 3)]         # longest k first
    assert picks(G.low_cost_mismatches(t)) == [("c", 0), ("d", 2)]           # fewest new experts, ties by response
    assert picks(G.counterexamples(t, lmax=4)) == [("d", 4), ("b", 3)]       # highest p_more with k* < Lmax
    g = G.gallery(t, 4)
    assert list(g.rule.value_counts().sort_index()) == [2, 2, 2, 2]
    assert len(G.gallery(t.head(0), 4)) == 0


def test_b4_rule_exact_picks():
    changed = pd.DataFrame([("a", 3, 1, 2, 0.90), ("a", 5, 2, 3, 0.95), ("b", 1, 4, 5, 0.99), ("b", 2, 3, 5, 0.999),
                            ("c", 0, 1, 2, np.nan), ("d", 7, 2, 3, 0.50), ("e", 1, 3, 2, np.nan)],
                           columns=["seq_id", "i", "k_full", "k_alpha0", "p_added"])
    assert picks(G.b4_cases(changed, 2)) == [("b", 1), ("a", 5)]
    assert picks(G.b4_cases(changed)) == [("b", 1), ("a", 5), ("d", 7)]      # +2 shifts, no p: never picked
    # ranked by the surrogate probability of the added token p[i + k*] (c's is past its end: never picked)
    surrogate = {"a": np.array([0, 0, 0, 0, 0.2, 0, 0, 0.3]), "b": np.array([0, 0, 0, 0, 0, 0.1]),
                 "c": np.array([0.5]), "d": np.array([0] * 9 + [0.8]), "e": np.zeros(5)}
    cases = G.b4_cases(changed, surrogate=surrogate)
    assert picks(cases) == [("d", 7), ("a", 5), ("b", 1)]
    assert cases.p_added_surrogate.tolist() == [0.8, 0.3, 0.1]


def with_tokens(it, seed=0):
    rng = np.random.default_rng(seed)
    return it.__class__(**{**it.__dict__, "tokens": rng.integers(0, 50, it.n),
                           "draft_chain": rng.integers(0, 50, (it.n, it.lmax))})


def test_npz_round_trip_with_and_without_tokens(tmp_path):
    a = with_tokens(synthetic_inputs(n=9, lmax=3, seed=1, seq_id="a"))
    b = with_tokens(synthetic_inputs(n=5, lmax=3, seed=2, seq_id="b"), seed=1)
    save_inputs([a, b], tmp_path / "t.npz")
    back = load_inputs(tmp_path / "t.npz")
    for x, y in zip([a, b], back):
        assert (x.tokens == y.tokens).all() and (x.draft_chain == y.draft_chain).all()
        assert np.allclose(x.p, y.p) and x.with_transitions("greedy").tokens is x.tokens
    plain = synthetic_inputs(n=4, lmax=3, seq_id="c")
    save_inputs([a, plain], tmp_path / "mixed.npz")                     # not every sequence has them: none saved
    assert all(it.tokens is None and it.draft_chain is None for it in load_inputs(tmp_path / "mixed.npz"))
    with pytest.raises(ValueError, match="'c'.*needs tokens and draft_chain"):
        plain.require_tokens("Appendix B")
    assert a.truncated(2).draft_chain.shape == (9, 2)
    with pytest.raises(ValueError, match="draft_chain must have shape"):
        a.__class__(**{**a.__dict__, "draft_chain": np.zeros((9, 2), dtype=int)})


class Vocabulary:
    """A tokenizer over a fixed list of token texts (decode joins them)."""
    def __init__(self, words):
        self.words = words

    def decode(self, ids):
        return "".join(self.words[i] for i in ids)


def test_appendix_b_on_synthetic_text():
    words = [" the", " cat", ".", "\n", " 19", " It", "ing", " слово"]
    rng = np.random.default_rng(3)
    items = []
    for s in range(3):
        it = synthetic_inputs(n=30, lmax=4, seed=s, seq_id=f"s{s}")
        items.append(it.__class__(**{**it.__dict__, "tokens": rng.integers(0, len(words), it.n),
                                     "draft_chain": rng.integers(0, len(words), (it.n, it.lmax))}))
    model = CostModel(draft_a=0.2, draft_b=0.1, beta0=3.0, alpha=0.3, c=0.0)
    by_t = {t: SimpleNamespace(solved=[A.solve(it.with_transitions(t), model) for it in items]) for t in ("surrogate", "greedy")}
    out = B.appendix_b(items, by_t, Vocabulary(words), n_boot=99)
    assert out.label_counts.positions.sum() == 90
    for t in by_t:
        b3 = out.b3[out.b3.transitions == t]
        assert b3.decisions.sum() == 90
        d = out.decisions[t]
        assert (d.k == np.concatenate([s.policy for s in by_t[t].solved])).all()
        row = b3.set_index("label").loc["script change"]
        assert row.decisions == sum(lab == "script change" for labs in out.labels.values() for lab in labs)
    assert out.b5.transitions.tolist()[:2] == ["any (no decision enters)"] * 2
    no_text = B.appendix_b(items, by_t, None, n_boot=9)
    assert set(no_text.b3[no_text.b3.decisions > 0].label) == {B.NO_TEXT}
