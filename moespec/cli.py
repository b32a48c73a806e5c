"""Command line: ``moespec reproduce`` (papermill over the notebooks), ``moespec notebooks``,
``moespec import-routing`` (traces from vLLM/SGLang dumps), ``moespec sweep`` (notebook grids
on a Dask cluster or Slurm), ``moespec advise`` (expert kernel and draft length from a run's run
file or a bandwidth table), ``moespec acceptance`` (the per-position acceptance profile of an
engine's metrics, logs or responses) and ``moespec run-file`` (a run's run file from its tables).

Bad input ends a command with one line naming the file or option, the field, what was expected
and what was found (exit status 1; 2 for a malformed command line). Anything else that goes wrong
is a bug in moespec: its traceback is printed with a line saying so (exit status 70)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import textwrap
import traceback
from pathlib import Path

from . import paths, runner
from .validate import InputError
from .validate.outputs import writable_file, writable_folder

# Each subcommand imports its own modules when it runs (zoo: transformers; sweep: Dask; advise and
# report: torch and the advice chain), so that `moespec --help` and `moespec notebooks` start at once.


def _message(exc: BaseException) -> str:
    """An error as one line: a KeyError's text without its quotes, an OSError with its file."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc)


def _reproduce(args) -> int:
    try:
        manifest = runner.reproduce(profile=args.profile, only=args.only, out=args.out,
                                    extra=runner.parse_assignments(args.param or []),
                                    device=args.device, progress=not args.no_progress, publish=args.publish,
                                    model=args.model, draft=args.draft)
    except (runner.NotebookError, InputError) as exc:
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
    """Each notebook's parameters: name, type, default and the comment of its ``parameters`` cell;
    a dict parameter's typed keys beside it."""
    from moespec.validate.parameters import dict_key_types, parameter_types

    for nb in runner.discover():
        declared, helps = runner.declared_parameters(nb), runner.parameter_help(nb)
        print(nb.stem)
        for name, kind in parameter_types(nb, declared).items():
            print(f"  {name}: {kind.describe()} = {declared[name]!r}" + (f"  # {helps[name]}" if helps.get(name) else ""))
            keys = dict_key_types(nb, name)
            if keys:
                print(textwrap.fill(", ".join(f"{k} ({t.describe()})" for k, t in keys.items()), 120,
                                    initial_indent="      keys: ", subsequent_indent="        "))
    return 0


def _build_models(args) -> int:
    from moespec import zoo

    if args.out is not None:
        try:
            writable_folder(args.out, "--out")
        except InputError as exc:
            print(f"moespec build-models: {exc}", file=sys.stderr)
            return 1
    summary = zoo.build_default_models(force=args.force, profile=args.profile, seed=args.seed,
                                       progress=not args.no_progress, out=args.out)
    for name, info in summary.items():
        state = f"trained in {info['seconds']:.0f} s" if info.get("built") else info["how"]
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
        for name, value in (("--prompt-start", args.prompt_start), ("--prompt-length", args.prompt_length)):
            if value is not None:
                print(f"moespec import-routing: {name} is for vLLM's dumps; SGLang's responses carry "
                      "meta_info.prompt_tokens and routed_experts_start_len", file=sys.stderr)
                return 2
        kwargs.update(num_layers=args.num_layers, top_k=args.top_k)
    elif args.num_layers is not None or args.top_k is not None:
        print("moespec import-routing: --num-layers/--top-k describe SGLang's flat payload; vLLM's "
              "arrays carry their shape", file=sys.stderr)
        return 2
    else:
        kwargs.update(prompt_start=args.prompt_start, prompt_length=args.prompt_length)
    try:
        out = writable_file(args.out, "--out")   # before the import, not after it
        with runner.hold_folder(out.parent, "--out's folder"):   # one import writes a folder at a time
            trace = import_jsonl(args.input, args.engine, **kwargs)
            trace.save(args.out)
    except (ValueError, FileNotFoundError, OSError, runner.NotebookError) as exc:
        print(f"moespec import-routing: {_message(exc)}", file=sys.stderr)
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
                                 progress=not args.no_progress, insecure=args.insecure)
    except (InputError, runner.NotebookError, OSError) as exc:
        print(f"moespec sweep: {_message(exc)}", file=sys.stderr)
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


