"""How large a run's real-draft measurement must be for advise's regret goal to be resolvable.

advise is judged by its regret: the throughput lost by running its k instead of the measured best,
with a 95 % interval from a paired bootstrap over the run's repetitions (each repetition a median
over prompts; ``moespec.advice.measured.regret``). The goal is an upper end of at most 2 %. This
script simulates runs like a measured one (``moespec.advice.measured.run_regret_sizing``: each k's
repetitions normal around its measured speedup with the measured spread between repetitions) for
several numbers of repetitions and of prompts per repetition, and writes, per machine state, the
median and 80th percentile of the simulated upper ends at the measured best k and the share of runs
that resolve the goal: the size to pre-register before the run that uses it.

Run: ``.venv/bin/python benchmarks/size_regret.py [RUN] [--trials 200]`` (RUN: a run folder or the
committed ``figures/``). Writes ``benchmarks/results/regret_sizing/<stamp>.csv`` and ``.json``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from moespec import io, paths, provenance
from moespec.advice.measured import run_regret_sizing
from moespec.measure import protocols


def main(argv=None) -> Path:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", nargs="?", default=str(paths.committed_figures_dir()))
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--reps", default="3,5,7,9,11,15")
    ap.add_argument("--prompt-factors", default="1,2,4")
    ap.add_argument("--out", default=str(paths.ROOT / "benchmarks" / "results" / "regret_sizing"))
    args = ap.parse_args(argv)
    table = run_regret_sizing(Path(args.run), trials=args.trials,
                              reps=tuple(int(x) for x in args.reps.split(",")),
                              prompt_factors=tuple(float(x) for x in args.prompt_factors.split(",")))
    out = paths.ensure(Path(args.out))
    stamp = protocols.stamp()
    csv = io.write_dataframe(out / f"{stamp}.csv", table)
    io.write_json(out / f"{stamp}.json", {"run": str(args.run), "trials": args.trials, "rows": f"{stamp}.csv",
                                           **provenance.full_record()})
    with_cols = ["state", "measured_reps", "best_k", "reps", "prompt_factor", "rep_spread", "regret_hi_median",
                 "regret_hi_p80", "share_resolved"]
    print(table[with_cols].round(4).to_string(index=False))
    print(f"rows: {csv}")
    return csv


if __name__ == "__main__":
    main()
