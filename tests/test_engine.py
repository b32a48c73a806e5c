"""The whole-model engine: the dedup switch gives the model's own outputs and the same greedy
tokens either way; speculative decoding is lossless; the oracle draft's acceptance is geometric."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from fakes import FakeTarget

from moespec.engine import (Engine, ModelDraft, OracleDraft, Switch, speculative_generate,
                            speculative_step, summarize_steps)
from moespec.engine.runs import greedy_agreement, oracle_sweep, real_draft_sweep
from moespec.engine.verify import measure_verify_times, summarize_verify
from moespec.theory import expected_tokens
from moespec.zoo import tiny_draft, tiny_moe


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Batch-one passes of a tiny model: one thread avoids oversubscribing the shared cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def engine():
    model = tiny_moe(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)
    return Engine(model, backend="torch")


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(0)
    return [rng.integers(1, 256, size=24) for _ in range(2)]


def test_switch_dispatch():
    s = Switch()
    assert [s.kernel_for(n) for n in (1, 2, 9, 10)] == ["slot", "slot", "slot", "dedup"]
    s.dedup = True
    assert [s.kernel_for(n) for n in (1, 2, 9, 10)] == ["slot", "dedup", "dedup", "dedup"]
    with pytest.raises(ValueError, match="n=0"):
        s.kernel_for(0)


@pytest.mark.parametrize("lean", [True, False])
def test_engine_matches_model_and_settings_agree(prompts, lean):
    model = tiny_moe(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)
    ids = torch.as_tensor(prompts[0])
    with torch.no_grad():
        ref = model(input_ids=ids.view(1, -1)).logits[0]
    eng = Engine(model, backend="torch", lean=lean)
    calls = []
    import moespec.engine.switch as K  # transformers' path calls the kernels through switch.expert_forward
    orig = K.expert_forward
    K.expert_forward = lambda *a, **kw: (calls.append(kw["kernel"]), orig(*a, **kw))[1]
    if lean:  # the lean path calls each layer's kernels, resolved once (moespec.engine.lean)
        for lay in eng.plan().layers:
            lay.kernels = {k: (lambda f, k: lambda *a: (calls.append(k), f(*a))[1])(f, k)
                           for k, f in lay.kernels.items()}
    try:
        for dd in (False, True):
            eng.dedup = dd
            eng.prefill(prompts[0][:15])
            calls.clear()
            eng.forward(prompts[0][15:])  # one pass of 9 tokens
            assert calls == ["dedup" if dd else "slot"] * 2  # one kernel call per layer
            assert torch.allclose(eng.last_logits, ref[15:], atol=1e-5)
    finally:
        K.expert_forward = orig


def test_greedy_and_verify_argmax_equal_with_dedup_off_and_on(engine, prompts):
    agree = greedy_agreement(engine, prompts, n_tokens=20)
    assert (agree["greedy_equal"] == 20).all() and agree["first_divergence"].isna().all()
    assert (agree["verify_argmax_equal"] == agree["verify_rows"]).all()


def test_speculative_is_lossless_on_the_engine(engine, prompts):
    first = engine.prefill(prompts[1])
    greedy = [first] + engine.greedy(first, 29)
    engine.crop(len(prompts[1]))
    engine.dedup = True
    out, steps = speculative_generate(engine, OracleDraft(engine, 0.7, 256, seed=3), prompts[1], 4, 30,
                                      first=first)
    engine.dedup = False
    assert out[:30] == greedy and engine.length == len(prompts[1])
    assert summarize_steps(steps)["cut_short"] == 0


def test_oracle_reference_extended_past_its_horizon_is_the_targets_greedy_text(engine, prompts):
    """A short horizon makes the oracle extend its reference mid-run, after partly accepted rounds:
    the extension continues the emitted text, so a draft the oracle did not corrupt is never
    rejected (every rejection is of a corrupted token)."""
    first = engine.prefill(prompts[1])
    engine.crop(len(prompts[1]))
    out, steps = speculative_generate(engine, OracleDraft(engine, 0.6, 256, seed=5, horizon=1), prompts[1], 4, 40,
                                      first=first)
    rejected = [s for s in steps if s.rejected]
    assert rejected and all(s.corrupted_reject for s in rejected)
    assert any(0 < s.accepted < 4 for s in steps)          # partly accepted rounds: the extension case


def test_model_draft_is_lossless_and_same_model_accepts_all(engine, prompts):
    first = engine.prefill(prompts[0])
    greedy = [first] + engine.greedy(first, 19)
    engine.crop(len(prompts[0]))
    out, _ = speculative_generate(engine, ModelDraft(tiny_draft(seed=2, vocab_size=256)), prompts[0], 3, 20,
                                  first=first)
    assert out[:20] == greedy
    twin = tiny_moe(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)
    out, steps = speculative_generate(engine, ModelDraft(twin), prompts[0], 3, 20, first=first)
    assert out[:20] == greedy
    assert sum(s.accepted for s in steps[:-1]) == 3 * (len(steps) - 1)


class _ListDraft:
    """Proposes fixed drafts (deterministic), counting its calls."""

    last_corrupted: list[bool] = []

    def __init__(self, drafts):
        self.drafts, self.calls = list(drafts), 0

    def prepare(self, generated, current, k):
        return None

    def propose(self, generated, current, k):
        self.calls += 1
        return self.drafts[:k]


class _TickClock:
    """A fake clock advancing by the next of ``ticks`` at every reading."""

    def __init__(self, ticks):
        self.t, self.ticks = 0.0, iter(ticks)

    def __call__(self):
        self.t += next(self.ticks)
        return self.t


def test_speculative_step_accepts_the_agreeing_prefix_and_times_medians():
    target = FakeTarget(vocab=100, a=1, b=1)             # greedy after t is t + 1
    target.prefill([1, 2, 3])                             # current = 4
    good = [5, 6, 7, 50]                                  # 3 agree, then a miss
    once = speculative_step(target, _ListDraft(good), [], 4, 4)
    assert (once.accepted, once.emitted, once.next_token, once.length) == (3, [5, 6, 7], 8, 3)
    assert target.tokens == [1, 2, 3, 4, 5, 6, 7]         # current + accepted drafts kept
    # three repetitions: same result, cache cropped back between verify passes, medians of the times
    target.prefill([1, 2, 3])
    draft = _ListDraft(good)
    # clock readings: t0, 3 x (draft start, end), 3 x (verify start, end), host start, end
    clock = _TickClock([0, 0, 1, 0, 5, 0, 2, 0, 10, 0, 30, 0, 20, 0, 7])
    cleared = []
    rep = speculative_step(target, draft, [], 4, 4, repeats=3, clock=clock, before_verify=lambda: cleared.append(1))
    assert (rep.drafts, rep.argmax, rep.accepted) == (once.drafts, once.argmax, once.accepted)
    assert target.tokens == [1, 2, 3, 4, 5, 6, 7] and draft.calls == 3 and len(cleared) == 3
    assert (rep.t_draft_s, rep.t_verify_s) == (2.0, 20.0)
    assert rep.t_step_s == pytest.approx(2.0 + 20.0 + 7.0)
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        speculative_step(target, draft, [], 8, 2, repeats=0)
    with pytest.raises(ValueError, match="OracleDraft draws them at random"):
        speculative_step(target, OracleDraft(target, 0.5, 100), [], 8, 2, repeats=2)


@pytest.mark.parametrize("a, k", [(0.3, 2), (0.6, 4), (0.9, 8)])
def test_oracle_acceptance_is_geometric_on_a_long_run(a, k):
    target = FakeTarget(vocab=1000)
    out, steps = speculative_generate(target, OracleDraft(target, a, 1000, seed=11), [5], k, 20000)
    s = summarize_steps(steps)
    assert abs(s["realized_a"] - a) < 0.04
    assert s["tokens_per_step"] == pytest.approx(expected_tokens(a, k), rel=0.03)
    assert s["cut_short"] == 0
    chain = [target.next_of(5)]
    for _ in range(49):
        chain.append(target.next_of(chain[-1]))
    assert out[:50] == chain


def test_sweeps_and_summaries_on_the_engine(engine, prompts):
    rows, info = measure_verify_times(engine, prompts, n_max=3, reps=3, warmup=0, depth=24, progress=False)
    assert len(rows) == 2 * 3 * 2 * 3 and info["argmax_agree_settings"] == info["argmax_rows"] == 6
    assert info["routing"][0].shape == (3, 2, 4)
    summ = summarize_verify(rows, n_boot=50)
    assert list(summ["n"]) == [1, 2, 3]
    assert (summ["S_lo_s"] <= summ["S_hi_s"]).all()
    runs = oracle_sweep(engine, prompts[:1], [0, 2], [0.5], n_tokens=8, depth=24, progress=False)
    assert set(runs["k"]) == {0, 2} and (runs.loc[runs["k"] == 0, "tokens_per_step"] == 1).all()
    real = real_draft_sweep(engine, tiny_draft(seed=2, vocab_size=256), prompts[:1], [1, 2], 6, progress=False)
    assert list(real["k"]) == [0, 1, 2] and real.loc[real["k"] == 0, "speedup"].iloc[0] == 1.0
