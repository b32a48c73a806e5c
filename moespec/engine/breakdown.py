"""Where a decode step's time goes: the whole step, its expert operation alone, the step without
its expert operation, one drafted token, and a reference read, all timed round-robin in one run
(:func:`moespec.measure.timing.time_interleaved`), for one or several subjects side by side.

Components, for a pass of n tokens appended to a cache of ``depth`` positions:

* ``step``: the target's forward pass (``Engine.forward``), cache cropped back after it;
* ``experts``: the L expert-operation calls of that pass alone (``moespec.kernels.expert_forward``
  on the inputs the pass gave each layer, captured once);
* ``step_without_experts``: the same pass with every layer's expert operation replaced by zeros
  (attention, norms, routers, embeddings, the LM head and the per-pass framework work);
* ``attention``, ``lm_head``: every layer's attention projections, and the LM head, alone, on
  the inputs the pass gave them (captured once): the bytes a pass reads once outside the experts
  (padded to the published model's in the byte-faithful-all subject, docs/engine.md);
* ``draft_token``: one token of the subject's draft model (``ModelDraft.propose(..., k=1)`` at the
  same position: a cache crop and one forward of one token);
* ``read``: one ``torch.sum`` over a fixed buffer (:class:`moespec.measure.regimes.ReferenceRead`),
  the bandwidth regime of the run.

The expert share of a step is ``experts / step`` at n = 1, the draft's cost ratio
``draft_token / step`` at n = 1 (issue 16's targets: at least 0.6 and at most 0.1).
"""

from __future__ import annotations

import resource

import numpy as np
import pandas as pd
import torch
from torch import nn

from moespec.engine.byte_shares import COMPONENTS
from moespec.engine.speculative import ModelDraft
from moespec.engine.switch import moe_layers
from moespec.engine.widen import attention_projections
from moespec.kernels import expert_forward
from moespec.measure.regimes import ReferenceRead
from moespec.measure.timing import time_interleaved, timer_for


class ZeroExperts(nn.Module):
    """An experts module returning zeros: the step without its expert operation."""

    def forward(self, hidden_states, top_k_index, top_k_weights):
        return torch.zeros_like(hidden_states)


def capture_expert_inputs(engine, ids) -> list[tuple]:
    """Run one pass of ``ids`` and return, per MoE layer, the kernel's arguments ``(x, ids,
    gates)`` (x padded as :class:`KernelExperts` pads it); the cache is cropped back."""

    got, handles = {}, []
    for layer in moe_layers(engine.model):
        exp = layer.mlp.experts

        def hook(module, args, output, exp=exp):
            x, idx, gates = args[:3]
            pad = exp.weights.hidden_size - x.shape[1]
            x = torch.nn.functional.pad(x, (0, pad)) if pad > 0 else x
            got[exp.layer] = (x.detach().float().contiguous(), idx.detach(), gates.detach())

        handles.append(exp.register_forward_hook(hook))
    _pass_with_hooks(engine, ids, handles)
    return [got[i] for i in sorted(got)]


def _pass_with_hooks(engine, ids, handles) -> None:
    """One pass of ``ids`` with the forward ``handles`` registered, then the hooks removed and
    the cache cropped back."""
    start = engine.length
    try:
        engine.forward(ids)
    finally:
        for h in handles:
            h.remove()
        engine.crop(start)


def capture_dense_inputs(engine, ids) -> dict[str, list[tuple]]:
    """Run one pass of ``ids`` and return the modules read once per pass outside the experts with
    the input each got: ``{"attention": [(projection, x), ...] (every layer's attention projections),
    "lm_head": [(head, x)]}``; the cache is cropped back."""
    model = engine.model
    mods = {"attention": attention_projections(model),
            "lm_head": [model.get_output_embeddings()]}
    got, handles = {}, []
    for part, modules in mods.items():
        for i, mod in enumerate(modules):
            def hook(module, args, output, key=(part, i)):
                got[key] = (module, args[0].detach().clone())
            handles.append(mod.register_forward_hook(hook))
    _pass_with_hooks(engine, ids, handles)
    return {part: [got[(part, i)] for i in range(len(modules))] for part, modules in mods.items()}


