"""A quick check that the ggml peer runs at a model shape at n = 1..9, and roughly how fast.

    .venv/bin/python benchmarks/ggml_peer/quick_time.py                    # OLMoE, f32/bf16/q8_0, 3 reps
    .venv/bin/python benchmarks/ggml_peer/quick_time.py --fmts q8_0 --reps 5

One interleaved run per format (moespec.measure.timing, a read flush of 4x the last-level cache
before every call, at least 256 MiB; cold weights), random routing, round-robin over a ``torch.sum``
as large (at least 1 GiB: this run's read bandwidth), the peer at n = 1..9, and moespec's cpp dedup
kernel at the same n. Prints ms per call and bandwidth on distinct expert bytes (U*b) over the
read bandwidth. A smoke test with few repetitions, not the benchmark: ``bench_kernels.py`` is
where the peer's ratios are measured.
"""

from __future__ import annotations

import argparse
import os
import sys

# as benchmarks/bench_kernels.py: huge pages for torch's (and the peer's) weights, passive OpenMP
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from moespec.measure import ggml_peer as peer  # noqa: E402
from moespec.measure import timing  # noqa: E402
from moespec.kernels import ExpertWeights, expert_forward  # noqa: E402
from moespec.measure.ids import random_ids  # noqa: E402
from moespec.measure.protocols import read_flush  # noqa: E402
from moespec.model_shapes import get_spec  # noqa: E402
from moespec.routing.stats import pass_union  # noqa: E402

MOESPEC_FMT = {"f32": "f32", "bf16": "bf16", "q8_0": "int8_b32"}


def run_format(model: str, fmt: str, ns, reps: int, threads: int, read) -> list[dict]:
    spec = get_spec(model)
    N, m, H = spec.num_experts, spec.top_k, spec.hidden_size
    w = ExpertWeights.random(spec, MOESPEC_FMT[fmt], seed=0)
    p = peer.GgmlExperts.from_weights(w, fmt=fmt, threads=threads)
    rng = np.random.default_rng(0)
    x = {n: torch.randn(n, H, generator=torch.Generator().manual_seed(n)) for n in ns}
    passes = {(k, n): [random_ids(n, m, N, rng) for _ in range(reps + 1)] for k in ("ggml", "dedup") for n in ns}
    expert_forward(x[ns[0]], passes["dedup", ns[0]][0], w, kernel="dedup", backend="cpp")  # build, pack
    used = {key: [] for key in passes}

    def caller(kind, n):
        it = iter(passes[kind, n])

        def call():
            ids = next(it)
            used[kind, n].append(pass_union(ids, N))
            if kind == "ggml":
                return p(x[n], ids)
            return expert_forward(x[n], ids, w, kernel="dedup", backend="cpp")
        return call

    calls = {"read": read[0]}
    for n in ns:
        calls[f"ggml n={n}"] = caller("ggml", n)
        calls[f"dedup n={n}"] = caller("dedup", n)
    with timing.MachineMonitor() as mon:
        res = timing.time_interleaved(calls, reps=reps, warmup=1, flush=read_flush(timing.flush_bytes()))
    t_read = np.array(res["read"].samples_ns)
    bw_read = read[1] / np.median(t_read) * 1e9
    rows = []
    for n in ns:
        for kind, b in (("ggml", p.bytes_per_expert), ("dedup", w.bytes_per_expert)):
            t = np.array(res[f"{kind} n={n}"].samples_ns)
            u = np.array(used[kind, n][1:])  # the timed passes (the first was the warm-up)
            ratio = (u * b / t) / (read[1] / t_read)  # per round, then the median
            rows.append({"fmt": fmt, "kernel": kind, "n": n, "ms": np.median(t) / 1e6,
                         "beta_over_read": float(np.median(ratio)), "read_GBps": bw_read / 1e9,
                         "other_load": mon.state.other_load})
    p.close()
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="olmoe")
    ap.add_argument("--fmts", default="f32,bf16,q8_0")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args(argv)
    if not peer.available():
        print(f"the ggml peer is not built: run .venv/bin/python benchmarks/ggml_peer/build.py", file=sys.stderr)
        return 1
    print(peer.version(), f"threads={args.threads}", f"THP={os.environ['THP_MEM_ALLOC_ENABLE']}",
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    read = timing.read_bandwidth_callable(timing.read_bytes())
    ns = list(range(1, 10))
    for fmt in args.fmts.split(","):
        rows = run_format(args.model, fmt, ns, args.reps, args.threads, read)
        print(f"\n{args.model} {fmt}: read {rows[0]['read_GBps']:.1f} GB/s, other_load {rows[0]['other_load']:.2f}")
        print("kernel  " + "".join(f"{f'n={n}':>8}" for n in ns))
        for kind in ("ggml", "dedup"):
            sel = [r for r in rows if r["kernel"] == kind]
            print(f"{kind:6s}ms" + "".join(f"{r['ms']:8.2f}" for r in sel))
            print(f"{kind:6s}bw" + "".join(f"{r['beta_over_read']:8.3f}" for r in sel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
