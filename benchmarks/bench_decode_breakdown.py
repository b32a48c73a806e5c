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

``--source random`` (or no trained models on disk) uses the default models' configurations with
random weights, labelled so: timing depends on shapes, formats and ids, and the routing of a
random router is close to uniform. Writes ``data/bench/breakdown/<stamp>_breakdown.csv``,
``<stamp>_shares.csv`` (times), ``<stamp>_bytes.csv`` (each component's bytes per step and share beside the
published model's at the subject's layers, :mod:`moespec.engine.byte_shares`) and ``<stamp>_provenance.json``.
"""

from __future__ import annotations

import argparse
import datetime as dt
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moespec import io, paths, provenance, zoo
from moespec.engine.breakdown import decode_breakdown, shares
from moespec.engine.byte_shares import byte_shares
from moespec.engine.subject import subject_from_models

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
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    source = args.source
    if source == "auto":
        source = "trained" if (paths.models_dir() / zoo.MOE_DIR / "model.safetensors").is_file() else "random"
    names = [s.strip() for s in args.subjects.split(",") if s.strip()]
    ns = tuple(int(x) for x in args.ns.split(","))
    started = dt.datetime.now(dt.timezone.utc)
    subjects, prompts, held = build(names, source, args.like, args.backend, args.depth, args.seed)
    bd = decode_breakdown(subjects, prompts, n_values=ns, reps=args.reps, warmup=args.warmup)
    fmt_of = {k: s.description.get("fmt", "f32") for k, s in subjects.items()}
    byte_tables = {k: byte_shares(s.engine, args.like, fmt_of[k], depths=(args.depth,)).assign(subject=k)
                   for k, s in subjects.items()}
    table = shares(bd, byte_tables)
    table["memory_held_GiB"] = table["subject"].map(held)
    table["label"] = table["subject"].map({k: s.label for k, s in subjects.items()})
    out = Path(args.out) if args.out else paths.bench_dir() / "breakdown"
    stamp = started.strftime("%Y%m%dT%H%M%S")
    io.write_dataframe(out / f"{stamp}_breakdown.csv", bd)
    io.write_dataframe(out / f"{stamp}_shares.csv", table)
    bytes_table = pd.concat(list(byte_tables.values()), ignore_index=True)
    io.write_dataframe(out / f"{stamp}_bytes.csv", bytes_table)
    io.write_json(out / f"{stamp}_provenance.json", {
        **provenance.full_record(), "started": started.isoformat(),
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(), "args": vars(args), "source": source,
        "targets": TARGETS, "subjects": {k: {"label": s.label, **s.description} for k, s in subjects.items()}})
    pd_opts = dict(index=False, float_format=lambda x: f"{x:.4g}")
    print(table.drop(columns=["label"]).to_string(**pd_opts))
    for _, r in table.iterrows():
        print(f"{r.subject}: expert share {r.expert_share:.3f} (target >= {TARGETS['expert_share_min']}), "
              f"draft token / step {r.draft_ratio:.3f} (target <= {TARGETS['draft_ratio_max']}), "
              f"memory held {r.memory_held_GiB:.2f} GiB; {r.label}")
    print(f"peak memory of this run (all subjects): {table.peak_memory_GiB.iloc[0]:.2f} GiB "
          f"(target for one subject <= {TARGETS['memory_GiB_max']} GiB); read {table.read_GBps.iloc[0]:.1f} GB/s")
    print(bytes_table[["subject", "component", "subject_bytes", "subject_share", "published_share"]].to_string(**pd_opts))
    print(f"written to {out}/{stamp}_*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