def _advise(args) -> int:
    import json

    from moespec import advice

    if args.schema:
        inputs = (("RUN", args.run), ("-a", args.acceptance), ("--acceptance-table", args.acceptance_table),
                  ("--bandwidth", args.bandwidth), ("--verify-times", args.verify_times))
        given = [name for name, value in inputs if value]
        if given:
            print(f"moespec advise: --schema prints the output's JSON Schema and nothing else; {', '.join(given)} "
                  "would select nothing (leave them out, or --schema out)", file=sys.stderr)
            return 2
        print(json.dumps(advice.ADVICE_SCHEMA, indent=2))
        return 0
    if args.explain and args.json == "-":
        print("moespec advise: --explain prints the derivation as text, --json - prints the JSON instead of the text: "
              "give one (or --explain with --json PATH)", file=sys.stderr)
        return 2
    try:
        out = None if args.json == "-" else writable_file(args.json, "--json")   # before the work
        result = advice.advise(args.run, args.acceptance, acceptance_table=args.acceptance_table,
                               acceptance_from=args.acceptance_from, bandwidth=args.bandwidth, engine=args.engine, model=args.model, trace=args.trace,
                               eps=args.eps, dense_ratio=args.dense_ratio, draft_fit=args.draft_fit,
                               free_draft=args.free_draft,
                               state=args.state, context=args.context, draft_of_run=args.run_draft,
                               fmt=args.format, target=args.target, draft=args.draft,
                               allow_incomplete=args.allow_incomplete, source=args.source,
                               verify_times=args.verify_times, method=args.method, batch_sizes=args.batch_sizes,
                               sglang_config=str(args.sglang_adaptive_config or "adaptive_config.json"))
    except (ValueError, KeyError, OSError) as exc:   # AdviceInputError and every InputError are ValueErrors
        print(f"moespec advise: {_message(exc)}", file=sys.stderr)
        return 1
    if out is None:
        print(json.dumps(result, indent=2))
        return 0
    # the answer first: a failure to write it below does not lose it
    print(advice.format_explain(result) if args.explain else advice.format_text(result))
    try:
        written = advice.write_json(result, out)
    except OSError as exc:
        print(f"moespec advise: the advice above was not written to {out}: {_message(exc)}", file=sys.stderr)
        return 1
    print(f"JSON: {written}")
    sched = result.get("batch_schedule")
    if args.sglang_adaptive_config and sched:
        if sched["sglang_cli"] is None:
            print(f"SGLang adaptive config: not written ({sched['note'].split('SGLang: ', 1)[-1]})")
        else:
            from moespec import io
            text = json.dumps(sched["sglang"], indent=2) + "\n"     # keys in batch-size order
            print(f"SGLang adaptive config: {io.write_text(args.sglang_adaptive_config, text)}")
    return 0


