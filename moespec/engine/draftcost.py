"""The real-draft experiment at several draft costs (paper 1, Appendix D.3; paper 2's EAGLE-3 regime).

Paper 1's real draft (Qwen3-0.6B for Qwen3-30B-A3B) costs a sizeable share of a target pass;
paper 2's EAGLE-3 draft about 0.08 of one. Here the draft's cost per token is a parameter of the
subject: the same trained draft with its dense MLPs widened function-preservingly
(:func:`moespec.engine.subject.widen_draft`, knob ``draft_cost`` = its MLP bytes per token as a
share of the target's expert bytes per token). Widening changes no token, so every draft of the
sweep proposes the same tokens and the acceptance is the same at every cost: only time moves.

* :func:`draft_cost_ratios`: the measured cost ratio c = one draft token / one target decode
  step, both timed in the same interleaved rounds, per draft;
* :func:`draft_cost_sweep`: speculative runs of every draft at every k on every prompt, and
  plain decoding (k = 0), in a seeded random order per prompt and repetition, each run after a
  same-round reference read; speedup over the same prompt's plain runs of the same regime;
* :func:`interleaved_sweep`: several sets of turns (:class:`SweepPart`: a round calibration's and
  the test turns it predicts) in one shuffled order, so that each meets the same mixture of the
  machine's states;
* the predictions of these runs are the round model's (:mod:`moespec.predict.speculative`), from
  terms measured before them (:mod:`moespec.engine.calibration`).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import pandas as pd
from moespec.progress import tqdm

from moespec import paper_reference
from moespec.engine.speculative import ModelDraft, speculative_generate, summarize_steps
from moespec.measure.regimes import classify
from moespec.measure.timing import time_interleaved
from moespec.runstats import speedups_by_part


def draft_cost_ratios(engine, drafts: dict, prompt, reps: int = 30, warmup: int = 2, reference=None) -> pd.DataFrame:
    """Per draft (``drafts``: knob -> draft model): the median time of one drafted token
    (``ModelDraft.propose`` with k = 1 at the prompt's end), of one target decode step at the same
    position, and their ratio per round (median, quartiles), all interleaved in one run with an
    optional reference read (``ref_GBps``)."""
    prompt = [int(t) for t in prompt]
    d = len(prompt)
    first = engine.prefill(prompt)

    def step():
        engine.forward([first])
        engine.crop(d)

    calls = {"target_step": step}
    for r, model in drafts.items():
        drafter = ModelDraft(model)
        drafter.begin(prompt, first)
        calls[r] = (lambda drafter=drafter: drafter.propose([], first, 1))
    if reference is not None:
        calls["read"] = reference.fn
    t = time_interleaved(calls, reps=reps, warmup=warmup)
    base = np.asarray(t["target_step"].samples_ns, float)
    bw = (reference.nbytes / np.asarray(t["read"].samples_ns, float)) if reference is not None else None
    rows = []
    for r in drafts:
        ratio = np.asarray(t[r].samples_ns, float) / base
        rows.append({"draft_cost": float(r), "t_draft_token_s": t[r].median_s,
                     "t_target_step_s": t["target_step"].median_s,
                     "cost_ratio": float(np.median(ratio)), "cost_ratio_q25": float(np.quantile(ratio, 0.25)),
                     "cost_ratio_q75": float(np.quantile(ratio, 0.75)), "reps": reps,
                     "ref_GBps": float(np.median(bw)) if bw is not None else float("nan")})
    return pd.DataFrame(rows)


def draft_cost_sweep(engine, drafts: dict, prompts: list, ks, n_tokens: int, reps: int = 1, seed: int = 0,
                     dedup: bool = True, reference=None, progress: bool = True, slot_costs=(),
                     desc: str = "draft-cost sweep", plain_runs: int = 1) -> pd.DataFrame:
    """Speculative runs of every draft (knob -> model) at every k in ``ks`` (k >= 1) and plain
    decoding (k = 0, knob NaN) on every prompt (module docstring), with deduplication ``dedup``;
    the drafts whose knob is in ``slot_costs`` also run every k with deduplication off (the
    per-slot kernel's verify passes as the draft runs; a round calibration's rows). Plain decoding
    runs ``plain_runs`` times in each prompt's shuffled grid per repetition, spread through it like
    any other cell: every speedup of the prompt divides by its plain throughput, so one plain run's
    noise would enter all of them at once. The prompts run one after another, each prefilled once.
    One row per run: prompt, draft_cost, k, dedup, rep, seq (its place in the sweep), ref_GBps, the fields of
    :func:`summarize_steps`, ``distinct_experts`` (the mean over the run's verify passes of the
    distinct (expert, layer) pairs each reads, :meth:`moespec.engine.target.Engine.routing_tap`;
    NaN for a target without routing), and ``speedup``: its throughput over the median throughput of the same
    prompt's plain runs in the same bandwidth regime (:func:`moespec.measure.regimes.classify` over
    the run's readings; all of the prompt's plain runs when that regime has none;
    :func:`moespec.runstats.speedup_over_plain`)."""
    part = SweepPart("sweep", list(prompts), reps=reps, slot_costs=tuple(slot_costs), plain_runs=plain_runs)
    drafters, ks = _checked(drafts, ks, [part])
    rng = np.random.default_rng(seed)
    grid = _grid(part, drafters, ks, dedup)
    plan = [(0, pi, rep, grid[gi]) for pi in range(len(prompts)) for rep in range(reps)
            for gi in rng.permutation(len(grid))]
    rows = _run_plan(engine, drafters, [part], plan, n_tokens, reference, progress, desc)
    df = _finish(rows)
    return df.drop(columns="part")


@dataclass(frozen=True)
class SweepPart:
    """One set of turns in :func:`interleaved_sweep`: its prompts, repetitions per prompt, plain
    runs per prompt and repetition, and the drafts that also run with the per-slot kernel (as in
    :func:`draft_cost_sweep`); ``name`` tags its rows (column ``part``)."""
    name: str
    prompts: list
    reps: int = 1
    slot_costs: tuple = ()
    plain_runs: int = 1


def interleaved_sweep(engine, drafts: dict, parts: list, ks, n_tokens: int, seed: int = 0, dedup: bool = True,
                      reference=None, progress: bool = True, desc: str = "interleaved sweep") -> pd.DataFrame:
    """The runs of several :class:`SweepPart` (a round calibration's turns and the test turns it
    predicts, say) in one shuffled order over every part, prompt, repetition and cell, each prompt
    prefilled once and resumed from its prefill whenever a run returns to it: every part meets the
    same mixture of the machine's states, where :func:`draft_cost_sweep` run once per part meets
    the stretch of time it runs in. Rows as :func:`draft_cost_sweep`'s with ``part`` (the part's
    name); ``prompt`` and ``rep`` count within the part, and each run's speedup divides by its own part's plain runs
    of the same prompt. Widening a draft changes no token, and neither does the order: the tokens
    are those of the sweep run part by part."""
    if len({p.name for p in parts}) != len(parts):
        raise ValueError(f"sweep parts need distinct names; found {[p.name for p in parts]}")
    drafters, ks = _checked(drafts, ks, parts)
    plan = [(i, pi, rep, cell) for i, part in enumerate(parts) for cell in _grid(part, drafters, ks, dedup)
            for pi in range(len(part.prompts)) for rep in range(part.reps)]
    rng = np.random.default_rng(seed)
    plan = [plan[j] for j in rng.permutation(len(plan))]
    return _finish(_run_plan(engine, drafters, parts, plan, n_tokens, reference, progress, desc))


def split_parts(rows: pd.DataFrame, parts: list) -> tuple:
    """:func:`interleaved_sweep`'s rows as one frame per part, in the order of ``parts``, without
    the ``part`` column (each as :func:`draft_cost_sweep` would give it)."""
    return tuple(rows[rows["part"] == p.name].drop(columns="part").reset_index(drop=True) for p in parts)


def _checked(drafts: dict, ks, parts: list) -> tuple[dict, list]:
    ks = sorted({int(k) for k in ks if int(k) >= 1})
    if not ks:
        raise ValueError("ks must hold at least one draft length >= 1")
    for part in parts:
        if int(part.plain_runs) < 1:
            raise ValueError(f"plain_runs must be at least 1 (plain runs per prompt and repetition); found "
                             f"{part.plain_runs}")
        if unknown := [r for r in part.slot_costs if r not in drafts]:
            raise ValueError(f"slot_costs {unknown} name no draft of the sweep (knobs {sorted(drafts)})")
        if not part.prompts or int(part.reps) < 1:
            raise ValueError(f"sweep part {part.name!r} needs at least one prompt and one repetition")
    prompts = sum(len(part.prompts) for part in parts)
    return {r: ModelDraft(m, held_prompts=prompts) for r, m in drafts.items()}, ks


def _grid(part: SweepPart, drafters: dict, ks: list, dedup: bool) -> list:
    """The cells one prompt runs per repetition: plain runs, every draft at every k, the per-slot
    drafts at every k."""
    return ([(None, 0, dedup)] * int(part.plain_runs) + [(r, k, dedup) for r in drafters for k in ks]
            + [(r, k, False) for r in part.slot_costs for k in ks])


def _run_plan(engine, drafters: dict, parts: list, plan: list, n_tokens: int, reference, progress: bool,
              desc: str) -> list:
    """Run ``plan`` ((part index, prompt index, repetition, cell) in order), each prompt prefilled
    once: when the run before was on another prompt, that one is set aside (the target's ``hold``)
    and this one resumed from its own prefill (``resume``: the same cache, value for value, as
    prefilling it again, a pass over the whole prompt that measured nothing);
    ``seq`` is each run's place in the plan."""
    prompts = [[[int(t) for t in p] for p in part.prompts] for part in parts]
    rows, current, first, held = [], None, None, {}
    for seq, (i, pi, rep, (r, k, dd)) in enumerate(tqdm(plan, desc=desc, disable=not progress)):
        prompt = prompts[i][pi]
        if current != (i, pi):
            if current is not None:
                held[current] = engine.hold(first)
            first = engine.resume(held.pop((i, pi))) if (i, pi) in held else engine.prefill(prompt)
            current = (i, pi)
        engine.dedup = dd
        bw = reference() if reference is not None else float("nan")
        drafter = drafters[r] if r is not None else drafters[next(iter(drafters))]
        with _routing_tap(engine) as distinct:
            _, steps = speculative_generate(engine, drafter, prompt, k, n_tokens, first=first)
        rows.append({"part": parts[i].name, "prompt": pi, "prompt_tokens": len(prompt),
                     "draft_cost": float("nan") if r is None else float(r), "k": k, "dedup": dd,
                     "rep": rep, "seq": seq, "ref_GBps": bw, **summarize_steps(steps),
                     "distinct_experts": _per_pass_mean(distinct, len(steps))})
    engine.dedup = False
    return rows


@contextmanager
def _routing_tap(engine):
    """The engine's :meth:`~moespec.engine.target.Engine.routing_tap`; None for a target without
    routing (a test's stand-in)."""
    if hasattr(engine, "routing_tap"):
        with engine.routing_tap() as counts:
            yield counts
    else:
        yield None


def _per_pass_mean(counts, steps: int) -> float:
    """A run's mean distinct (expert, layer) pairs per verify pass (one pass per step); NaN without
    a routing tap."""
    if counts is None:
        return float("nan")
    if len(counts) != steps:
        raise RuntimeError(f"routing tap counted {len(counts)} passes for a run of {steps} steps")
    return float(np.mean(counts))


def _finish(rows: list) -> pd.DataFrame:
    """The runs' bandwidth regimes (over every row: one machine) and each run's speedup over its
    own part's plain runs."""
    df = pd.DataFrame(rows)
    df["regime"] = "one" if df["ref_GBps"].isna().all() else classify(df["ref_GBps"].to_numpy(float))
    df["speedup"] = speedups_by_part(df)
    return df


def paper_references() -> dict:
    """The papers' published numbers drawn beside the sweep, labelled as theirs, never inputs:
    paper 1's median real-draft speedup at k = 1 (Appendix D.3) and paper 2's draft time per token
    over its pooled target intercept (eq. (6) / (A3): a drafted token's share of a target pass)."""
    number = paper_reference.paper2_number
    return {"paper1_k1": paper_reference.paper1_scalar("real_draft_median_speedup_k1"),
            "paper2_ratio": number("draft_time_ms") / number("pooled_beta0_ms")}
