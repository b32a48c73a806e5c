"""Speculative decoding at batch B: every sequence drafts k tokens, the target verifies all B
sequences' ``[current] + drafts`` in one pass of n = B(k + 1) tokens (:class:`moespec.engine.batch.BatchEngine`),
and each sequence keeps its own longest agreeing prefix (greedy verification per sequence), so the
sequences' caches become ragged (paper 1, Section 4, at batch B; issue 56).

:class:`BatchModelDraft` is :class:`moespec.engine.speculative.ModelDraft` for B sequences: the real
draft with one KV cache per sequence, each kept in step with its sequence's text, and every draft
pass batched (:class:`moespec.engine.batch.BatchLM`: its dense MLPs and LM head once over the
batch's tokens, attention per sequence). k = 0 with no draft is plain decoding at batch B (one pass
of B tokens per round).

:func:`time_round_terms` times the round model's terms at each B with the interleaved timer of
:mod:`moespec.measure.timing`: the verify pass at n = B(k + 1) and the draft's k tokens for B
sequences, beside the machine's read bandwidth in the same rotation; the host's share of a round
comes from the runs (:func:`summarize_batch_steps`). :class:`BatchOracleDraft` is the oracle draft
(acceptance set by a) per sequence.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import torch

from moespec.engine.batch import BatchEngine, BatchLM, check_batch
from moespec.measure.timing import time_interleaved


class BatchModelDraft:
    """A small causal LM drafting k greedy tokens for each of B sequences, one KV cache per
    sequence, each cropped to the longest prefix it shares with its sequence's text before the
    next draft (as :class:`moespec.engine.speculative.ModelDraft` at batch one). Every draft pass
    runs the B sequences together."""

    def __init__(self, model: torch.nn.Module):
        limit = int(getattr(model.config, "max_position_embeddings", 0) or 0) or 1 << 30
        self.lm = BatchLM(model, prefill_chunk=limit)  # a prompt in one pass, as ModelDraft feeds it
        self.prompts: list[list[int]] = []
        self.cached: list[list[int]] = []  # the tokens each draft cache holds

    def begin(self, prompts) -> None:
        """Start one sequence per prompt (each prompt fed in one pass of the draft)."""
        self.prompts = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
        self.lm.prefill(self.prompts)
        self.cached = [list(p) for p in self.prompts]

    def prepare(self, generated, currents, k) -> None:
        return None

    def rewind(self, lengths) -> None:
        """Keep the first ``lengths[b]`` tokens of each draft cache."""
        self.lm.crop(lengths)
        for row, keep in zip(self.cached, lengths):
            del row[int(keep):]

    def propose(self, generated: list, currents: list, k: int) -> list[list[int]]:
        """k drafts per sequence after ``prompt + generated[b] + [currents[b]]``: a first pass
        feeding what each cache lacks of its text (one token after a rejection, two after a round
        that accepted every draft), then k - 1 passes of one token per sequence."""
        if k == 0:
            return [[] for _ in currents]
        texts = [p + list(g) + [int(c)] for p, g, c in zip(self.prompts, generated, currents)]
        common = []
        for have, text in zip(self.cached, texts):
            j = 0
            for x, y in zip(have, text):
                if x != y:
                    break
                j += 1
            common.append(min(j, len(text) - 1))  # feed at least the current token
        self.rewind(common)
        device = self.lm.device
        segments = [text[j:] for text, j in zip(texts, common)]
        drafts = [[] for _ in texts]
        for step in range(k):
            ids = [torch.tensor(s, dtype=torch.long, device=device) for s in segments]
            logits = self.lm.run(list(range(len(ids))), ids)
            for b, (seg, lg) in enumerate(zip(segments, logits)):
                self.cached[b] += seg
                drafts[b].append(int(lg[-1].argmax()))
            segments = [[d[-1]] for d in drafts]
        return drafts


class BatchOracleDraft:
    """The oracle draft for B sequences (:class:`moespec.engine.speculative.OracleDraft` per
    sequence): each sequence's greedy continuation, each token replaced by a different one with
    probability ``1 - a``, drawn from sequence b's own generator (seeded ``[seed, b]``, so sequence b
    draws what ``OracleDraft(..., seed=[seed, b])`` draws at batch one). The continuations come from
    ``engine`` (a batch-one :class:`moespec.engine.Engine` on the target's model, its own cache),
    untimed in :meth:`prepare`; where a sequence's text leaves its continuation, or the continuation
    runs short, it is decoded again from the sequence's text."""

    def __init__(self, engine, a: float, vocab: int, seed: int = 0, horizon: int = 64):
        if not 0.0 <= a <= 1.0:
            raise ValueError(f"a: the oracle's acceptance must lie in [0, 1], found {a}")
        if vocab < 2:
            raise ValueError(f"vocab: must be >= 2, found {vocab}")
        self.engine, self.a, self.vocab, self.seed, self.horizon = engine, float(a), int(vocab), seed, int(horizon)
        self.prompts: list[list[int]] = []
        self.references: list[list[int]] = []
        self.rngs: list = []

    def begin(self, prompts, references=None) -> None:
        """Start one sequence per prompt; ``references[b]``: prompt b's greedy continuation from its
        first token (default: decoded when first needed)."""
        self.prompts = [[int(t) for t in np.asarray(p).reshape(-1)] for p in prompts]
        self.references = [list(r) for r in references] if references is not None else [[] for _ in self.prompts]
        self.rngs = [np.random.default_rng([self.seed, b]) for b in range(len(self.prompts))]

    def prepare(self, generated: list, currents: list, k: int) -> None:
        """Untimed: every continuation covers its sequence's ``generated + [current]`` and k more tokens."""
        for b, (gen, cur) in enumerate(zip(generated, currents)):
            ref, pos = self.references[b], len(gen)
            ok = len(ref) > pos and ref[pos] == cur and ref[:pos] == list(gen)
            if ok and len(ref) >= pos + 1 + k:
                continue
            if not ok:  # the emitted text left the continuation: restart it from here
                ref = list(gen) + [int(cur)]
            self.engine.prefill(self.prompts[b] + ref[:-1])
            ref = ref + self.engine.greedy(ref[-1], pos + 1 + max(k, self.horizon) - len(ref))
            self.references[b] = ref

    def propose(self, generated: list, currents: list, k: int) -> list[list[int]]:
        return [oracle_drafts(ref[len(gen) + 1: len(gen) + 1 + k], rng, self.a, self.vocab)
                for ref, rng, gen in zip(self.references, self.rngs, generated)]


def oracle_drafts(text, rng, a: float, vocab: int) -> list[int]:
    """The oracle's drafts of the greedy ``text``'s next tokens: each kept with probability ``a``,
    else replaced by any other token (shifted by 1..vocab - 1, drawn from ``rng``)."""
    row = []
    for tok in text:
        if rng.random() >= a:
            tok = (int(tok) + 1 + int(rng.integers(vocab - 1))) % vocab
        row.append(int(tok))
    return row


@dataclass
class BatchStep:
    """One round at batch B: the drafts and the target's argmax over ``[current] + drafts`` of
    every sequence, how many drafts each accepted, the cache lengths before the round, and its times."""

    drafts: list
    argmax: list
    accepted: list
    lengths: list
    t_draft_s: float
    t_verify_s: float
    t_step_s: float  # draft + verify + host work (acceptance, cache crops)

    @property
    def k(self) -> int:
        return len(self.drafts[0])

    @property
    def batch(self) -> int:
        return len(self.drafts)


def batch_speculative_step(target: BatchLM, drafter, generated: list, currents: list, k: int,
                           clock=time.perf_counter) -> BatchStep:
    """One round: the drafter proposes ``k`` tokens per sequence, the target verifies every
    sequence's ``[current] + drafts`` in one pass of B(k + 1) tokens, each sequence keeps its
    longest agreeing prefix and its cache is cropped to it. ``drafter`` None: k must be 0."""
    if drafter is not None:
        drafter.prepare(generated, currents, k)  # untimed: the oracle's continuations
    lengths = target.lengths
    t0 = clock()
    drafts = drafter.propose(generated, currents, k) if drafter is not None else [[] for _ in currents]
    t1 = clock()
    argmax = target.forward([[int(c)] + d for c, d in zip(currents, drafts)])
    t2 = clock()
    accepted = []
    for d, a in zip(drafts, argmax):
        j = 0
        while j < k and d[j] == a[j]:
            j += 1
        accepted.append(j)
    target.crop([n + 1 + j for n, j in zip(lengths, accepted)])  # the current token and the accepted drafts
    t3 = clock()
    return BatchStep(drafts, argmax, accepted, lengths, t1 - t0, t2 - t1, t3 - t0)


def _check_run(k: int, n_tokens: int, drafter) -> None:
    if k < 0:
        raise ValueError(f"k: the draft length must be >= 0, found {k}")
    if n_tokens < 1:
        raise ValueError(f"n_tokens: must be >= 1, found {n_tokens}")
    if k > 0 and drafter is None:
        raise ValueError(f"drafter: k = {k} drafts need a drafter, found none")


def batch_generate(target: BatchLM, prompts, k: int, n_tokens: int, drafter=None, references=None,
                   clock=time.perf_counter, prefilled=None) -> tuple[list[list[int]], list[BatchStep]]:
    """Decode the B = len(prompts) sequences together until each holds at least ``n_tokens``
    tokens after its prompt, with draft length ``k`` (k = 0, ``drafter`` None: plain decoding, one
    pass of B tokens per round); ``references``: the prompts' greedy continuations for a
    :class:`BatchOracleDraft`. Every sequence stays in the batch until the last one is done, so
    every verify pass holds B(k + 1) tokens. Returns each sequence's emitted tokens (its greedy
    first token, then per round the current token's successors it accepted, as
    :func:`moespec.engine.speculative.speculative_generate`) and one :class:`BatchStep` per round.
    ``prefilled``: the prompts' greedy first tokens where ``target`` already holds these prompts'
    caches and nothing after them (a :class:`RoundSetup` restored): the run starts there instead of
    prefilling again, with the same tokens (the caches hold the same values)."""
    _check_run(k, n_tokens, drafter)
    prompts = list(prompts)
    check_batch(len(prompts), "prompts")
    if prefilled is None:
        currents = target.prefill(prompts)
    else:
        held, lengths = target.lengths, [len(p) for p in prompts]
        if len(prefilled) != len(prompts) or held != lengths:
            raise ValueError(f"prefilled: expected the first tokens of {len(prompts)} prompts whose caches hold "
                             f"{lengths} positions; found {len(prefilled)} tokens and caches of {held}")
        currents = [int(t) for t in prefilled]
    if drafter is not None:
        drafter.begin(prompts) if references is None else drafter.begin(prompts, references)
    generated: list[list[int]] = [[] for _ in prompts]
    steps: list[BatchStep] = []
    while min(len(g) for g in generated) < n_tokens:
        st = batch_speculative_step(target, drafter, generated, currents, k, clock=clock)
        for b, (g, j) in enumerate(zip(generated, st.accepted)):
            g += [currents[b]] + st.drafts[b][:j]
            currents[b] = st.argmax[b][j]
        steps.append(st)
    return generated, steps


def summarize_batch_steps(steps: list[BatchStep]) -> dict:
    """Tokens, acceptance and times of a run at batch B: ``throughput_per_seq`` (tokens emitted
    per sequence per second), ``throughput_batch`` (all sequences' tokens per second), realized
    acceptance (accepted drafts over accepted drafts plus rejections, pooled over sequences), and
    per-round means of the verify pass, the draft and the host's work outside both (the round
    model's terms at this B)."""
    if not steps:
        raise ValueError("steps: no rounds to summarize")
    B, k = steps[0].batch, steps[0].k
    acc = sum(sum(s.accepted) for s in steps)
    rej = sum(sum(j < k for j in s.accepted) for s in steps)
    emitted = acc + B * len(steps)
    t_total = sum(s.t_step_s for s in steps)
    return {"B": B, "k": k, "n_pass": B * (k + 1), "rounds": len(steps), "emitted": emitted,
            "tokens_per_round_per_seq": emitted / (B * len(steps)),
            "realized_a": acc / (acc + rej) if acc + rej else float("nan"), "time_s": t_total,
            "throughput_per_seq": emitted / B / t_total if t_total > 0 else float("nan"),
            "throughput_batch": emitted / t_total if t_total > 0 else float("nan"),
            "t_step_mean_s": float(np.mean([s.t_step_s for s in steps])),
            "t_verify_mean_s": float(np.mean([s.t_verify_s for s in steps])),
            "t_draft_mean_s": float(np.mean([s.t_draft_s for s in steps])),
            "t_host_mean_s": float(np.mean([s.t_step_s - s.t_verify_s - s.t_draft_s for s in steps]))}


@dataclass
class RoundSetup:
    """B prefilled sequences of the target (a :class:`BatchEngine` of its own) and of the draft, at
    which :func:`time_round_terms` times a round's verify pass and draft; :meth:`restore` crops
    both back to where the round starts. The round starts at the prompts' end (``offset`` 0) or,
    after :meth:`seek`, ``offset`` tokens into each sequence's greedy text (``firsts[b]`` followed
    by ``continuations[b]``), as a decode loop's later round does when every earlier draft was
    accepted. Without a draft the verify pass's drafts are the text's next tokens (so that the pass
    routes as accepted drafts do; no ``continuations`` given: token 0), or with ``oracle`` =
    (a, vocab, seed) the oracle draft's tokens for them (:func:`oracle_drafts`, so that the pass
    holds the replaced tokens a run's rejected drafts bring, drawn from a generator seeded by
    (seed, B, offset, k))."""

    target: BatchLM
    drafter: BatchModelDraft | None
    firsts: list
    base: list
    draft_base: list
    continuations: list | None = None
    offset: int = 0
    prompt_base: list = field(default_factory=list)
    draft_prompt_base: list = field(default_factory=list)
    oracle: tuple | None = None

    def __post_init__(self):
        self.prompt_base = self.prompt_base or list(self.base)
        self.draft_prompt_base = self.draft_prompt_base or list(self.draft_base)
        self._texts = [[int(f)] + [int(t) for t in (self.continuations[b] if self.continuations else [])]
                       for b, f in enumerate(self.firsts)]

    @property
    def batch(self) -> int:
        return len(self.firsts)

    def text(self, b: int) -> list[int]:
        """Sequence b's greedy text after its prompt: its first token, then its continuation (a copy)."""
        return list(self._texts[b])

    @property
    def currents(self) -> list[int]:
        """Each sequence's current token at the round's start (the text's token at ``offset``)."""
        return [t[self.offset] for t in self._texts]

    @property
    def generated(self) -> list[list[int]]:
        """What each sequence emitted before the round: its text's first ``offset`` tokens."""
        return [self.text(b)[:self.offset] for b in range(self.batch)]

    def restore(self) -> None:
        self.target.crop(self.base)
        if self.drafter is not None:
            self.drafter.rewind(self.draft_base)

    def seek(self, offset: int) -> None:
        """Start the round ``offset`` tokens into the greedy text (untimed): both caches are
        cropped to the prompts and fed the text's first ``offset`` tokens (the target in one pass
        per sequence, the draft in one batched pass); ``offset`` 0 is the prompts' end."""
        offset = int(offset)
        if offset < 0:
            raise ValueError(f"offset: must be >= 0, found {offset}")
        if offset and self.continuations is None:
            raise ValueError(f"offset: {offset} needs the sequences' continuations, found none")
        short = [b for b in range(self.batch) if len(self.text(b)) <= offset]
        if short:
            raise ValueError(f"continuations[{short[0]}]: offset {offset} needs more than {offset} tokens of text, "
                             f"found {len(self.text(short[0]))}")
        self.target.crop(self.prompt_base)
        if self.drafter is not None:
            self.drafter.rewind(self.draft_prompt_base)
        self.offset = offset
        if offset:
            fed = [self.text(b)[:offset] for b in range(self.batch)]
            self.target.run(list(range(self.batch)), [torch.tensor(t, device=self.target.device) for t in fed])
            if self.drafter is not None:
                self.drafter.lm.run(list(range(self.batch)), [torch.tensor(t, device=self.drafter.lm.device)
                                                              for t in fed])
                for row, t in zip(self.drafter.cached, fed):
                    row += t
        self.base = self.target.lengths
        self.draft_base = self.drafter.lm.lengths if self.drafter is not None else []

    def previous_round(self, k: int) -> None:
        """The pass a decode loop's round at ``offset`` follows, untimed: the round before it at the
        same k, verified with every draft accepted, which is the target's pass over the min(k + 1,
        ``offset``) tokens of the text just before ``offset`` (cropped off first, so the caches end
        where they started, holding the same values). It leaves in the machine's caches what a run's
        previous round leaves there. At ``offset`` 0 there is no text before the round: nothing runs."""
        m = min(int(k) + 1, self.offset)
        if m == 0:
            return
        self.target.crop([n - m for n in self.base])
        self.target.forward([t[self.offset - m:self.offset] for t in self._texts])

    def drafts(self, k: int) -> list[list[int]]:
        """The k drafts per sequence the verify pass at k checks (the draft's, from the round's start)."""
        if self.drafter is not None:
            out = self.drafter.propose(self.generated, self.currents, k)
            self.restore()
            return out
        if self.continuations is None:
            return [[0] * k for _ in self.firsts]
        short = [b for b, c in enumerate(self.continuations) if len(c) < self.offset + k]
        if short:
            raise ValueError(f"continuations[{short[0]}]: {k} drafts asked at offset {self.offset}, found "
                             f"{len(self.continuations[short[0]])} tokens")
        text = [list(c[self.offset:self.offset + k]) for c in self.continuations]
        if self.oracle is None:
            return text
        a, vocab, seed = self.oracle
        rng = np.random.default_rng([int(seed), self.batch, self.offset, int(k)])
        return [oracle_drafts(t, rng, float(a), int(vocab)) for t in text]


def round_setup(engine, draft_model, prompts, continuations=None, oracle=None) -> RoundSetup:
    """A :class:`RoundSetup` of ``engine`` (a :class:`moespec.engine.Engine`) and ``draft_model``
    (None: the verify pass alone, its drafts ``continuations[b]``, or the oracle's of them with
    ``oracle`` = (a, vocab, seed)) on ``prompts`` (B = their count)."""
    target = BatchEngine(engine)
    firsts = target.prefill(prompts)
    drafter = None
    if draft_model is not None:
        drafter = BatchModelDraft(draft_model)
        drafter.begin(prompts)
    return RoundSetup(target, drafter, firsts, target.lengths, drafter.lm.lengths if drafter is not None else [],
                      [list(c) for c in continuations] if continuations is not None else None, oracle=oracle)


def text_positions(n_tokens: int, count: int) -> list[int]:
    """``count`` positions spread evenly over a run's ``n_tokens`` tokens per sequence (the centres of
    ``count`` equal strata, rounded down): where :func:`time_round_terms` starts its rounds so that
    the terms meet the text the runs decode, not only its first tokens."""
    if n_tokens < 1 or count < 1:
        raise ValueError(f"n_tokens and count: must be >= 1, found {n_tokens} and {count}")
    return [int((i + 0.5) * n_tokens / count) for i in range(count)]


def time_round_terms(setups: list[RoundSetup], ks, reps: int, warmup: int = 1, timer=None,
                     read=None, offsets=(0,)) -> pd.DataFrame:
    """The round terms at every setup's B and every k in ``ks``, at every position of ``offsets``
    (:meth:`RoundSetup.seek`: a round that starts that many tokens into the greedy text), timed per
    position in one rotation of :func:`moespec.measure.timing.time_interleaved` with ``read`` (a
    callable and the bytes it reads, :func:`moespec.measure.timing.read_bandwidth_callable`, made once
    by the caller: allocating the machine's reference buffer takes seconds; None: no read): ``verify``
    (one pass of every sequence's current token and k drafts: n = B(k + 1) tokens) and, with a draft,
    ``draft`` (its k tokens for B sequences, from the round's start). Before every call both are
    cropped back to the round's start (untimed), so each call starts from the same KV caches. A pass's
    experts, and so its time, depend on the tokens it holds; positions spread over a run's text
    (:func:`text_positions`) give terms of the text the runs decode. Inside a run each round follows
    the previous round's pass over the tokens just before it, and what that pass leaves in the
    machine's caches (the experts consecutive tokens share, paper 1's reuse) is part of the round's
    time, so at a position into the text every call follows, untimed, that previous round
    (:meth:`RoundSetup.previous_round`); at the prompts' end, where no round came before, the call
    after the read follows an untimed verify pass. The setups are left at the prompts' end. One row
    per (offset, B, k, term): offset, B, k, n, term, the timing columns (:meth:`moespec.measure.timing.Timing.row`) and ``read_GBps``, the
    read bandwidth of the same rotation."""
    if not setups:
        raise ValueError("setups: nothing to time")
    ks = [int(k) for k in ks]
    if not ks or min(ks) < 0:
        raise ValueError(f"ks: draft lengths >= 0 needed, found {ks}")
    offsets = [int(j) for j in offsets]
    if not offsets:
        raise ValueError("offsets: no position to time the round at")
    frames = []
    try:
        for offset in offsets:
            for s in setups:
                s.seek(offset)
            frames.append(_time_at_offset(setups, ks, reps, warmup, timer, read).assign(offset=offset))
    finally:
        for s in setups:
            s.seek(0)
    df = pd.concat(frames, ignore_index=True)
    return df[["offset"] + [c for c in df if c != "offset"]]


def _time_at_offset(setups: list[RoundSetup], ks: list[int], reps: int, warmup: int, timer, read) -> pd.DataFrame:
    """:func:`time_round_terms` at the setups' current round start."""
    calls, meta = {}, {}
    for s in setups:
        for k in ks:
            segs = [[c] + d for c, d in zip(s.currents, s.drafts(k))]
            name = f"verify B={s.batch} k={k}"
            calls[name] = (lambda t=s.target, x=segs: t.forward(x))
            meta[name] = (s, k, "verify")
            if s.drafter is not None and k > 0:
                name = f"draft B={s.batch} k={k}"
                calls[name] = (lambda d=s.drafter, g=s.generated, c=s.currents, kk=k: d.propose(g, c, kk))
                meta[name] = (s, k, "draft")
    into_text = setups[0].offset > 0
    prepare = {name: (lambda s=s, k=k: s.previous_round(k)) for name, (s, k, _) in meta.items()} if into_text else {}
    nbytes, after_read = 0, []
    if read is not None:
        read_fn, nbytes = read
        calls["read"] = read_fn if into_text else (lambda: (read_fn(), after_read.append(True)))
    warm = next(iter(calls.values()))

    def restore():
        for s in setups:
            s.restore()
        if after_read:  # at the prompts' end (no previous round to run), one untimed pass follows the read
            after_read.clear()
            warm()
            for s in setups:
                s.restore()

    timings = time_interleaved(calls, reps=reps, warmup=warmup, timer=timer, flush=restore, prepare=prepare)
    restore()
    gbps = nbytes / timings["read"].median_s / 1e9 if nbytes else float("nan")
    return pd.DataFrame([{"B": s.batch, "k": k, "n": s.batch * (k + 1), "term": term, **timings[name].row(),
                          "read_GBps": gbps} for name, (s, k, term) in meta.items()])
