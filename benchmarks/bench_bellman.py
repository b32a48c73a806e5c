"""Benchmark of ``moespec.oracle.bellman`` at the issue's size: N = 10^5 positions x Lmax = 12.

Prints the median and interquartile range over repetitions, with the machine and versions, and
writes them to data/bench/bellman.json. Target: at most 1 s per solve on this machine.

    .venv/bin/python benchmarks/bench_bellman.py [--n 100000] [--lmax 12] [--reps 7]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from moespec import io, paths, provenance
from moespec.oracle import bellman


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--lmax", type=int, default=12)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    p = rng.beta(4, 1.5, args.n)
    cost = rng.uniform(5.0, 9.0, (args.n, args.lmax, args.lmax + 1))
    bellman(p[:1000], cost[:1000])                    # warm-up (imports, allocator)
    times = []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        dp, policy = bellman(p, cost)
        times.append(time.perf_counter() - t0)
    t = np.array(times)
    q25, med, q75 = np.percentile(t, [25, 50, 75])
    result = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
              "n": args.n, "lmax": args.lmax, "reps": args.reps, "median_s": float(med), "q25_s": float(q25),
              "q75_s": float(q75), "min_s": float(t.min()), "max_s": float(t.max()), "dp0": float(dp[0]),
              "within_1s": bool(med <= 1.0),
              "load_average_1_5_15": list(os.getloadavg()), "provenance": provenance.full_record()}
    io.write_json(paths.bench_dir() / "bellman.json", result)
    print(f"bellman N={args.n} Lmax={args.lmax}: median {med:.3f} s (IQR {q25:.3f}-{q75:.3f}, "
          f"min {t.min():.3f}, max {t.max():.3f}) over {args.reps} runs; target <= 1 s: "
          f"{'met' if med <= 1.0 else 'NOT met'}; load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
