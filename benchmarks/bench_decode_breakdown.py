"""Where a decode step's time goes, per subject, in one interleaved run (issue 16, item 1;
docs/engine.md, "The byte-faithful subject").

For each subject (the default MoE as trained; the byte-faithful subject; optionally its other
layouts and formats) this times, round-robin in one run (``moespec.engine.breakdown``): the whole
decode step at n = 1 and the verify pass at n = 8 (per-slot and deduplicating), the expert
operation of that pass alone, the pass without its expert operation, one drafted token, and a
reference read. It prints and writes the expert operation's share of the n = 1 step, the draft
token's cost relative to it, and the memory each subject holds and the run's peak, against the
targets (expert share >= 0.6, draft <= 0.1, memory <= 16 GiB).

    .venv/bin/python benchmarks/bench_decode_breakdown.py                   # trained models if built
    .venv/bin/python benchmarks/bench_decode_breakdown.py --source random --reps 30
    .venv/bin/python benchmarks/bench_decode_breakdown.py --subjects default,byte-faithful,byte-faithful-intermediate

Where a step stands against its byte limit: ``--transformers`` also times every step
through transformers' forward (the path the engine ran before its lean one,
``Engine.variant(lean=False)``) in the same rounds; ``--ceiling`` (default on) times the read
ceiling (:class:`moespec.measure.ceiling.ReadCeiling`) in them too; every step is then set beside
the bytes its pass reads over the run's read bandwidth (the ceiling, or the ``torch.sum`` read where
that is faster): ``<stamp>_limits.csv`` (per subject, path and pass) and ``<stamp>_components.csv``
(the n = 1 step's components alone against their bytes, and the step's remainder). ``--profile``
writes a per-operation profile (``torch.profiler``, :mod:`moespec.engine.profile`) of one decode
step and one verify pass of ``--profile-n`` tokens on each path: ``<stamp>_profile.csv`` (the
parts of a pass) and ``<stamp>_profile_ops.csv`` (operations). ``--peer`` adds llama.cpp's own CPU
decode on a model both engines load (``benchmarks/ggml_peer/llamacpp_peer.py``), timed in the same
rounds.

    .venv/bin/python benchmarks/bench_decode_breakdown.py --subjects byte-faithful-all --transformers \
        --profile --peer --ns 1,2,5,9 --reps 30

``--batch-sizes 1,2,4,8`` (with ``--batch-ks``) only times verify passes of B sequences x (k + 1)
tokens on the first subject, on the lean path and on transformers' batched modules, beside the read
ceiling, with each pass's bytes and share of its byte limit (:func:`batch_passes`;
``<stamp>_batch.csv``).

``--source random`` (or no trained models on disk) uses the default models' configurations with
random weights, labelled so: timing depends on shapes, formats and ids, and the routing of a
random router is close to uniform. Writes ``data/bench/breakdown/<stamp>_breakdown.csv``,
``<stamp>_shares.csv`` (times), ``<stamp>_bytes.csv`` (each component's bytes per step and share beside the
published model's at the subject's layers, :mod:`moespec.engine.byte_shares`) and ``<stamp>_provenance.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moespec import io, paths, provenance, zoo
from moespec.engine.breakdown import (batch_pass_bytes, byte_limits, component_limits, decode_breakdown, pass_bytes,
                                     pass_total, shares)
from moespec.engine.byte_shares import byte_shares
from moespec.engine.profile import op_profile, pass_steps
from moespec.engine.subject import subject_from_models
from moespec.measure.ceiling import PREFIX, ReadCeiling
from moespec.measure.timing import time_interleaved

#: name -> arguments of moespec.engine.subject.subject_from_models
SUBJECTS = {
    "default": dict(kind="default"),
    "byte-faithful": dict(kind="byte-faithful"),
    "byte-faithful-intermediate": dict(kind="byte-faithful", layout="intermediate"),
    "byte-faithful-bf16": dict(kind="byte-faithful", fmt="bf16"),
    "byte-faithful-all": dict(kind="byte-faithful-all"),
}
TARGETS = {"expert_share_min": 0.6, "draft_ratio_max": 0.1, "memory_GiB_max": 16.0}


def models(source: str, seed: int = 0):
    """(target, draft, tokenizer, origin) of the default models: trained, or random at their shapes."""
    if source == "trained":
        return zoo.load_default_moe(), zoo.load_draft(), zoo.load_tokenizer(), "default MoE (trained here)"
    from transformers import LlamaForCausalLM, OlmoeForCausalLM

    torch.manual_seed(seed)
    target = OlmoeForCausalLM(zoo.default_moe_config()).eval()
    draft = LlamaForCausalLM(zoo.default_draft_config()).eval()
    return target, draft, None, "random weights at the default MoE's shapes (not trained)"


def rss_bytes() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


def build(names, source: str, like: str, backend: str, depth: int, seed: int):
    """The subjects, each one prompt (WikiText validation text when a tokenizer exists, else seeded
    random ids) and the resident memory each added once its kernels ran a pass."""
    from moespec.engine import prompts as P

    subjects, prompts, held = {}, {}, {}
    for name in names:
        if name not in SUBJECTS:
            raise SystemExit(f"unknown subject {name!r}; known: {sorted(SUBJECTS)}")
        before = rss_bytes()
        target, draft, tok, origin = models(source, seed)
        sub = subject_from_models(**SUBJECTS[name], target=target, draft=draft, tokenizer=tok, origin=origin,
                                  like=like, backend=backend, seed=seed)
        prompt = (P.validation_prompts(tok, depth, count=1)[0][0] if tok is not None
                  else np.random.default_rng(seed).integers(1, sub.vocab_size, size=depth))
        sub.engine.prefill(prompt)        # the kernels' derived layouts (int8 packing) exist from here on
        subjects[name], prompts[name] = sub, prompt
        held[name] = (rss_bytes() - before) / 2**30
    return subjects, prompts, held


def peer_module():
    """``benchmarks/ggml_peer/llamacpp_peer.py`` (not a package: loaded from its file)."""
    path = Path(__file__).resolve().parent / "ggml_peer" / "llamacpp_peer.py"
    spec = importlib.util.spec_from_file_location("llamacpp_peer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def continuation(engine, prompt, n: int) -> list[int]:
    """The prompt's greedy next token and the n - 1 after it (the tokens every timed pass feeds)."""
    first = engine.prefill(prompt)
    return [first] + engine.greedy(first, n - 1)


