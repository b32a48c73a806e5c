"""Round calibration: the terms of the round model timed where rounds run, in the same shuffled
sweep as the runs that test the predictions made from them, on prompts those runs do not use
(:mod:`moespec.predict.round_model`).

* :func:`verify_loops`: teacher-forced decode loops, one per pass size n = 1..n_max and kernel:
  speculative decoding with the oracle draft at acceptance 1 and draft length k = n - 1, so that
  every verify pass holds n tokens, each follows the previous round's pass and the host's work of a
  round, and the cache grows as in decoding (over the same ``n_tokens`` positions as the runs it
  predicts). Each loop is preceded by a same-round reference read. Gives tau_p(n) for both kernels,
  the host time h(k) and the oracle draft's own time per round.
* :func:`depth_sweep`: those loops and the oracle runs of their depth in one shuffled order, so
  that the calibration meets the machine its runs meet (notebook 05's oracle-draft calibration).
* the real draft's terms come from its runs on calibration prompts (other MT-Bench turns than the
  runs it predicts) in one :func:`moespec.engine.draftcost.interleaved_sweep` with the test turns,
  the draft as trained also with the per-slot kernel (``slot_costs``).

Nothing here computes a prediction; the rows go to :mod:`moespec.predict.calibration`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from moespec.progress import tqdm

from moespec.engine.runs import oracle_run_row, prompt_reference, timed_oracle_run


def verify_loops(engine, prompts: list, n_max: int = 9, n_tokens: int = 48, reps: int = 1, seed: int = 0,
                 depth: int | None = None, reference=None, vocab: int | None = None,
                 progress: bool = True, first_prompt: int = 0) -> pd.DataFrame:
    """Decode loops with verify passes of n = 1..n_max tokens, with deduplication off and on, on
    every prompt, ``reps`` times, in a seeded random order per prompt and repetition (module
    docstring). One row per loop: prompt, d, n, k (= n - 1), dedup, rep, ref_GBps and the fields of
    :func:`moespec.engine.speculative.summarize_steps` (per-round means of the verify pass
    ``t_verify_mean_s``, the draft ``t_draft_mean_s``, the host ``t_host_mean_s``). ``prompt`` is
    the prompt's index in the caller's list of the depth's prompts: ``first_prompt`` + its place in
    ``prompts`` (so that the rows say which prompts the calibration used)."""
    if n_max < 1 or n_tokens < 1 or reps < 1:
        raise ValueError(f"need n_max >= 1, n_tokens >= 1 and reps >= 1; got {n_max}, {n_tokens}, {reps}")
    vocab = vocab or engine.model.config.vocab_size
    grid = _loop_grid(n_max)
    rng = np.random.default_rng(seed)
    rows = []
    bar = tqdm(total=len(prompts) * reps * len(grid), desc=f"verify loops d={depth}", disable=not progress)
    for pi, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        engine.dedup = False
        first, text = prompt_reference(engine, prompt, n_tokens + n_max + 1)
        for rep in range(reps):
            for gi in rng.permutation(len(grid)):
                rows.append(_loop_run(engine, prompt, first, text, grid[gi], pi, rep, vocab, seed, n_tokens, reference,
                                      first_prompt, depth))
                bar.update()
    bar.close()
    engine.dedup = False
    return pd.DataFrame(rows)


def _loop_grid(n_max: int) -> list:
    """The (pass size n, deduplicating) cells of one prompt's verify loops."""
    return [(n, dd) for n in range(1, n_max + 1) for dd in (False, True)]


def _loop_run(engine, prompt, first, text, cell, pi, rep, vocab, seed, n_tokens, reference, first_prompt,
              depth) -> dict:
    """One verify loop of prompt ``pi`` (the oracle draft at acceptance 1 and k = n - 1, kernel
    ``cell[1]``, seeded by (``seed``, prompt, repetition, n)) as a row; the row's prompt is
    ``first_prompt`` + ``pi``."""
    n, dd = cell
    engine.dedup = dd
    return {"prompt": first_prompt + pi, "d": depth if depth is not None else len(prompt), "n": n, "k": n - 1,
            "dedup": dd, "rep": rep, **timed_oracle_run(engine, prompt, first, text, n - 1, 1.0, vocab,
                                                        [seed, pi, rep, n], n_tokens, reference)}


