"""CUDA bandwidth benchmark of moespec's per-slot and deduplicating expert kernels.

For every preset shape in ``moespec.models.PRESETS`` (random weights: timing depends on shapes,
format and ids, not on values), each format and each pass size n = 1..9, one interleaved run
times the per-slot op, the dedup op and a read of ``--membw-gib`` GiB (``torch.sum``: the GPU's
read bandwidth measured in the same run), each call after a 256 MiB L2 flush, with CUDA events
(``moespec.bench.timing``). Reported per row, with medians and interquartile ranges:

* effective bandwidth beta_p(n) = requested bytes / time (paper 1, Section 2): per-slot requests
  n*m*b, dedup U*b (b = bytes of one expert, U = distinct experts of the pass);
* r(n) = beta_dedup(n) / beta_slot(n), and each kernel's bandwidth as a share of the read bandwidth;
* ubar(n) under independent uniform routing, N(1 - q^n) / (n m) with q = 1 - m/N (paper 1,
  Section 1), and whether ubar(n) < r(n) (dedup faster on such routing).

Times are GPU time only (:class:`moespec.bench.timing.QueuedCudaTimer`): a spin kernel holds the GPU while the host
enqueues each call, so the host's launch overhead (Python, dispatcher, three launches) stays out
of the events; ``--plain-timer`` uses ``moespec.bench.timing.CudaTimer`` instead, which includes it.

Ids: each token's m experts drawn uniformly without replacement (seeded), so U follows uniform
routing; the pass is the same for every repetition. Rows go to ``rows.csv`` as they are measured
(a rerun into the same folder resumes); ``report.md`` and ``provenance.json`` (commit, versions,
GPU record via NVML) are written at the end.

    python benchmarks/bench_kernels_cuda.py --out reports/gpu/bench      # all presets, all formats
    python benchmarks/bench_kernels_cuda.py --quick --out /tmp/b          # shrunk shapes, seconds
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import sys
import zlib
from pathlib import Path

FORMATS = ("f32", "bf16", "int8_b32")
FIELDS = ["model", "fmt", "n", "m", "N", "H", "I", "U", "expert_bytes", "slot_bytes", "dedup_bytes",
          "t_slot_s", "t_slot_q25_s", "t_slot_q75_s", "t_dedup_s", "t_dedup_q25_s", "t_dedup_q75_s",
          "t_read_s", "read_bytes", "beta_slot_GBps", "beta_dedup_GBps", "beta_read_GBps", "r",
          "r_q25", "r_q75", "slot_of_read", "dedup_of_read", "ubar_uniform", "dedup_faster_uniform",
          "reps", "gpu_throttle", "flags"]
KEY = ["model", "fmt", "n"]


def parse_args(argv=None) -> argparse.Namespace:
    from moespec.models import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: data/bench/cuda/<UTC time>)")
    ap.add_argument("--models", default=",".join(PRESETS), help="comma-separated preset names")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: f32, bf16, int8_b32")
    ap.add_argument("--ns", default="1,2,3,4,5,6,7,8,9", help="pass sizes n")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--membw-gib", type=float, default=1.0, help="GiB read by the bandwidth reference")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--plain-timer", action="store_true",
                    help="time with moespec.bench.timing.CudaTimer (includes host launch overhead)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: shapes shrunk to H=I=256, 5 reps, n in {1,2,9}")
    args = ap.parse_args(argv)
    args.models = [s.strip() for s in args.models.split(",") if s.strip()]
    args.formats = [s.strip() for s in args.formats.split(",") if s.strip()]
    args.ns = [int(s) for s in args.ns.split(",") if s.strip()]
    bad = [f for f in args.formats if f not in FORMATS]
    if bad:
        ap.error(f"unknown formats {bad}; expected some of {FORMATS}")
    if any(n < 1 for n in args.ns):
        ap.error(f"pass sizes must be >= 1, got {args.ns}")
    if args.quick:
        args.reps, args.warmup, args.ns = min(args.reps, 5), 1, [n for n in args.ns if n in (1, 2, 9)] or [1]
    return args


def ubar_uniform(n: int, m: int, num_experts: int) -> float:
    """ubar(n) = E[U(n)] / (n m) under independent uniform routing, E[U] = N (1 - q^n),
    q = 1 - m/N (paper 1, Section 1, after Huang et al. 2025)."""
    q = 1.0 - m / num_experts
    return num_experts * (1.0 - q ** n) / (n * m)


def device_random_weights(shape, fmt: str, device: str, seed: int):
    """Random experts ``(N, H, I)`` generated on the device (a published layer in f32 is up to
    3.2 GB: generating it on the host would dominate the run). Same value law as
    ``ExpertWeights.random``: N(0, 1/K) floats; int8 uniform in [-127, 127] with positive scales."""
    import torch

    from moespec.kernels import BLOCK, KERNEL_FORMATS, ExpertWeights

    N, H, I = shape
    gen = torch.Generator(device=device).manual_seed(seed)

    def make(rows, k):
        if fmt == "int8_b32":
            q = torch.randint(-127, 128, (N, rows, k), generator=gen, device=device, dtype=torch.int8)
            s = (torch.rand((N, rows, k // BLOCK), generator=gen, device=device) + 0.5) * (math.sqrt(3.0) / (127 * math.sqrt(k)))
            return q, s
        w = torch.empty((N, rows, k), dtype=KERNEL_FORMATS[fmt], device=device)
        for e in range(N):
            w[e] = torch.randn((rows, k), generator=gen, device=device).mul_(1.0 / math.sqrt(k))
        return w, None

    (g, gs), (u, us), (d, ds) = make(I, H), make(I, H), make(H, I)
    return ExpertWeights(fmt, g, u, d, gs, us, ds)


def row_for(model, fmt, n, spec_shape, m, U, b, timings, read_bytes, state) -> dict:
    """One result row from the interleaved timings of slot, dedup and the read reference."""
    N, H, I = spec_shape
    ts, td, tr = timings["slot"], timings["dedup"], timings["read"]
    slot_bytes, dedup_bytes = n * m * b, U * b
    beta_s, beta_d, beta_r = slot_bytes / ts.median_s, dedup_bytes / td.median_s, read_bytes / tr.median_s
    r = beta_d / beta_s
    ub = ubar_uniform(n, m, N)
    return {
        "model": model, "fmt": fmt, "n": n, "m": m, "N": N, "H": H, "I": I, "U": U, "expert_bytes": b,
        "slot_bytes": slot_bytes, "dedup_bytes": dedup_bytes,
        "t_slot_s": ts.median_s, "t_slot_q25_s": ts.q25_s, "t_slot_q75_s": ts.q75_s,
        "t_dedup_s": td.median_s, "t_dedup_q25_s": td.q25_s, "t_dedup_q75_s": td.q75_s,
        "t_read_s": tr.median_s, "read_bytes": read_bytes,
        "beta_slot_GBps": beta_s / 1e9, "beta_dedup_GBps": beta_d / 1e9, "beta_read_GBps": beta_r / 1e9,
        # r at the quartiles: dedup's slow quartile over slot's fast one and vice versa (a spread, not a CI)
        "r": r, "r_q25": (dedup_bytes / td.q75_s) / (slot_bytes / ts.q25_s),
        "r_q75": (dedup_bytes / td.q25_s) / (slot_bytes / ts.q75_s),
        "slot_of_read": beta_s / beta_r, "dedup_of_read": beta_d / beta_r,
        "ubar_uniform": ub, "dedup_faster_uniform": int(ub < r),
        "reps": ts.reps, "gpu_throttle": state.gpu_throttle, "flags": ";".join(state.flags),
    }


def report_markdown(rows: list[dict], header: dict) -> str:
    """The report: one table per (model, format), n down the rows."""
    lines = ["# CUDA expert kernels: effective bandwidth and r(n)", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += ["", "Bandwidths in GB/s (1e9 B/s), medians over repetitions with [q25, q75] of time turned into "
              "bandwidth; `read` is `torch.sum` over the reference buffer in the same interleaved run; "
              "`r = beta_dedup / beta_slot`; `ubar` under independent uniform routing; "
              "`dedup faster` when ubar(n) < r(n).", ""]
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["model"], row["fmt"]), []).append(row)
    for (model, fmt), grp in groups.items():
        g0 = grp[0]
        lines += [f"## {model}, {fmt} (N={g0['N']}, m={g0['m']}, H={g0['H']}, I={g0['I']}, "
                  f"b={int(g0['expert_bytes']) / 1e6:.2f} MB per expert)", "",
                  "| n | U | t slot (us) | t dedup (us) | beta slot | beta dedup | read | slot/read | dedup/read "
                  "| r(n) [q25, q75] | ubar(n) | dedup faster | flags |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(grp, key=lambda x: int(x["n"])):
            f = lambda k: float(r[k])  # noqa: E731 - rows read back from CSV are strings
            bs_lo, bs_hi = f("slot_bytes") / f("t_slot_q75_s") / 1e9, f("slot_bytes") / f("t_slot_q25_s") / 1e9
            bd_lo, bd_hi = f("dedup_bytes") / f("t_dedup_q75_s") / 1e9, f("dedup_bytes") / f("t_dedup_q25_s") / 1e9
            lines.append(
                f"| {r['n']} | {r['U']} | {f('t_slot_s') * 1e6:.1f} | {f('t_dedup_s') * 1e6:.1f} "
                f"| {f('beta_slot_GBps'):.0f} [{bs_lo:.0f}, {bs_hi:.0f}] | {f('beta_dedup_GBps'):.0f} [{bd_lo:.0f}, {bd_hi:.0f}] "
                f"| {f('beta_read_GBps'):.0f} | {f('slot_of_read'):.2f} | {f('dedup_of_read'):.2f} "
                f"| {f('r'):.3f} [{f('r_q25'):.3f}, {f('r_q75'):.3f}] | {f('ubar_uniform'):.3f} "
                f"| {'yes' if int(float(r['dedup_faster_uniform'])) else 'no'} | {r['flags'] or ''} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    import numpy as np
    import torch

    from moespec import io, paths, provenance
    from moespec.bench import timing
    from moespec.kernels import build
    from moespec.kernels.shapes import random_ids
    from moespec.models import get_spec

    if not str(args.device).startswith("cuda"):
        sys.exit("bench_kernels_cuda: --device must be a CUDA device (cuda or cuda:N)")
    if not torch.cuda.is_available():
        sys.exit(f"bench_kernels_cuda: no GPU visible to torch {torch.__version__} "
                 f"(torch.version.cuda = {torch.version.cuda}); see docs/cuda.md")
    build.load_cuda()  # raises ExtensionBuildError naming what is missing
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = paths.ensure(args.out or paths.bench_dir() / "cuda" / stamp)
    log = io.RowLog(out / "rows.csv", FIELDS, KEY)
    done = log.done_keys()
    device = args.device
    ops = {"slot": torch.ops.moespec.expert_slot, "dedup": torch.ops.moespec.expert_dedup}
    timer = timing.CudaTimer(device) if args.plain_timer else timing.QueuedCudaTimer(device)
    flush = timing.CacheFlush(timing.FLUSH_BYTES, device)
    read_fn, read_bytes = timing.read_bandwidth_callable(int(args.membw_gib * 2**30), device)
    print(f"bench_kernels_cuda: {torch.cuda.get_device_name(device)}, writing {out}", flush=True)

    for model in args.models:
        spec = get_spec(model)
        N, m = spec.num_experts, spec.top_k
        H, I = (256, 256) if args.quick else (spec.hidden_size, spec.expert_intermediate)
        for fmt in args.formats:
            todo = [n for n in args.ns if (model, fmt, str(n)) not in done]
            if not todo:
                continue
            w = device_random_weights((N, H, I), fmt, device, args.seed)
            b = w.bytes_per_expert
            for n in todo:
                ids_cpu = random_ids(n, m, N, np.random.default_rng([args.seed, zlib.crc32(model.encode()), n]))
                U = int(ids_cpu.unique().numel())
                gen = torch.Generator(device=device).manual_seed(args.seed + n)
                x = torch.randn((n, H), generator=gen, device=device)
                ids = ids_cpu.to(device)
                gates = torch.softmax(torch.randn((n, m), generator=gen, device=device), dim=1)
                calls = {k: (lambda op=op: op(x, ids, gates, *w.tensors())) for k, op in ops.items()}
                calls["read"] = read_fn
                overruns0 = getattr(timer, "overruns", 0)
                with timing.MachineMonitor(device) as mon:
                    res = timing.time_interleaved(calls, reps=args.reps, warmup=args.warmup, timer=timer,
                                                  flush=flush)
                if getattr(timer, "overruns", 0) > overruns0:
                    mon.state.flags.append(f"host_overran_spin={timer.overruns - overruns0}")
                row = row_for(model, fmt, n, (N, H, I), m, U, b, res, read_bytes, mon.state)
                log.append(row)
                print(f"{model:>16} {fmt:>8} n={n} U={U:3d}: slot {row['beta_slot_GBps']:7.0f} GB/s, "
                      f"dedup {row['beta_dedup_GBps']:7.0f} GB/s, read {row['beta_read_GBps']:7.0f} GB/s, "
                      f"r={row['r']:.3f}, ubar={row['ubar_uniform']:.3f} {row['flags']}", flush=True)
            del w
            torch.cuda.empty_cache()

    rec = provenance.full_record()
    gpus = rec["hardware"].get("gpus") or []
    header = {"date (UTC)": stamp, "GPU": torch.cuda.get_device_name(device),
              "GPU record (NVML)": gpus[int(device.split(":")[1]) if ":" in device else 0] if gpus else "n/a",
              "torch": torch.__version__, "CUDA (torch)": torch.version.cuda, "commit": rec["git_commit"],
              "reps": args.reps, "warm-up rounds": args.warmup, "L2 flush": f"{timing.FLUSH_BYTES >> 20} MiB",
              "timer": ("moespec.bench.timing.CudaTimer (includes host launch overhead)" if args.plain_timer else
                        f"CUDA events after a {(timer.spin_s or 0) * 1e3:.2f} ms spin kernel (GPU time only)"),
              "shapes": "shrunk to H=I=256 (--quick)" if args.quick else "published (moespec.models.PRESETS)"}
    io.write_json(out / "provenance.json", {"args": {k: str(v) for k, v in vars(args).items()}, **rec})
    io.write_text(out / "report.md", report_markdown(log.rows(), header))
    print(f"wrote {out / 'report.md'} and {out / 'rows.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
