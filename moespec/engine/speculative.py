"""Speculative decoding at batch one: a drafter proposes k tokens, the target verifies them with
the current token in one pass of k + 1 tokens, and the longest agreeing prefix is kept
(Leviathan et al., 2023; paper 1, Sections 1 and 4, Appendix D).

Two drafters: :class:`OracleDraft`, the target's own greedy token corrupted with probability
1 - a by a seeded draw (so acceptance is geometric at rate a, paper 1, Section 4), and
:class:`ModelDraft`, a small causal LM drafting greedily with its own KV cache (Appendix D.3).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Step:
    """One speculative step: k drafted, ``accepted`` of them kept, ``accepted + 1`` emitted."""

    k: int
    accepted: int
    rejected: bool  # a draft was rejected (False when all k were accepted, and at k = 0)
    corrupted_reject: bool  # the first rejected draft was one the oracle corrupted
    t_step_s: float  # draft + verify + host work of the step
    t_verify_s: float  # the target's verify pass alone
    t_draft_s: float


class OracleDraft:
    """Proposes the target's greedy continuation, each token replaced by a different one with
    probability ``1 - a`` (seeded). The greedy continuation is computed once per prompt, outside
    the timed steps; where the emitted text leaves it (the batched verify argmax differs from the
    batch-one greedy token), it is recomputed from there, also untimed."""

    def __init__(self, target, a: float, vocab: int, seed: int = 0, horizon: int = 64):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"oracle acceptance a must lie in [0, 1], got {a}")
        if vocab < 2:
            raise ValueError(f"vocab must be >= 2, got {vocab}")
        self.target, self.a, self.vocab = target, float(a), int(vocab)
        self.rng = np.random.default_rng(seed)
        self.horizon = int(horizon)
        self.reference: list[int] = []  # greedy continuation after the prompt; [0] is the first token
        self.last_corrupted: list[bool] = []

    def begin(self, prompt, first: int, reference: list[int] | None = None) -> None:
        """Start a prompt whose greedy next token is ``first``; ``reference`` may pass a
        precomputed greedy continuation (starting with ``first``)."""
        self.reference = list(reference) if reference is not None else [int(first)]

    def prepare(self, generated: list[int], current: int, k: int) -> None:
        """Untimed: make sure the reference covers ``generated + [current]`` and k more tokens."""
        pos = len(generated)
        ok = (len(self.reference) > pos and self.reference[pos] == current
              and self.reference[:pos] == generated)
        if ok and len(self.reference) >= pos + 1 + k:
            return
        # the target's cache holds the emitted text up to ``current``: the reference is continued from
        # there (a reference that left the emitted text, or too short to cover k, restarts at ``current``)
        self.reference = list(generated) + [int(current)]
        need = max(k, self.horizon)
        start = self.target.length
        self.reference += self.target.greedy(self.reference[-1], need)
        self.target.crop(start)

    def propose(self, generated: list[int], current: int, k: int) -> list[int]:
        pos = len(generated)
        out, flags = [], []
        for tok in self.reference[pos + 1: pos + 1 + k]:
            bad = bool(self.rng.random() >= self.a)
            if bad:  # any other token: shift by 1..vocab-1
                tok = (tok + 1 + int(self.rng.integers(self.vocab - 1))) % self.vocab
            out.append(int(tok))
            flags.append(bad)
        self.last_corrupted = flags
        return out


class ModelDraft:
    """A small causal LM drafting k greedy tokens, with its own KV cache kept in step with the
    emitted text (cropped to the longest prefix it shares with it after every step).

    ``held_prompts``: how many prompts' caches :meth:`begin` keeps (0: none, every run feeds its
    prompt afresh). A run that begins on a kept prompt starts from that prompt's cache cropped back
    to the prompt: the values the prompt's own pass wrote, which no later pass rewrites (a sweep
    that returns to its prompts in a shuffled order feeds each once)."""

    def __init__(self, model: torch.nn.Module, held_prompts: int = 0):
        self.model = model.eval()
        self.device = model.get_input_embeddings().weight.device  # token ids are built there
        self.cache = None
        self.cached: list[int] = []  # the tokens the draft cache holds
        self.last_corrupted: list[bool] = []
        self.held_prompts = int(held_prompts)
        self._held: dict[tuple, object] = {}     # prompt -> its cache, oldest first

    @torch.inference_mode()
    def _feed(self, ids: list[int]) -> int:
        out = self.model(input_ids=torch.tensor([ids], dtype=torch.long, device=self.device), cache=self.cache,
                         use_cache=True)
        self.cached += ids  # the DynamicCache grew in place
        return int(out.logits[0, -1].argmax())

    def begin(self, prompt, first: int, reference=None) -> None:
        from transformers import DynamicCache

        self.prompt = [int(t) for t in prompt]
        key = tuple(self.prompt)
        if key in self._held:
            self.cache = self._held[key]
            extra = int(self.cache.get_seq_length()) - len(self.prompt)   # what the last run on it fed
            if extra > 0:
                self.cache.crop(-extra)
            self.cached = list(self.prompt)
            return
        self.cache = DynamicCache(config=self.model.config)
        self.cached = []
        self._feed(self.prompt)
        if self.held_prompts > 0:
            if len(self._held) >= self.held_prompts:
                del self._held[next(iter(self._held))]
            self._held[key] = self.cache

    def prepare(self, generated, current, k) -> None:
        return None

    def propose(self, generated: list[int], current: int, k: int) -> list[int]:
        if k == 0:
            return []
        text = self.prompt + list(generated) + [int(current)]
        common = 0
        for x, y in zip(self.cached, text):
            if x != y:
                break
            common += 1
        common = min(common, len(text) - 1)  # feed at least the current token
        if common < len(self.cached):
            self.cache.crop(common - len(self.cached))
            del self.cached[common:]
        out = [self._feed(text[common:])]
        while len(out) < k:
            out.append(self._feed([out[-1]]))
        self.last_corrupted = [False] * k
        return out


@dataclass
class StepResult:
    """What one speculative step did: the drafts, the target's argmax over ``[current] + drafts``,
    how many drafts were accepted, the cache length before the step, and its times."""

    drafts: list[int]
    argmax: list[int]
    accepted: int
    length: int  # target positions before the step (prompt + emitted text)
    t_draft_s: float
    t_verify_s: float
    t_step_s: float  # draft + verify + host work (acceptance, cache crop)

    @property
    def emitted(self) -> list[int]:
        """The tokens this step adds after the current one: the accepted drafts."""
        return self.drafts[:self.accepted]

    @property
    def next_token(self) -> int:
        """The target's token after the accepted drafts: the next step's current token."""
        return self.argmax[self.accepted]


def _median_timed(fn, repeats: int, clock, before=None):
    """Run ``fn`` ``repeats`` times (``before`` untimed ahead of each); (median seconds, last result)."""
    times, out = [], None
    for rep in range(repeats):
        if before is not None:
            before(rep)
        t0 = clock()
        out = fn()
        times.append(clock() - t0)
    return float(np.median(times)), out


def speculative_step(target, drafter, generated: list[int], current: int, k: int, repeats: int = 1,
                     clock=time.perf_counter, before_verify=None) -> StepResult:
    """One step: the drafter proposes ``k`` tokens after ``generated + [current]``, the target
    verifies ``[current] + drafts`` in one pass, the longest agreeing prefix is kept and the target's
    cache is cropped to it (Leviathan et al., 2023; paper 1, Section 4).

    ``repeats > 1`` times drafting and verification that many times and keeps the medians (the
    verify pass is re-run after cropping the cache back; both must be deterministic, as
    :class:`ModelDraft` is and :class:`OracleDraft`, which draws corruptions, is not).
    ``before_verify()`` runs untimed before each verify pass (e.g. to clear a router tap, so that
    it holds the last pass's routing afterwards). :meth:`prepare` of the drafter is not timed.
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    if repeats > 1 and isinstance(drafter, OracleDraft):
        raise ValueError("repeats > 1 re-proposes the drafts; OracleDraft draws them at random")
    drafter.prepare(generated, current, k)
    length = target.length
    t0 = clock()
    t_draft, drafts = _median_timed(lambda: drafter.propose(generated, current, k), repeats, clock)

    def reset(rep):
        if rep:
            target.crop(length)  # the earlier repetition's pass
        if before_verify is not None:
            before_verify()

    t_verify, argmax = _median_timed(lambda: target.forward([current] + drafts), repeats, clock, reset)
    t_host = clock()
    j = 0
    while j < k and drafts[j] == argmax[j]:
        j += 1
    target.crop(length + 1 + j)  # keep the current token and the accepted drafts
    t_end = clock()
    t_step = (t_end - t0) if repeats == 1 else (t_draft + t_verify + (t_end - t_host))
    return StepResult(list(drafts), list(argmax), j, length, t_draft, t_verify, t_step)


def speculative_generate(target, drafter, prompt, k: int, n_tokens: int, first: int | None = None,
                         reference: list[int] | None = None, clock=time.perf_counter) -> tuple[list[int], list[Step]]:
    """Generate at least ``n_tokens`` tokens after ``prompt`` with draft length ``k``.

    ``first``: the prompt's greedy next token when the target's cache already holds the prompt
    (a run then reuses the prefill; the cache is cropped back to the prompt at the end). Returns the
    emitted tokens and one :class:`Step` per step (:func:`speculative_step`). The step time covers
    drafting, the verify pass and the host work (acceptance, cache crop); :meth:`OracleDraft.prepare`
    is not timed.
    """
    if k < 0 or n_tokens < 1:
        raise ValueError(f"need k >= 0 and n_tokens >= 1, got k={k}, n_tokens={n_tokens}")
    prompt = [int(t) for t in np.asarray(prompt).reshape(-1)]
    if first is None:
        first = target.prefill(prompt)
    elif target.length != len(prompt):
        raise ValueError(f"target cache holds {target.length} positions, the prompt {len(prompt)}")
    drafter.begin(prompt, first, reference)
    generated: list[int] = []
    current = int(first)
    steps: list[Step] = []
    while len(generated) < n_tokens:
        st = speculative_step(target, drafter, generated, current, k, clock=clock)
        j = st.accepted
        corrupted = bool(j < k and drafter.last_corrupted[j])
        steps.append(Step(k, j, j < k, corrupted, st.t_step_s, st.t_verify_s, st.t_draft_s))
        generated += [current] + st.emitted
        current = st.next_token
    target.crop(len(prompt))
    return generated, steps


def summarize_steps(steps: list[Step]) -> dict:
    """Tokens per step, realized acceptance and throughput of a run.

    Realized acceptance is the geometric maximum-likelihood estimate: accepted drafts over
    accepted drafts plus rejections (drafts after the first rejection are never examined).
    ``catch_up``: the rounds whose draft began by feeding two tokens, the last draft and the
    target's bonus token, because the round before accepted all k drafts (:meth:`ModelDraft.propose`;
    after a rejection it feeds one, the correction); 0 at k = 0, where nothing is drafted. Times
    per round: medians and means of the step, the verify pass and the draft; ``h_median_s`` the
    median of the step outside its verify pass (draft included), ``t_host_mean_s`` the mean of the
    step outside both the verify pass and the draft (the round model's h(k)). ``accepted_hist``: the
    steps that accepted exactly j drafts, j = 0..k, as space-separated counts (the per-position
    acceptance profile of the run: p_i is the share of its steps that accepted at least i).
    """
    if not steps:
        raise ValueError("no steps to summarize")
    acc = sum(s.accepted for s in steps)
    rej = sum(s.rejected for s in steps)
    emitted = acc + len(steps)
    t_total = sum(s.t_step_s for s in steps)
    hist = np.bincount([s.accepted for s in steps], minlength=max(s.k for s in steps) + 1)
    return {"steps": len(steps), "emitted": emitted, "tokens_per_step": emitted / len(steps),
            "accepted": acc, "rejections": rej, "accepted_hist": " ".join(str(int(c)) for c in hist),
            "realized_a": acc / (acc + rej) if acc + rej else float("nan"),
            "cut_short": sum(s.rejected and not s.corrupted_reject for s in steps),
            "catch_up": sum(not s.rejected for s in steps[:-1]) if steps[0].k >= 1 else 0,
            "time_s": t_total, "throughput": emitted / t_total if t_total > 0 else float("nan"),
            "t_step_median_s": float(np.median([s.t_step_s for s in steps])),
            "t_verify_median_s": float(np.median([s.t_verify_s for s in steps])),
            "t_draft_median_s": float(np.median([s.t_draft_s for s in steps])),
            "t_step_mean_s": float(np.mean([s.t_step_s for s in steps])),
            "t_verify_mean_s": float(np.mean([s.t_verify_s for s in steps])),
            "t_draft_mean_s": float(np.mean([s.t_draft_s for s in steps])),
            "h_median_s": float(np.median([s.t_step_s - s.t_verify_s for s in steps])),
            "t_host_mean_s": float(np.mean([s.t_step_s - s.t_verify_s - s.t_draft_s for s in steps]))}
