"""Training speed of the embedded models: the previous training path against the current one,
interleaved in one run (issue 15, item 1; numbers in docs/models.md).

Paths (each its own model, same initialisation, same batches; one training step = forward,
backward, gradient clip, optimiser step of ``--batch-size`` x 256 tokens):

* ``moe previous``: the default MoE with the padded ``[N, C, H]`` bmm expert operation
  (:data:`moespec.zoo.experts.PADDED_IMPLEMENTATION`), f32, the multi-tensor AdamW;
* ``moe current``: the grouped ``torch._grouped_mm`` expert operation, f32, fused AdamW (the
  recipe's path);
* ``draft previous``: the dense draft, eager f32, multi-tensor AdamW;
* ``draft current``: forward and loss through ``torch.compile`` under bf16 autocast, fused AdamW;
* ``draft current + teacher``: the same plus the MoE teacher's forward pass (grouped experts),
  the cost of a distillation step as the recipe trains it.

Steps are timed with the project's harness (``moespec.measure.timing.time_interleaved``:
round-robin, medians and quartiles), ``--warmup`` untimed rounds first (torch.compile compiles
in the first). The other processes' CPU share over the run is recorded (``MachineMonitor``).
Rows: ``data/bench/training/<stamp>_training.csv`` (+ ``_provenance.json``).

Run: ``.venv/bin/python benchmarks/bench_training.py [--reps 15] [--threads 1]``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from moespec import io, paths, zoo
from moespec.measure import protocols
from moespec.measure.timing import MachineMonitor, time_interleaved
from moespec.zoo import build
from moespec.zoo.experts import IMPLEMENTATION, PADDED_IMPLEMENTATION
from moespec.zoo.train import Trainer, TrainConfig, bf16_native


def _model(what: str, experts: str | None = None):
    torch.manual_seed(0)
    model = build.new_model(what, "full")
    if experts is not None:
        model.config._experts_implementation = experts
    return model


def trainers(stream: np.ndarray, batch_size: int) -> dict[str, Trainer]:
    """The five paths of the module docstring, each a :class:`Trainer` on its own model."""
    base = dict(steps=10**6, batch_size=batch_size, seq_len=zoo.CONTEXT, warmup=20)
    prev = TrainConfig(**base, fused_optimizer=False)
    moe_now = build.PROFILES["full"]["moe"]
    draft_now = build.PROFILES["full"]["draft"]
    same = lambda cfg, **kw: TrainConfig(**{**cfg.to_dict(), **base, **kw})
    teacher = _model("moe", IMPLEMENTATION).eval()
    return {
        "moe previous": Trainer(_model("moe", PADDED_IMPLEMENTATION), stream, prev),
        "moe current": Trainer(_model("moe", IMPLEMENTATION), stream, same(moe_now)),
        "draft previous": Trainer(_model("draft"), stream, prev),
        "draft current": Trainer(_model("draft"), stream, same(draft_now, distill=0.0)),
        "draft current + teacher": Trainer(_model("draft"), stream, same(draft_now), teacher=teacher),
    }


def rows(timings, tokens_per_step: int) -> pd.DataFrame:
    """One row per path: median/quartile step times, tokens/s at the median, and the speed-up of
    each current path over its model's previous one (ratio of medians)."""
    out = []
    for name, t in timings.items():
        out.append({"path": name, "model": name.split()[0], **t.row(),
                    "tokens_per_step": tokens_per_step, "tokens_per_s": tokens_per_step / t.median_s})
    df = pd.DataFrame(out)
    prev = df[df["path"].str.endswith("previous")].set_index("model")["t_median_s"]
    df["speedup_vs_previous"] = prev.reindex(df["model"]).to_numpy() / df["t_median_s"]
    return df


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=15, help="timed steps per path (default 15)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed rounds first (default 3)")
    ap.add_argument("--batch-size", type=int, default=build.PROFILES["full"]["moe"].batch_size)
    ap.add_argument("--threads", type=int, default=build.TRAIN_THREADS, help="torch intra-op threads")
    ap.add_argument("--out", type=Path, default=None, help="folder for the rows (default data/bench/training)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    stream = build.training_stream(zoo.load_tokenizer() if (paths.models_dir() / zoo.TOKENIZER_DIR).is_dir()
                                   else build.train_tokenizer("full"), None)
    paths_ = trainers(stream, args.batch_size)
    with MachineMonitor() as mon:
        timings = time_interleaved({k: tr.step for k, tr in paths_.items()}, reps=args.reps, warmup=args.warmup)
    df = rows(timings, args.batch_size * zoo.CONTEXT).assign(threads=args.threads, **mon.state.row())
    stamp = protocols.stamp()
    out = paths.ensure(args.out or paths.bench_dir() / "training")
    io.write_dataframe(out / f"{stamp}_training.csv", df)
    protocols.write_provenance(out / f"{stamp}_training_provenance.json",
                               {**{k: str(v) for k, v in vars(args).items()}, "bf16_native": bf16_native()})
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(df[["path", "t_median_s", "t_q25_s", "t_q75_s", "tokens_per_s", "speedup_vs_previous"]].round(4))
    print(f"other processes' CPU share during the run: {mon.state.other_load:.2f}; rows: {out}/{stamp}_training.csv")
    return 0


if __name__ == "__main__":
    sys.exit(main())