def _callables(name: str, subject, prompt, n_values, dedup_kernels: bool, transformers_path: bool = False) -> dict:

    eng = subject.engine
    d = len(prompt)
    first = eng.prefill(prompt)
    cont = [first] + eng.greedy(first, max(n_values))
    eng.crop(d)
    old = None
    if transformers_path and eng.lean:   # the same model through transformers' forward (Engine.variant)
        old = eng.variant(lean=False)
        old.prefill(prompt)
    layers = moe_layers(eng.model)
    experts = [layer.mlp.experts for layer in layers]
    zero = ZeroExperts()
    calls = {}
    for n in n_values:
        settings = (False, True) if (dedup_kernels and n > 1) else (False,)
        inputs = capture_expert_inputs(eng, cont[:n])
        for dd in settings:
            tag = f"n={n}" + ("" if n == 1 else (" dedup" if dd else " slot"))
            kernel = "slot" if n == 1 or (not dd and n <= eng.switch.slot_max) else "dedup"  # Switch.kernel_for

            def step(n=n, dd=dd):
                eng.dedup = dd
                eng.forward(cont[:n])
                eng.crop(d)

            def ops(inputs=inputs, kernel=kernel):
                for e, (x, idx, g) in zip(experts, inputs):
                    expert_forward(x, idx, e.weights, gates=g, kernel=kernel, backend=eng.switch.backend)

            calls[(name, "step", tag)] = step
            calls[(name, "experts", tag)] = ops
            if old is not None:
                def step_old(n=n, dd=dd):
                    eng.dedup = dd
                    old.forward(cont[:n])
                    old.crop(d)

                calls[(name, "step_transformers", tag)] = step_old

        def bare(n=n):
            for layer in layers:
                layer.mlp.experts = zero
            try:
                eng.forward(cont[:n])
            finally:
                for layer, e in zip(layers, experts):
                    layer.mlp.experts = e
                eng.crop(d)

        calls[(name, "step_without_experts", f"n={n}")] = bare
        for part, pairs in capture_dense_inputs(eng, cont[:n]).items():
            def dense(pairs=pairs):
                with torch.inference_mode():
                    for module, x in pairs:
                        module(x)

            calls[(name, part, f"n={n}")] = dense
    if subject.draft is not None:
        drafter = ModelDraft(subject.draft)
        drafter.begin(list(prompt), first)
        calls[(name, "draft_token", "n=1")] = lambda: drafter.propose([], first, 1)
    return calls


def peak_memory_bytes(device: str = "cpu") -> int:
    """Peak resident memory of this process so far (Linux ``ru_maxrss``), or on a GPU the peak
    memory torch allocated there."""
    if str(device).startswith("cuda"):
        return int(torch.cuda.max_memory_allocated(torch.device(device)))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def decode_breakdown(subjects: dict, prompts: dict, n_values=(1, 8), reps: int = 50, warmup: int = 3,
                     read_bytes: int | None = None, device: str = "cpu", dedup_kernels: bool = True,
                     transformers_path: bool = False, extra_calls: dict | None = None) -> pd.DataFrame:
    """Time every component (module docstring) of every subject in one interleaved run.

    ``transformers_path``: also time each step through transformers' forward (component
    ``step_transformers``) where the engine runs the lean path. ``extra_calls``: more callables,
    ``{(subject, component, pass): fn}``, timed in the same rounds (the peer engine's steps).

    ``subjects``: name -> :class:`moespec.engine.subject.Subject`; ``prompts``: name -> token ids
    (the cache depth is the prompt's length). Returns one row per (subject, component, pass) with
    the median and quartiles in seconds and, per subject, the derived rows ``rest`` (step minus
    experts), ``expert_share`` and ``draft_ratio`` (n = 1); ``read`` rows carry the bandwidth."""

    if 1 not in n_values:
        raise ValueError(f"n_values must include 1 (the decode step); got {n_values}")
    calls = {}
    for name, sub in subjects.items():
        calls.update(_callables(name, sub, prompts[name], tuple(n_values), dedup_kernels, transformers_path))
    calls.update(extra_calls or {})
    ref = ReferenceRead(read_bytes, device)
    calls[("", "read", "")] = ref.fn
    timings = time_interleaved(calls, reps=reps, warmup=warmup, timer=timer_for(device))
    rows = []
    for (name, comp, tag), t in timings.items():
        row = {"subject": name, "component": comp, "pass": tag, "t_median_s": t.median_s, "t_q25_s": t.q25_s,
               "t_q75_s": t.q75_s, "reps": t.reps}
        if comp == "read":
            row["GBps"] = ref.nbytes / t.median_s / 1e9
        rows.append(row)
    df = pd.DataFrame(rows)
    out = [df]
    for name in subjects:
        if name not in set(df.subject):
            continue
        sel = df[df.subject == name].set_index(["component", "pass"])["t_median_s"]
        step1, exp1 = sel[("step", "n=1")], sel[("experts", "n=1")]
        extra = [{"subject": name, "component": "rest", "pass": "n=1", "t_median_s": step1 - exp1},
                 {"subject": name, "component": "expert_share", "pass": "n=1", "value": exp1 / step1}]
        if ("draft_token", "n=1") in sel.index:
            extra.append({"subject": name, "component": "draft_ratio", "pass": "n=1",
                          "value": sel[("draft_token", "n=1")] / step1})
        out.append(pd.DataFrame(extra))
    res = pd.concat(out, ignore_index=True)
    res["peak_memory_GiB"] = peak_memory_bytes(device) / 2**30
    return res


