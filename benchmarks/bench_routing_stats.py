"""Speed of the routing statistics (issue 2, item 5): a synthetic trace of 60 documents x 4096
tokens (245,760 tokens, about WikiText-103 test) x 16 layers x m = 8 of N = 64 experts.

Times, as medians over repetitions with their interquartile range (moespec.measure.timing, the
project's one timing harness; no cache flush: the statistics' own arrays are the workload):
  * reuse + mean_union + byte_share for n = 1..9 from a cold trace (window sums computed);
  * 2000 document-level bootstrap resamples of the layer-mean reuse (window sums cached), and
    the same from a cold trace;
and prints them with the machine and versions. Rows go to ``data/bench/routing_stats.json``.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_routing_stats.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import time

from moespec import io, paths, provenance
from moespec.measure import protocols
from moespec.measure.timing import summary_line, time_interleaved
from moespec.routing import bootstrap, byte_share, mean_union, reuse, synthetic


def bench(num_experts: int, repeats: int, resamples: int) -> dict:
    t0 = time.perf_counter()
    trace = synthetic.sticky(60, 4096, 16, num_experts, 8, keep=0.363,
                             working_set=min(47, num_experts), seed=0)
    gen_s = time.perf_counter() - t0

    def cold_stats():
        trace._cache.clear()
        reuse(trace, 9), mean_union(trace, 9), byte_share(trace, 9)

    def warm_boot():
        bootstrap(trace, 9, "reuse", resamples=resamples, seed=1)

    def cold_boot():
        trace._cache.clear()
        warm_boot()

    timings = time_interleaved({"stats_n1to9_cold": cold_stats,
                                f"bootstrap_{resamples}_warm": warm_boot,
                                f"bootstrap_{resamples}_cold": cold_boot}, reps=repeats, warmup=1)
    return {"trace": {"docs": trace.num_docs, "tokens": trace.num_tokens, "L": trace.num_layers,
                      "m": trace.top_k, "N": trace.num_experts, "generation_s": gen_s},
            **{name: t.row() for name, t in timings.items()}}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--resamples", type=int, default=2000)
    ap.add_argument("--experts", type=int, nargs="+", default=[64, 256],
                    help="N values to run (64 is the issue's target; 256 exercises 4-word masks)")
    args = ap.parse_args(argv)
    record = {"provenance": provenance.full_record(),
              "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "results": {}}
    print(protocols.machine_line(record["provenance"]))
    for N in args.experts:
        res = bench(N, args.repeats, args.resamples)
        record["results"][f"N={N}"] = res
        tr = res["trace"]
        print(f"\ntrace: {tr['docs']} docs, {tr['tokens']} tokens x L={tr['L']} x m={tr['m']}, N={tr['N']} "
              f"(generated in {tr['generation_s']:.1f} s)")
        for key, val in res.items():
            if key != "trace":
                print(summary_line(key, val))
    out = io.write_json(paths.ensure(paths.bench_dir()) / "routing_stats.json", record)
    print(f"\nwritten: {out}")
    return record


if __name__ == "__main__":
    main()