def pass_bytes_at(engine, prompt, n: int) -> dict:
    """:func:`moespec.engine.breakdown.pass_bytes` of the pass of n greedy tokens after ``prompt``."""
    tokens = continuation(engine, prompt, n)
    engine.crop(len(prompt))
    return pass_bytes(engine, tokens, n)


def profile_subjects(subjects: dict, prompts: dict, n: int, reps: int):
    """Per-operation profiles (:func:`moespec.engine.profile.op_profile`) of a decode step and a
    verify pass of ``n`` tokens (dedup on) on each subject's lean path and transformers' path, all
    in one round-robin order."""
    steps = {}
    for name, sub in subjects.items():
        eng = sub.engine
        engines = [("lean", eng)] + ([("transformers", eng.variant(lean=False))] if eng.lean else [])
        for path, e in engines:
            tokens = continuation(e, prompts[name], n)
            e.crop(len(prompts[name]))
            for tag, step in pass_steps(e, tokens, (1, n)).items():
                steps[(name, path, tag)] = _with_dedup(e, step)
    with torch.inference_mode():
        parts, ops = op_profile(steps, reps=reps)
    out = []
    for df in (parts, ops):
        keys = pd.DataFrame(df.pop("key").tolist(), columns=["subject", "path", "pass"], index=df.index)
        out.append(pd.concat([keys, df], axis=1))
    return out[0], out[1]


def _with_dedup(engine, step):
    """``step`` run with the engine's dedup switch on (the verify passes of the runs)."""
    def run():
        with engine.dedup_as(True):
            step()
    return run


def read_reference(bd: pd.DataFrame, ceiling: ReadCeiling | None) -> tuple[float, dict]:
    """The run's read bandwidth: the read ceiling's best pattern or the ``torch.sum`` read, whichever
    is faster (as the expert-operation benchmark takes it), with both recorded."""
    read = float(bd[bd.component == "read"].GBps.iloc[0])
    record = {"torch_sum_GBps": read}
    if ceiling is not None:
        rows = bd[bd.component == "read_ceiling"]
        per = {r["pass"][len(PREFIX):]: ceiling.bytes[r["pass"][len(PREFIX):]] / r.t_median_s / 1e9
               for _, r in rows.iterrows()}
        best = max(per, key=per.get)
        record.update({"ceiling_GBps": per[best], "ceiling_pattern": best, "ceiling_patterns_GBps": per,
                       "ceiling": ceiling.record()})
    record["GBps"] = max(read, record.get("ceiling_GBps", 0.0))
    record["used"] = "ceiling" if record["GBps"] > read else "torch.sum"
    return record["GBps"], record


