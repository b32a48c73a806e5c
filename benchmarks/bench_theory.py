"""Speed of the staircase (issue 3, item 6): k*(a) on 10^5 acceptance values with kmax = 16.

Times, as medians with interquartile ranges over repetitions (``moespec.measure.timing``, callables
interleaved, no cache flush: the inputs are a few MB):
  * ``best_draft_length(V, a)``: the vectorized smallest maximizer of G_a(k)/V(k) (target: 0.1 s);
  * ``step_points(V)`` (eq. B.31) and ``staircase(V)``, then reading k*(a) off the staircase;
for two step-time vectors of length 17: the affine cost 1 + k/5, and the deduplicating-engine step
time built from paper 1's published Table 1 row "llama.cpp CUDA, OLMoE" (their hardware). Both
ways of computing k*(a) are checked to agree away from the step points. Writes
``data/bench/theory.json`` with the machine and versions.

Run: ``.venv/bin/python benchmarks/bench_theory.py [--repeats 21] [--values 100000]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from moespec import io, paths, provenance
from moespec import theory as th
from moespec.measure import protocols
from moespec.measure.timing import summary_line, time_interleaved
from moespec.tables import theory as tables


def step_vectors(kmax: int) -> dict[str, np.ndarray]:
    table1 = tables.read_table1()
    row = table1[(table1["engine"] == "llama.cpp CUDA") & (table1["model"] == "OLMoE")]
    rec = tables.table1_step_times(row, kmax=kmax, dense_ratio=0.5)[0]
    return {"affine 1 + k/5": 1 + 0.2 * np.arange(kmax + 1),
            "paper 1 Table 1, llama.cpp CUDA OLMoE, dedup engine": rec["V_dedup"]}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--values", type=int, default=100_000)
    ap.add_argument("--kmax", type=int, default=16)
    args = ap.parse_args(argv)
    a = np.random.default_rng(0).random(args.values)
    record = {"provenance": provenance.full_record(), "values": args.values, "kmax": args.kmax,
              "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "results": {}}
    print(protocols.machine_line(record["provenance"]))
    for name, V in step_vectors(args.kmax).items():
        st = th.staircase(V)
        far = np.min(np.abs(a[:, None] - np.asarray(st.breakpoints + (2.0,))[None, :]), axis=1) > 1e-9
        agree = bool(np.array_equal(th.best_draft_length(V, a[far]), st(a[far])))
        timings = time_interleaved({
            "best_draft_length(V, a)": lambda: th.best_draft_length(V, a),
            "step_points(V)": lambda: th.step_points(V),
            "staircase(V)": lambda: th.staircase(V),
            "staircase(V)(a)": lambda: st(a),
        }, reps=args.repeats, warmup=2)
        res = {key: t.row() for key, t in timings.items()}
        res["staircase_agrees_with_argmax"] = agree
        res["step_points"] = [float(x) for x in th.step_points(V)]
        record["results"][name] = res
        print(f"\n{name}: k*(a) from the staircase agrees with the argmax: {agree}")
        for key, t in timings.items():
            print(summary_line(key, t.row(), unit="ms", width=26))
    out = io.write_json(paths.ensure(paths.bench_dir()) / "theory.json", record)
    print(f"\nwritten {out}")
    return record


if __name__ == "__main__":
    main()
