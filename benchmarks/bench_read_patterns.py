"""How this machine's read rate depends on the access pattern (issue 4; docs/kernels.md, "How the
read pattern matters").

The CPU kernels' bandwidth targets are ratios to the read ceiling, the best of some of these
patterns (``moespec.measure.ceiling``). This script times, in one interleaved run with a ``torch.sum``
reference (a read flush of 4x the last-level cache, at least 256 MiB, before every call), the extension's
``read_probe``: threads streaming a second buffer as large (at least 1 GiB and the flush) in the
patterns the kernels use, with a running sum and nothing else (``moespec/kernels/csrc/cpu/read_probe.cpp``):

* ``halves``: one contiguous share per thread, as a parallel ``torch.sum`` reads;
* ``lanes``: consecutive matrices of ``--matrix-bytes`` (default: one int8 OLMoE gate matrix,
  2304 x 1024 bytes), thread t reading share t of each in turn, as the kernels' lanes do;
* ``whole``: the same matrices dealt whole, thread t reading matrices t, t + threads, ...;
* ``side``: 512-byte units each with 64 bytes from a second array, as int8 weights read beside a
  separate array of block scales (two streams);
* ``fused``: the same bytes as 576-byte units in one stream;

each with 0 and ``--fmas`` vector multiply-adds per 64-byte line (four chains side by side), and
with ``--prefetch B`` also with a software prefetch B bytes ahead. Per cell: GB/s (median over
rounds) and the ratio to the same round's ``torch.sum`` (paired per round: median and quartiles).

    .venv/bin/python benchmarks/bench_read_patterns.py                 # 15 rounds, ~1 min
    .venv/bin/python benchmarks/bench_read_patterns.py --rounds 31 --fmas 4 --prefetch 2048

Writes ``data/bench/kernels/<stamp>_read_patterns.csv`` and ``<stamp>_read_patterns_provenance.json``.
"""

from __future__ import annotations

import argparse
import os

# huge pages for both 1 GiB buffers, as in bench_kernels.py (set before torch allocates)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", os.environ.get("MOESPEC_BENCH_THP", "1"))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from moespec import io  # noqa: E402
from moespec.kernels import build  # noqa: E402
from moespec.measure import protocols, timing  # noqa: E402
from moespec.measure.protocols import read_flush, read_unsteady  # noqa: E402

PATTERNS = ("halves", "lanes", "whole", "side", "fused")


def summarize(read_ns, read_bytes: int, probe_ns: dict, probe_bytes: dict) -> pd.DataFrame:
    """One row per probe cell ``(pattern, fmas, prefetch)`` from per-round times (ns): the probe's GB/s
    (median over rounds) and its ratio to the same round's reference read (paired, median and
    quartiles); ``read_GBps`` and its range over the rounds, ``read_unsteady`` as bench_kernels.py
    flags a block whose reads saw the bandwidth regime change."""
    read_bw = read_bytes / np.asarray(read_ns, dtype=float)  # bytes per ns = GB/s
    rows = []
    for (pattern, fmas, prefetch), ns in probe_ns.items():
        bw = probe_bytes[(pattern, fmas, prefetch)] / np.asarray(ns, dtype=float)
        ratio = bw / read_bw
        rows.append({"pattern": pattern, "fmas_per_line": fmas, "prefetch_bytes": prefetch, "rounds": len(bw),
                     "GBps": float(np.median(bw)),
                     "over_read": float(np.median(ratio)), "over_read_q25": float(np.quantile(ratio, 0.25)),
                     "over_read_q75": float(np.quantile(ratio, 0.75)), "read_GBps": float(np.median(read_bw)),
                     "read_min_GBps": float(read_bw.min()), "read_max_GBps": float(read_bw.max()),
                     "read_unsteady": read_unsteady(read_bw)})
    return pd.DataFrame(rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--patterns", default=",".join(PATTERNS))
    ap.add_argument("--fmas", type=int, default=2, help="multiply-adds per 64-byte line in the second setting")
    ap.add_argument("--prefetch", type=int, default=0, help="also with a software prefetch this many bytes ahead")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--matrix-bytes", type=int, default=2304 * 1024)
    ap.add_argument("--gib", type=float, default=None,
                    help="size of the reference read and of the probe buffer (default: the larger of 1 GiB "
                         "and the flush)")
    protocols.add_common_arguments(ap, protocol=False, membw=False, seed=False)
    args = ap.parse_args(argv)
    patterns = args.patterns.split(",")
    unknown = [p for p in patterns if p not in PATTERNS]
    if unknown:
        ap.error(f"unknown pattern {unknown}; known: {list(PATTERNS)}")
    torch.set_num_threads(args.threads)
    mod = build.load_cpu()
    nbytes = timing.read_bytes() if args.gib is None else int(args.gib * 2**30)
    read, read_bytes = timing.read_bandwidth_callable(nbytes)
    buf = torch.ones(nbytes // 4)
    cells = [(p, f, d) for p in patterns for f in sorted({0, args.fmas}) for d in sorted({0, args.prefetch})]
    probe_ns = {c: [] for c in cells}
    probe_bytes = {c: mod.read_probe(buf, c[0], args.matrix_bytes, args.threads, c[1], c[2])[1] for c in cells}

    def probe(cell):
        return lambda: probe_ns[cell].append(mod.read_probe(buf, cell[0], args.matrix_bytes, args.threads, *cell[1:])[0])

    calls = {"read": read, **{c: probe(c) for c in cells}}
    res = timing.time_interleaved(calls, reps=args.rounds, warmup=1, flush=read_flush(protocols.sizes(args)[0]))
    # the probe's own clock (inside the parallel region); the warm-up call's time is dropped
    df = summarize(res["read"].samples_ns, read_bytes, {c: v[1:] for c, v in probe_ns.items()}, probe_bytes)
    df["threads"] = args.threads
    df["matrix_bytes"] = args.matrix_bytes
    df["thp"] = os.environ.get("THP_MEM_ALLOC_ENABLE", "0")
    df["date"] = protocols.utc_now()
    stamp = protocols.stamp()
    out = protocols.kernels_dir()
    io.write_dataframe(out / f"{stamp}_read_patterns.csv", df)
    protocols.write_provenance(out / f"{stamp}_read_patterns_provenance.json", args)
    r = df.iloc[0]
    print(f"torch.sum over {nbytes / 2**30:.3g} GiB: {r.read_GBps:.1f} GB/s"
          f" (rounds {r.read_min_GBps:.1f}-{r.read_max_GBps:.1f})"
          + ("  WARNING: bandwidth regime changed during the run; rerun" if r.read_unsteady else ""))
    print("read probe / torch.sum, paired per round (median [q25, q75]):")
    for _, row in df.iterrows():
        print(f"  {row.pattern:>7} fmas {row.fmas_per_line} prefetch {row.prefetch_bytes:>5}: {row.GBps:5.1f} GB/s  "
              f"{row.over_read:.3f} "
              f"[{row.over_read_q25:.3f}, {row.over_read_q75:.3f}]")
    print(f"rows: {out / (stamp + '_read_patterns.csv')}")


if __name__ == "__main__":
    main()