def summarize(out: Path, stamp: str) -> list[Path]:
    """The run's summary tables from its files (docs/engine.md shows them; ``--summarize STAMP``
    writes them again without measuring): ``<stamp>_steps.csv`` (per subject and pass, the bytes, the
    byte limit, and each path's median step and share of the limit with its quartile range),
    ``<stamp>_parts.csv`` (the profile's parts, us per traced pass, one column per path and pass),
    ``<stamp>_run.csv`` (the machine, versions, read bandwidths and load of the run) and
    ``<stamp>_goals.csv`` (:func:`goals` at each read reference). The steps' shares are against the
    run's read reference (the ceiling where it is the faster read), with the share against the
    ``torch.sum`` read beside them (``_share_at_sum_read``, the reference of the committed run's
    breakdown)."""
    every = pd.read_csv(out / f"{stamp}_limits.csv")
    prov = json.loads((out / f"{stamp}_provenance.json").read_text())
    main_ref = (prov.get("read_reference") or {}).get("used", "torch.sum")
    lim = every[every.reference == main_ref]
    at_sum = every[every.reference == "torch.sum"].set_index(["subject", "path", "pass"]).share_of_limit
    rows = []
    for (subject, tag), g in lim.groupby(["subject", "pass"], sort=False):
        row = {"subject": subject, "pass": tag, "bytes_MB": g.bytes_MB.iloc[0], "limit_ms": g.limit_ms.iloc[0]}
        for r in g.itertuples():
            row[f"{r.path}_ms"] = r.step_ms
            row[f"{r.path}_share"] = r.share_of_limit
            row[f"{r.path}_share_IQR"] = f"{r.share_q25:.2f}-{r.share_q75:.2f}"
            if main_ref != "torch.sum":
                row[f"{r.path}_share_at_sum_read"] = at_sum.get((subject, r.path, tag), np.nan)
        rows.append(row)
    written = [out / f"{stamp}_steps.csv"]
    io.write_dataframe(written[0], pd.DataFrame(rows))
    if (out / f"{stamp}_profile.csv").is_file():
        prof = pd.read_csv(out / f"{stamp}_profile.csv")
        prof["column"] = prof.path + " " + prof["pass"] + " (us)"
        wide = prof.pivot_table(index=["subject", "part"], columns="column", values="us_per_pass", sort=False)
        written.append(out / f"{stamp}_parts.csv")
        io.write_dataframe(written[-1], wide.reset_index())
    hw, ver, ref = prov.get("hardware", {}), prov.get("versions", {}), prov.get("read_reference") or {}
    cpu = hw.get("cpu", {})
    peer = prov.get("peer") or {}
    run = {"started": prov.get("started", "")[:19], "cpu": cpu.get("cpu_model"),
           "logical_cpus": cpu.get("logical_cpus"),
           "threads": prov["args"]["threads"], "reps": prov["args"]["reps"], "depth": prov["args"]["depth"],
           "read_torch_sum_GBps": ref.get("torch_sum_GBps"), "read_ceiling_GBps": ref.get("ceiling_GBps"),
           "limits_use": ref.get("used"), "load_average_1_5_15": " ".join(f"{v:.2f}" for v in
                                                                         prov.get("load_average_1_5_15", [])),
           "torch": ver.get("torch"), "transformers": ver.get("transformers"),
           "llama_cpp_python": peer.get("llama_cpp_python", "")}
    written.append(out / f"{stamp}_run.csv")
    io.write_dataframe(written[-1], pd.DataFrame([run]))
    written.append(out / f"{stamp}_bound.csv")
    io.write_dataframe(written[-1], kernel_bound(pd.read_csv(out / f"{stamp}_components.csv"), lim))
    written.append(out / f"{stamp}_goals.csv")
    io.write_dataframe(written[-1], pd.concat([goals(g).assign(read_reference=ref)
                                               for ref, g in every.groupby("reference", sort=False)],
                                              ignore_index=True))
    return written


