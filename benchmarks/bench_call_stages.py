"""Where the time of a cold C++ kernel call goes (issue 4; docs/kernels.md, "Where a call's time goes").

For one model shape and each format, rounds of: a cache flush and a 1 GiB ``torch.sum`` (the read
bandwidth of the round, as in ``bench_kernels.py``), then for each n a cache flush and one
``expert_forward`` call (dedup kernel, cpp backend, a fresh random pass) with the driver's stage
clock on (:mod:`moespec.kernels.call_stages`): Python and pybind11 in, set-up, helper wake-up, the
work items (the weight stream), step 4, pybind11 and Python out. Per (format, n): the median of
each stage, the effective bandwidth (U*b / time) over the round's read bandwidth of the whole call
(from Python, as bench_kernels.py times it), of the C++ op alone (first line to return) and of the
work stage, and the fixed stages' share of the call.

    .venv/bin/python benchmarks/bench_call_stages.py                    # OLMoE, f32/bf16/int8, n = 1,2,4,9
    .venv/bin/python benchmarks/bench_call_stages.py --fmts int8_b32 --ns 1,2,3,4,5,6,7,8,9 --reps 21
    .venv/bin/python benchmarks/bench_call_stages.py --protocol warm-code   # cold weights, warm code

``--protocol cold`` (the default) flushes the caches before every call, as bench_kernels.py does, so
code and data are cold along with the weights; ``--protocol warm-code`` keeps the code warm and
the weights cold by giving each call the next of ``--copies`` copies of the layer (see
:func:`bench_format`).

Writes ``data/bench/kernels/<stamp>_stages.csv``, ``<stamp>_stages_provenance.json`` and a figure
``<stamp>_stages.png``.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("THP_MEM_ALLOC_ENABLE", os.environ.get("MOESPEC_BENCH_THP", "1"))  # as bench_kernels.py

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from moespec import io  # noqa: E402
from moespec.kernels import ExpertWeights, build  # noqa: E402
from moespec.kernels.call_stages import STAGES, stage_clock, timed_call  # noqa: E402
from moespec.measure import protocols, timing  # noqa: E402
from moespec.measure.ids import random_ids  # noqa: E402
from moespec.measure.protocols import Copies, read_flush, read_unsteady  # noqa: E402
from moespec.model_shapes import get_spec  # noqa: E402
from moespec.plots.kernels import call_stages_figure  # noqa: E402
from moespec.routing.stats import pass_union  # noqa: E402


def summarize(records, expert_bytes: int) -> dict:
    """The columns of one (format, n) row from its rounds' ``(requested bytes, CallStages, read
    bandwidth in B/s)``: the median of each stage (us), of the total (and its quartiles) and of the
    fixed stages (us and share of the call), and the call's and the work stage's effective
    bandwidth over the read bandwidth, paired per round, median over rounds (as bench_kernels.py)."""
    req = np.array([r for r, _, _ in records], dtype=float)
    st = [s for _, s, _ in records]
    rbw = np.array([bw for _, _, bw in records], dtype=float)
    total = np.array([s.total for s in st]) * 1e-6
    work = np.array([s.work for s in st]) * 1e-6
    op = np.array([s.op for s in st]) * 1e-6
    row = {"U_mean": float(req.mean() / expert_bytes), "reps": len(records)}
    row.update({f"{k}_us": float(np.median([getattr(s, k) for s in st])) for k in STAGES})
    row.update({"total_us": float(np.median(total)) * 1e6, "total_us_q25": float(np.quantile(total, 0.25)) * 1e6,
                "total_us_q75": float(np.quantile(total, 0.75)) * 1e6,
                "fixed_us": float(np.median([s.fixed for s in st])),
                "fixed_share": float(np.median([s.fixed / s.total for s in st])),
                "total_over_read": float(np.median(req / total / rbw)),
                "op_over_read": float(np.median(req / op / rbw)),
                "work_over_read": float(np.median(req / work / rbw))})
    return row



def bench_format(model: str, fmt: str, ns, reps: int, flush_bytes: int | None, membw_bytes: int | None, seed: int,
                 protocol: str = "cold", copies: int = 3) -> pd.DataFrame:
    """One run for one format: ``reps`` rounds; returns one row per n.

    ``protocol``: ``cold`` flushes the caches before every call (weights, code and metadata all
    cold: bench_kernels.py's protocol); ``warm-code`` does not flush between the calls of a round
    but gives each call the next of ``copies`` copies of the layer, so the weights it reads are cold
    (the other copies' reads evicted them) while the code and the driver's data stay warm, as for
    consecutive layers in an inference engine; one untimed call after the round's read warms them.
    """
    n_copies = protocols.check_protocol(protocol, copies)
    spec = get_spec(model)
    N, m, H = spec.num_experts, spec.top_k, spec.hidden_size
    layers = Copies(ExpertWeights.random(spec, fmt, seed=seed + i) for i in range(n_copies))
    b = layers.items[0].bytes_per_expert
    rng = np.random.default_rng(seed)
    x = {n: torch.randn(n, H, generator=torch.Generator().manual_seed(n)) for n in ns}
    for w in layers.items:  # build/load, pack, keep each copy's call plan
        timed_call(x[ns[0]], random_ids(ns[0], m, N, rng), w)
    read, read_bytes = timing.read_bandwidth_callable(membw_bytes)
    flush = read_flush(flush_bytes)
    read_bw, per_n = [], {n: [] for n in ns}
    with stage_clock():  # on throughout: nothing of the extension runs between a flush and its call
        for _ in tqdm(range(reps), desc=f"{model} {fmt} {protocol}", leave=False):
            flush()
            t = timing.CpuTimer()(read)
            read_bw.append(read_bytes / (t * 1e-9))
            if protocol == "warm-code":
                timed_call(x[ns[0]], random_ids(ns[0], m, N, rng), layers.next())  # untimed: warms the code
            for n in ns:
                ids = random_ids(n, m, N, rng)
                if protocol == "cold":
                    flush()
                _, st = timed_call(x[n], ids, layers.next())
                per_n[n].append((pass_union(ids, N) * b, st, read_bw[-1]))
    rows = []
    for n in ns:
        row = {"model": model, "fmt": fmt, "kernel": "dedup", "backend": "cpp", "n": n, "m": m, "N": N, "H": H,
               "I": spec.expert_intermediate, "expert_bytes": b}
        row.update(summarize(per_n[n], b))
        row.update({"read_GBps": float(np.median(read_bw)) / 1e9, "read_min_GBps": min(read_bw) / 1e9,
                    "read_max_GBps": max(read_bw) / 1e9})
        rows.append(row)
    df = pd.DataFrame(rows)
    for col, value in protocols.run_columns(layers.items[0].fmt).items():
        df[col] = value
    df["protocol"], df["copies"] = protocol, len(layers.items)
    df["flags"] = "read_unsteady" if read_unsteady(read_bw) else ""
    return df


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="olmoe")
    ap.add_argument("--fmts", default="f32,bf16,int8_b32")
    ap.add_argument("--ns", default="1,2,4,9")
    protocols.add_common_arguments(ap, reps=15)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    build.load_cpu()
    ns = [int(v) for v in args.ns.split(",")]
    stamp = protocols.stamp()
    out = protocols.kernels_dir()
    frames = []
    for fmt in args.fmts.split(","):
        df = bench_format(args.model, fmt, ns, args.reps, *protocols.sizes(args), args.seed,
                          protocol=args.protocol, copies=args.copies)
        frames.append(df)
        io.write_dataframe(out / f"{stamp}_stages.csv", pd.concat(frames))  # rows as they come
        flag = "  WARNING: read bandwidth changed regime in this block; rerun it" if df["flags"].iloc[0] else ""
        print(f"{args.model} {fmt} ({args.protocol}): read {df.read_GBps.iloc[0]:.1f} GB/s "
              f"({df.read_min_GBps.iloc[0]:.1f}-{df.read_max_GBps.iloc[0]:.1f}){flag}", flush=True)
        cols = ["n", "U_mean", *[f"{k}_us" for k in STAGES], "total_us", "fixed_share", "total_over_read", "op_over_read",
                "work_over_read"]
        print(df[cols].round(3).to_string(index=False), flush=True)
    df = pd.concat(frames)
    protocols.write_provenance(out / f"{stamp}_stages_provenance.json", args)
    fig = call_stages_figure(df, args.model)
    io.save_figure(fig, out / f"{stamp}_stages.png")
    print(f"\nrows: {out / (stamp + '_stages.csv')}\nfigure: {out / (stamp + '_stages.png')}")


if __name__ == "__main__":
    main()
