"""CUDA bandwidth benchmark of moespec's per-slot and deduplicating expert kernels, with in-run peers.

For every preset shape in ``moespec.model_shapes.PRESETS`` (random weights: timing depends on shapes,
format and ids, not on values), each format and each pass size n = 1..9, one interleaved run
(``moespec.measure.timing.time_interleaved``) per cache protocol times, round-robin:

* our kernels on each execution path (``--variants``; ``moespec.kernels.cuda_api``): ``fused`` (two
  launches, cp.async rings, programmatic dependent launch on sm_90), ``fused-nopdl``, ``legacy``
  (the three launches of the first H200 run); each with the per-slot and the dedup op, and with
  ``--graph`` the fused ops also replayed from a CUDA graph;
* the peers (``--peers``; ``moespec.measure.cuda_peers``): torch's per-expert matmuls and
  ``torch._grouped_mm`` (bf16, where torch has it) on the same weights and routing, each replayed
  from a CUDA graph (GPU time only, like our ops' timing);
* a read of ``--membw-gib`` GiB (``torch.sum``; default the larger of 1 GiB and the flush): the GPU's read
  bandwidth in the same run.

Cache protocols (``--protocols``), so that the weights come from HBM: ``flush`` writes and reads a
buffer of 4x the GPU's L2, at least 256 MiB (paper 1, Appendix E: 256 MiB; ``timing.flush_bytes``), before
every call (it leaves the L2 full of dirty lines that
the next call's reads must write back first); ``rotate`` keeps ``--copies`` copies of the layer and
gives each call the next one, with no flush (the L2 then holds clean lines of other copies, as in a
model's decode where the other layers' weights evict this layer's). Times are GPU time only
(:class:`moespec.measure.timing.QueuedCudaTimer`: a spin kernel holds the GPU while the host
enqueues the call); ``--plain-timer`` includes the host's launch overhead.

Per row (one per protocol, variant and kernel; long format): median and quartiles of time,
requested bytes (per-slot n*m*b, dedup and peers U*b), bandwidth, the read bandwidth of the same
run and the share of it, the launch plan of our kernels (path, launches, PDL, ring depths, grids),
and ``ubar(n)`` of uniform routing. Before timing, every output is checked: our variants bitwise
equal, peers within a per-format ceiling of ours (flags name any mismatch). ``report.md`` adds
r(n) = beta_dedup / beta_slot per variant, the issue's goals met or short (per-slot n = 1 share of
the read; dedup share on distinct bytes; r(2), r(8)) and whether our kernels beat every peer at
every n. Rows go to ``rows.csv`` as measured (resumable); ``provenance.json`` at the end.

    python benchmarks/bench_kernels_cuda.py --out reports/gpu/bench      # all presets, all formats
    python benchmarks/bench_kernels_cuda.py --quick --out /tmp/b          # shrunk shapes, seconds
    python3 benchmarks/bench_kernels_cuda.py --summarize rows.csv         # goals + tables of any rows CSV

``--summarize`` needs only the Python standard library: it also reads the CSV of the torch-free
benchmark (``tools/bench_standalone.cu``, same columns), e.g. on a lent GPU without a CUDA torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import math
import sys
import zlib
from pathlib import Path

FORMATS = ("f32", "bf16", "int8_b32")
KERNELS = ("slot", "dedup")
PROTOCOLS = ("flush", "rotate")
#: Error ceilings of a peer against our kernels' output (relative to its largest magnitude).
PEER_CEILING = {"f32": 1e-4, "bf16": 3e-2, "int8_b32": 5e-2}
#: The issue's goals at each preset (fused path): per-slot at n = 1 as a share of the same-run read
#: bandwidth; dedup on distinct bytes at every n <= 9; r(2) and r(8).
GOALS = {"slot_n1": {"f32": 0.85, "bf16": 0.85, "int8_b32": 0.75}, "dedup": 0.85, "r2": 0.95, "r8": 0.90}
FIELDS = ["model", "fmt", "n", "m", "N", "H", "I", "U", "expert_bytes", "protocol", "variant", "kernel", "graph",
          "bytes", "t_s", "t_q25_s", "t_q75_s", "beta_GBps", "t_read_s", "beta_read_GBps", "of_read", "plan",
          "ubar_uniform", "reps", "gpu_throttle", "flags"]
KEY = ["model", "fmt", "n", "protocol"]


def variants():
    """Our kernels' execution paths by name."""
    from moespec.kernels.cuda_api import TuningChoice

    return {"fused": TuningChoice("fused"), "fused-nopdl": TuningChoice("fused", pdl=0),
            "legacy": TuningChoice("legacy")}