def _add_advise(sub) -> None:
    adv = sub.add_parser("advise", help="expert kernel and draft length for speculative decoding, from a run's "
                                        "run file or a bandwidth table",
                         description="Decide from which pass size the deduplicating expert kernel is faster, "
                                     "the best draft length k*(a) per kernel with the error bands of paper 1's "
                                     "bounds (17)-(21), the throughput a wrong choice loses, and settings for "
                                     "vLLM, SGLang and llama.cpp. Prints the answer on one screen (--explain: "
                                     "its derivation) and writes JSON.")
    adv.add_argument("run", nargs="?", type=Path,
                     help="run folder (or figures/) with its run file (moespec run-file RUN makes it), or the run "
                          "file itself")
    adv.add_argument("-a", "--acceptance", nargs="+", type=float, metavar="A",
                     help="what-if acceptance rate(s) a in [0, 1), geometric acceptance assumed (G_a(k) = "
                          "(1 - a^(k+1)) / (1 - a)); without any acceptance option a run's own measured profile")
    adv.add_argument("--acceptance-table", type=Path, metavar="CSV",
                     help="acceptance rates: columns accepted,rejections (pooled) or a column a; geometric assumed")
    adv.add_argument("--acceptance-from", nargs="+", type=Path, metavar="FILE",
                     help="decide from a measured per-position acceptance profile: an engine's /metrics scrape(s) "
                          "(two: differenced), log, or responses (vLLM, SGLang, llama.cpp; see moespec acceptance)")
    adv.add_argument("--bandwidth", type=Path, metavar="CSV",
                     help="a bandwidth table instead of a run (Table-1 layout or one row per n)")
    adv.add_argument("--verify-times", nargs="+", metavar="FILE",
                     help="verify costs from an engine's kernel benchmark (test-backend-ops perf -o MUL_MAT_ID, "
                          "llama-bench, vLLM benchmark_moe.py and its tuned JSON, moespec's rows or "
                          "02_bandwidth_by_n.csv); prefix slot= or dedup= to say which kernel path a file timed")
    adv.add_argument("--method", default="draft_model", choices=("draft_model", "eagle3", "mtp", "ngram"),
                     help="draft method of the printed settings (default draft_model)")
    adv.add_argument("--engine", help="row of the bandwidth table (e.g. 'llama.cpp CUDA')")
    adv.add_argument("--model", help="row of the bandwidth table / model preset (e.g. OLMoE)")
    adv.add_argument("--format", help="storage format for the preset's expert bytes (default: the paper's)")
    adv.add_argument("--trace", type=Path, metavar="NPZ",
                     help="routing trace whose union/byte share is used (with a bandwidth table, or a run's "
                          "notebook 03 fits)")
    adv.add_argument("--eps", type=float, help="bandwidth error of the table's engine (published rows: the paper's)")
    adv.add_argument("--state", help="machine state of the run's round model (quiet, loaded; default quiet)")
    adv.add_argument("--context", help="context of the run's round model (chat: the real draft's prompts; d=<depth>: "
                                       "the oracle draft's; default chat where the run has it)")
    adv.add_argument("--run-draft", metavar="NAME", help="which of the run's drafts (default: the draft as trained)")
    adv.add_argument("--dense-ratio", type=float,
                     help="dense bytes per pass as a multiple of m W where the source has none: notebook 03's fits, a "
                          "bandwidth table, verify times (default 0.5; refused with round models, which measured it)")
    adv.add_argument("--draft-fit", metavar="A,B",
                     help="another draft: t_draft(k) = A k + B ms (ms per drafted token, ms per round; paper 2's "
                          "eq. (A4)); default the run's own draft, measured")
    adv.add_argument("--free-draft", action="store_true",
                     help="take the draft as free (t_draft = 0): the theory's idealization, only when asked for")
    adv.add_argument("--target", default="<target-model>", help="target model name/path in the settings")
    adv.add_argument("--draft", default="<draft-model>", help="draft model name/path in the settings")
    adv.add_argument("--explain", action="store_true",
                     help="print the derivation: bounds, assumptions, the saving at every n, the round's terms, "
                          "every engine's speedup at every k, where each option name was read")
    adv.add_argument("--json", default="advice.json", metavar="PATH",
                     help="where to write the JSON (default advice.json; '-' prints the JSON instead of the text)")
    adv.add_argument("--source", help="label of the bandwidth table's rows ('published': paper 1's published "
                                      "numbers); default: recognised by their content "
                                      "(data/paper_reference/digests.json)")
    adv.add_argument("--allow-incomplete", action="store_true",
                     help="use the run file of a run that did not finish (running, failed, interrupted); the output "
                          "says which notebooks' tables it holds")
    adv.add_argument("--batch-sizes", nargs="+", type=int, metavar="B",
                     help="also k*(B) at these batch sizes (B sequences per verify pass of B(k + 1) tokens; B >= 2 "
                          "needs --trace) and the per-batch schedules of vLLM and SGLang")
    adv.add_argument("--sglang-adaptive-config", type=Path, metavar="FILE",
                     help="with --batch-sizes: write SGLang's --speculative-adaptive-config file there")
    adv.add_argument("--schema", action="store_true", help="print the JSON Schema of the output and exit")
    adv.set_defaults(func=_advise)


def _acceptance(args) -> int:
    import json

    from moespec import acceptance

    try:
        out = None if args.json is None else writable_file(args.json, "--json")
        prof = acceptance.load(args.files, engine=args.engine, state=args.state)
    except (InputError, OSError) as exc:
        print(f"moespec acceptance: {_message(exc)}", file=sys.stderr)
        return 1
    print(acceptance.format_profile(prof))
    if out is not None:
        from moespec import io

        print(f"JSON: {io.write_text(out, json.dumps(prof.to_json(), indent=2) + chr(10))}")
    return 0


ACCEPTANCE_HELP = ("the per-position acceptance profile of an engine's metrics, logs or responses (vLLM, SGLang, "
                   "llama.cpp) or of a moespec run")
