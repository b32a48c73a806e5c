"""Round calibration: the terms of the round model timed where rounds run, before the speculative
runs that test the predictions made from them (paper 1's protocol: inputs first, tests after;
:mod:`moespec.predict.round_model`).

* :func:`verify_loops`: teacher-forced decode loops, one per pass size n = 1..n_max and kernel:
  speculative decoding with the oracle draft at acceptance 1 and draft length k = n - 1, so that
  every verify pass holds n tokens, each follows the previous round's pass and the host's work of a
  round, and the cache grows as in decoding (over the same ``n_tokens`` positions as the runs it
  predicts). Each loop is preceded by a same-round reference read. Gives tau_p(n) for both kernels,
  the host time h(k) and the oracle draft's own time per round.
* the draft's time as it runs comes from the real-draft runs on calibration prompts (other MT-Bench
  turns than the runs it predicts), with the per-slot kernel for the draft as trained
  (``slot_costs``): in notebook 05 one :func:`moespec.engine.draftcost.interleaved_sweep` with the
  test turns (amendment of 2026-12-05 evening), or :func:`moespec.engine.draftcost.draft_cost_sweep`
  before them (``draft_calibration = "before"``).

Nothing here computes a prediction; the rows go to :mod:`moespec.predict.calibration`.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from moespec.engine.speculative import OracleDraft, speculative_generate, summarize_steps


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
    grid = [(n, dd) for n in range(1, n_max + 1) for dd in (False, True)]
    rng = np.random.default_rng(seed)
    rows = []
    bar = tqdm(total=len(prompts) * reps * len(grid), desc=f"verify loops d={depth}", disable=not progress)
    for pi, prompt in enumerate(prompts):
        prompt = [int(t) for t in prompt]
        engine.dedup = False
        first = engine.prefill(prompt)
        reference_text = [first] + engine.greedy(first, n_tokens + n_max + 1)
        engine.crop(len(prompt))
        for rep in range(reps):
            for gi in rng.permutation(len(grid)):
                n, dd = grid[gi]
                engine.dedup = dd
                drafter = OracleDraft(engine, 1.0, vocab, seed=[seed, pi, rep, n])
                bw = reference() if reference is not None else float("nan")
                _, steps = speculative_generate(engine, drafter, prompt, n - 1, n_tokens, first=first,
                                                reference=reference_text)
                rows.append({"prompt": first_prompt + pi, "d": depth if depth is not None else len(prompt), "n": n, "k": n - 1,
                             "dedup": dd, "rep": rep, "ref_GBps": bw, **summarize_steps(steps)})
                bar.update()
    bar.close()
    engine.dedup = False
    return pd.DataFrame(rows)
