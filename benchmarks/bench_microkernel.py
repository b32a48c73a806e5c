"""The C++ dot micro-kernels' own pace, without the memory stream (issue 4; docs/kernels.md, "What
limits the rest").

One thread runs a format's micro-kernel (the ISA path in use) for T tokens over rows that stay in
L1 (8 rows) or L2 (128 rows) of K = 2048 weights (OLMoE's H), through the extension's
``microkernel_ns``: nanoseconds per 64 weight bytes, the unit in which every format needs one
vector multiply-add per token. Rounds interleave every (format, T, size) cell; the table gives the
median over rounds and the interquartile range (this VM's arithmetic pace, like its memory
bandwidth, varies between minutes), and the weight bandwidth that pace allows one core at T tokens
(64 B over the median time, GB/s).

    .venv/bin/python benchmarks/bench_microkernel.py
    .venv/bin/python benchmarks/bench_microkernel.py --fmts int8_b32 --tokens 1,2,3,4 --rounds 21

Writes ``data/bench/kernels/<stamp>_microkernel.csv`` and ``<stamp>_microkernel_provenance.json``.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd
import torch
from tqdm import tqdm

from moespec import io
from moespec.kernels import build
from moespec.measure import protocols

SIZES = {"L1": 8, "L2": 128}  # rows of K weights: 8 x 2048 x 4 B = 64 KiB at most (f32), 128 rows: 1 MiB


def summarize(samples: dict) -> pd.DataFrame:
    """Rows (fmt, size, T) from ``{(fmt, size, T): [ns per 64 B, ...]}``: median, quartiles, and
    the per-core pace as GB/s of weights (64 B / median ns) and per token (x T)."""
    rows = []
    for (fmt, size, T), v in samples.items():
        v = np.asarray(v, dtype=float)
        med = float(np.median(v))
        rows.append({"fmt": fmt, "size": size, "T": T, "rounds": len(v), "ns_per_64B": med,
                     "ns_per_64B_q25": float(np.quantile(v, 0.25)), "ns_per_64B_q75": float(np.quantile(v, 0.75)),
                     "ns_per_64B_token": med / T, "weights_GBps_per_core": 64.0 / med,
                     "token_GBps_per_core": 64.0 * T / med})
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fmts", default="f32,bf16,int8_b32")
    ap.add_argument("--tokens", default="1,2,3,4,6,9")
    ap.add_argument("--sizes", default="L1,L2")
    ap.add_argument("--K", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--bytes-per-cell", type=float, default=64.0, help="MiB of weights streamed per measurement")
    args = ap.parse_args(argv)
    mod = build.load_cpu()
    fmts, tokens, sizes = args.fmts.split(","), [int(t) for t in args.tokens.split(",")], args.sizes.split(",")
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        ap.error(f"unknown size {unknown}; known: {sorted(SIZES)}")
    esize = {"f32": 4, "bf16": 2, "int8_b32": 1}
    cells = [(f, s, t) for f in fmts for s in sizes for t in tokens]
    samples = {c: [] for c in cells}
    for _ in tqdm(range(args.rounds), desc="rounds"):
        for fmt, size, T in cells:
            rows = SIZES[size]
            reps = max(1, int(args.bytes_per_cell * 2**20 / (rows * args.K * esize[fmt])))
            samples[(fmt, size, T)].append(mod.microkernel_ns(fmt, T, rows, args.K, reps))
    df = summarize(samples)
    df["K"] = args.K
    df["cpu_isa"] = [torch.ops.moespec.cpu_isa(f) for f in df["fmt"]]
    df["date"] = protocols.utc_now()
    stamp = protocols.stamp()
    out = protocols.kernels_dir()
    io.write_dataframe(out / f"{stamp}_microkernel.csv", df)
    protocols.write_provenance(out / f"{stamp}_microkernel_provenance.json", args)
    table = df.pivot_table(index=["fmt", "size"], columns="T", values="ns_per_64B_token", sort=False).round(3)
    print("ns per 64 weight bytes and token (median over rounds; one thread):")
    print(table.to_string())
    print("\nper-core pace, GB/s of weights at T tokens:")
    print(df.pivot_table(index=["fmt", "size"], columns="T", values="weights_GBps_per_core", sort=False).round(1).to_string())
    print(f"\nrows: {out / (stamp + '_microkernel.csv')}")


if __name__ == "__main__":
    main()
