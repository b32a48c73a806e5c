"""``torch.compile`` on the lean decode path, measured (issue 55, item 2; docs/engine_time.md).

The lean path (:mod:`moespec.engine.lean`) runs every operation of transformers' forward in the
same order, so that tokens and logits are transformers' bit for bit. This benchmark asks whether
``torch.compile`` (inductor, CPU) of the lean pass (:meth:`moespec.engine.lean.LeanOlmoe.forward`,
the expert and dense kernels traced through their fake implementations, :mod:`moespec.kernels.fake`)
would take a step closer to its byte limit, and at what cost:

* **compiles**: the wall time of the first call at each pass size (tracing and code generation),
  the graphs and graph breaks dynamo reports (``torch._dynamo.explain``);
* **bits**: whether the compiled pass's logits equal the eager pass's (``torch.equal``) from the
  same cache, and the largest difference where they do not;
* **time**: the eager and the compiled pass at n = 1 (plain decode, per-slot kernel) and n = 9
  (a verify pass, deduplicating kernel), each from the same cache cropped back, interleaved in one
  run with the read ceiling (:class:`moespec.measure.ceiling.ReadCeiling`), every call after one
  untimed eager decode step (the caches as a decode loop leaves them, the same for both paths); each
  step's share of its byte limit (bytes of the pass, :func:`moespec.engine.breakdown.pass_bytes`, over
  the ceiling).

Every call starts at the same cache length, so the compiled pass meets one shape per pass size: the
most favourable case for it (a decode loop's growing cache recompiles or runs a dynamic graph).

    .venv/bin/python benchmarks/bench_lean_compile.py                     # byte-faithful-all, full profile
    .venv/bin/python benchmarks/bench_lean_compile.py --profile quick --reps 5

Writes ``benchmarks/results/lean_compile/<stamp>_compile.csv`` (per path and pass: median and
quartiles, byte limit, share, logits equal, compile seconds, graphs, breaks) and
``<stamp>_provenance.json`` (arguments, the ceiling, the machine and versions).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
import torch

from moespec import io, provenance
from moespec.engine.breakdown import pass_bytes, pass_total
from moespec.engine.subject import load_subject
from moespec.measure import protocols
from moespec.measure.ceiling import PREFIX, ReadCeiling
from moespec.measure.timing import time_interleaved
from moespec.threads import torch_threads

OUT = Path(__file__).resolve().parent / "results" / "lean_compile"
NS = (1, 9)


def measure(engine, prompt, reps: int, warmup: int, backend: str = "inductor",
            read_bytes: int | None = None) -> tuple[pd.DataFrame, dict]:
    """Compile the engine's lean pass with ``backend`` (``torch.compile``'s), check its logits, time
    both paths beside the read ceiling (``read_bytes`` per call; None: the machine's)."""
    import torch._dynamo as dynamo

    first = engine.prefill(prompt)
    tokens = [first] + engine.greedy(first, NS[-1] - 1)
    start = len(prompt)
    engine.crop(start)
    plan = engine.plan()
    compiled = torch.compile(plan.forward, backend=backend)
    ids = {n: torch.tensor(tokens[:n]).view(1, -1) for n in NS}
    nbytes = {n: pass_total(pass_bytes(engine, tokens, n), "slot" if n == 1 else "dedup") for n in NS}
    engine.crop(start)

    def run(fn, n):
        def call():
            try:
                with engine.dedup_as(n > 1), torch.inference_mode():
                    return fn(ids[n], engine.cache)
            finally:
                engine.cache.crop(start)
        return call

    info = {}
    for n in NS:
        eager = run(plan.forward, n)()
        t0 = time.perf_counter()
        got = run(compiled, n)()
        info[n] = {"compile_s": time.perf_counter() - t0, "logits_equal": bool(torch.equal(eager, got)),
                   "max_abs_diff": float((eager - got).abs().max())}
        try:
            with engine.dedup_as(n > 1), torch.inference_mode():
                ex = dynamo.explain(plan.forward)(ids[n], engine.cache)
        finally:
            engine.cache.crop(start)
        info[n].update(graphs=ex.graph_count, breaks=ex.graph_break_count,
                       break_reasons=sorted({" ".join(str(b.reason).split())[:240] for b in ex.break_reasons})[:5])
    ceiling = ReadCeiling(read_bytes)
    calls = {(path, n): run(fn, n) for n in NS for path, fn in (("eager", plan.forward), ("compiled", compiled))}
    calls.update({("read", name): fn for name, fn in ceiling.calls().items()})
    # every call after one untimed eager decode step, as a decode loop's step follows the last: on a machine
    # whose last-level cache holds much of a step's bytes, the call after the ceiling's reads would
    # otherwise start cold and the one after it warm
    timings = time_interleaved(calls, reps=reps, warmup=warmup, flush=run(plan.forward, 1))
    gbps = max(ceiling.bytes[name[len(PREFIX):]] / timings[("read", name)].median_s / 1e9 for name in ceiling.calls())
    rows = []
    for (path, n), tm in timings.items():
        if path == "read":
            continue
        limit = nbytes[n] / (gbps * 1e9)
        rows.append({"path": path, "pass": "n=1 slot" if n == 1 else f"n={n} dedup", "step_ms": 1e3 * tm.median_s,
                     "step_q25_ms": 1e3 * tm.q25_s, "step_q75_ms": 1e3 * tm.q75_s, "reps": tm.reps,
                     "bytes_MB": nbytes[n] / 1e6, "ceiling_GBps": gbps, "limit_ms": 1e3 * limit,
                     "share_of_limit": limit / tm.median_s,
                     **({"logits_equal": info[n]["logits_equal"], "max_abs_diff": info[n]["max_abs_diff"],
                         "compile_s": info[n]["compile_s"], "graphs": info[n]["graphs"],
                         "breaks": info[n]["breaks"]} if path == "compiled" else {})})
    return pd.DataFrame(rows), {"ceiling": ceiling.record(), "ceiling_GBps": gbps,
                                "compile": {f"n={n}": v for n, v in info.items()}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="byte-faithful-all", help="a subject of moespec.engine.subject")
    ap.add_argument("--profile", default="full", choices=("quick", "full"))
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the timed work")
    ap.add_argument("--compile-backend", default="inductor", help="torch.compile's backend (eager: dynamo alone)")
    ap.add_argument("--read-bytes", type=int, default=0, help="bytes of each ceiling read (0: the machine's)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    stamp, t0 = protocols.stamp(), time.perf_counter()
    sub = load_subject(args.model, profile=args.profile)
    if not sub.engine.lean:
        raise SystemExit(f"{sub.label}: the lean path does not run this model; nothing to compile")
    prompt = sub.chat_prompts(1, args.prompt_tokens, seed=args.seed)[0]
    with torch_threads(args.threads):
        table, extra = measure(sub.engine, prompt, args.reps, args.warmup, args.compile_backend,
                               args.read_bytes or None)
    args.out.mkdir(parents=True, exist_ok=True)
    csv = io.write_dataframe(args.out / f"{stamp}_compile.csv", table.assign(subject=sub.label))
    io.write_json(args.out / f"{stamp}_provenance.json", {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "subject": sub.label, "prompt_tokens": len(prompt), "wall_s": round(time.perf_counter() - t0, 1),
        **extra, "provenance": provenance.full_record()})
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(table.round(3).to_string(index=False))
    print(f"rows: {csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