ACCEPTANCE_DESCRIPTION = (
    "Read acceptance as the engine measured it (the format detected from the content; docs/advise.md lists every "
    "format and where it was read) and print p_i (the share of verify steps that accepted at least i drafts) with "
    "its interval, the conditional rates, tokens per step G(k) = 1 + p_1 + ... + p_k, the mean acceptance length and "
    "how far the profile is from the best geometric fit. Two Prometheus scrapes of one server (before, after) are "
    "differenced; other files of one kind are pooled.")


def _add_acceptance(sub) -> None:
    acc = sub.add_parser("acceptance", help=ACCEPTANCE_HELP, description=ACCEPTANCE_DESCRIPTION)
    acc.add_argument("files", nargs="+", type=Path, metavar="FILE",
                     help="metrics scrape(s), log, responses (JSON/JSONL), or a moespec run folder / profile table")
    acc.add_argument("--engine", default="auto", choices=["auto", "vllm", "sglang", "llamacpp", "moespec"],
                     help="refuse a file of another engine (default auto: detected from the content)")
    acc.add_argument("--state", help="machine state of a moespec run (default quiet)")
    acc.add_argument("--json", metavar="OUT", help="write the profile as JSON (K, p, G, mean_acceptance_length, "
                                                   "intervals, per-prompt profiles)")
    acc.set_defaults(func=_acceptance)


def _add_run_file(sub) -> None:
    rf = sub.add_parser("run-file", help="write a run's run file, what moespec advise reads, from the tables the "
                                         "run wrote",
                        description="Assemble the run file from a run's tables (notebook 05's round models or "
                                    "notebook 03's fits, 06's eps, the real-draft runs' acceptance and speedups, "
                                    "the manifest) and write it beside them.")
    rf.add_argument("run", type=Path, help="run folder (runs/<run>/), its figures/, or the committed figures/")
    rf.add_argument("--allow-incomplete", action="store_true",
                    help="build it from a run that did not finish; the file says so and advise refuses it unless "
                         "given --allow-incomplete too")
    rf.set_defaults(func=_run_file)


def _run_file(args) -> int:
    from moespec.predict import run_file

    try:   # bad input (an InputError) is reported in one line by main()
        print(f"moespec run-file: {run_file.write_run_file(args.run, allow_incomplete=args.allow_incomplete)}")
    except OSError as exc:
        print(f"moespec run-file: {_message(exc)}", file=sys.stderr)
        return 1
    return 0


def _report(args) -> int:
    from moespec import report

    try:
        files = [Path(f) for f in args.files] if args.files else None
        if args.check:
            diffs = report.check_files(args.run, files, allow_incomplete=args.allow_incomplete)
            for path, diff in diffs.items():
                print(diff, end="")
            print(f"moespec report: {len(diffs)} file(s) differ from {args.run}" if diffs else
                  f"moespec report: every block matches {args.run}")
            return 1 if diffs else 0
        # one writer per folder written: the run's figures (its REPORT.md; not the run folder, which a live run that
        # --allow-incomplete reports on holds) and the repository (its documents), or the folders of --files
        tables = args.run / "figures"
        if not tables.is_dir() or (args.run / "MANIFEST.json").exists():
            tables = args.run
        folders = [tables, paths.ROOT] if files is None else [f.absolute().parent for f in files]
        with contextlib.ExitStack() as held:
            for folder in sorted({Path(f).absolute() for f in folders if Path(f).is_dir()}):
                held.enter_context(runner.hold_folder(folder, "a folder moespec report writes"))
            changed = report.update_files(args.run, files, allow_incomplete=args.allow_incomplete)
    except (InputError, OSError, runner.NotebookError) as exc:
        print(f"moespec report: {_message(exc)}", file=sys.stderr)
        return 1
    print(f"moespec report: {len(changed)} file(s) rewritten from {args.run}" +
          "".join(f"\n  {p}" for p in changed))
    return 0