def kernel_bound(components: pd.DataFrame, lim: pd.DataFrame) -> pd.DataFrame:
    """Per subject, the n = 1 step's three components alone (attention projections, expert
    operation, LM head) taken together: their time, their bytes' limit and the share of it, which is
    the share a step would reach if nothing but these ran (the kernels' bound); beside it each path's
    step, its share, and its time outside the three."""
    rows = []
    for subject, g in components.groupby("subject", sort=False):
        three = g[g.component.isin(["attention", "experts", "lm_head"])]
        t, limit = three.time_ms.sum(), three.limit_ms.sum()
        row = {"subject": subject, "three_components_ms": t, "their_limit_ms": limit, "kernels_bound_share": limit / t}
        steps = lim[(lim.subject == subject) & (lim.n == 1)].set_index("path")
        for path in ("lean", "transformers"):
            if path in steps.index:
                row[f"{path}_step_ms"] = steps.loc[path, "step_ms"]
                row[f"{path}_share"] = steps.loc[path, "share_of_limit"]
                row[f"{path}_outside_three_ms"] = steps.loc[path, "step_ms"] - t
        rows.append(row)
    return pd.DataFrame(rows)


#: The decode-step goal: the share of the byte limit a step reaches.
GOAL_SHARE = 0.85


def goals(lim: pd.DataFrame, subject: str = "byte-faithful-all", peer: str = "peer-olmoe-shape") -> pd.DataFrame:
    """The decode-step goals from a run's ``_limits.csv``: the lean path's plain decode step and its verify
    passes (each kernel, the least share over the passes of 2..9 tokens) at least
    :data:`GOAL_SHARE` of their byte limits, and moespec's decode step on the peer model at least the
    better of llama.cpp's two contexts' share in the same run; each with the median share, its
    quartile range and whether the median meets it."""
    rows = []
    lean = lim[(lim.subject == subject) & (lim.path == "lean")]
    one = lean[lean.n == 1]
    if len(one):
        r = one.iloc[0]
        rows.append({"goal": f"{subject}: plain decode step", "share": r.share_of_limit, "share_q25": r.share_q25,
                     "share_q75": r.share_q75, "target": GOAL_SHARE, "met": bool(r.share_of_limit >= GOAL_SHARE)})
    for kernel in ("dedup", "slot"):
        ver = lean[(lean.n > 1) & (lean.n <= 9) & (lean.kernel == kernel)]
        if len(ver):
            r = ver.loc[ver.share_of_limit.idxmin()]
            rows.append({"goal": f"{subject}: verify passes of 2..9 tokens, {kernel} (least, at {r['pass']})",
                         "share": r.share_of_limit, "share_q25": r.share_q25, "share_q75": r.share_q75,
                         "target": GOAL_SHARE, "met": bool(r.share_of_limit >= GOAL_SHARE)})
    p = lim[(lim.subject == peer) & (lim.n == 1)].set_index("path")
    if "lean" in p.index and p.index.str.startswith("llamacpp").any():
        best = p[p.index.str.startswith("llamacpp")].share_of_limit.idxmax()
        r = p.loc["lean"]
        rows.append({"goal": f"{peer}: moespec's decode step against llama.cpp's ({best})", "share": r.share_of_limit,
                     "share_q25": r.share_q25, "share_q75": r.share_q75, "target": p.loc[best, "share_of_limit"],
                     "met": bool(r.share_of_limit >= p.loc[best, "share_of_limit"])})
    return pd.DataFrame(rows)