def depth_sweep(engine, cal_prompts: list, oracle_prompts: list, ks, a_values, n_tokens: int, n_max: int = 9,
                cal_reps: int = 1, oracle_reps: int = 1, cal_seed: int = 0, oracle_seed: int = 0, seed: int = 0,
                depth: int | None = None, reference=None, vocab: int | None = None, progress: bool = True,
                first_cal_prompt: int = 0, routing_out: list | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The round calibration at one depth and the oracle runs it predicts, in one shuffled order: (the rows of
    :func:`verify_loops` on ``cal_prompts``, the rows of :func:`moespec.engine.runs.oracle_sweep`
    (deduplicating kernel) on ``oracle_prompts``), each with ``seq``, its place in the one order.

    Every (part, prompt, repetition, cell) is one unit of a plan shuffled with ``seed``, so that the
    calibration meets the same mixture of the machine's states as the runs it predicts, as the real
    draft's calibration does (:func:`moespec.engine.draftcost.interleaved_sweep`); when a unit's
    prompt is not the one the unit before ran on, that one is set aside (the engine's ``hold``) and
    this one resumed from its own prefill (``resume``). Each prompt is prefilled and its greedy continuation decoded
    (untimed) with its own part's kernel, and each run's draft is seeded as in the two sweeps
    (``cal_seed``, ``oracle_seed``), so the tokens and steps of every run are those of the two
    sweeps run one after the other; only the order, and so the machine each run meets, differs.
    ``routing_out`` receives the oracle prompts' routing as :func:`~moespec.engine.runs.oracle_sweep`'s."""
    if n_max < 1 or n_tokens < 1 or cal_reps < 1 or oracle_reps < 1:
        raise ValueError(f"need n_max, n_tokens, cal_reps and oracle_reps >= 1; got {n_max}, {n_tokens}, {cal_reps}, "
                         f"{oracle_reps}")
    if not cal_prompts or not oracle_prompts:
        raise ValueError(f"a depth sweep needs calibration and oracle prompts; got {len(cal_prompts)} and "
                         f"{len(oracle_prompts)}")
    vocab = vocab or engine.model.config.vocab_size
    ks, a_values = list(ks), list(a_values)
    if not ks or not a_values:
        raise ValueError("a depth sweep needs at least one draft length k and one acceptance a")
    parts = {"cal": ([[int(t) for t in p] for p in cal_prompts], False, n_tokens + n_max + 1),
             "oracle": ([[int(t) for t in p] for p in oracle_prompts], True, n_tokens + max(ks) + 1)}
    plan = ([("cal", pi, rep, cell) for pi in range(len(cal_prompts)) for rep in range(cal_reps)
             for cell in _loop_grid(n_max)]
            + [("oracle", pi, rep, (k, a)) for pi in range(len(oracle_prompts)) for rep in range(oracle_reps)
               for k in ks for a in a_values])
    plan = [plan[j] for j in np.random.default_rng(seed).permutation(len(plan))]
    texts, held, current, first = {}, {}, None, None
    for part, pi in ((part, pi) for part in parts for pi in range(len(parts[part][0]))):   # untimed, part by part
        prompts, dedup, length = parts[part]
        engine.dedup = dedup
        texts[part, pi] = prompt_reference(engine, prompts[pi], length)[1]
        if part == "oracle" and routing_out is not None:
            routing_out.append(engine.record_routing(texts[part, pi][:n_tokens]))
        held[part, pi] = engine.hold(texts[part, pi][0])
    rows = {"cal": [], "oracle": []}
    for seq, (part, pi, rep, cell) in enumerate(tqdm(plan, desc=f"calibration and oracle runs d={depth}",
                                                     disable=not progress)):
        prompt, text = parts[part][0][pi], texts[part, pi]
        if current != (part, pi):
            if current is not None:
                held[current] = engine.hold(first)
            first, current = engine.resume(held.pop((part, pi))), (part, pi)
        if part == "cal":
            row = _loop_run(engine, prompt, first, text, cell, pi, rep, vocab, cal_seed, n_tokens, reference,
                            first_cal_prompt, depth)
        else:
            engine.dedup = True
            row = oracle_run_row(engine, prompt, first, text, cell, pi, rep, vocab, oracle_seed, n_tokens, reference,
                                 depth)
        rows[part].append({**row, "seq": seq})
    engine.dedup = False
    return pd.DataFrame(rows["cal"]), pd.DataFrame(rows["oracle"])
