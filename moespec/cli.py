"""Command line: ``moespec reproduce`` (papermill over the notebooks), ``moespec notebooks``,
``moespec import-routing`` (traces from vLLM/SGLang dumps) and ``moespec sweep`` (notebook grids
on a Dask cluster or Slurm)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import runner


def _reproduce(args) -> int:
    try:
        manifest = runner.reproduce(profile=args.profile, only=args.only, out=args.out,
                                    extra=runner.parse_assignments(args.param or []),
                                    device=args.device, progress=not args.no_progress)
    except runner.NotebookError as exc:
        print(f"moespec reproduce: {exc}", file=sys.stderr)
        return 1
    print(f"moespec reproduce: done; manifest {manifest}")
    return 0


def _list(args) -> int:
    for nb in runner.discover():
        params = runner.declared_parameters(nb)
        print(f"{nb.stem}: " + ", ".join(f"{k}={v}" for k, v in params.items()))
    return 0


def _build_models(args) -> int:
    from moespec import zoo

    summary = zoo.build_default_models(force=args.force, profile=args.profile, seed=args.seed,
                                       progress=not args.no_progress)
    for name, info in summary.items():
        state = f"built in {info['seconds']:.0f} s" if info.get("built") else "cached"
        print(f"{name}: {info['folder']} ({state})")
    return 0


def _import_routing(args) -> int:
    from moespec.routing.engines import import_jsonl

    dense = args.dense_layers
    if dense not in ("auto", "none"):
        try:
            dense = [int(x) for x in dense.split(",") if x.strip()]
        except ValueError:
            print(f"moespec import-routing: --dense-layers {dense!r}: give auto, none or "
                  f"comma-separated layer indices", file=sys.stderr)
            return 2
    kwargs = dict(num_experts=args.num_experts, config=args.config, fmt=args.format, model=args.model,
                  dense_layers=None if dense == "none" else dense, tokens=args.tokens, source=args.source,
                  expert_bytes=args.expert_bytes)
    if args.engine == "sglang":
        kwargs.update(num_layers=args.num_layers, top_k=args.top_k)
    elif args.num_layers is not None or args.top_k is not None:
        print("moespec import-routing: --num-layers/--top-k describe SGLang's flat payload; vLLM's "
              "arrays carry their shape", file=sys.stderr)
        return 2
    try:
        trace = import_jsonl(args.input, args.engine, **kwargs)
        trace.save(args.out)
    except (ValueError, FileNotFoundError, OSError) as exc:
        print(f"moespec import-routing: {exc}", file=sys.stderr)
        return 1
    m = trace.meta
    print(f"moespec import-routing: {trace!r}")
    print(f"  prompt tokens {sum(m['prompt_tokens'])}, generated tokens {sum(m['generated_tokens'])}; "
          f"engine layers {m['engine_layers']}, dense layers dropped {m['dense_layers']}; "
          f"expert bytes per layer {sorted(set(trace.expert_bytes.tolist()))}")
    if m["skipped_requests"]:
        print(f"  requests without {args.tokens} tokens (left out): {m['skipped_requests']}")
    print(f"  written to {args.out}")
    return 0


def _sweep(args) -> int:
    from moespec import sweep

    try:
        options = runner.parse_assignments(args.executor_option or [])
        result = sweep.run_sweep(args.grid, out=args.out, executor=args.executor, scheduler=args.scheduler,
                                 workers=args.workers, executor_options=options,
                                 overrides=runner.parse_assignments(args.param or []), force=args.force,
                                 progress=not args.no_progress)
    except (sweep.SweepError, runner.NotebookError, OSError) as exc:
        print(f"moespec sweep: {exc}", file=sys.stderr)
        return 1
    for job in result.jobs:
        took = "" if job.get("wall_s") is None else (
            f"  (ran {job['wall_s']} s in an earlier run)" if job["status"] == "skipped" else f"  ({job['wall_s']} s)")
        print(f"  {job['status']:8s} {job['job']}  {job.get('label', '')}{took}")
    for job in result.failed:
        print(f"moespec sweep: job {job['job']} failed: {job.get('error')}", file=sys.stderr)
    print(f"moespec sweep: {len(result.jobs) - len(result.failed)} of {len(result.jobs)} jobs done; "
          f"merged tables in {result.folder / 'tables'}; summary {result.folder / 'sweep.json'}")
    return 1 if result.failed else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moespec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="run every notebook through papermill, in order")
    rep.add_argument("--profile", choices=runner.PROFILES, default="full",
                     help="quick: seconds per notebook (tests); full: the measurements behind the figures")
    rep.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (e.g. 01 or 01_routing_reuse)")
    rep.add_argument("--out", type=Path, help="run folder for executed notebooks and the manifest (default runs/<time>-<profile>)")
    rep.add_argument("--device", help="device parameter for every notebook (cpu, cuda, cuda:1, ...)")
    rep.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                     help="extra notebook parameter (repeatable); unknown names are an error")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    rep.set_defaults(func=_reproduce)
    bld = sub.add_parser("build-models", help="train the embedded default MoE, draft and tokenizer "
                                              "into data/models (skips what is cached)")
    bld.add_argument("--force", action="store_true", help="rebuild even if cached")
    bld.add_argument("--profile", choices=["full", "smoke"], default="full")
    bld.add_argument("--seed", type=int, default=0)
    bld.add_argument("--no-progress", action="store_true", help="no progress bar")
    bld.set_defaults(func=_build_models)
    lst = sub.add_parser("notebooks", help="list the notebooks and their parameters")
    lst.set_defaults(func=_list)
    imp = sub.add_parser("import-routing", help="build a routing trace (.npz) from the routed experts a "
                                                "vLLM or SGLang deployment returned (JSONL dump)")
    imp.add_argument("input", type=Path, help="JSONL (or .jsonl.gz): vLLM RequestOutput dumps "
                                              "(scripts/record_vllm.py) or SGLang responses")
    imp.add_argument("--engine", choices=["vllm", "sglang"], required=True)
    imp.add_argument("--out", type=Path, required=True, help="trace file to write (.npz)")
    imp.add_argument("--config", help="the model's config.json (file or checkpoint folder): N, top_k, "
                                      "dense layers, expert bytes")
    imp.add_argument("--num-experts", type=int, help="N (default from --config)")
    imp.add_argument("--num-layers", type=int, help="SGLang: layers in the payload (default: config's num_hidden_layers)")
    imp.add_argument("--top-k", type=int, help="SGLang: experts per token (default: config's num_experts_per_tok)")
    imp.add_argument("--format", help="storage format for the expert bytes w_l (default: the config's dtype)")
    imp.add_argument("--expert-bytes", type=float, help="w_l, the same for every layer (default from --config)")
    imp.add_argument("--model", help="model name stored in the trace (default: the config's name)")
    imp.add_argument("--tokens", choices=["all", "prompt", "generated"], default="all")
    imp.add_argument("--dense-layers", default="auto",
                     help="auto (config, else all-zero placeholder layers), none, or indices like 0,1")
    imp.add_argument("--source", help="the trace's label in plots and tables")
    imp.set_defaults(func=_import_routing)
    swp = sub.add_parser("sweep", help="run a grid of (notebook, parameters) jobs on Dask or Slurm")
    swp.add_argument("grid", type=Path, help="grid file (.toml or .json; see docs/sweep.md)")
    swp.add_argument("--executor", choices=["dask", "slurm", "submitit-local"], default="dask")
    swp.add_argument("--scheduler", help="address of a running Dask scheduler (default: a LocalCluster here)")
    swp.add_argument("--workers", type=int, default=2, help="LocalCluster worker processes (default 2)")
    swp.add_argument("--out", type=Path, help="sweep folder (default runs/sweep-<grid name>; reruns skip finished jobs)")
    swp.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                     help="parameter for every job whose notebook declares it (overrides the grid)")
    swp.add_argument("--executor-option", action="append", metavar="KEY=VALUE",
                     help="submitit parameter (repeatable), e.g. slurm_partition=gpu, gpus_per_node=4, timeout_min=120")
    swp.add_argument("--force", action="store_true", help="run finished jobs again")
    swp.add_argument("--no-progress", action="store_true", help="no progress bar")
    swp.set_defaults(func=_sweep)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
