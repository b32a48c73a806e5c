"""The whole-model runs of paper 1, Section 4 and Appendix D, as sweeps that return row tables:
the dedup-switch output check, the oracle-draft grid (k = 0..8 x 11 acceptance values) and the
real-draft runs on MT-Bench first turns (Appendix D.3)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from moespec.progress import tqdm

from moespec.engine.speculative import ModelDraft, OracleDraft, speculative_generate, summarize_steps


def greedy_agreement(engine, prompts: list, n_tokens: int) -> pd.DataFrame:
    """Greedy decoding of ``n_tokens`` per prompt with deduplication off and on (Appendix E's
    check): per prompt, the positions that agree and the first divergence (None if none).
    Decoding is one token per pass (the per-slot kernel either way) except the verify-style
    check, so this also runs the whole continuation as one teacher-forced pass per setting."""
    rows = []
    for pi, prompt in enumerate(prompts):
        seqs, forced = {}, {}
        for dd in (False, True):
            engine.dedup = dd
            first = engine.prefill(prompt)
            seqs[dd] = [first] + engine.greedy(first, n_tokens - 1)
            engine.crop(len(prompt))
        for dd in (False, True):  # the same continuation verified in passes of up to 9 tokens
            engine.dedup = dd
            out = []
            for s in range(0, n_tokens - 1, 9):
                out += engine.forward(seqs[False][s:s + 9])
            forced[dd] = out[: n_tokens - 1]
            engine.crop(len(prompt))
        a, b = seqs[False], seqs[True]
        div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        rows.append({"prompt": pi, "tokens": n_tokens, "greedy_equal": int(sum(x == y for x, y in zip(a, b))),
                     "first_divergence": div,
                     "verify_rows": len(forced[False]),
                     "verify_argmax_equal": int(sum(x == y for x, y in zip(forced[False], forced[True]))),
                     "verify_matches_greedy": int(sum(x == y for x, y in zip(forced[True], a[1:])))})
    engine.dedup = False
    return pd.DataFrame(rows)


def oracle_sweep(engine, prompts: list, ks, a_values, n_tokens: int, reps: int = 1, seed: int = 0,
                 depth: int | None = None, dedup: bool = True, vocab: int | None = None,
                 progress: bool = True, routing_out: list | None = None, reference=None) -> pd.DataFrame:
    """Speculative decoding with the oracle draft over every (k, a), on every prompt, ``reps``
    times (paper 1, Section 4 and Appendix D.2), with deduplication ``dedup``.

    Each prompt is prefilled once and its greedy continuation decoded once (untimed); every run
    reuses that cache and crops back to the prompt. Runs of one repetition go in a seeded random
    order. One row per run: the fields of :func:`summarize_steps` plus prompt, d, k, a, rep.
    ``routing_out``: a list that receives, per prompt, the routing ``[n_tokens, L, m]`` of the greedy
    continuation the runs verify (teacher-forced, untimed): the "text" routing of Table 3.
    ``reference``: a :class:`moespec.measure.regimes.ReferenceRead` timed before each run (``ref_GBps``).
    """
    vocab = vocab or engine.model.config.vocab_size
    ks, a_values = list(ks), list(a_values)
    rng = np.random.default_rng(seed)
    grid = [(k, a) for k in ks for a in a_values]
    rows = []
    bar = tqdm(total=len(prompts) * reps * len(grid), desc=f"oracle d={depth}", disable=not progress)
    engine.dedup = dedup
    for pi, prompt in enumerate(prompts):
        first, greedy_text = prompt_reference(engine, prompt, n_tokens + max(ks) + 1)
        if routing_out is not None:
            routing_out.append(engine.record_routing(greedy_text[:n_tokens]))
        for rep in range(reps):
            for gi in rng.permutation(len(grid)):
                rows.append(oracle_run_row(engine, prompt, first, greedy_text, grid[gi], pi, rep, vocab, seed,
                                           n_tokens, reference, depth))
                bar.update()
    bar.close()
    engine.dedup = False
    return pd.DataFrame(rows)


def prompt_reference(engine, prompt, length: int) -> tuple[int, list]:
    """Prefill ``prompt`` (with the engine's current kernel) and decode its greedy continuation of
    ``length`` tokens after the first, untimed, then crop back to the prompt: (the prompt's greedy
    next token, the continuation the oracle draft's runs verify against)."""
    first = engine.prefill(prompt)
    text = [first] + engine.greedy(first, length)
    engine.crop(len(prompt))
    return first, text


def timed_oracle_run(engine, prompt, first: int, text: list, k: int, a: float, vocab: int, seed, n_tokens: int,
                     reference=None) -> dict:
    """One run of speculative decoding with the oracle draft at acceptance ``a`` and draft length
    ``k`` on a prefilled ``prompt`` (``first`` its greedy next token, ``text`` its greedy
    continuation), preceded by a same-round reference read (``ref_GBps``; NaN without ``reference``):
    the fields of :func:`summarize_steps` and ``ref_GBps``. The cache is cropped back to the prompt."""
    drafter = OracleDraft(engine, a, vocab, seed=seed)
    bw = reference() if reference is not None else float("nan")
    _, steps = speculative_generate(engine, drafter, prompt, k, n_tokens, first=first, reference=text)
    return {"ref_GBps": bw, **summarize_steps(steps)}


def oracle_run_row(engine, prompt, first: int, text: list, cell: tuple, pi: int, rep: int, vocab: int, seed,
                   n_tokens: int, reference=None, depth: int | None = None) -> dict:
    """One oracle-grid run (``cell`` = (k, a), the engine's kernel as set) of prompt ``pi`` as
    :func:`oracle_sweep` records it: prompt, d (``depth``, else the prompt's length), k, a, rep and
    :func:`timed_oracle_run`'s fields, the draft seeded by (``seed``, prompt, repetition, k, a)."""
    k, a = cell
    return {"prompt": pi, "d": depth if depth is not None else len(prompt), "k": k, "a": a, "rep": rep,
            **timed_oracle_run(engine, prompt, first, text, k, a, vocab, [seed, pi, rep, k, int(round(a * 1000))],
                               n_tokens, reference)}


def real_draft_sweep(engine, draft_model, prompts: list, ks, n_tokens: int, dedup: bool = True,
                     progress: bool = True) -> pd.DataFrame:
    """Speculative decoding with a real draft model, greedy, against plain decoding (k = 0, the
    same loop with a drafter that never drafts), on every prompt (paper 1, Appendix D.3).
    One row per (prompt, k) with the fields of :func:`summarize_steps` and the speedup over k = 0."""
    ks = sorted(set([0] + list(ks)))
    drafter = ModelDraft(draft_model)
    rows = []
    engine.dedup = dedup
    for pi, prompt in enumerate(tqdm(prompts, desc="real draft", disable=not progress)):
        first = engine.prefill(prompt)
        for k in ks:
            _, steps = speculative_generate(engine, drafter, prompt, k, n_tokens, first=first)
            rows.append({"prompt": pi, "prompt_tokens": len(prompt), "k": k, **summarize_steps(steps)})
    engine.dedup = False
    df = pd.DataFrame(rows)
    plain = df[df["k"] == 0].set_index("prompt")["throughput"]
    df["speedup"] = df["throughput"] / df["prompt"].map(plain)
    return df
