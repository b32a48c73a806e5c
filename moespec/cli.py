"""Command line: ``moespec reproduce`` (papermill over the notebooks) and ``moespec notebooks``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import runner


def _reproduce(args) -> int:
    try:
        manifest = runner.reproduce(profile=args.profile, only=args.only, out=args.out,
                                    extra=runner.parse_assignments(args.param or []),
                                    device=args.device, progress=not args.no_progress, publish=args.publish)
    except runner.NotebookError as exc:
        print(f"moespec reproduce: {exc}", file=sys.stderr)
        return 1
    except runner.RunInterrupted as exc:  # SIGINT/SIGTERM: one line, 128 + the signal number
        print(f"moespec reproduce: {exc}", file=sys.stderr)
        return exc.exit_status
    except KeyboardInterrupt:  # Ctrl-C outside the notebooks (while they were being read)
        print("moespec reproduce: interrupted by SIGINT", file=sys.stderr)
        return 130
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="moespec", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    rep = sub.add_parser("reproduce", help="run every notebook through papermill, in order")
    rep.add_argument("--profile", choices=runner.PROFILES, default=None,
                     help="quick: seconds per notebook (tests); full (default): the measurements behind the figures")
    rep.add_argument("--only", nargs="+", metavar="NAME", help="run only these notebooks (e.g. 01 or 01_routing_reuse)")
    rep.add_argument("--out", type=Path, help="run folder: executed notebooks, manifest, figures/ and data/ "
                                              "(default runs/<time>-<profile>); refused while a live run holds it")
    rep.add_argument("--device", help="device parameter for every notebook (cpu, cuda, cuda:1, ...)")
    rep.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                     help="extra notebook parameter (repeatable); unknown names are an error")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    rep.add_argument("--publish", action="store_true",
                     help="the make reproduce run: full profile, every notebook, defaults only; measurements in data/ "
                          "and, at the end, the run's figures copied into the committed figures/")
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
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