def parse_args(argv=None) -> argparse.Namespace:
    from moespec.measure.cuda_peers import PEERS
    from moespec.model_shapes import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None,
                    help="output folder (default: data/bench/cuda/<UTC time>)")
    ap.add_argument("--models", default=",".join(PRESETS), help="comma-separated preset names")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma-separated: f32, bf16, int8_b32")
    ap.add_argument("--ns", default="1,2,3,4,5,6,7,8,9", help="pass sizes n")
    ap.add_argument("--variants", default="fused,legacy", help="our execution paths: fused, fused-nopdl, legacy")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"torch peers ({', '.join(PEERS)}) or 'none'")
    ap.add_argument("--graph", action="store_true", help="also time the fused ops replayed from a CUDA graph")
    ap.add_argument("--protocols", default="rotate", help="cache protocols: flush, rotate (comma-separated)")
    ap.add_argument("--copies", type=int, default=3, help="layer copies for the rotate protocol (>= 2)")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--membw-gib", type=float, default=None,
                    help="GiB read by the bandwidth reference (default: the larger of 1 GiB and the flush)")
    ap.add_argument("--spin-cycles", type=int, default=500_000,
                    help="GPU clock cycles of the spin kernel that covers each call's host enqueue")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--plain-timer", action="store_true",
                    help="time with moespec.measure.timing.CudaTimer (includes host launch overhead)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: shapes shrunk to H=I=256, 5 reps, n in {1,2,9}")
    args = ap.parse_args(argv)
    split = lambda v: [s.strip() for s in v.split(",") if s.strip() and s.strip() != "none"]  # noqa: E731
    args.models, args.formats, args.variants = split(args.models), split(args.formats), split(args.variants)
    args.peers, args.protocols = split(args.peers), split(args.protocols)
    args.ns = [int(s) for s in split(args.ns)]
    for what, got, allowed in (("formats", args.formats, FORMATS), ("variants", args.variants, tuple(variants())),
                               ("peers", args.peers, PEERS), ("protocols", args.protocols, PROTOCOLS)):
        bad = [v for v in got if v not in allowed]
        if bad:
            ap.error(f"unknown {what} {bad}; expected some of {allowed}")
    if not args.protocols:
        ap.error("--protocols: name at least one of flush, rotate")
    if any(n < 1 for n in args.ns):
        ap.error(f"pass sizes must be >= 1, got {args.ns}")
    if args.copies < 2:
        ap.error(f"--copies must be >= 2 (consecutive calls on different copies), got {args.copies}")
    if args.quick:
        args.reps, args.warmup, args.ns = min(args.reps, 5), 1, [n for n in args.ns if n in (1, 2, 9)] or [1]
    return args


def ubar_uniform(n: int, m: int, num_experts: int) -> float:
    """ubar(n) = E[U(n)] / (n m) under independent uniform routing, E[U] = N (1 - q^n),
    q = 1 - m/N (paper 1, Section 1, after Huang et al. 2025)."""
    q = 1.0 - m / num_experts
    return num_experts * (1.0 - q ** n) / (n * m)


def callable_name(variant: str, kernel: str, graph: bool = False) -> str:
    return f"{variant}/{kernel}" + ("/graph" if graph else "")


def split_name(name: str) -> tuple[str, str, bool]:
    """(variant, kernel, graph) of a callable's name; peers are ('peer:<name>', 'peer', graph)."""
    parts = name.split("/")
    return parts[0], parts[1], len(parts) > 2


def device_random_weights(shape, fmt: str, device: str, seed: int):
    """Random experts ``(N, H, I)`` drawn on the device (``ExpertWeights.random(on_device=True)``)."""
    from moespec.kernels import ExpertWeights

    return ExpertWeights.random(shape, fmt, seed=seed, device=device, on_device=True)


