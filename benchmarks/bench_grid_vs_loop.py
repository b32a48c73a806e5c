"""Why a verify pass costs more in notebook 05's shuffled grid than inside a decode loop (issue 24,
item 2; docs/engine.md, "Verify times: the grid and the loop").

The shuffled grid (:func:`moespec.engine.verify.measure_verify_times`) times each pass of n tokens
right after an unrelated pass (any of the 18 (n, kernel) passes of the repetition, in random order,
or the 256 MiB reference read), each followed by a crop of the KV cache back to the prompt. Inside a
decode loop a pass follows the previous round's pass of the same size, and the cache grows. This
benchmark times the same pass (the n tokens of the prompt's greedy continuation after 2n others,
at the same cache position) after each kind of predecessor, all conditions interleaved in a fresh
random order per repetition, so that a difference between conditions is the predecessor's and not
the machine's:

* ``loop``: inside a teacher-forced decode loop (the two rounds before fed n tokens each);
* ``same``: the same pass just before, then a crop (a grid of one pass size);
* ``after_n9_dedup`` / ``after_n9_slot``: a pass of 9 tokens with either kernel, then a crop;
* ``after_read`` / ``after_read_16M`` / ``after_read_1G``: a read of 256 MiB (the grid's reference
  read), 16 MiB or 1 GiB of an unrelated buffer (``ReferenceRead``), no pass;
* ``after_alloc``: 256 MiB allocated and freed untouched (the allocator alone);
* ``after_spin``: 5 ms of arithmetic without memory traffic (busy, no reads);
* ``after_idle_1ms`` / ``after_idle`` / ``after_idle_20ms``: 1, 5 or 20 ms asleep;
* ``after_crop_only``: one extra position appended untimed and cropped (the cache shrinks and grows);
* ``grid``: a predecessor drawn as the grid draws it (one of the 18 passes or the read).

Writes ``data/bench/grid_vs_loop/<stamp>_rows.csv`` (one timing per row), ``<stamp>_summary.csv``
(median and IQR per n and condition, and the median difference to ``loop`` with a bootstrap
interval) and ``<stamp>_provenance.json``.

    .venv/bin/python benchmarks/bench_grid_vs_loop.py --reps 40
"""

from __future__ import annotations

import argparse
import datetime as dt
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from moespec import io, paths, provenance
from moespec.engine.subject import load_subject
from moespec.engine.verify import prepare_prompt
from moespec.measure.regimes import ReferenceRead

CONDITIONS = ("loop", "same", "after_n9_dedup", "after_n9_slot", "after_read", "after_read_16M", "after_read_1G",
              "after_alloc", "after_spin", "after_idle_1ms", "after_idle", "after_idle_20ms", "after_crop_only", "grid")


def timed_pass(engine, tokens, clock=time.perf_counter) -> float:
    """Seconds of one forward pass over ``tokens``, the cache left holding them."""
    t0 = clock()
    engine.forward(tokens)
    return clock() - t0


class Predecessors:
    """What may run before the timed pass besides passes: reads of 16 MiB, 256 MiB (the grid's
    reference read) and 1 GiB of an unrelated buffer, an allocation of 256 MiB freed unread, and
    5 ms of arithmetic on a few registers' worth of data (busy, no memory traffic)."""

    def __init__(self):
        self.reads = {"after_read_16M": ReferenceRead(2**24), "after_read": ReferenceRead(), "after_read_1G":
                      ReferenceRead(2**30)}

    def __call__(self, condition: str) -> bool:
        if condition in self.reads:
            self.reads[condition]()
        elif condition == "after_alloc":
            buf = torch.empty(2**26)       # 256 MiB of float32, never touched
            del buf
        elif condition == "after_spin":
            x, t_end = 1.0, time.perf_counter() + 0.005
            while time.perf_counter() < t_end:
                x = x * 1.0000001 + 1e-9
        elif condition.startswith("after_idle"):
            time.sleep({"after_idle_1ms": 0.001, "after_idle": 0.005, "after_idle_20ms": 0.020}[condition])
        else:
            return False
        return True


