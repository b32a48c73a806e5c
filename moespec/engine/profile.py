"""Where a pass's time goes, operation by operation: ``torch.profiler`` with its Python tracer over
passes of an :class:`moespec.engine.Engine`, each event's own time given to the part of the pass
whose function called it.

The kernels (:mod:`moespec.kernels`) are pybind11 functions, not torch operators: the profiler sees
them through its Python tracer as calls of built-in methods (``expert_slot``, ``expert_dedup``,
``dense``). Every event (a Python function, a torch operator, a built-in call) has its own time
(its duration less its children's); :func:`op_profile` gives it to the first part (:data:`PARTS`)
that names it or one of its callers, else to ``framework`` (Python and dispatch outside every
named part); the profiler's own start and other threads' events (a progress bar's) are left out.
The tracer slows the Python parts by a factor the profile cannot undo: the shares are of a traced
pass; the step's own time comes from the untraced, interleaved timing beside it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

#: The part of the profiler's own work (starting its trace): left out of every table.
PROFILER = "the profiler itself"
#: The parts of a pass, each with the names (substrings of a profiler event's name) that mark it,
#: checked in this order on the event and then on its callers.
PARTS = {
    PROFILER: ("/profiler.py(",),
    "expert kernel": ("expert_slot", "expert_dedup"),
    "dense kernel (attention, LM head)": ("built-in method dense of",),
    "attention core (sdpa)": ("scaled_dot_product",),
    "norms": ("lean.py({_rms}): _rms", "modeling_olmoe.py({OlmoeRMSNorm}): forward"),
    "rotary": ("): _rotate_half", "): _angles", "): apply_rotary_pos_emb", "): rotate_half",
               "modeling_olmoe.py({OlmoeRotaryEmbedding}): forward"),
    "KV cache": ("cache_utils.py", "): reserve"),
    "causal mask": ("masking_utils.py",),
    "router": ("modeling_olmoe.py({OlmoeTopKRouter}): forward",),
    "kernel calls (padding, checks)": ("): padded", "lean.py({_Padded}): __call__", "switch.py(", "dispatch.py(",
                                       "widen.py(", "dense.py("),
    "attention (reshapes, rotary sums, cache writes)": ("): _attention", "modeling_olmoe.py({OlmoeAttention}): forward",
                                                        "sdpa_attention.py"),
    "MoE block (router ops, gates)": ("): _moe", "modeling_olmoe.py({OlmoeSparseMoeBlock}): forward"),
    "embedding and LM-head glue": ("): embedding", "sparse.py("),
}


def _line(obj) -> int:
    fn = getattr(obj, "forward", None) or getattr(obj, "__call__", None) if isinstance(obj, type) else obj
    return fn.__code__.co_firstlineno


def part_markers() -> dict[str, tuple[str, ...]]:
    """:data:`PARTS` with the ``{name}`` fields filled by the first line of that function in the
    installed sources (the profiler names a Python event ``file(first line): function``)."""
    from transformers.models.olmoe import modeling_olmoe as M

    from moespec.engine import lean

    where = {"_rms": _line(lean._rms), "_Padded": _line(lean._Padded.__call__)}
    for name in ("OlmoeRMSNorm", "OlmoeRotaryEmbedding", "OlmoeTopKRouter", "OlmoeAttention", "OlmoeSparseMoeBlock"):
        fwd = getattr(M, name).forward
        where[name] = _line(getattr(fwd, "__wrapped__", fwd))
    return {part: tuple(m.format(**where) for m in marks) for part, marks in PARTS.items()}


def _part_of(event, markers, memo) -> str:
    """The part of ``event``: the first part naming it or, failing that, its nearest caller."""
    chain, e, found = [], event, "framework"
    while e is not None:
        if id(e) in memo:
            found = memo[id(e)]
            break
        chain.append(e)
        hit = next((part for part, marks in markers.items() if any(m in e.name for m in marks)), None)
        if hit is not None:
            found = hit
            break
        e = e.cpu_parent
    for c in chain:
        memo[id(c)] = found
    return found


def _traced(step) -> tuple[dict, dict]:
    """One profiled call of ``step()``: own time per part and (time, calls) per operation (us)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        step()
    events = prof.events()
    ours = next(e.thread for e in events if e.name.startswith("aten::"))  # the pass's thread, not others'
    markers, memo = part_markers(), {}
    parts: dict[str, float] = {}
    ops: dict[tuple, list] = {}
    for e in events:
        if e.thread != ours:
            continue
        own = float(e.self_cpu_time_total)
        part = _part_of(e, markers, memo)
        if part == PROFILER:
            continue
        parts[part] = parts.get(part, 0.0) + own
        if e.name.startswith("aten::") or e.name.startswith("<built-in method") and " of pybind11" in e.name:
            name = e.name.split(" of ")[0].replace("<built-in method ", "kernel ")
            cell = ops.setdefault((name, part), [0.0, 0])
            cell[0] += own
            cell[1] += 1
    return parts, ops