def _add_report(sub) -> None:
    rpt = sub.add_parser("report", help="write a run's REPORT.md and the README's and docs' result blocks from files",
                         description="Write RUN's REPORT.md beside its figures (a section per notebook, from the run's "
                                     "own files) and rewrite every <!-- moespec-report:NAME --> block of README.md, "
                                     "docs/*.md and figures/README.md from RUN (a runs/<run>/ folder or figures/) and "
                                     "the committed records the markers name; a block whose file is missing is an "
                                     "error naming the file.")
    rpt.add_argument("run", type=Path, help="run folder (runs/<run>/) or figures folder (figures/)")
    rpt.add_argument("--check", action="store_true", help="change nothing; print the differences, exit 1 if any")
    rpt.add_argument("--files", nargs="+", metavar="MD", help="only these Markdown files (default README.md, "
                                                               "docs/*.md, figures/README.md and the run's REPORT.md)")
    rpt.add_argument("--allow-incomplete", action="store_true",
                     help="write from a run that did not finish (running, failed, interrupted); the run's "
                          "description says so and which notebooks finished")
    rpt.set_defaults(func=_report)


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
    rep.add_argument("--model", metavar="PATH", help="your model (a checkpoint folder, or a config.json beside an "
                                                     "engine's routing): model= of 01-03, the subject of 05-07")
    rep.add_argument("--draft", metavar="PATH", help="the draft checkpoint of --model (the subject's draft)")
    rep.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                     help="extra notebook parameter (repeatable); unknown names are an error")
    rep.add_argument("--no-progress", action="store_true", help="no progress bar")
    rep.add_argument("--publish", action="store_true",
                     help="the make reproduce run: full profile, every notebook, defaults only; measurements in data/ "
                          "and, at the end, the run's figures copied into the committed figures/")
    rep.set_defaults(func=_reproduce)
    bld = sub.add_parser("build-models", help="build the embedded default MoE, draft and tokenizer into "
                                              "data/models (reuses the build there, committed with the full recipe's)")
    bld.add_argument("--force", action="store_true",
                     help="train from scratch even if data/models holds a build of the recipe (replaces it)")
    bld.add_argument("--out", type=Path, help="models folder (default data/models, the committed build)")
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
    imp.add_argument("--prompt-start", type=int, help="vLLM: the requests' routed_experts_prompt_start s (the "
                                                      "engine returned positions s..P+G-2) where the dump does not "
                                                      "record it")
    imp.add_argument("--prompt-length", type=int, help="vLLM: the prompt's token count P for records that do not hold "
                                                       "it (a /inference/v1/generate response stored without its "
                                                       "request)")
    imp.add_argument("--tokens", choices=["all", "prompt", "generated"], default="all")
    imp.add_argument("--dense-layers", default="auto",
                     help="auto (config, else all-zero placeholder layers), none, or indices like 0,1")
    imp.add_argument("--source", help="the trace's label in plots and tables")
    imp.set_defaults(func=_import_routing)
    swp = sub.add_parser("sweep", help="run a grid of (notebook, parameters) jobs on Dask or Slurm")
    swp.add_argument("grid", type=Path, help="grid file (.toml or .json; see docs/sweep.md)")
    swp.add_argument("--executor", choices=["dask", "slurm", "submitit-local"], default="dask")
    swp.add_argument("--scheduler", help="address of a running Dask scheduler (default: a LocalCluster here); "
                                         "tls://... with certificates from the Dask configuration")
    swp.add_argument("--insecure", action="store_true",
                     help="allow a plain tcp:// scheduler on an address other than this machine's loopback "
                          "(whoever reaches it can run code on its workers and send results that are unpickled here)")
    swp.add_argument("--workers", type=int, help="LocalCluster worker processes (default 2; only without --scheduler, "
                                                 "with --executor dask)")
    swp.add_argument("--out", type=Path, help="sweep folder (default runs/sweep-<grid name>; reruns skip finished jobs)")
    swp.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                     help="parameter for every job whose notebook declares it (overrides the grid)")
    swp.add_argument("--executor-option", action="append", metavar="KEY=VALUE",
                     help="submitit parameter (repeatable), e.g. slurm_partition=gpu, gpus_per_node=4, timeout_min=120")
    swp.add_argument("--force", action="store_true", help="run finished jobs again")
    swp.add_argument("--no-progress", action="store_true", help="no progress bar")
    swp.set_defaults(func=_sweep)
    _add_advise(sub)
    _add_acceptance(sub)
    _add_run_file(sub)
    _add_report(sub)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (InputError, runner.NotebookError) as exc:   # bad input a command did not report itself
        print(f"moespec {args.command}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"moespec {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception:   # not bad input (each command reports that in one line): a bug in moespec
        traceback.print_exc()
        print(f"moespec {args.command}: the error above is a bug in moespec, not a problem with the input; "
              "please report it with this traceback", file=sys.stderr)
        return 70


if __name__ == "__main__":
    sys.exit(main())