def thread_counts(subject, prompt, counts, reps: int, warmup: int, read_bytes: int | None = None) -> pd.DataFrame:
    """The lean decode step and the deduplicating verify pass of 9 tokens at each of torch's thread
    ``counts`` (the kernels take torch's intra-op threads), each beside the read ceiling at the same
    count, all in one interleaved run: per count the ceiling (GB/s), each step's median and quartiles
    (ms) and its share of its byte limit at that count's ceiling (``read_bytes`` per ceiling call;
    None: the machine's)."""
    eng = subject.engine
    tokens = continuation(eng, prompt, 9)
    eng.crop(len(prompt))
    per = {1: pass_bytes(eng, tokens, 1), 9: pass_bytes(eng, tokens, 9)}
    bytes_of = {1: pass_total(per[1], "slot"), 9: pass_total(per[9], "dedup")}
    ceilings = {t: ReadCeiling(nbytes=read_bytes, threads=t) for t in counts}

    def at(t, fn):
        def run():
            torch.set_num_threads(t)
            try:
                fn()
            finally:
                torch.set_num_threads(1)
        return run

    def step(n):
        def run():
            with eng.dedup_as(n > 1):
                eng.forward(tokens[:n])
                eng.crop(len(prompt))
        return run

    calls = {}
    for t in counts:
        calls.update({(t, f"n={n}"): at(t, step(n)) for n in (1, 9)})
        calls.update({(t, name): at(t, fn) for name, fn in ceilings[t].calls().items()})
    timings = time_interleaved(calls, reps=reps, warmup=warmup)
    rows = []
    for t in counts:
        gbps = max(ceilings[t].bytes[name[len(PREFIX):]] / timings[(t, name)].median_s / 1e9
                   for name in ceilings[t].calls())
        for n in (1, 9):
            tm = timings[(t, f"n={n}")]
            limit = bytes_of[n] / (gbps * 1e9)
            rows.append({"threads": t, "pass": "n=1" if n == 1 else "n=9 dedup", "ceiling_GBps": gbps,
                         "step_ms": 1e3 * tm.median_s, "step_q25_ms": 1e3 * tm.q25_s, "step_q75_ms": 1e3 * tm.q75_s,
                         "limit_ms": 1e3 * limit, "share_of_limit": limit / tm.median_s})
    return pd.DataFrame(rows)