def _ratio(g: pd.DataFrame, num: str, den: str) -> float:
    """The step's median time at pass ``num`` over that at ``den`` (NaN when either is absent)."""
    step = g[g.component == "step"].set_index("pass").t_median_s
    return float(step[num] / step[den]) if num in step.index and den in step.index else np.nan


#: The byte table's components that the breakdown also times alone (its own component names).
TIMED_BYTES = ("attention", "experts", "lm_head")


def shares(breakdown: pd.DataFrame, byte_tables: dict[str, pd.DataFrame] | None = None) -> pd.DataFrame:
    """One row per subject: step, expert operation, rest, attention projections, LM head and draft
    token at n = 1 (ms), the step at n = 2 (deduplicating) over the step at n = 1 (what one more
    verified token costs, when n = 2 was timed), the expert share and the draft's cost ratio, the
    run's read bandwidth and peak memory.

    ``byte_tables`` {subject: :func:`moespec.engine.byte_shares.byte_shares` table at one depth}:
    each component's bytes per step beside its time, as ``<c>_MB``, ``<c>_share`` (of the step's
    bytes), ``<c>_share_published`` (the published model's share at the same layers, from its
    config; model in ``published``) and, for the components timed alone, ``<c>_GBps`` (its bytes
    over its median time)."""
    rows = []
    read = breakdown[breakdown.component == "read"]
    for name, g in breakdown[breakdown.subject != ""].groupby("subject", sort=False):
        t = g[g["pass"] == "n=1"].set_index("component")
        row = {"subject": name, "step_ms": 1e3 * t.t_median_s.get("step", np.nan),
               "experts_ms": 1e3 * t.t_median_s.get("experts", np.nan),
               "step_without_experts_ms": 1e3 * t.t_median_s.get("step_without_experts", np.nan),
               "attention_ms": 1e3 * t.t_median_s.get("attention", np.nan),
               "lm_head_ms": 1e3 * t.t_median_s.get("lm_head", np.nan),
               "step_n2_over_n1": _ratio(g, "n=2 dedup", "n=1"),
               "draft_token_ms": 1e3 * t.t_median_s.get("draft_token", np.nan),
               "expert_share": t.value.get("expert_share", np.nan),
               "draft_ratio": t.value.get("draft_ratio", np.nan),
               "read_GBps": float(read.GBps.iloc[0]) if len(read) else np.nan,
               "peak_memory_GiB": float(g.peak_memory_GiB.iloc[0])}
        table = (byte_tables or {}).get(name)
        if table is not None:
            row.update(_bytes_columns(table, row))
        rows.append(row)
    return pd.DataFrame(rows)


def _bytes_columns(table: pd.DataFrame, times: dict) -> dict:
    if table["depth"].nunique() != 1:
        raise ValueError(f"byte table: one depth expected beside the breakdown, found {sorted(table['depth'].unique())}")
    out = {"bytes_depth": int(table["depth"].iloc[0]), "published": str(table["published"].iloc[0])}
    for r in table.itertuples():
        out[f"{r.component}_MB"] = r.subject_bytes / 1e6
        out[f"{r.component}_share"] = float(r.subject_share)
        out[f"{r.component}_share_published"] = float(r.published_share)
        if r.component in TIMED_BYTES:
            out[f"{r.component}_GBps"] = r.subject_bytes / (1e-3 * times[f"{r.component}_ms"]) / 1e9
    return out


