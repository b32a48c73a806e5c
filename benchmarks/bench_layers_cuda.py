"""The expert layers of a verify pass on a GPU (``moespec.measure.layer_stack``): a preset's MoE layers
with random weights, routing replayed from a trace, per-slot and dedup passes eager and replayed from
a CUDA graph, T(n) and S(n) = T_slot - T_dedup per mode.

    python benchmarks/bench_layers_cuda.py --out reports/gpu/layers               # OLMoE, bf16, n = 1..9
    python benchmarks/bench_layers_cuda.py --model qwen3 --fmt int8_b32 --windows 8
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main(argv=None) -> int:
    from moespec.model_shapes import PRESETS

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="run folder (default: data/bench/layer_stack/<UTC time>)")
    ap.add_argument("--model", default="olmoe", choices=sorted(PRESETS))
    ap.add_argument("--fmt", default="bf16", choices=("f32", "bf16", "int8_b32"))
    ap.add_argument("--ns", default="1,2,3,4,5,6,7,8,9")
    ap.add_argument("--windows", type=int, default=4, help="routing windows per n")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None, help="first this many MoE layers (default: all)")
    ap.add_argument("--trace", default="", help="RoutingTrace file (default: recorded if present, else synthetic)")
    ap.add_argument("--no-graph", action="store_true", help="eager passes only")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    from moespec.measure import layer_stack

    try:
        cfg = layer_stack.StackConfig(model=args.model, fmt=args.fmt, device=args.device,
                                      ns=tuple(int(v) for v in args.ns.split(",") if v.strip()), windows=args.windows,
                                      reps=args.reps, warmup=args.warmup, trace_file=args.trace, layers=args.layers,
                                      graph=not args.no_graph)
    except ValueError as exc:
        ap.error(str(exc))
    out = layer_stack.run(cfg, args.out)
    print((out / "report.md").read_text())
    print(f"rows: {out / 'rows.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
