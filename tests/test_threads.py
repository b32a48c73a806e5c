"""Untimed work runs on every core (moespec.threads): its numbers must not depend on the thread
count. Routing recorded through the byte-faithful engine (moespec's CPU kernels) and the oracle's
junk tails are compared on one thread and on two."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moespec.engine.operation import record_trace
from moespec.engine.subject import load_subject
from moespec.oracle.junk import junk_tails
from moespec.oracle.record import reference_sequences
from moespec.threads import torch_threads, untimed_threads, usable_cores


@pytest.fixture(scope="module")
def subject():
    return load_subject("byte-faithful", profile="quick")


def test_untimed_threads():
    assert untimed_threads(3) == 3
    assert untimed_threads(0) == usable_cores() >= 1
    with pytest.raises(ValueError, match="untimed_threads must be >= 0"):
        untimed_threads(-1)


def test_torch_threads_restores():
    before = torch.get_num_threads()
    with torch_threads(2):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == before
    with torch_threads(0):
        assert torch.get_num_threads() == before


def test_routing_record_same_on_one_and_two_threads(subject):
    rng = np.random.default_rng(0)
    docs = [rng.integers(1, subject.vocab_size, size=40) for _ in range(3)]
    traces = {}
    for n in (1, 2):
        with torch_threads(n):
            traces[n] = record_trace(subject.engine, docs, 32, source="test")
    assert traces[1].num_docs == traces[2].num_docs == 6        # 40 tokens in segments of 32: 32 + 8
    for a, b in zip(traces[1].docs, traces[2].docs):
        np.testing.assert_array_equal(a, b)


def test_junk_tails_same_on_one_and_two_threads(subject):
    prompt = [int(t) for t in subject.question_prompts(["a question"], 8, seed=0)[0]]
    ref = reference_sequences(subject.engine, [{"question_id": 1, "ids": prompt}], 10, threads=1,
                              progress=False)[1]
    assert reference_sequences(subject.engine, [{"question_id": 1, "ids": prompt}], 10, threads=2,
                               progress=False)[1] == ref
    one, two = (junk_tails(subject.target, subject.draft, prompt, ref, lmax=4, seed=0, threads=n) for n in (1, 2))
    for name in ("p", "greedy", "U", "draft_chain"):
        np.testing.assert_array_equal(getattr(one, name), getattr(two, name), err_msg=name)
    # the draft's q comes from torch's own matmul, whose blocking follows the thread count on some
    # CPUs (an AMD EPYC VM: a few entries one float32 ulp apart); moespec's kernels (p) do not
    np.testing.assert_allclose(one.q, two.q, rtol=1e-6, atol=0, err_msg="q")
    assert np.isfinite(one.U[:, 0, :2]).all()
