"""The expert operation at batched verify passes (issue 56, item 3): n = B(k + 1) tokens, one window
of k + 1 consecutive tokens from each of B different documents of the routing trace, both kernels.

The expert-operation benchmark of notebooks 02/03 (``moespec.measure.expert_op``) in its batch mode
(``BenchConfig.batch_sizes``): per backend one run, one interleaved group per layer holding every
(B, k + 1) pass with both kernels, the read ceiling's patterns and the ``torch.sum`` read, round-robin
over the repetitions, a cache flush before every call sized from the machine's last-level cache
(``timing.flush_bytes``), one torch thread, random weights at the model's shape. Then the fits of
eq. (4)/(E.1) over the whole range of n and the regimes (``moespec.fit.regimes``: whether, and from
which n, the time stops being explained by bytes), per backend, kernel and layer.

    .venv/bin/python benchmarks/bench_batch_passes.py                       # OLMoE, f32, cpp/torch/ggml
    .venv/bin/python benchmarks/bench_batch_passes.py --backends cpp --reps 5 --passes 2

Writes under ``benchmarks/results/batch/``: ``<stamp>_batch.csv`` (one row per pass and kernel: B,
k_plus_1, n, U, the times' median and quartiles over the repetitions, beside each the read ceiling of
its group, the ``torch.sum`` read, the machine's load and the hardware), ``<stamp>_fits.csv`` (the
single fit over the range and the regimes), ``<stamp>.json`` (arguments, hardware and versions,
the flush and reads, per backend its run, read ceiling and regimes) and the runs' folders under
``expert_op/`` (``rows.csv``, ``provenance.json``). docs/kernels.md, "Batched verify passes", is written
from these files by ``moespec report``.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from moespec import fit, io, provenance
from moespec.measure import discard, expert_op, ggml_peer, protocols, timing

OUT = Path(__file__).resolve().parent / "results" / "batch"
CPU_BACKENDS = ("cpp", "torch", expert_op.GGML)


def pass_table(run_dir: Path, record: dict) -> pd.DataFrame:
    """The batched passes of one run with, on every row, the read ceiling and the ``torch.sum`` read of
    its group (GB/s, ``read_probe`` the ceiling's pattern), the run's hardware and whether the discard
    rule keeps the group."""
    rows = expert_op.load_rows(run_dir)
    judged = discard.apply_rule(rows, source=str(run_dir / "rows.csv")).rows
    passes = judged[judged["kind"] == expert_op.BATCH].copy()
    passes["kept"] = ~passes["discarded"].astype(bool)
    passes = passes.drop(columns=list(discard.RULE_COLUMNS))
    for reference, cols in (("ceiling", ["read_GBps", "read_hi_GBps", "read_probe"]), ("sum", ["read_GBps"])):
        g = expert_op.read_groups(rows, reference)[["layer"] + cols]
        if reference == "sum":
            g = g.rename(columns={"read_GBps": "sum_GBps"})
        passes = passes.merge(g, on="layer", how="left")
    for col in ("B", "k_plus_1", "n", "U", "layer"):
        passes[col] = passes[col].astype(int)
    passes["beta_GBps"] = passes["requested_bytes"] / passes["t_median_s"] / 1e9
    passes["beta_over_read"] = passes["beta_GBps"] / passes["read_GBps"]
    cpu = record["hardware"]["cpu"]
    passes["cpu_model"], passes["logical_cpus"] = cpu.get("cpu_model"), cpu.get("logical_cpus")
    passes["llc_bytes"] = (cpu.get("llc") or {}).get("bytes")
    passes["torch"] = record["versions"]["torch"]
    return passes


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=None,
                    help=f"comma-separated, of {', '.join(CPU_BACKENDS)} (default: all; ggml where its peer is built)")
    ap.add_argument("--model", default="olmoe")
    ap.add_argument("--fmt", default="f32", help="f32, bf16 or int8_b32 (ggml: q8_0)")
    ap.add_argument("--batch-sizes", default="1,2,4,8", help="B, sequences per pass")
    ap.add_argument("--windows", default="1,2,3,4,5,6,7,8,9", help="k + 1, tokens per sequence")
    ap.add_argument("--passes", type=int, default=1, help="passes per (B, k + 1), each from other documents")
    ap.add_argument("--layers", default="0", help="MoE layers timed (one group each)")
    ap.add_argument("--reps", type=int, default=5, help="timed rounds")
    ap.add_argument("--quick", action="store_true", help="tiny shapes and a 1 MiB flush: seconds, for tests")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    backends = (args.backends.split(",") if args.backends else
                [b for b in CPU_BACKENDS if b != expert_op.GGML or ggml_peer.available()])
    unknown = sorted(set(backends) - set(CPU_BACKENDS))
    if unknown:
        raise SystemExit(f"--backends: expected some of {', '.join(CPU_BACKENDS)}; found {', '.join(unknown)}")
    ints = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    base = expert_op.profile_config("quick" if args.quick else "full", args.model, args.fmt, "auto", "cpu", args.seed)
    # the routing notebooks 02/03 time their windows on (full profile: 16 documents of 512 tokens)
    trace = expert_op.routing_for(args.model, seed=args.seed, num_docs=16, doc_len=64 if args.quick else 512)
    stamp, t0 = protocols.stamp(), time.perf_counter()
    record = provenance.full_record()
    tables, fits, runs = [], [], {}
    for backend in backends:
        cfg = expert_op.BenchConfig(**{**base.as_dict(), "backend": backend, "layers": ints(args.layers),
                                       "ns": ints(args.windows), "batch_sizes": ints(args.batch_sizes),
                                       "windows_per_n": args.passes, "reps": args.reps, "u_count": 0,
                                       "interleave": "layer"})
        started = time.perf_counter()
        run_dir = expert_op.run(cfg, out_dir=args.out / "expert_op", trace=trace)
        table = pass_table(run_dir, record)
        tables.append(table)
        kept = table[table["kept"]]
        single = fit.fit_layers(kept, ns=range(2, int(kept["n"].max()) + 1), kinds=(expert_op.BATCH,))
        reg = fit.regimes(kept)
        fits.append(pd.concat([single.assign(regime="single fit"), reg]))
        runs[backend] = {"run_dir": str(run_dir.relative_to(args.out)),
                         "wall_s": round(time.perf_counter() - started, 1),
                         "read_ceiling": expert_op.read_bandwidth(expert_op.load_rows(run_dir)),
                         "sum_read": expert_op.read_bandwidth(expert_op.load_rows(run_dir), reference="sum"),
                         "other_load": float(table["other_load"].max()), "flags": sorted(set(table["flags"].dropna())),
                         "kept_passes": int(table["kept"].sum()), "passes": int(len(table)),
                         "regimes": reg[["layer", "kernel", "regime", "n_from", "n_to"]].to_dict("records")}
        print(f"{backend}: {run_dir}, read ceiling {runs[backend]['read_ceiling']['median_GBps']:.1f} GB/s, "
              f"other load {runs[backend]['other_load']:.2f}, {runs[backend]['wall_s']:.0f} s")
        print(reg[["layer", "kernel", "regime", "n_from", "n_to", "fit_median_rel_err"]].to_string(index=False))
    csv = io.write_dataframe(args.out / f"{stamp}_batch.csv", pd.concat(tables))
    io.write_dataframe(args.out / f"{stamp}_fits.csv", pd.concat(fits))
    io.write_json(args.out / f"{stamp}.json", {
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}, "backends": backends,
        "model": args.model, "fmt": args.fmt, "trace": trace.label, "cold": timing.cold_record("cpu",
                                                                                              base.flush_bytes,
                                                                                              base.membw_bytes),
        "runs": runs, "wall_s": round(time.perf_counter() - t0, 1), "provenance": record})
    print(f"rows: {csv}")


if __name__ == "__main__":
    main()