def rows_for(model, fmt, n, shape, m, U, b, timings, read_bytes, protocol, plans, state, flags=()) -> list[dict]:
    """One row per timed callable (all but the read) of one interleaved run."""
    from moespec.measure.expert_op import requested_bytes

    N, H, I = shape
    tr = timings["read"]
    beta_r = read_bytes / tr.median_s
    out = []
    for name, t in timings.items():
        if name == "read":
            continue
        variant, kernel, graph = split_name(name)
        nbytes = requested_bytes(kernel, n, m, U, b)
        beta = nbytes / t.median_s
        out.append({
            "model": model, "fmt": fmt, "n": n, "m": m, "N": N, "H": H, "I": I, "U": U, "expert_bytes": b,
            "protocol": protocol, "variant": variant, "kernel": kernel, "graph": int(graph), "bytes": nbytes,
            "t_s": t.median_s, "t_q25_s": t.q25_s, "t_q75_s": t.q75_s, "beta_GBps": beta / 1e9,
            "t_read_s": tr.median_s, "beta_read_GBps": beta_r / 1e9, "of_read": beta / beta_r,
            "plan": plans.get((variant, kernel), ""), "ubar_uniform": ubar_uniform(n, m, N), "reps": t.reps,
            "gpu_throttle": state.gpu_throttle, "flags": ";".join([*state.flags, *flags])})
    return out


def _f(row, k) -> float:
    return float(row[k])  # rows read back from CSV are strings


def r_values(rows: list[dict]) -> dict[tuple, float]:
    """r(n) = beta_dedup / beta_slot for every (model, fmt, protocol, variant, graph, n) with both."""
    by = {}
    for r in rows:
        if r["kernel"] in KERNELS:
            by[(r["model"], r["fmt"], r["protocol"], r["variant"], int(_f(r, "graph")), int(_f(r, "n")), r["kernel"])] = r
    out = {}
    for (model, fmt, proto, var, graph, n, kernel), r in by.items():
        if kernel == "dedup" and (model, fmt, proto, var, graph, n, "slot") in by:
            out[(model, fmt, proto, var, graph, n)] = _f(r, "beta_GBps") / _f(by[(model, fmt, proto, var, graph, n, "slot")], "beta_GBps")
    return out


def goal_summary(rows: list[dict], variant: str = "fused") -> list[dict]:
    """Per (model, fmt, protocol): the issue's goals for ``variant`` (eager calls) met or short,
    and whether its faster kernel beats every peer at every n (a peer must be present)."""
    rs = r_values(rows)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["fmt"], r["protocol"]), []).append(r)
    out = []
    for (model, fmt, proto), grp in groups.items():
        ours = [r for r in grp if r["variant"] == variant and not int(_f(r, "graph"))]
        slot1 = [_f(r, "of_read") for r in ours if r["kernel"] == "slot" and int(_f(r, "n")) == 1]
        dedup = [_f(r, "of_read") for r in ours if r["kernel"] == "dedup" and int(_f(r, "n")) <= 9]
        r2, r8 = rs.get((model, fmt, proto, variant, 0, 2)), rs.get((model, fmt, proto, variant, 0, 8))
        beats, ns = True, sorted({int(_f(r, "n")) for r in grp})
        peers_seen = False
        for n in ns:
            best_ours = min((_f(r, "t_s") for r in ours if int(_f(r, "n")) == n), default=math.inf)
            for r in grp:
                if r["kernel"] == "peer" and int(_f(r, "n")) == n:
                    peers_seen = True
                    beats &= best_ours < _f(r, "t_s")
        row = {"model": model, "fmt": fmt, "protocol": proto,
               "slot_n1": slot1[0] if slot1 else None, "dedup_min": min(dedup) if dedup else None,
               "r2": r2, "r8": r8, "beats_peers": beats if peers_seen else None}
        row["met"] = {"slot_n1": row["slot_n1"] is not None and row["slot_n1"] >= GOALS["slot_n1"][fmt],
                      "dedup": row["dedup_min"] is not None and row["dedup_min"] >= GOALS["dedup"],
                      "r2": r2 is not None and r2 >= GOALS["r2"], "r8": r8 is not None and r8 >= GOALS["r8"]}
        out.append(row)
    return out


