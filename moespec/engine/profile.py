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


def op_profile(step, reps: int = 5, warmup: int = 2) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Profile ``reps`` calls of ``step()`` (one pass each, e.g. a forward and its crop) after
    ``warmup`` untraced ones. Returns (parts, operations): per part its own time per pass (us) and
    share of the traced pass; per event name (torch operators and the kernels' built-in calls; a
    built-in's object address dropped) its own time and calls per pass, largest first."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(warmup):
        step()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(reps):
            step()
    events = prof.events()
    ours = next(e.thread for e in events if e.name.startswith("aten::"))  # the passes' thread, not others'
    events = [e for e in events if e.thread == ours]
    markers, memo = part_markers(), {}
    parts: dict[str, float] = {}
    ops: dict[str, list] = {}
    for e in events:
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
    total = sum(parts.values())
    part_rows = [{"part": p, "us_per_pass": t / reps, "share": t / total} for p, t in parts.items()]
    op_rows = [{"operation": name, "part": part, "us_per_pass": t / reps, "calls_per_pass": c / reps}
               for (name, part), (t, c) in ops.items()]
    order = {p: i for i, p in enumerate([*PARTS, "framework"])}  # PARTS' order, the rest last
    parts_df = pd.DataFrame(part_rows).sort_values("part", key=lambda s: s.map(order)).reset_index(drop=True)
    ops_df = pd.DataFrame(op_rows).sort_values("us_per_pass", ascending=False).reset_index(drop=True)
    return parts_df, ops_df


def profile_engine(engine, tokens, ns=(1, 9), reps: int = 5) -> tuple[pd.DataFrame, pd.DataFrame]:
    """:func:`op_profile` of the passes of ``n`` tokens (``tokens[:n]`` appended to the engine's
    cache, cropped back after each) for each n in ``ns``; the rows carry ``pass`` (``n=<n>``)."""
    start = engine.length
    parts, ops = [], []
    for n in ns:
        def step(n=n):
            engine.forward(tokens[:n])
            engine.crop(start)

        with torch.inference_mode():
            p, o = op_profile(step, reps=reps)
        parts.append(p.assign(**{"pass": f"n={n}"}))
        ops.append(o.assign(**{"pass": f"n={n}"}))
    return pd.concat(parts, ignore_index=True), pd.concat(ops, ignore_index=True)


def part_summary(parts: pd.DataFrame) -> pd.DataFrame:
    """Per pass, the kernels' share and everything else's of a traced pass."""
    kern = parts.part.isin(["expert kernel", "dense kernel (attention, LM head)"])
    g = parts.assign(kernel=np.where(kern, "kernels", "outside kernels")).groupby(["pass", "kernel"]).us_per_pass
    return g.sum().unstack().reset_index()