def batch_passes(subject, Bs, ks, depth: int, reps: int, warmup: int, seed: int = 0,
                 read_bytes: int | None = None) -> pd.DataFrame:
    """The verify pass of B sequences x (k + 1) tokens (the tokens of a round that accepts every
    draft: each sequence's greedy text) through the engine at batch B on the lean path and on
    transformers' batched modules (``Engine.variant(lean=False)``), at every (B, k), beside the read
    ceiling, in one interleaved run with the dedup switch on (the runs' setting), each pass after an
    untimed previous round on its path (the prompts' last k + 1 tokens again, as a decode loop's pass
    follows the one before it, and not the ceiling's reads, which leave the machine's caches cold):
    per (B, k, path) the
    median and quartiles (ms), the pass's bytes (:func:`moespec.engine.breakdown.batch_pass_bytes`
    under the kernel the switch picks), its byte limit at the ceiling and the share of it reached,
    and per (B, k) ``lean_speedup``, transformers' median over the lean path's."""
    from moespec.engine.batch import BatchEngine

    eng = subject.engine
    prompts = [np.asarray(p) for p in subject.chat_prompts(max(Bs), depth, seed=seed)]
    texts = [continuation(eng, p, max(ks) + 1) for p in prompts]
    ceiling = ReadCeiling(nbytes=read_bytes)
    calls, before, meta = {}, {}, {}
    with eng.dedup_as(True):
        for path, engine in (("lean", eng), ("transformers", eng.variant(lean=False))):
            for B in Bs:
                target = BatchEngine(engine)
                target.prefill(prompts[:B])
                lengths = target.lengths
                for k in ks:
                    segs = [t[:k + 1] for t in texts[:B]]

                    def run(t=target, x=segs, keep=lengths):
                        t.forward(x)
                        t.crop(keep)

                    def previous_round(t=target, keep=lengths, m=k + 1, tails=[p[-(k + 1):] for p in prompts[:B]]):
                        t.crop([n - m for n in keep])
                        t.forward(tails)
                    calls[(path, B, k)] = run
                    before[(path, B, k)] = previous_round
                    if path == "lean":
                        kernel = eng.switch.kernel_for(B * (k + 1))
                        meta[(B, k)] = (kernel, pass_total(batch_pass_bytes(target, segs), kernel))
        calls.update({("ceiling", name): fn for name, fn in ceiling.calls().items()})
        timings = time_interleaved(calls, reps=reps, warmup=warmup, prepare=before)
    gbps = max(ceiling.bytes[name[len(PREFIX):]] / timings[("ceiling", name)].median_s / 1e9
               for name in ceiling.calls())
    rows = []
    for (path, B, k), tm in ((key, timings[key]) for key in calls if key[0] != "ceiling"):
        kernel, nbytes = meta[(B, k)]
        limit = nbytes / (gbps * 1e9)
        rows.append({"B": B, "k": k, "n": B * (k + 1), "path": path, "kernel": kernel,
                     "step_ms": 1e3 * tm.median_s, "step_q25_ms": 1e3 * tm.q25_s, "step_q75_ms": 1e3 * tm.q75_s,
                     "bytes_MB": nbytes / 1e6, "limit_ms": 1e3 * limit, "share_of_limit": limit / tm.median_s,
                     "ceiling_GBps": gbps, "reps": len(tm.samples_ns)})
    table = pd.DataFrame(rows)
    lean = table[table.path == "lean"].set_index(["B", "k"]).step_ms
    other = table[table.path == "transformers"].set_index(["B", "k"]).step_ms
    speedup = (other / lean).rename("lean_speedup").reset_index()
    return table.merge(speedup, on=["B", "k"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--subjects", default="default,byte-faithful", help=f"comma-separated, of {sorted(SUBJECTS)}")
    ap.add_argument("--source", default="auto", choices=("auto", "trained", "random"),
                    help="the default models trained here, or random weights at their shapes (auto: trained if built)")
    ap.add_argument("--like", default="olmoe", help="the published expert shape of the byte-faithful subjects")
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--depth", type=int, default=64, help="cache positions before the timed pass")
    ap.add_argument("--ns", default="1,8", help="pass sizes (1 must be among them)")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="output folder (default data/bench/breakdown)")
    ap.add_argument("--transformers", action="store_true",
                    help="also time every step through transformers' forward (Engine.variant(lean=False))")
    ap.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                    help="leave out the read ceiling (the byte limits then use the torch.sum read)")
    ap.add_argument("--profile", action="store_true", help="write a per-operation profile of each path")
    ap.add_argument("--profile-n", type=int, default=9, help="tokens of the profiled verify pass")
    ap.add_argument("--profile-reps", type=int, default=5)
    ap.add_argument("--peer", action="store_true", help="llama.cpp's CPU decode on a model both engines load")
    ap.add_argument("--peer-experts", type=int, default=16,
                    help="experts per layer of the peer model (OLMoE's shapes otherwise; 8 routed per token)")
    ap.add_argument("--thread-counts", default="", metavar="1,2",
                    help="only compare torch thread counts on the first subject's lean step (<stamp>_threads.csv)")
    ap.add_argument("--batch-sizes", default="", metavar="1,2,4,8",
                    help="only time verify passes of B sequences on the lean path and on transformers' batched "
                         "modules, on the first subject (<stamp>_batch.csv)")
    ap.add_argument("--batch-ks", default="0,1,3,8", help="draft lengths k of --batch-sizes (passes of B(k + 1))")
    ap.add_argument("--summarize", default="", metavar="STAMP",
                    help="only write the summary tables of the run STAMP in --out (no measurement)")
    args = ap.parse_args(argv)
    if args.summarize:
        for path in summarize(Path(args.out) if args.out else paths.bench_dir() / "breakdown", args.summarize):
            print(f"written {path}")
        return 0

    torch.set_num_threads(args.threads)
    source = args.source
    if source == "auto":
        source = "trained" if (paths.models_dir() / zoo.MOE_DIR / "model.safetensors").is_file() else "random"
    names = [s.strip() for s in args.subjects.split(",") if s.strip()]
    ns = tuple(int(x) for x in args.ns.split(","))
    started = dt.datetime.now(dt.timezone.utc)
    subjects, prompts, held = build(names, source, args.like, args.backend, args.depth, args.seed)
    out = Path(args.out) if args.out else paths.bench_dir() / "breakdown"
    stamp = started.strftime("%Y%m%dT%H%M%S")
    if args.thread_counts:
        counts = tuple(int(t) for t in args.thread_counts.split(","))
        table = thread_counts(subjects[names[0]], prompts[names[0]], counts, args.reps, args.warmup)
        io.write_dataframe(out / f"{stamp}_threads.csv", table.assign(subject=names[0]))
        io.write_json(out / f"{stamp}_threads_provenance.json", {
            **provenance.full_record(), "started": started.isoformat(), "args": vars(args),
            "load_average_1_5_15": list(os.getloadavg())})
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        return 0
    if args.batch_sizes:
        Bs, ks = (tuple(int(x) for x in v.split(",")) for v in (args.batch_sizes, args.batch_ks))
        table = batch_passes(subjects[names[0]], Bs, ks, args.depth, args.reps, args.warmup, seed=args.seed)
        io.write_dataframe(out / f"{stamp}_batch.csv", table.assign(subject=names[0]))
        io.write_json(out / f"{stamp}_batch_provenance.json", {
            **provenance.full_record(), "started": started.isoformat(),
            "finished": dt.datetime.now(dt.timezone.utc).isoformat(), "args": vars(args),
            "load_average_1_5_15": list(os.getloadavg())})
        print(table.to_string(index=False, float_format=lambda x: f"{x:.4g}"))
        return 0
    extra, ceiling, peer = {}, None, None
    if args.peer:
        peer = peer_module().PeerPair(experts=args.peer_experts, depth=args.depth, seed=args.seed,
                                      backend=args.backend, threads=args.threads)
        subjects[peer.name], prompts[peer.name] = peer.subject, peer.prompt
        held[peer.name] = np.nan
        extra.update(peer.calls(ns))
    if args.ceiling:
        ceiling = ReadCeiling()
        extra.update({("", "read_ceiling", name): fn for name, fn in ceiling.calls().items()})
    if args.profile:
        profiles = profile_subjects(subjects, prompts, args.profile_n, args.profile_reps)
        io.write_dataframe(out / f"{stamp}_profile.csv", profiles[0])
        io.write_dataframe(out / f"{stamp}_profile_ops.csv", profiles[1])
    bd = decode_breakdown(subjects, prompts, n_values=ns, reps=args.reps, warmup=args.warmup,
                          transformers_path=args.transformers, extra_calls=extra)
    gbps, ceiling_record = read_reference(bd, ceiling)
    bytes_by_pass = {(k, n): pass_bytes_at(s.engine, prompts[k], n) for k, s in subjects.items() for n in ns}
    if peer is not None:
        bytes_by_pass.update(peer.bytes_by_pass(ns))
    limits = pd.concat([byte_limits(bd, bytes_by_pass, gbps).assign(reference=ceiling_record["used"]),
                        byte_limits(bd, bytes_by_pass).assign(reference="torch.sum")], ignore_index=True)
    limits = limits.drop_duplicates(subset=["subject", "path", "pass", "reference"])
    fmt_of = {k: s.description.get("fmt", "f32") for k, s in subjects.items()}
    byte_tables = {k: byte_shares(s.engine, args.like, fmt_of[k], depths=(args.depth,)).assign(subject=k)
                   for k, s in subjects.items()}
    table = shares(bd, byte_tables)
    table["memory_held_GiB"] = table["subject"].map(held)
    table["label"] = table["subject"].map({k: s.label for k, s in subjects.items()})
    components = component_limits(bd, byte_tables, gbps)
    io.write_dataframe(out / f"{stamp}_limits.csv", limits)
    io.write_dataframe(out / f"{stamp}_components.csv", components)
    io.write_dataframe(out / f"{stamp}_breakdown.csv", bd)
    io.write_dataframe(out / f"{stamp}_shares.csv", table)
    bytes_table = pd.concat(list(byte_tables.values()), ignore_index=True)
    io.write_dataframe(out / f"{stamp}_bytes.csv", bytes_table)
    io.write_json(out / f"{stamp}_provenance.json", {
        **provenance.full_record(), "started": started.isoformat(),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(), "args": vars(args), "source": source,
        "targets": TARGETS, "subjects": {k: {"label": s.label, **s.description} for k, s in subjects.items()},
        "read_reference": ceiling_record, "load_average_1_5_15": list(os.getloadavg()),
        "peer": peer.record() if peer is not None else None})
    pd_opts = dict(index=False, float_format=lambda x: f"{x:.4g}")
    print(table.drop(columns=["label"]).to_string(**pd_opts))
    for _, r in table.iterrows():
        print(f"{r.subject}: expert share {r.expert_share:.3f} (target >= {TARGETS['expert_share_min']}), "
              f"draft token / step {r.draft_ratio:.3f} (target <= {TARGETS['draft_ratio_max']}), "
              f"memory held {r.memory_held_GiB:.2f} GiB; {r.label}")
    print(f"peak memory of this run (all subjects): {table.peak_memory_GiB.iloc[0]:.2f} GiB "
          f"(target for one subject <= {TARGETS['memory_GiB_max']} GiB); read {table.read_GBps.iloc[0]:.1f} GB/s")
    print(bytes_table[["subject", "component", "subject_bytes", "subject_share", "published_share"]].to_string(**pd_opts))
    print(limits[["subject", "path", "pass", "step_ms", "bytes_MB", "limit_ms", "share_of_limit", "share_q25",
                  "share_q75"]].to_string(**pd_opts))
    print(components.to_string(**pd_opts))
    print(f"read reference: {ceiling_record}")
    summarize(out, stamp)
    print(f"written to {out}/{stamp}_*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