def report_markdown(rows: list[dict], header: dict) -> str:
    """The report: the goals, then one table per (model, format, protocol) with n down the rows."""
    fmt_v = lambda v: "n/a" if v is None else f"{v:.2f}"  # noqa: E731
    lines = ["# CUDA expert kernels: bandwidth, r(n) and torch peers", ""]
    lines += [f"- {k}: {v}" for k, v in header.items()]
    lines += ["", "Shares are bandwidth / the read bandwidth (`torch.sum`) of the same interleaved run; per-slot "
              "bandwidth counts n*m*b requested bytes, dedup and the peers U*b (distinct experts). "
              "`r = beta_dedup / beta_slot`. Medians over repetitions.", "",
              "## Goals (fused path, eager calls)", "",
              f"Goals: per-slot at n = 1 >= {GOALS['slot_n1']['f32']} of the read (f32, bf16), "
              f">= {GOALS['slot_n1']['int8_b32']} (int8); dedup >= {GOALS['dedup']} at every n <= 9; "
              f"r(2) >= {GOALS['r2']}; r(8) >= {GOALS['r8']}; faster than every peer at every n.", "",
              "| model | fmt | protocol | slot n=1 | dedup min | r(2) | r(8) | beats peers |",
              "|---|---|---|---|---|---|---|---|"]
    mark = lambda ok: "" if ok else " (short)"  # noqa: E731
    for g in goal_summary(rows):
        m = g["met"]
        bp = "n/a" if g["beats_peers"] is None else ("yes" if g["beats_peers"] else "no")
        lines.append(f"| {g['model']} | {g['fmt']} | {g['protocol']} | {fmt_v(g['slot_n1'])}{mark(m['slot_n1'])} "
                     f"| {fmt_v(g['dedup_min'])}{mark(m['dedup'])} | {fmt_v(g['r2'])}{mark(m['r2'])} "
                     f"| {fmt_v(g['r8'])}{mark(m['r8'])} | {bp} |")
    rs = r_values(rows)
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["model"], r["fmt"], r["protocol"]), []).append(r)
    for (model, fmt, proto), grp in groups.items():
        g0 = grp[0]
        cols = sorted({(r["variant"], r["kernel"], int(_f(r, "graph"))) for r in grp},
                      key=lambda c: (c[1] == "peer", c[0], c[2], c[1]))
        names = [f"{v}{'/graph' if gr else ''} {k}" if k != "peer" else v.removeprefix("peer:") + (" (graph)" if gr else "")
                 for v, k, gr in cols]
        rvars = sorted({(v, gr) for v, k, gr in cols if k == "dedup"})
        lines += ["", f"## {model}, {fmt}, protocol {proto} (N={g0['N']}, m={g0['m']}, H={g0['H']}, I={g0['I']}, "
                  f"b={_f(g0, 'expert_bytes') / 1e6:.2f} MB per expert)", "",
                  "Each cell: share of the read bandwidth [time in us].", "",
                  "| n | U | read GB/s | " + " | ".join(names) + " | " +
                  " | ".join(f"r {v}{'/graph' if gr else ''}" for v, gr in rvars) + " | flags |",
                  "|" + "---|" * (4 + len(names) + len(rvars))]
        for n in sorted({int(_f(r, "n")) for r in grp}):
            at = {(r["variant"], r["kernel"], int(_f(r, "graph"))): r for r in grp if int(_f(r, "n")) == n}
            any_row = next(iter(at.values()))
            cells = [f"{_f(at[c], 'of_read'):.2f} [{_f(at[c], 't_s') * 1e6:.1f}]" if c in at else "" for c in cols]
            rcells = [f"{rs[(model, fmt, proto, v, gr, n)]:.3f}" if (model, fmt, proto, v, gr, n) in rs else ""
                      for v, gr in rvars]
            flags = ";".join(sorted({f for r in at.values() for f in r["flags"].split(";") if f}))
            lines.append(f"| {n} | {any_row['U']} | {_f(any_row, 'beta_read_GBps'):.0f} | " + " | ".join(cells)
                         + " | " + " | ".join(rcells) + f" | {flags} |")
    return "\n".join(lines) + "\n"


def plan_text(plan) -> str:
    d = plan.as_dict()
    text = f"{d['path']} {d['launches']} launches gu {d['grid_gu_x']}x{d['grid_gu_y']} dn {d['grid_dn_x']}x{d['grid_dn_y']}"
    if d["path"] == "fused":
        text += f" rings {d['ring_gu']}/{d['ring_dn']} pdl {d['pdl']}"
    return text