def op_profile(steps: dict, reps: int = 5, warmup: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile ``steps`` ``{key: step}`` (each ``step()`` one pass, e.g. a forward and its crop),
    ``reps`` traced calls of each in round-robin order after ``warmup`` untraced ones, so that every
    step meets the same mixture of the machine's moments. Returns (parts, operations), with a
    ``key`` column: per part the median over the calls of its own time (us) and its share of the
    parts' medians; per event name (torch operators and the kernels' built-in calls, a built-in's
    object address dropped) its median own time and calls per pass, largest first."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    per_part: dict = {}
    per_op: dict = {}
    for _ in range(reps):
        for key, step in steps.items():
            parts, ops = _traced(step)
            for part, t in parts.items():
                per_part.setdefault((key, part), []).append(t)
            for op, (t, c) in ops.items():
                per_op.setdefault((key, *op), []).append((t, c))
    order = {p: i for i, p in enumerate([*PARTS, "framework"])}  # PARTS' order, the rest last
    part_rows = [{"key": k, "part": p, "us_per_pass": float(np.median(v + [0.0] * (reps - len(v))))}
                 for (k, p), v in per_part.items()]
    parts_df = pd.DataFrame(part_rows)
    parts_df["share"] = parts_df.us_per_pass / parts_df.groupby("key").us_per_pass.transform("sum")
    parts_df = parts_df.sort_values(["key", "part"], key=lambda s: s.map(order) if s.name == "part" else s.astype(str))
    op_rows = [{"key": k, "operation": name, "part": part,
                "us_per_pass": float(np.median([t for t, _ in v] + [0.0] * (reps - len(v)))),
                "calls_per_pass": float(np.median([c for _, c in v] + [0] * (reps - len(v))))}
               for (k, name, part), v in per_op.items()]
    ops_df = pd.DataFrame(op_rows).sort_values(["key", "us_per_pass"], ascending=[True, False])
    return parts_df.reset_index(drop=True), ops_df.reset_index(drop=True)


def pass_steps(engine, tokens, ns=(1, 9)) -> dict:
    """``{"n=<n>": step}``: a pass of ``tokens[:n]`` appended to the engine's cache, cropped back."""
    start = engine.length

    def make(n):
        def step():
            engine.forward(tokens[:n])
            engine.crop(start)
        return step
    return {f"n={n}": make(n) for n in ns}


def profile_engine(engine, tokens, ns=(1, 9), reps: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`op_profile` of :func:`pass_steps`; the rows carry ``pass`` (``n=<n>``)."""
    with torch.inference_mode():
        parts, ops = op_profile(pass_steps(engine, tokens, ns), reps=reps)
    return parts.rename(columns={"key": "pass"}), ops.rename(columns={"key": "pass"})
