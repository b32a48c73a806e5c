"""Speculation under concurrency, measured on the engine (issue 56, items 4 and 5): throughput per
sequence at batch B and draft length k, relative to plain decoding at the same B.

Every (B, k) cell is a run of :func:`moespec.engine.batch_speculative.batch_generate`: B sequences
(the first B of the run's prompts) decoded together until each holds ``--n-tokens`` tokens, every
round one verify pass of n = B(k + 1) tokens through the kernel switch (the dedup switch as set:
``--dedup``), each sequence accepting its own drafts. The draft is the oracle draft at acceptance
``--a`` per sequence (default; the continuations decoded untimed beforehand) or the subject's real
draft (``--draft real``), batched. The cells run in a seeded shuffled order per repetition, each
preceded by a ``torch.sum`` read of the machine's reference size (the read bandwidth of the same
run, cell by cell) and watched by :class:`moespec.measure.timing.MachineMonitor` (other processes'
load). After the grid, the round terms per B (:func:`moespec.engine.batch_speculative.time_round_terms`:
the verify pass at n = B(k + 1) and the draft, medians over ``--term-reps`` interleaved
repetitions beside a read) on the same prompts, at ``--term-positions`` places spread over the
runs' text, with the oracle's replaced drafts where the oracle drafts, each call after the previous
round's pass over the text just before it.

    .venv/bin/python benchmarks/bench_batch_engine.py                           # quick profile, oracle a = 0.8
    .venv/bin/python benchmarks/bench_batch_engine.py --draft real --profile full --n-tokens 32

Writes under ``benchmarks/results/batch_engine/``: ``<stamp>_runs.csv`` (one row per cell and
repetition: B, k, rep, the run's tokens, acceptance, throughput per sequence and per batch, the
per-round means of the verify pass, the draft and the host, ``read_GBps`` of the read before it, the
machine's load and flags), ``<stamp>_summary.csv`` (per (B, k): medians over the repetitions and
``rel_plain``, the median throughput per sequence over the median of plain decoding (k = 0) at the
same B, with ``rel_plain_q25``/``rel_plain_q75`` of the per-repetition ratios), ``<stamp>_terms.csv``
(the round terms) and ``<stamp>.json`` (arguments, the subject, the read size, the machine's record
and versions, the wall time).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io, provenance
from moespec.engine.batch import BatchEngine
from moespec.engine.batch_speculative import (BatchModelDraft, BatchOracleDraft, batch_generate, round_setup,
                                              summarize_batch_steps, text_positions, time_round_terms)
from moespec.engine.runs import prompt_reference
from moespec.engine.subject import load_subject
from moespec.measure import protocols, timing
from moespec.threads import torch_threads

OUT = Path(__file__).resolve().parent / "results" / "batch_engine"


def _ints(text: str, name: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",")]
    except ValueError:
        raise SystemExit(f"{name}: expected comma-separated integers, found {text!r}") from None


def run_cell(target, sub, prompts, refs, B: int, k: int, args, read) -> dict:
    """One (B, k) run, after a read of the machine's reference size: the run's summary row."""
    read_fn, nbytes = read
    bw = nbytes / (timing.CpuTimer()(read_fn) * 1e-9) / 1e9
    if args.draft == "oracle":
        drafter = BatchOracleDraft(sub.engine, args.a, sub.vocab_size, seed=args.seed) if k else None
    else:
        drafter = BatchModelDraft(sub.draft) if k else None
    with timing.MachineMonitor() as mon:
        _, steps = batch_generate(target, prompts[:B], k, args.n_tokens, drafter=drafter,
                                  references=refs[:B] if drafter is not None and args.draft == "oracle" else None)
    return {**summarize_batch_steps(steps), "read_GBps": bw, **mon.state.row()}


def summarize(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (B, k): medians over the repetitions, and the throughput per sequence relative to plain
    decoding (k = 0) at the same B (the ratio of medians; the quartiles of the per-repetition ratios)."""
    cols = ["throughput_per_seq", "throughput_batch", "realized_a", "tokens_per_round_per_seq", "t_verify_mean_s",
            "t_draft_mean_s", "t_host_mean_s", "t_step_mean_s", "read_GBps", "other_load"]
    out = runs.groupby(["B", "k"], as_index=False).agg(
        n_pass=("n_pass", "first"), reps=("rep", "count"), **{c: (c, "median") for c in cols})
    plain = runs[runs.k == 0].set_index(["B", "rep"])["throughput_per_seq"]
    ratio = runs.assign(r=runs.throughput_per_seq.values / plain.loc[list(zip(runs.B, runs.rep))].values)
    q = ratio.groupby(["B", "k"]).r.quantile([0.25, 0.75]).unstack()
    base = out[out.k == 0].set_index("B")["throughput_per_seq"]
    out["rel_plain"] = out.throughput_per_seq / base.loc[out.B].values
    out["rel_plain_q25"] = q.loc[list(zip(out.B, out.k)), 0.25].values
    out["rel_plain_q75"] = q.loc[list(zip(out.B, out.k)), 0.75].values
    return out


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="byte-faithful-all", help="a subject of moespec.engine.subject")
    ap.add_argument("--profile", default="quick", choices=("quick", "full"))
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="B, sequences decoded together")
    ap.add_argument("--ks", default="0,1,2,3,4,5,6,7,8", help="draft lengths (0: plain decoding, needed)")
    ap.add_argument("--draft", default="oracle", choices=("oracle", "real"))
    ap.add_argument("--a", type=float, default=0.8, help="the oracle draft's acceptance")
    ap.add_argument("--dedup", type=int, default=1, choices=(0, 1), help="the dedup switch during the runs")
    ap.add_argument("--n-tokens", type=int, default=32, help="tokens per sequence per run")
    ap.add_argument("--prompt-tokens", type=int, default=24)
    ap.add_argument("--reps", type=int, default=5, help="repetitions of the whole grid")
    ap.add_argument("--term-reps", type=int, default=5, help="interleaved repetitions of the round terms")
    ap.add_argument("--term-positions", type=int, default=8,
                    help="places in the runs' text the round terms are timed at (text_positions)")
    ap.add_argument("--read-bytes", type=int, default=0, help="bytes of each reference read (0: the machine's)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the timed work")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    Bs, ks = _ints(args.batch_sizes, "--batch-sizes"), _ints(args.ks, "--ks")
    if min(Bs) < 1:
        raise SystemExit(f"--batch-sizes: every B must be >= 1, found {min(Bs)}")
    if 0 not in ks or min(ks) < 0:
        raise SystemExit(f"--ks: draft lengths >= 0 including 0 (plain decoding, the reference), found {ks}")
    stamp, t0 = protocols.stamp(), time.perf_counter()
    record = provenance.full_record()
    sub = load_subject(args.model, profile=args.profile)
    sub.engine.dedup = bool(args.dedup)
    prompts = [np.asarray(p) for p in sub.chat_prompts(max(Bs), args.prompt_tokens, seed=args.seed)]
    refs = [prompt_reference(sub.engine, p, args.n_tokens + max(ks) + 1)[1] for p in prompts]  # untimed
    read = timing.read_bandwidth_callable(args.read_bytes or None)
    cells = [(B, k) for B in Bs for k in ks]
    rng = np.random.default_rng(args.seed)
    rows = []
    with torch_threads(args.threads):
        target = BatchEngine(sub.engine)
        for rep in range(args.reps):
            for i in rng.permutation(len(cells)):
                B, k = cells[i]
                rows.append({"rep": rep, **run_cell(target, sub, prompts, refs, B, k, args, read)})
                print(f"rep {rep} B={B} k={k}: {rows[-1]['throughput_per_seq']:.1f} tokens/s per sequence, "
                      f"read {rows[-1]['read_GBps']:.1f} GB/s, other load {rows[-1]['other_load']:.2f}", flush=True)
        draft = sub.draft if args.draft == "real" else None
        oracle = None if draft is not None else (args.a, sub.vocab_size, args.seed)
        setups = [round_setup(sub.engine, draft, prompts[:B], continuations=[r[1:] for r in refs[:B]], oracle=oracle)
                  for B in Bs]
        with timing.MachineMonitor() as mon:
            terms = time_round_terms(setups, ks, reps=args.term_reps, read=read,
                                     offsets=text_positions(args.n_tokens, min(args.term_positions, args.n_tokens)))
    terms = terms.assign(**mon.state.row())
    runs = pd.DataFrame(rows)
    summary = summarize(runs)
    runs_csv = io.write_dataframe(args.out / f"{stamp}_runs.csv", runs)
    io.write_dataframe(args.out / f"{stamp}_summary.csv", summary)
    io.write_dataframe(args.out / f"{stamp}_terms.csv", terms)
    io.write_json(args.out / f"{stamp}.json", {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "subject": {"kind": sub.kind, "label": sub.label, "description": sub.description},
        "prompt_lengths": [len(p) for p in prompts], "read_bytes": read[1],
        "machine": "shared CPU: other processes ran during the run (other_load per row)",
        "wall_s": round(time.perf_counter() - t0, 1), "provenance": record})
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(summary.pivot(index="k", columns="B", values="rel_plain").round(3).to_string())
    print(f"rows: {runs_csv}")
    return runs_csv


if __name__ == "__main__":
    main()