def summarize(csv_path: Path, title: str = "") -> str:
    """The report of an existing rows CSV (this benchmark's or bench_standalone's); stdlib only."""
    import csv

    with Path(csv_path).open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    if not rows:
        raise ValueError(f"{csv_path}: no rows")
    missing = {"model", "fmt", "n", "protocol", "variant", "kernel", "graph", "of_read", "t_s"} - set(rows[0])
    if missing:
        raise ValueError(f"{csv_path}: not a rows CSV of the CUDA benchmarks (missing columns {sorted(missing)})")
    return report_markdown(rows, {"rows": title or str(csv_path)})


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["--summarize"]:
        if len(argv) != 2:
            sys.exit("usage: bench_kernels_cuda.py --summarize ROWS.csv")
        print(summarize(Path(argv[1])))
        return 0
    args = parse_args(argv)
    import numpy as np
    import torch

    from moespec import io, paths, provenance
    from moespec.measure import cuda_peers, timing
    from moespec.kernels import build, cuda_api
    from moespec.measure.ids import random_ids
    from moespec.model_shapes import get_spec

    if not str(args.device).startswith("cuda"):
        sys.exit("bench_kernels_cuda: --device must be a CUDA device (cuda or cuda:N)")
    if not torch.cuda.is_available():
        sys.exit(f"bench_kernels_cuda: no GPU visible to torch {torch.__version__} "
                 f"(torch.version.cuda = {torch.version.cuda}); see docs/cuda.md")
    build.load_cuda()  # raises ExtensionBuildError naming what is missing
    lib = cuda_api.loaded_library()
    tuning0 = cuda_api.get_tuning(lib)
    chosen = {k: v for k, v in variants().items() if k in args.variants}
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = paths.ensure(args.out or paths.bench_dir() / "cuda" / stamp)
    log = io.RowLog(out / "rows.csv", FIELDS, KEY)
    done = log.done_keys()
    device = args.device
    ops = {"slot": torch.ops.moespec.expert_slot, "dedup": torch.ops.moespec.expert_dedup}
    timer = timing.CudaTimer(device) if args.plain_timer else timing.QueuedCudaTimer(device, args.spin_cycles)
    cold = timing.cold_record(device, read=None if args.membw_gib is None else int(args.membw_gib * 2**30))
    flush = timing.CacheFlush(cold["flush_bytes"], device)
    read_fn, read_bytes = timing.read_bandwidth_callable(cold["read_bytes"], device)
    props = torch.cuda.get_device_properties(device)
    print(f"bench_kernels_cuda: {props.name}, L2 {getattr(props, 'L2_cache_size', 0) / 2**20:.0f} MiB, "
          f"writing {out}", flush=True)

    for model in args.models:
        spec = get_spec(model)
        N, m = spec.num_experts, spec.top_k
        H, I = (256, 256) if args.quick else (spec.hidden_size, spec.expert_intermediate)
        for fmt in args.formats:
            todo = [(n, p) for n in args.ns for p in args.protocols if (model, fmt, str(n), p) not in done]
            if not todo:
                continue
            ncopies = args.copies if "rotate" in args.protocols else 1
            copies = [device_random_weights((N, H, I), fmt, device, args.seed + c) for c in range(ncopies)]
            b = copies[0].bytes_per_expert
            for n, protocol in todo:
                ids_cpu = random_ids(n, m, N, np.random.default_rng([args.seed, zlib.crc32(model.encode()), n]))
                U = int(ids_cpu.unique().numel())
                gen = torch.Generator(device=device).manual_seed(args.seed + n)
                x = torch.randn((n, H), generator=gen, device=device)
                ids = ids_cpu.to(device)
                gates = torch.softmax(torch.randn((n, m), generator=gen, device=device), dim=1)
                use = copies if protocol == "rotate" else copies[:1]
                routing = cuda_peers.group_routing(ids_cpu, gates, N, device)
                flags, plans, calls, outputs = [], {}, {}, {}
                turn = itertools.count()  # rotate: every weight-reading call takes the next copy

                def rotating(per_copy):
                    return lambda: per_copy[next(turn) % len(per_copy)]()

                for vname, choice in chosen.items():
                    for kernel, op in ops.items():
                        cuda_api.set_tuning(lib, choice)
                        plans[(vname, kernel)] = plan_text(cuda_api.get_plan(lib, x, ids, use[0], kernel))
                        outputs[(vname, kernel)] = op(x, ids, gates, *use[0].tensors())
                        per_copy = [lambda op=op, w=w, choice=choice: (cuda_api.set_tuning(lib, choice),
                                                                       op(x, ids, gates, *w.tensors()))
                                    for w in use]
                        calls[callable_name(vname, kernel)] = rotating(per_copy)
                        if args.graph and vname == "fused":
                            try:
                                graphs = [cuda_peers.graph_replay(lambda op=op, w=w: op(x, ids, gates, *w.tensors()))
                                          for w in use]
                                calls[callable_name(vname, kernel, True)] = rotating(graphs)
                                plans[(vname, kernel)] += " (graph replay too)"
                            except Exception as exc:  # report, keep measuring the rest
                                flags.append(f"graph capture of {vname}/{kernel} failed: {type(exc).__name__}")
                ref = next(iter(outputs.values()))
                for key, y in outputs.items():
                    if not torch.equal(y, ref):
                        flags.append(f"{key[0]}/{key[1]} differs bitwise from {next(iter(outputs))}")
                for peer in args.peers:
                    why = cuda_peers.grouped_mm_unsupported(use[0]) if peer == "grouped_mm" else None
                    if why:
                        continue
                    try:
                        y = cuda_peers.peer_call(peer, x, routing, use[0])()
                        err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                        if not err <= PEER_CEILING[fmt]:
                            flags.append(f"{peer} off by {err:.1e}")
                        graphs = [cuda_peers.graph_replay(cuda_peers.peer_call(peer, x, routing, w)) for w in use]
                        calls[callable_name(f"peer:{peer}", "peer", True)] = rotating(graphs)
                    except Exception as exc:  # a peer this torch/GPU cannot run is reported, not fatal
                        flags.append(f"{peer} not run: {type(exc).__name__}: {str(exc)[:80]}")
                calls["read"] = read_fn
                overruns0 = getattr(timer, "overruns", 0)
                with timing.MachineMonitor(device) as mon:
                    res = timing.time_interleaved(calls, reps=args.reps, warmup=args.warmup, timer=timer,
                                                  flush=flush if protocol == "flush" else None)
                if getattr(timer, "overruns", 0) > overruns0:
                    mon.state.flags.append(f"host_overran_spin={timer.overruns - overruns0}")
                rows = rows_for(model, fmt, n, (N, H, I), m, U, b, res, read_bytes, protocol, plans, mon.state, flags)
                log.extend(rows)
                best = {r["variant"] + "/" + r["kernel"] + ("/graph" if r["graph"] else ""): r["of_read"] for r in rows}
                print(f"{model:>16} {fmt:>8} n={n} U={U:3d} {protocol:>6}: "
                      + " ".join(f"{k} {v:.2f}" for k, v in best.items())
                      + f" (read {rows[0]['beta_read_GBps']:.0f} GB/s) {';'.join(flags)}", flush=True)
                del calls, outputs
            del copies
            torch.cuda.empty_cache()
    cuda_api.set_tuning(lib, cuda_api.TuningChoice(
        {v: k for k, v in cuda_api.PATHS.items()}[tuning0.path], tuning0.pdl, tuning0.ring_gu, tuning0.ring_dn,
        tuning0.dn_warps, tuning0.gu_blocks_per_sm))

    rec = provenance.full_record()
    gpus = rec["hardware"].get("gpus") or []
    header = {"date (UTC)": stamp, "GPU": props.name, "SMs": props.multi_processor_count,
              "L2 (MiB)": f"{getattr(props, 'L2_cache_size', 0) / 2**20:.0f}",
              "GPU record (NVML)": gpus[int(device.split(":")[1]) if ":" in device else 0] if gpus else "n/a",
              "torch": torch.__version__, "CUDA (torch)": torch.version.cuda, "commit": rec["git_commit"],
              "reps": args.reps, "warm-up rounds": args.warmup, "protocols": ", ".join(args.protocols),
              "flush": f"{cold['flush_bytes'] >> 20} MiB written and read before every call (protocol flush; "
                       f"{cold['rule']})",
              "rotation": f"{args.copies} layer copies, each call the next (protocol rotate)",
              "timer": ("moespec.measure.timing.CudaTimer (includes host launch overhead)" if args.plain_timer else
                        f"CUDA events after a {(timer.spin_s or 0) * 1e6:.0f} us spin kernel (GPU time only)"),
              "shapes": "shrunk to H=I=256 (--quick)" if args.quick else "published (moespec.model_shapes.PRESETS)"}
    io.write_json(out / "provenance.json", {"args": {k: str(v) for k, v in vars(args).items()}, **rec, "cold": cold})
    io.write_text(out / "report.md", report_markdown(log.rows(), header))
    print(f"wrote {out / 'report.md'} and {out / 'rows.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
