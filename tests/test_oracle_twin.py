"""The routing twin (moespec.engine.subject.routing_twin) that notebook 07's junk tails and notebook
06's WikiText routing run on: the byte-faithful subjects' narrow model gives the subject's routing
(counterfactual unions cell for cell, recorded traces expert for expert), and both fall back to the
subject's own target when a twin disagrees."""

from __future__ import annotations

import numpy as np
import pytest

from moespec import zoo
from moespec.engine.operation import layer_weights, record_trace, record_trace_on_twin
from moespec.engine.subject import load_subject, routing_twin
from moespec.oracle.junk import junk_tails, junk_tails_summary, sequences_junk_tails, twin_agreement


@pytest.fixture(scope="module")
def wide():
    return load_subject("byte-faithful-all", profile="quick")


def _prompts(sub, count=2, length=10):
    rng = np.random.default_rng(3)
    return [{"ids": [int(t) for t in rng.integers(1, sub.vocab_size, size=length)], "question_id": f"q{i}",
             "category": "c"} for i in range(count)]


def _references(sub, prompts, length=5):
    rng = np.random.default_rng(4)
    return {p["question_id"]: [int(t) for t in rng.integers(1, sub.vocab_size, size=length)] for p in prompts}


@pytest.mark.parametrize("kind", ["byte-faithful", "byte-faithful-all"])
def test_twin_routes_as_the_widened_target(kind):
    sub = load_subject(kind, profile="quick")
    twin = routing_twin(sub, "quick").model
    assert twin is not sub.target
    prompts = _prompts(sub, 1)
    got = twin_agreement(sub.target, twin, sub.draft, prompts[0]["ids"], _references(sub, prompts)["q0"], states=4,
                         lmax=3, seed=0)
    # union cells (i, k, a) with a <= k: 4 states x (2 + 3 + 4)
    assert got["states"] == 4 and got["union_cells"] == 4 * (2 + 3 + 4)
    assert got["union_cells_equal"] == got["union_cells"] and got["union_max_abs_diff"] == 0.0
    assert got["p_max_abs_diff"] == 0.0 and got["q_max_abs_diff"] == 0.0


def test_no_twin_for_unwidened_subjects():
    assert routing_twin(load_subject("default", profile="quick"), "quick") is None
    assert routing_twin(load_subject("replay", profile="quick", trace_file="synthetic"), "quick") is None


def test_tails_on_the_twin_equal_the_targets(wide):
    twin = routing_twin(wide, "quick").model
    prompts = _prompts(wide)
    refs = _references(wide, prompts)
    on_twin, agreement = sequences_junk_tails(wide.target, wide.draft, prompts, refs, lmax=3, seed=5, twin=twin,
                                              check_states=3, progress=False)
    assert agreement["used"] == "twin"
    for s, (p, it) in enumerate(zip(prompts, on_twin)):
        own = junk_tails(wide.target, wide.draft, p["ids"], refs[p["question_id"]], lmax=3, seed=5 + s)
        np.testing.assert_array_equal(it.U, own.U)
        np.testing.assert_array_equal(it.p, own.p)
        assert it.seq_id == p["question_id"] and it.category == "c"
    line = junk_tails_summary(on_twin, agreement, 1.0, 2)
    assert "10 positions" in line and "its narrow twin" in line and f"{agreement['union_cells']} of" in line


def test_a_twin_that_routes_otherwise_is_not_used(wide):
    other = zoo.tiny_moe(seed=11, vocab_size=wide.vocab_size)       # another model of the same family
    prompts = _prompts(wide, 1)
    refs = _references(wide, prompts)
    items, agreement = sequences_junk_tails(wide.target, wide.draft, prompts, refs, lmax=3, seed=0, twin=other,
                                            check_states=3, progress=False)
    assert agreement["used"] == "target" and agreement["union_cells_equal"] < agreement["union_cells"]
    own = junk_tails(wide.target, wide.draft, prompts[0]["ids"], refs["q0"], lmax=3, seed=0)
    np.testing.assert_array_equal(items[0].U, own.U)
    assert "the subject's target" in junk_tails_summary(items, agreement, 1.0, 1)
    assert sequences_junk_tails(wide.target, wide.draft, prompts, refs, lmax=3, progress=False)[1] is None


def test_fits_routing_on_the_twin_is_the_engines(wide):
    """Notebook 06's WikiText routing (record_trace_on_twin): recorded on the twin, every document's
    routing and the expert bytes are those recorded on the subject's engine; a twin that routes
    otherwise is not used."""
    rng = np.random.default_rng(7)
    docs = [rng.integers(1, wide.vocab_size, size=n) for n in (40, 25, 70)]
    own = record_trace(wide.engine, docs, 32, source="t")
    on_twin, ran = record_trace_on_twin(wide.engine, routing_twin(wide, "quick"), docs, 32, source="t")
    assert ran == "twin" and on_twin.num_docs == own.num_docs == 2 + 1 + 3
    for a, b in zip(on_twin.docs, own.docs):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(on_twin.expert_bytes, own.expert_bytes)
    assert on_twin.expert_bytes[0] > layer_weights(routing_twin(wide, "quick"))[0].bytes_per_expert   # the wide bytes
    other = load_subject("default", profile="quick", fmt="int8_b32")
    other.engine.model.model.layers[0].mlp.gate.weight.data.mul_(-1.0)         # routes otherwise
    fallback, ran = record_trace_on_twin(wide.engine, other.engine, docs, 32, source="t")
    assert ran == "engine"
    for a, b in zip(fallback.docs, own.docs):
        np.testing.assert_array_equal(a, b)
    assert record_trace_on_twin(wide.engine, None, docs, 32, source="t")[1] is None