def run_condition(engine, cont: list[int], d: int, n: int, condition: str, before: Predecessors,
                  rng: np.random.Generator) -> float:
    """Time the pass of ``cont[2n:3n]`` at cache position d + 2n after ``condition``'s predecessor.

    ``loop``: the two rounds of n tokens before it were passes of their own (``cont[:n]``, then
    ``cont[n:2n]``); every other condition brings the cache to d + 2n with one untimed pass of 2n
    tokens, then runs its predecessor. The cache is cropped back to the prompt afterwards."""
    timed = cont[2 * n:3 * n]
    engine.dedup = n > 1
    if condition == "loop":
        engine.forward(cont[:n])
        engine.forward(cont[n:2 * n])
    else:
        engine.forward(cont[:2 * n])
        base = d + 2 * n
        if condition == "same":
            engine.forward(timed)
            engine.crop(base)
        elif condition in ("after_n9_dedup", "after_n9_slot"):
            engine.dedup = condition.endswith("dedup")
            engine.forward(cont[2 * n:2 * n + 9])
            engine.crop(base)
            engine.dedup = n > 1
        elif condition == "after_crop_only":
            engine.forward(timed[:1])
            engine.crop(base)
        elif condition == "grid":
            pick = int(rng.integers(19))
            if pick == 18:
                before("after_read")
            else:
                engine.dedup = bool(pick % 2)
                engine.forward(cont[2 * n:2 * n + pick // 2 + 1])
                engine.crop(base)
                engine.dedup = n > 1
        elif not before(condition):
            raise ValueError(f"unknown condition {condition!r}; known {CONDITIONS}")
    t = timed_pass(engine, timed)
    engine.crop(d)
    return t


def summarize(rows: pd.DataFrame, n_boot: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Per n and condition: median, quartiles, and the median of the paired difference to the
    ``loop`` condition of the same repetition with a 95 % bootstrap interval (repetitions resampled)."""
    rng = np.random.default_rng(seed)
    out = []
    for n, g in rows.groupby("n"):
        wide = g.pivot_table(index="rep", columns="condition", values="t_s", aggfunc="first")
        for c in wide.columns:
            x = wide[c].to_numpy(float)
            diff = x - wide["loop"].to_numpy(float)
            boot = np.median(diff[rng.integers(len(diff), size=(n_boot, len(diff)))], axis=1)
            out.append({"n": int(n), "condition": c, "reps": len(x), "median_ms": 1e3 * np.median(x),
                        "q25_ms": 1e3 * np.quantile(x, 0.25), "q75_ms": 1e3 * np.quantile(x, 0.75),
                        "minus_loop_ms": 1e3 * np.median(diff), "minus_loop_lo_ms": 1e3 * np.quantile(boot, 0.025),
                        "minus_loop_hi_ms": 1e3 * np.quantile(boot, 0.975)})
    return pd.DataFrame(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="byte-faithful", help="subject of moespec.engine.subject (full profile)")
    ap.add_argument("--depth", type=int, default=64)
    ap.add_argument("--ns", default="1,2", help="pass sizes timed")
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="", help="output folder (default data/bench/grid_vs_loop)")
    args = ap.parse_args(argv)

    torch.set_num_threads(args.threads)
    started = dt.datetime.now(dt.timezone.utc)
    sub = load_subject(args.model, profile="full", seed=args.seed)
    engine = sub.engine
    prompt = sub.depth_prompts(args.depth, 1, args.seed)[0]
    cont = prepare_prompt(engine, prompt, n_max=30)   # three rounds of n and a pass of 9 after two
    engine.prefill(prompt)
    ref = ReferenceRead()
    before = Predecessors()
    ns = [int(x) for x in args.ns.split(",")]
    grid = [(n, c) for n in ns for c in CONDITIONS]
    rng = np.random.default_rng(args.seed)
    rows = []
    for rep in tqdm(range(-args.warmup, args.reps), desc="grid vs loop"):
        bw = ref()
        for i in rng.permutation(len(grid)):
            n, c = grid[i]
            t = run_condition(engine, cont, len(prompt), n, c, before, rng)
            if rep >= 0:
                rows.append({"rep": rep, "n": n, "condition": c, "t_s": t, "ref_GBps": bw})
    rows = pd.DataFrame(rows)
    summary = summarize(rows, seed=args.seed)
    out = paths.bench_dir() / "grid_vs_loop" if not args.out else Path(args.out)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    io.write_dataframe(out / f"{stamp}_rows.csv", rows)
    io.write_dataframe(out / f"{stamp}_summary.csv", summary.assign(subject=sub.label))
    io.write_json(out / f"{stamp}_provenance.json", {**provenance.full_record(), "started": started.isoformat(),
                                                     "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
                                                     "args": vars(args), "subject": sub.label})
    print(summary.round(3).to_string(index=False))
    print(f"written to {out}/{stamp}_*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
