"""Fits (4)/(E.1) and epsilon per engine (issue 27, item 2): the expert-operation benchmark of
notebooks 02/03 (``moespec.measure.expert_op``, the main model's profile: two layers, n = 1..9,
chosen-id passes at 5 values of U per n, 5 routing windows per n, cold weights, one thread) run on
another engine's CPU expert operation, so that paper 1's per-kernel fits and its bandwidth error
epsilon exist per engine, as its Table 1 and Section 4 give them.

    .venv/bin/python benchmarks/ggml_peer/build.py            # once: llama.cpp's ggml, as a peer
    .venv/bin/python benchmarks/bench_engine_fits.py           # ggml, OLMoE's shape, f32 (about 10 min)

The default engine is ``ggml``: llama.cpp's CPU MUL_MAT_ID (deduplicating: it reads each distinct
expert of a pass once) and its per-slot counterpart, one MUL_MAT_ID call per token
(docs/ggml_peer.md). ``--backends cpp,ggml`` also re-times moespec's own kernels. The runs are
written under ``benchmarks/results/engine_fits/<run_id>/`` (``rows.csv``, ``provenance.json`` with
hardware and versions; an interrupted run resumes), which notebook 03 reads (its parameter
``engine_fit_runs``) to put each engine's fits beside those of its own run. Torch's allocations use
the page size notebooks 02/03 run with (no ``THP_MEM_ALLOC_ENABLE``), and the ggml peer the same.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from moespec import fit
from moespec.measure import discard, expert_op

OUT = Path(__file__).resolve().parent / "results" / "engine_fits"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=expert_op.GGML, help="comma-separated: ggml, cpp")
    ap.add_argument("--model", default="olmoe")
    ap.add_argument("--fmt", default="f32", help="f32, bf16 or int8_b32 (ggml: q8_0)")
    ap.add_argument("--profile", default="full", choices=("quick", "full"))
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    # the routing notebook 03 times its windows on (its full profile: 16 documents of 512 tokens)
    num_docs, doc_len = (4, 64) if args.profile == "quick" else (16, 512)
    trace = expert_op.routing_for(args.model, seed=args.seed, num_docs=num_docs, doc_len=doc_len)
    for backend in args.backends.split(","):
        cfg = expert_op.profile_config(args.profile, args.model, args.fmt, backend, "cpu", args.seed, role="main")
        run_dir = expert_op.run(cfg, out_dir=args.out, trace=trace)
        decision = discard.apply_rule(expert_op.load_rows(run_dir), source=str(run_dir / "rows.csv"))
        rows = decision.kept
        fits = fit.fit_layers(rows)
        eps = fit.epsilon(fit.window_errors(fits, rows))
        print(f"{backend}: run {run_dir} (torch threads {torch.get_num_threads()} outside the run); "
              f"read bandwidth {expert_op.read_bandwidth(rows)['median_GBps']:.2f} GB/s")
        print(fits[["layer", "kernel", "fit", "t_op", "c_u", "c_re", "c_g", "c_t"]].to_string(index=False))
        print(eps.to_string(index=False))


if __name__ == "__main__":
    main()