def bytes_lines(row: pd.Series) -> list[str]:
    """One line per component of a :func:`shares` row with bytes: its MB per step, share against the
    published model's, and (timed alone) its time and GB/s; none without bytes."""
    if "published" not in row.index or pd.isna(row.get("published")):
        return []
    lines = []
    for c in COMPONENTS:
        timed = (f"; {row[f'{c}_ms']:.3f} ms alone, {row[f'{c}_GBps']:.1f} GB/s" if c in TIMED_BYTES else "")
        lines.append(f"{c}: {row[f'{c}_MB']:.2f} MB per step, share {row[f'{c}_share']:.3f} "
                     f"({row['published']}: {row[f'{c}_share_published']:.3f}){timed}")
    return lines


def pass_bytes(engine, tokens, n: int) -> dict[str, float]:
    """Bytes one pass of ``tokens[:n]`` at the engine's cache reads (:mod:`moespec.engine.byte_shares`'s
    components): ``dense`` (attention projections, LM head, routers, norms, embedding rows), ``kv_cache``
    (every cached position's keys and values, every layer), and the experts as each kernel reads
    them: ``experts_slot`` (n m experts per layer, one read per (token, slot)) and ``experts_dedup``
    (each distinct expert of the pass once per layer, from the pass's own routing)."""
    depth = engine.length
    with engine.routing_tap() as counts:
        engine.forward(tokens[:n])
    engine.crop(depth)
    return _pass_byte_counts(engine, [depth], n, counts[0])


def _pass_byte_counts(engine, depths, n: int, distinct: int) -> dict[str, float]:
    """The byte components of one pass of n tokens over caches of ``depths`` positions whose routing
    chose ``distinct`` (expert, layer) pairs (:func:`pass_bytes`, :func:`batch_pass_bytes`)."""
    from moespec.engine.byte_shares import subject_step_bytes
    from moespec.engine.operation import layer_weights

    one = subject_step_bytes(engine, 0)
    per_expert = [w.bytes_per_expert for w in layer_weights(engine).values()]
    m = int(engine.model.config.num_experts_per_tok)
    return {"dense": float(one["attention"] + one["lm_head"] + one["other"]),
            "kv_cache": float(sum(subject_step_bytes(engine, d)["kv_cache"] for d in depths)),
            "experts_slot": float(n * m * sum(per_expert)), "experts_dedup": float(distinct * np.mean(per_expert))}


def batch_pass_bytes(target, segments) -> dict[str, float]:
    """Bytes one pass of a :class:`moespec.engine.batch.BatchEngine` over ``segments`` (one token
    list per sequence, appended to its cache) reads, as :func:`pass_bytes` counts a batch-one pass:
    ``dense`` once per pass, ``kv_cache`` every sequence's cached positions, ``experts_slot`` n m
    experts per layer (n the segments' tokens together) and ``experts_dedup`` each distinct expert
    of the pass once per layer, from the pass's own routing (paper 1's U over the B sequences'
    tokens). The caches are cropped back after the pass."""
    from moespec.engine.byte_shares import subject_step_bytes
    from moespec.engine.operation import layer_weights

    engine, switch = target.engine, target.switch
    if switch is None or switch.record is not None:
        raise ValueError("target: the pass's routing is read from the kernel switch's record, which must exist "
                         "and not be open")
    lengths = target.lengths
    switch.record = []
    try:
        target.forward(segments)
        record = switch.record
    finally:
        switch.record = None
        target.crop(lengths)
    distinct = sum(len(np.unique(ids)) for _, ids in record)
    return _pass_byte_counts(engine, lengths, sum(len(seg) for seg in segments), distinct)


def pass_total(b: dict[str, float], kernel: str) -> float:
    """The bytes of a pass (:func:`pass_bytes`'s ``b``) read with ``kernel`` (``slot`` or ``dedup``):
    dense weights, KV cache and the experts as that kernel reads them."""
    return b["dense"] + b["kv_cache"] + b[f"experts_{kernel}"]


def byte_limits(breakdown: pd.DataFrame, bytes_by_pass: dict, gbps: float | None = None) -> pd.DataFrame:
    """Each timed step beside its byte limit: the bytes its pass reads over the run's read bandwidth
    (the reference read's median), and the share of the limit the step reaches (limit / step time;
    1 would be a step that only reads its bytes at the read rate). ``bytes_by_pass``
    ``{(subject, n): pass_bytes(...)}`` (or ``{(subject, n, path): {"total": bytes, "kernel": name}}``
    for one path, e.g. a peer engine's own format). One row per (subject, path, pass): ``path`` ``lean`` (the
    engine's step), ``transformers`` (``step_transformers``) or a peer's name; the median step and its
    quartiles (ms), the bytes (MB), the limit (ms) and ``share_of_limit`` with its quartile range
    (limit over the step's quartiles). ``gbps``: the read bandwidth (default the reference read's)."""
    gbps = float(breakdown[breakdown.component == "read"].GBps.iloc[0]) if gbps is None else float(gbps)
    paths = {"step": "lean", "step_transformers": "transformers"}
    rows = []
    for r in breakdown.rename(columns={"pass": "tag"}).itertuples():
        comp = str(r.component)
        path = paths.get(comp, comp[len("peer_"):] if comp.startswith("peer_") else None)
        n = int(str(r.tag).split()[0].split("=")[1]) if path is not None else 0
        b = (bytes_by_pass.get((r.subject, n, path), bytes_by_pass.get((r.subject, n)))
             if path is not None else None)
        if b is None or pd.isna(r.t_median_s):
            continue
        kernel = b.get("kernel") or ("dedup" if "dedup" in str(r.tag) else "slot")
        total = b["total"] if "total" in b else pass_total(b, kernel)
        limit = total / (gbps * 1e9)
        rows.append({"subject": r.subject, "path": path, "pass": r.tag, "n": n, "kernel": kernel,
                     "step_ms": 1e3 * r.t_median_s, "step_q25_ms": 1e3 * r.t_q25_s, "step_q75_ms": 1e3 * r.t_q75_s,
                     "bytes_MB": total / 1e6, "limit_ms": 1e3 * limit, "share_of_limit": limit / r.t_median_s,
                     "share_q25": limit / r.t_q75_s, "share_q75": limit / r.t_q25_s, "read_GBps": gbps,
                     "reps": r.reps})
    return pd.DataFrame(rows)


def component_limits(breakdown: pd.DataFrame, byte_tables: dict[str, pd.DataFrame],
                     gbps: float | None = None) -> pd.DataFrame:
    """Per subject, the n = 1 step's components timed alone (attention projections, expert
    operation, LM head) beside their bytes' limit at the read bandwidth ``gbps`` (default the
    reference read's), and the step's remainder (the step less the three) for each path timed:
    time (ms), bytes (MB), limit (ms), share of the limit."""
    gbps = float(breakdown[breakdown.component == "read"].GBps.iloc[0]) if gbps is None else float(gbps)
    rows = []
    for name, table in byte_tables.items():
        t = breakdown[(breakdown.subject == name) & (breakdown["pass"] == "n=1")].set_index("component").t_median_s
        b = table.set_index("component").subject_bytes
        parts = {"attention": "attention", "experts": "experts", "lm_head": "lm_head"}
        alone = 0.0
        for comp, col in parts.items():
            alone += t[comp]
            rows.append({"subject": name, "component": comp, "time_ms": 1e3 * t[comp], "bytes_MB": b[col] / 1e6,
                         "limit_ms": 1e3 * b[col] / (gbps * 1e9), "share_of_limit": b[col] / (gbps * 1e9) / t[comp]})
        rest = b["kv_cache"] + b["other"]
        for comp in ("step", "step_transformers"):
            if comp in t.index:
                rows.append({"subject": name, "component": f"{comp} less the three", "time_ms": 1e3 * (t[comp] - alone),
                             "bytes_MB": rest / 1e6, "limit_ms": 1e3 * rest / (gbps * 1e9),
                             "share_of_limit": np.nan})
    return pd.DataFrame(rows).assign(read_GBps=gbps)
