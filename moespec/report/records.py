"""Blocks over committed records (:mod:`moespec.report`): benchmark results, reproduce and test
timings, the GPU check, the embedded models' build. Each marker names its file or folder (a path
from the repository root); nothing here reads a path it was not given, except the committed
build of the embedded models (``data/models/``)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd

from moespec import theory
from moespec.measure.overhead_fit import fit, markdown, read_rows
from moespec.measure.regimes import classify
from moespec.report.blocks import block
from moespec.report.format import machine, md_table, named_table, num, pct, span, when
from moespec.report.run import ReportError, RunFiles


def _bench_record(run: RunFiles, file: str) -> dict:
    rec = run.repo_json(file)
    if "provenance" not in rec:
        raise ReportError(f"{file}: no provenance (not a benchmark record)")
    return rec


@block("reproduce-time")
def reproduce_time(run: RunFiles, file: str, limit_min: str = "90") -> str:
    """benchmarks/time_reproduce.py's record: ``make reproduce`` on a fresh clone, end to end."""
    rec = _bench_record(run, file)
    total = rec["total_s"] / 60
    if rec["rc"] != 0:
        return f"`make reproduce` on a fresh clone exited with {rec['rc']} after {total:.1f} min (`{file}`)."
    before = rec.get("before_notebooks_s")
    nbs = ", ".join(f"{nb['name'][:2]} {nb['wall_s'] / 60:.1f}" for nb in rec["notebooks"] if nb.get("wall_s"))
    verdict = "met" if total <= float(limit_min) else "**not met**"
    return (f"`make reproduce` on a fresh clone, started {when(rec['started_utc'][:19])}, took **{total:.1f} min** "
            f"end to end on {machine(rec['provenance'])} "
            f"(goal ≤ {limit_min} min: {verdict}): "
            + (f"{before / 60:.1f} min creating `.venv`, installing and building before the first notebook, then "
               if before is not None else "")
            + f"notebooks (min) {nbs} (`{file}`; {rec['how']}).")


@block("test-time")
def test_time(run: RunFiles, file: str, limit_min: str = "15") -> str:
    """benchmarks/time_reproduce.py --target test's record: ``make test`` on a fresh clone, end to end."""
    rec = _bench_record(run, file)
    total = rec["total_s"] / 60
    py = rec.get("pytest") or {}
    counts = ", ".join(f"{py[k]} {k}" for k in ("passed", "skipped", "failed", "error") if py.get(k))
    verdict = "met" if rec["rc"] == 0 and total <= float(limit_min) else "**not met**"
    return (f"`make test` on a fresh clone, started {when(rec['started_utc'][:19])}, exited with {rec['rc']} after "
            f"**{total:.1f} min** end to end on "
            f"{machine(rec['provenance'])} (goal ≤ {limit_min} min: {verdict})"
            + (f"; pytest: {counts} in {py['seconds'] / 60:.1f} min" if py else "; no pytest summary in its output")
            + f" (`{file}`; {rec['how']}).")


@block("interleaved-pilot")
def interleaved_pilot(run: RunFiles, file: str) -> str:
    """benchmarks/bench_interleaved_calibration.py's record: the real draft's round calibration
    before its test runs against interleaved with them, in one session on one machine."""
    rec = _bench_record(run, file)
    parts = []
    for name, p in rec["protocols"].items():
        if "error" in p:
            parts.append(f"{name}: no prediction ({p['error']})")
            continue
        se = ("" if p.get("measurement_se") is None else
              f"; the measurement's standard error {pct(p['measurement_se'])}, a perfect prediction outside 5 % at "
              f"about {p['expected_outside_by_noise']:.1f} by its noise alone")
        parts.append(f"{name}: within 5 % at {p['within_5pct']} of {p['points']} points (largest |error| "
                     f"{pct(p['largest_abs_error'])}, mean {100 * p['mean_error']:+.1f} %, measured inside the "
                     "predicted "
                     f"interval at {p['inside_interval']}); with the runs' own step times within 5 % at "
                     f"{p['within_5pct_measured_steps']}; V(0) predicted {num(p['V0_hat_ms'], 2)} ms, measured "
                     f"{num(p['V0_meas_ms'], 2)} ms; reads {num(p['read_GBps_model'], 2)} GB/s (calibration), "
                     f"{num(p['read_GBps_runs'], 2)} GB/s (test){se}; {p['wall_s'] / 60:.1f} min")
    return (f"Real draft, {rec['state']} machine, {rec['profile']} profile's sizes ({rec['calibration_prompts']} "
            f"calibration turns, {rec['test_prompts']} test turns x {rec['test_reps']}, draft costs "
            f"{', '.join(f'{r:g}' for r in rec['draft_costs'])}, k = {min(rec['ks'])}..{max(rec['ks'])}), "
            "both protocols "
            f"in one session on {machine(rec['provenance'])}, the measuring process pinned to one CPU, torch threads "
            f"{rec.get('torch_threads', 'not set (torch default; the record predates the setting)')}: "
            + "; ".join(parts) + f" (`{file}`).")


@block("routing-speed")
def routing_speed(run: RunFiles, file: str) -> str:
    """benchmarks/bench_routing_stats.py's record: statistics and bootstrap times."""
    rec = _bench_record(run, file)
    parts = []
    for key, res in rec["results"].items():
        tr = res["trace"]
        t = {k: v for k, v in res.items() if k != "trace"}
        timing = "; ".join(f"{k} {v['t_median_s']:.3f} s (IQR {v['t_q25_s']:.3f}–{v['t_q75_s']:.3f})"
                           for k, v in t.items())
        parts.append(f"{tr['tokens']:,}-token x {tr['L']}-layer x m = {tr['m']} trace, {key}: {timing}")
    return f"`{file}` ({rec['date_utc']} UTC, {machine(rec['provenance'])}): " + "; ".join(parts) + "."


@block("theory-speed")
def theory_speed(run: RunFiles, file: str) -> str:
    """benchmarks/bench_theory.py's record, and the paper's worked examples computed exactly."""
    rec = _bench_record(run, file)
    times = [res["best_draft_length(V, a)"]["t_median_s"] for res in rec["results"].values()]
    agree = all(res["staircase_agrees_with_argmax"] for res in rec["results"].values())
    rho = [theory.byte_threshold(Fraction(13, 20), k, 1, 1) for k in (1, 2)]
    jump = theory.step_points([1, 2, 2])[0]
    return (f"k*(a) for {rec['values']:,} acceptance values with kmax = {rec['kmax']} in "
            f"{span([1e3 * t for t in times], 1)} ms over {len(times)} step-time vectors (`{file}`, "
            f"{rec['date_utc']} UTC; the staircase agrees with the argmax: {'yes' if agree else 'no'}); the paper's "
            f"worked examples come out exactly (a = 13/20 → rho*_1 = {rho[0]}, rho*_2 = {rho[1]}; V = (1, 2, 2) "
            f"jumps from k* = 0 to 2 at a = {float(jump):.6f}, (√5 − 1)/2).")


@block("theory-timings")
def theory_timings(run: RunFiles, file: str) -> str:
    """benchmarks/bench_theory.py's record as a table: every function and step-time vector."""
    rec = _bench_record(run, file)
    names = [k for k in next(iter(rec["results"].values())) if isinstance(next(iter(rec["results"].values()))[k], dict)]
    rows = []
    for vec, res in rec["results"].items():
        rows.append([vec] + [f"{1e3 * res[k]['t_median_s']:.2f} ms ({1e3 * res[k]['t_q25_s']:.2f}–"
                             f"{1e3 * res[k]['t_q75_s']:.2f})" for k in names])
    return (f"k*(a) for {rec['values']:,} acceptance values with kmax = {rec['kmax']} (`{file}`, "
            f"{rec['date_utc']} UTC, "
            f"{machine(rec['provenance'])}, numpy {rec['provenance']['versions'].get('numpy')}):\n\n"
            + md_table(["step time"] + [f"`{k}`" for k in names], rows))


@block("bellman-speed")
def bellman_speed(run: RunFiles, file: str) -> str:
    rec = _bench_record(run, file)
    return (f"Bellman solve of N = {rec['n']:,} positions x Lmax = {rec['lmax']} in {rec['median_s']:.3f} s "
            f"(median of {rec['reps']}, IQR {rec['q25_s']:.3f}–{rec['q75_s']:.3f} s; `{file}`, "
            f"{rec['date_utc']} UTC, "
            f"{machine(rec['provenance'])}).")


def kernel_blocks(run: RunFiles, runs: str, folder: str) -> pd.DataFrame:
    """The rows of bench_kernels.py runs ``runs`` (comma-separated stamps), with the run's stamp and
    its bandwidth regime per (run, model, format) block: ``low``/``high`` by
    :func:`moespec.measure.regimes.classify` of the blocks' reference reads, ``steady`` unless the
    block's reads changed regime (``read_unsteady``)."""
    frames = []
    for stamp in runs.split(","):
        df = run.repo_csv(f"{folder}/{stamp.strip()}.csv")
        frames.append(df.assign(run=stamp.strip()))
    df = pd.concat(frames, ignore_index=True)
    blocks = df.groupby(["run", "model", "fmt"], sort=False).agg(read=("read_GBps", "first"),
                                                                 flags=("flags", "first")).reset_index()
    blocks["regime"] = classify(blocks["read"].to_numpy(float))
    blocks["steady"] = ~blocks["flags"].apply(lambda v: isinstance(v, str) and "read_unsteady" in v)
    return df.merge(blocks[["run", "model", "fmt", "regime", "steady"]], on=["run", "model", "fmt"])


FMT_NAMES = {"f32": "f32", "bf16": "bf16", "int8_b32": "int8 (32-value blocks)"}


@block("repo-table")
def repo_table(run: RunFiles, file: str, columns: str = "", digits: str = "3") -> str:
    """A committed benchmark's table (a path from the repository root) as it is, like ``table``."""
    return named_table(run.repo_csv(file), file, columns, digits)


@block("kernel-breadth")
def kernel_breadth(run: RunFiles, stamp: str, folder: str) -> str:
    """One bench_kernels.py --ggml run over models and formats: per (model, format), both engines'
    r(2) and r(8) (deduplicating over per-slot effective bandwidth, paired per round), their
    deduplicating kernels' shares of the read bandwidth, and moespec dedup / ggml MUL_MAT_ID; blocks
    whose reference read changed regime are marked."""
    df = run.repo_csv(f"{folder}/{stamp}.csv")
    prov = run.repo_json(f"{folder}/{stamp}_provenance.json")
    rows = []
    for (model, fmt), g in df.groupby(["model", "fmt"], sort=False):
        d = g[(g.kernel == "dedup") & (g.backend == "cpp")].set_index("n")
        peer = g[(g.kernel == "dedup") & (g.backend == "ggml")]
        unsteady = "read_unsteady" in str(g["flags"].iloc[0])
        rows.append([model, fmt, num(d.r_n.get(2)), num(d.r_n.get(8)), num(d.r_n_ggml.get(2)), num(d.r_n_ggml.get(8)),
                     span(d.beta_over_read, 2), span(peer.beta_over_read, 2), span(d.dedup_over_ggml, 2),
                     "read changed regime (unreliable)" if unsteady else ""])
    args = prov.get("args", {})
    return (f"Run `{folder}/{stamp}*` ({when(str(df['date'].iloc[0])[:19])}, {machine(prov)}, protocol "
            f"{df['protocol'].iloc[0]}, {args.get('reps')} rounds, {args.get('threads')} threads, read "
            f"{span(df['read_GBps'], 1)} GB/s; random weights at each published shape; ggml in Q8_0 for int8_b32):\n\n"
            + md_table(["model", "format", "moespec r(2)", "moespec r(8)", "ggml r(2)", "ggml r(8)",
                        "moespec dedup / read, n = 1..9", "ggml MUL_MAT_ID / read, n = 1..9",
                        "moespec dedup / ggml", "note"], rows))


@block("kernel-shares")
def kernel_shares(run: RunFiles, runs: str, folder: str, model: str = "olmoe", regime: str = "low") -> str:
    """The CPU kernels' shares of the read bandwidth, r(n) and the in-run peers, over the steady
    blocks of the given regime of bench_kernels.py runs, with the issue's targets."""
    df = kernel_blocks(run, runs, folder)
    sel = df[(df["model"] == model) & df["steady"] & (df["regime"].isin([regime, "one"]))]
    if sel.empty:
        raise ReportError(f"no steady {regime}-regime block of {model} in runs {runs}")
    fmts = [f for f in ("f32", "bf16", "int8_b32") if f in set(sel["fmt"])]

    def col(fmt, kernel, backend, n=None, value="beta_over_read"):
        s = sel[(sel.fmt == fmt) & (sel.kernel == kernel) & (sel.backend == backend)]
        if n is not None:
            s = s[s.n == n]
        return s[value].dropna()

    slot1 = {f: col(f, "slot", "cpp", 1) for f in fmts}
    dedup = {f: col(f, "dedup", "cpp") for f in fmts}
    r2 = {f: col(f, "dedup", "cpp", 2, "r_n") for f in fmts}
    r8 = {f: col(f, "dedup", "cpp", 8, "r_n") for f in fmts}
    ggml = {f: col(f, "dedup", "ggml") for f in fmts}
    vs = {f: col(f, "dedup", "cpp", value="dedup_over_ggml") if "dedup_over_ggml" in sel else pd.Series(dtype=float)
          for f in fmts}
    torch_ref = {f: col(f, "slot", "torch", 1) for f in fmts}

    def verdict(ok: bool) -> str:
        return "met" if ok else "**not met**"
    float_fmts = [f for f in fmts if f != "int8_b32"]
    rows = [
        ["per-slot n = 1, share of read bandwidth"] + [span(slot1[f]) for f in fmts]
        + ["≥ 0.85 (f32, bf16): " + verdict(all(slot1[f].min() >= 0.85 for f in float_fmts))],
        ["dedup on distinct bytes, share of read bandwidth, n = 1..9"] + [span(dedup[f]) for f in fmts]
        + ["≥ 0.95 at every n: " + ", ".join(f"{f} {verdict(dedup[f].min() >= 0.95)}" for f in fmts)],
        ["r(n) = beta_dedup/beta_slot"] + [f"r(2) {span(r2[f])}, r(8) {span(r8[f])}" for f in fmts]
        + ["r(2) ≥ 0.95, r(8) ≥ 0.9: " + verdict(all(r2[f].min() >= 0.95 and r8[f].min() >= 0.9 for f in fmts))],
    ]
    if any(len(ggml[f]) for f in fmts):
        rows.append(["ggml MUL_MAT_ID (dedup), share of read, n = 1..9"]
                     + [("Q8_0 " if f == "int8_b32" else "") + span(ggml[f], 2) for f in fmts] + [""])
        rows.append(["moespec dedup / ggml, paired per round"] + [span(vs[f], 2) for f in fmts]
                    + ["ahead or level: " + verdict(all(vs[f].min() >= 0.95 for f in fmts if len(vs[f])))])
    if any(len(torch_ref[f]) for f in fmts):
        rows.append(["torch's per-expert matmuls, n = 1"] + [span(torch_ref[f], 2) if len(torch_ref[f]) else ""
                                                              for f in fmts] + [""])
    blocks = sel.drop_duplicates(["run", "fmt"])
    reads = span(blocks["read_GBps"], 1)
    reps = span(sel["reps"], 0)
    used = "; ".join(f"{FMT_NAMES[f]}: {', '.join(blocks[blocks.fmt == f]['run'])}" for f in fmts)
    return (md_table([""] + [FMT_NAMES[f] for f in fmts] + ["target"], rows)
            + f"\n\nBlocks used ({regime}-bandwidth regime, reads steady within the block, {reps} rounds, read "
            f"{reads} GB/s): {used} (`{folder}/<run>.csv`).")


@block("kernel-regimes")
def kernel_regimes(run: RunFiles, runs: str, folder: str, model: str = "olmoe") -> str:
    """The same kernels' dedup shares in the other (high-bandwidth) regime of the same runs."""
    df = kernel_blocks(run, runs, folder)
    hi = df[(df["model"] == model) & (df["regime"] == "high") & (df["backend"] == "cpp") & (df["kernel"] == "dedup")]
    if hi.empty:
        return "None of these runs' blocks fell in a faster bandwidth regime."
    parts = [f"{FMT_NAMES[f]} {span(g['beta_over_read'], 2)}" for f, g in hi.groupby("fmt", sort=False)]
    return (f"In the machine's fast regime (reads of {span(hi['read_GBps'], 0)} GB/s, blocks of the same runs) the "
            f"dedup kernel reaches a lower share of the read: {', '.join(parts)}.")


@block("kernel-run-tables")
def kernel_run_tables(run: RunFiles, runs: str, folder: str) -> str:
    """bench_kernels.py runs block by block: the read, the regime (``unsteady`` for a block whose
    reads changed regime) and, per n, r(n), the shares of the read and the peer's."""
    df = kernel_blocks(run, runs, folder)
    df["label"] = np.where(df["steady"], df["regime"], "unsteady")
    if "protocol" in df.columns:
        df["label"] = df["label"] + np.where(df["protocol"].fillna("cold") == "warm-code", ", warm-code", "")
    keys = ["model", "fmt", "label", "run"]
    blocks = df.drop_duplicates(["run", "model", "fmt"])
    head = md_table(["model", "fmt", "regime", "run", "read GB/s", "other_load", "torch.sum over one pass / read"],
                    [[r.model, r.fmt, r.label, r.run, num(r.read_GBps, 1), num(r.other_load, 3),
                      num(r.layer_read_over_read, 3)] for r in blocks.itertuples()])
    out = [head]
    ns = sorted(int(n) for n in df["n"].unique())
    for title, kernel, backend, value in _KERNEL_TABLES:
        if value not in df.columns:
            continue
        sel = df[(df.kernel == kernel) & (df.backend == backend)].dropna(subset=[value])
        if sel.empty:
            continue
        piv = sel.pivot_table(index=keys, columns="n", values=value, sort=False)
        rows = [list(idx) + [num(piv.loc[idx].get(n)) for n in ns] for idx in piv.index]
        out.append(f"{title}:\n\n" + md_table(keys + [str(n) for n in ns], rows))
    return "\n\n".join(out) + f"\n\n(`{folder}/<run>.csv`, {span(df['reps'], 0)} rounds.)"


_KERNEL_TABLES = (
    ("r(n) = beta_dedup / beta_slot (paired per round)", "dedup", "cpp", "r_n"),
    ("per-slot beta / read bandwidth (requested bytes n*m*b)", "slot", "cpp", "beta_over_read"),
    ("dedup beta / read bandwidth (distinct bytes U*b)", "dedup", "cpp", "beta_over_read"),
    ("ggml MUL_MAT_ID beta / read bandwidth (distinct bytes, ggml's own b)", "dedup", "ggml", "beta_over_read"),
    ("moespec dedup / ggml MUL_MAT_ID, effective bandwidth (paired per round)", "dedup", "cpp", "dedup_over_ggml"),
)


@block("kernel-crossover")
def kernel_crossover(run: RunFiles, runs: str, folder: str) -> str:
    """Where ubar(n) < r(n) (deduplication faster, paper 1, eq. (7)) in bench_kernels.py runs' ``_ubar.csv``."""
    frames = [run.repo_csv(f"{folder}/{s.strip()}_ubar.csv").assign(run=s.strip())
              for s in runs.split(",")]
    ub = pd.concat(frames, ignore_index=True)
    cells = ub.dropna(subset=["n_where_ubar_lt_r"]).drop_duplicates(["run", "model", "fmt", "routing"])
    full = cells[cells["n_where_ubar_lt_r"].astype(str) == "2,3,4,5,6,7,8,9"]
    short = cells[cells["n_where_ubar_lt_r"].astype(str) != "2,3,4,5,6,7,8,9"]
    text = (f"ubar(n) < r(n) at every n = 2..9 in {len(full)} of {len(cells)} (run, model, format, routing) cells "
            f"(routings: {', '.join(dict.fromkeys(cells['routing']))})")
    if len(short):
        text += "; elsewhere: " + "; ".join(f"{r.run} {r.model} {r.fmt} {r.routing}: n = {r.n_where_ubar_lt_r}"
                                             for r in short.itertuples())
    return text + " (`<run>_ubar.csv`)."


@block("gpu-results")
def gpu_results(run: RunFiles, folder: str) -> str:
    """The CUDA kernels' correctness and bandwidth from a gpu_check.sh run's files."""
    prov = run.repo_json(f"{folder}/bench_provenance.json")
    gpus = prov["hardware"].get("gpus") or [{}]
    gpu = gpus[0].get("name", "?") if isinstance(gpus[0], dict) else str(gpus[0])
    tests = [line for line in run.repo_path(f"{folder}/pytest_cuda_run2.txt").read_text().splitlines()
             if " passed" in line][-1].strip()
    harness = run.repo_path(f"{folder}/standalone_check.txt").read_text().strip().splitlines()[-1].strip()
    df = run.repo_csv(f"{folder}/bench_kernels_cuda.csv")
    fmts = list(dict.fromkeys(df["fmt"]))
    n1 = df[df.n == 1]
    slot1 = ", ".join(f"{span(n1[n1.fmt == f]['slot_of_read'], 2)} ({f})" for f in fmts)
    rr = ", ".join(f"{span(df[df.fmt == f]['r'], 2)} ({f})" for f in fmts)
    olmoe = df[df.model == "olmoe"].set_index(["fmt", "n"])["r"]
    ol = ", ".join(f"{f} r(2) {num(olmoe[(f, 2)], 2)}, r(8) {num(olmoe[(f, 8)], 2)}" for f in fmts if (f, 8) in olmoe)
    wins = df[(df.n >= 2) & (df["dedup_faster_uniform"] == 1)]
    win_text = "; ".join(f"{f}: {len(g)} of {len(df[(df.fmt == f) & (df.n >= 2)])} (model, n) points"
                         for f, g in wins.groupby("fmt", sort=False)) or "none"
    stream = n1[n1.fmt.isin(["f32", "bf16"])]
    return (f"One lent {gpu} (`{folder}/`, torch {prov['versions'].get('torch')}): the torch-free harness says "
            f"\"{harness}\"; the CUDA tests: "
            f"\"{tests}\". Bandwidth (CUDA events, {int(df.reps.iloc[0])} repetitions, random routing, read bandwidth "
            f"{span(df['beta_read_GBps'] / 1e3, 1)} TB/s by `torch.sum` in the same run): at n = 1 the per-slot kernel "
            f"reaches {slot1} of the read; r(n) = {rr} over the presets and n = 1..9 (OLMoE: {ol}); under uniform "
            f"routing ubar(n) < r(n) at {win_text}. At n = 1 the f32 and bf16 points stream "
            f"{span(stream['beta_slot_GBps'] / 1e3, 1)} TB/s (per-slot bytes / time; `bench_kernels_cuda.csv`; the "
            f"per-call fixed cost is fitted in `overhead_fit.md` there).")


def _repo_csvs(run: RunFiles, files: str, folder: str) -> pd.DataFrame:
    return pd.concat([run.repo_csv(f"{folder}/{f.strip()}").assign(file=f.strip()) for f in files.split(",")],
                     ignore_index=True)


@block("call-stages")
def call_stages(run: RunFiles, files: str, folder: str) -> str:
    """bench_call_stages.py runs: the fixed work of a call and the work stage's pace, per protocol."""
    df = _repo_csvs(run, files, folder)
    df["protocol"] = df["protocol"].fillna("cold") if "protocol" in df else "cold"  # runs before the option: cold
    parts = []
    for protocol, g in df.groupby("protocol", sort=False):
        one = g[g.n == 1]
        fixed = ", ".join(f"{f} {span(h['fixed_us'], 0)} µs ({span(100 * h['fixed_share'], 0)} % of the call)"
                          for f, h in one.groupby("fmt", sort=False))
        work = ", ".join(f"{f} {span(h['work_over_read'], 2)}" for f, h in g.groupby("fmt", sort=False))
        total = ", ".join(f"{f} {span(h['total_over_read'], 2)}" for f, h in g.groupby("fmt", sort=False))
        parts.append(f"under `--protocol {protocol}` ({len(g.file.unique())} runs, read "
                     f"{span(g['read_GBps'], 0)} GB/s) a one-token call carries {fixed} of fixed work (Python, "
                     f"pybind11, set-up, wake-up, combine); over n = {int(g.n.min())}..{int(g.n.max())} the work stage "
                     f"streams at {work} of the read, the whole call at {total}")
    return "Where the time goes (`bench_call_stages.py`, `" + "`, `".join(df.file.unique()) + "`): " + \
        "; ".join(parts) + "."


@block("call-stages-table")
def call_stages_table(run: RunFiles, files: str, folder: str) -> str:
    """bench_call_stages.py runs as a table: per protocol, format and n = 1 / n >= 2, the ranges
    over the runs of each stage's median and the call's, op's and work stage's share of the read."""
    df = _repo_csvs(run, files, folder)
    df["protocol"] = df["protocol"].fillna("cold") if "protocol" in df else "cold"
    stages = ["python_in_us", "setup_us", "wake_us", "work_us", "combine_us", "python_out_us"]
    rows = []
    for (protocol, fmt), g in df.groupby(["protocol", "fmt"], sort=False):
        for label, h in (("n = 1", g[g.n == 1]), (f"n = 2-{int(g.n.max())}", g[g.n >= 2])):
            if h.empty:
                continue
            work = h["work_us"] / 1e3
            rows.append([protocol, fmt, label] + [f"{span(h[s], 0)} us" for s in stages if s != "work_us"][:3]
                        + [f"{span(work, 1)} ms"] + [f"{span(h[s], 0)} us" for s in ("combine_us", "python_out_us")]
                        + [f"{span(100 * h['fixed_share'], 1)} %", span(h["total_over_read"]), span(h["op_over_read"]),
                           span(h["work_over_read"])])
    return (md_table(["protocol", "format", "n", "Python + pybind11 in", "set-up", "wake-up", "work items", "step 4",
                      "out", "fixed share", "call / read", "op / read", "work / read"], rows)
            + f"\n\n(Ranges over the runs' medians: `{'`, `'.join(df.file.unique())}`; read "
            f"{span(df['read_GBps'], 1)} GB/s, {span(df['reps'], 0)} rounds.)")


@block("microkernel")
def microkernel(run: RunFiles, file: str, folder: str) -> str:
    """bench_microkernel.py: one core's pace of the dot micro-kernels, weights in L1/L2."""
    df = run.repo_csv(f"{folder}/{file}")
    Ts = sorted(df["T"].unique())
    picks = [t for t in (1, 4) if t in Ts] or Ts[:2]
    parts = [f"{span(df[df['T'] == t]['weights_GBps_per_core'], 0)} GB/s of weights at T = {t}" for t in picks]
    return (f"The micro-kernels' own pace (`bench_microkernel.py`, `{file}`, one thread, weights in "
            f"{'/'.join(df['size'].unique())}, formats {', '.join(df['fmt'].unique())}): one core keeps up with "
            + ", ".join(parts) + ".")


@block("microkernel-table")
def microkernel_table(run: RunFiles, file: str, folder: str) -> str:
    """bench_microkernel.py: ns per 64 weight bytes and token, per format and T, L1 / L2."""
    df = run.repo_csv(f"{folder}/{file}")
    Ts = sorted(int(t) for t in df["T"].unique())
    sizes = list(dict.fromkeys(df["size"]))
    rows = []
    for fmt, g in df.groupby("fmt", sort=False):
        cells = []
        for t in Ts:
            vals = [g[(g["T"] == t) & (g["size"] == s)]["ns_per_64B_token"] for s in sizes]
            cells.append(" / ".join(num(v.iloc[0], 2) if len(v) else "" for v in vals))
        rows.append([f"{fmt} ({' / '.join(sizes)})"] + cells)
    return (md_table(["format"] + [f"T = {t}" for t in Ts], rows)
            + f"\n\n(`{file}`, {df['date'].iloc[0]}, median of {int(df['rounds'].iloc[0])} rounds, ns per 64 weight "
            f"bytes and token, K = {int(df['K'].iloc[0])}, ISA path {', '.join(dict.fromkeys(df['cpu_isa']))}.)")


@block("training-speed")
def training_speed(run: RunFiles, file: str, folder: str) -> str:
    """bench_training.py: tokens/s of the previous and the current training path of each embedded
    model, interleaved in one run, with the speed-up (ratio of median step times) and the
    issue's 3x goal."""
    df = run.repo_csv(f"{folder}/{file}")
    prov = run.repo_json(f"{folder}/{file.replace('.csv', '_provenance.json')}")
    rows = []
    for r in df.itertuples():
        is_previous = r.path.endswith("previous")
        goal = "" if is_previous or "teacher" in r.path else ("met" if r.speedup_vs_previous >= 3 else "short")
        rows.append([r.path, num(r.t_median_s * 1e3, 0), f"{num(r.t_q25_s * 1e3, 0)}–{num(r.t_q75_s * 1e3, 0)}",
                     f"{r.tokens_per_s:,.0f}", "" if is_previous else f"{r.speedup_vs_previous:.2f}x",
                     goal])
    return (f"Run `{file}` ({when(prov.get('date', '')) if prov.get('date') else file[:16]}; {machine(prov)}, "
            f"{int(df['threads'].iloc[0])} thread, other processes' CPU share {df['other_load'].iloc[0]:.2f}; "
            f"{int(df['reps'].iloc[0])} steps per path of {int(df['tokens_per_step'].iloc[0]):,} tokens):\n\n"
            + md_table(["path", "step (ms, median)", "interquartile range (ms)", "tokens/s", "vs previous",
                        "3x goal"], rows))


@block("checkpoints")
def checkpoints(run: RunFiles) -> str:
    """The committed build of the embedded models (``data/models/*/moespec.json``): what was
    trained, for how long, how fast, its final loss and fingerprint, and where."""
    rows = []
    for what in ("default-moe", "default-draft"):
        meta = run.repo_json(f"data/models/{what}/moespec.json")
        t, h, rec = meta["timing"], meta["history"][-1], meta["recipe"]["train"]
        rows.append([what, f"{t['tokens']:,}", f"{t['seconds'] / 60:.1f}", f"{t['tokens_per_s']:,.0f}",
                     rec["precision"] + (", compiled" if rec["compile"] else "")
                     + (f", distilled (lambda {rec['distill']:g})" if rec["distill"] else ""),
                     num(h["lm_loss"], 3), num(meta["check"]["nll_per_token"], 4),
                     machine(meta["provenance"])])
    return md_table(["model", "tokens trained", "minutes", "tokens/s", "path", "last training loss (nats/token)",
                     "fingerprint (nats/token)", "machine"], rows)


@block("router-recipes")
def router_recipes(run: RunFiles, file: str, folder: str) -> str:
    """benchmarks/router_recipes.py: each router recipe's evaluation points (perplexity, reuse,
    load spread) as JSON lines."""
    df = pd.read_json(run.repo_path(f"{folder}/{file}"), lines=True)
    rows = [[r.name, f"{r.tokens / 1e6:.2f} M", num(r.ppl_token, 1), num(r.rho2), num(r.rho9), num(r.cv_max, 2),
             num(r.minload, 3), num(r.maxload, 2)] for r in df.itertuples()]
    return md_table(["run", "tokens", "perplexity", "rho_hat(2)", "rho_hat(9)", "load CV", "idlest / mean",
                     "busiest / mean"], rows)


@block("read-patterns")
def read_patterns(run: RunFiles, files: str, folder: str) -> str:
    """bench_read_patterns.py: each read pattern of the kernels against torch.sum, per regime."""
    df = _repo_csvs(run, files, folder)
    runs = df.groupby("file").agg(read=("read_GBps", "first")).reset_index()
    runs["regime"] = classify(runs["read"].to_numpy(float))
    df = df.merge(runs[["file", "regime"]], on="file")
    plain = df[(df.fmas_per_line == 0) & (df.prefetch_bytes == 0)]
    parts = []
    for regime, g in plain.groupby("regime", sort=False):
        cells = ", ".join(f"{p} {span(h['over_read'], 2)}" for p, h in g.groupby("pattern", sort=False))
        parts.append(f"{regime}-bandwidth runs (read {span(g['read_GBps'], 0)} GB/s): {cells}")
    fma = df[(df.fmas_per_line > 0) & (df.prefetch_bytes == 0)]
    extra = (f"; with {int(fma.fmas_per_line.max())} multiply-adds per 64-byte line {span(fma['over_read'], 2)}"
             if len(fma) else "")
    return ("The kernels' read patterns beside `torch.sum` in the same rounds (`bench_read_patterns.py`, "
            f"{len(runs)} runs; the probe's bandwidth over the reference read, no arithmetic): " + "; ".join(parts)
            + extra + ".")


@block("build-compare")
def build_compare(run: RunFiles, file: str, folder: str) -> str:
    """compare_cpu_builds.py: this tree's CPU extension against a base revision's, bitwise and timed."""
    df = run.repo_csv(f"{folder}/{file}")
    new = df[df.build == "new"]
    rows = []
    for (fmt, kernel), g in new.groupby(["fmt", "kernel"], sort=False):
        geo = float(np.exp(np.log(g["t_over_other"]).mean()))
        base = df[(df.build == "base") & (df.fmt == fmt) & (df.kernel == kernel)]
        rows.append([fmt, kernel, num(geo), span(g["t_over_other"]), span(g["beta_over_read"]),
                     span(base["beta_over_read"])])
    blocks = df.drop_duplicates("fmt")
    flags = "; ".join(f"{r.fmt}: {r.flags}" for r in blocks.itertuples() if isinstance(r.flags, str) and r.flags)
    return (f"`{file}` ({df['date'].iloc[0]}, base revision {df['base_rev'].iloc[0]}; "
            f"{int(df['checked_outputs'].iloc[0])} "
            f"outputs compared bit for bit before timing, none differed; {int(df['reps'].iloc[0])} rounds, "
            f"{int(df['threads'].iloc[0])} kernel thread(s), protocol {df['protocol'].iloc[0]}, model "
            f"{df['model'].iloc[0]}, read "
            f"{span(blocks['read_GBps'], 1)} GB/s, other load {span(blocks['other_load'], 2)}"
            + (f"; flagged {flags}" if flags else "") + "):\n\n"
            + md_table(["format", "kernel", "time new/base, geometric mean over n", "range over n = 1..9",
                        "new: share of read", "base: share of read"], rows))


@block("grid-vs-loop")
def grid_vs_loop(run: RunFiles, stamp: str, folder: str) -> str:
    """benchmarks/bench_grid_vs_loop.py: the same pass after each kind of predecessor."""
    t = run.repo_csv(f"{folder}/{stamp}_summary.csv")
    prov = run.repo_json(f"{folder}/{stamp}_provenance.json")
    ns = sorted(t["n"].unique())
    rows = []
    for c in [c for c in dict.fromkeys(t["condition"]) if c != "loop"]:
        row = [c]
        for n in ns:
            r = t[(t.n == n) & (t.condition == c)].iloc[0]
            row.append(f"{r.minus_loop_ms:+.2f} [{r.minus_loop_lo_ms:+.2f}, {r.minus_loop_hi_ms:+.2f}]")
        rows.append(row)
    base = ", ".join(f"n = {n}: {num(t[(t.n == n) & (t.condition == 'loop')]['median_ms'].iloc[0], 2)} ms" for n in ns)
    args = prov.get("args", {})
    return (f"Run `{folder}/{stamp}_*` ({when(prov.get('started', '?')[:19])}, {machine(prov)}, "
            f"{args.get('reps')} repetitions, every condition in a fresh random order per repetition; "
            f"{t['subject'].iloc[0]}). The pass inside the loop takes {base} (median); each other predecessor, "
            "the median paired difference to it (ms, 95 % bootstrap interval):\n\n"
            + md_table(["what ran just before the timed pass"] + [f"n = {n}" for n in ns], rows))


@block("decode-breakdown")
def decode_breakdown(run: RunFiles, stamp: str, folder: str) -> str:
    """benchmarks/bench_decode_breakdown.py: where a decode step's time goes, per subject."""
    sh = run.repo_csv(f"{folder}/{stamp}_shares.csv")
    prov = run.repo_json(f"{folder}/{stamp}_provenance.json")
    rows = [[r.subject, num(r.step_ms, 2), num(r.experts_ms, 2), num(r.expert_share), num(r.step_without_experts_ms, 2),
             num(r.draft_ratio), num(r.memory_held_GiB, 2)] for r in sh.itertuples()]
    args = prov.get("args", {})
    load = prov.get("load_average", prov.get("load_average_1_5_15"))
    ratio = None
    names = list(sh["subject"])
    if "byte-faithful" in names and "byte-faithful-intermediate" in names:
        s = sh.set_index("subject")
        ratio = s.loc["byte-faithful-intermediate", "experts_ms"] / s.loc["byte-faithful", "experts_ms"]
    return (f"Run `{folder}/{stamp}_*` ({when(prov.get('started', '?')[:19])}, {machine(prov)}, read "
            f"{span(sh['read_GBps'], 1)} GB/s, {args.get('reps')} repetitions, {args.get('threads')} thread; "
            f"{sh['label'].iloc[0]}"
            + (f"; load average {load}" if load else "") + "):\n\n"
            + md_table(["subject", "step (ms)", "expert op. (ms)", "expert share", "step without experts (ms)",
                        "draft token / step", "memory held (GiB)"], rows)
            + f"\n\nPeak memory of that process (all subjects built): {span(sh['peak_memory_GiB'], 1)} GiB."
            + (f" The same expert bytes laid out with only I widened took {ratio:.1f}x the published layout's time."
               if ratio is not None else ""))


@block("decode-components")
def decode_components(run: RunFiles, stamp: str, folder: str) -> str:
    """benchmarks/bench_decode_breakdown.py's per-component time and bytes of the n = 1 step, per
    subject, beside the published model's byte shares (its ``_bytes.csv``, moespec.engine.byte_shares)."""
    sh = run.repo_csv(f"{folder}/{stamp}_shares.csv").set_index("subject")
    by = run.repo_csv(f"{folder}/{stamp}_bytes.csv")
    prov = run.repo_json(f"{folder}/{stamp}_provenance.json")
    times = {"attention": "attention_ms", "experts": "experts_ms", "lm_head": "lm_head_ms"}
    rows = []
    for r in by.itertuples():
        t = sh.loc[r.subject, times[r.component]] if r.component in times else float("nan")
        rows.append([r.subject, r.component, num(t, 2), num(r.subject_bytes / 1e6, 2), num(r.subject_share),
                     num(r.published_share), num(r.share_ratio)])
    steps = "; ".join(f"{name}: step {num(v.step_ms, 2)} ms, step at n = 2 / step at n = 1 {num(v.step_n2_over_n1)}"
                      for name, v in sh.iterrows())
    return (f"Run `{folder}/{stamp}_*` ({when(prov.get('started', '?')[:19])}, {machine(prov)}, read "
            f"{span(sh['read_GBps'], 1)} GB/s, {prov.get('args', {}).get('reps')} repetitions, cache depth "
            f"{int(by['depth'].iloc[0])}; bytes of one decode step per component, the published model "
            f"{by['published'].iloc[0]} at the subject's {int(by['layers'].iloc[0])} layers):\n\n"
            + md_table(["subject", "component", "time alone (ms)", "bytes (MB)", "share of the step's bytes",
                        "published share", "share ratio"], rows)
            + f"\n\n{steps}.")


@block("gpu-overhead-fit")
def gpu_overhead_fit(run: RunFiles, file: str, model: str = "olmoe", goal: str = "0.85") -> str:
    """The legacy CUDA kernels' fixed cost and streaming rate from a GPU run's n = 1 rows
    (:mod:`moespec.measure.overhead_fit`), and the fixed cost a per-slot bf16 call of ``model`` may
    have to reach ``goal`` of the read at n = 1."""
    rows = read_rows(run.repo_path(file))
    fits = fit(rows)
    if not fits:
        raise ReportError(f"{file}: no f32 and bf16 rows at n = 1 to fit")
    slot = [f for f in fits if f["kernel"] == "slot"]
    dedup = [f for f in fits if f["kernel"] == "dedup"]
    df = run.repo_csv(file)
    read = float(df["beta_read_GBps"].median()) * 1e9
    one = df[(df.model == model) & (df.fmt == "bf16") & (df.n == 1)].iloc[0]
    nbytes, g = float(one["slot_bytes"]), float(goal)
    t_goal, t_bytes = nbytes / (g * read), nbytes / read
    return (markdown(fits) + f"\n\n(`{file}`, through `benchmarks/gpu_overhead_fit.py`.) The extra bytes stream at "
            f"{span([f['beta_GBps'] / 1e3 for f in fits], 1)} TB/s, the read bandwidth of the same run "
            f"{read / 1e12:.1f} TB/s: the legacy kernels are not slow at streaming; a fixed cost of "
            f"{span([f['a_us'] for f in slot], 0)} us per call ({span([f['a_us'] for f in dedup], 0)} us for dedup) is "
            f"{span([100 * f['a_share_bf16'] for f in fits], 0)} % of a bf16 call. For {goal} of the read at n = 1 "
            f"({model} bf16: {nbytes / 1e6:.1f} MB in at most {1e6 * t_goal:.1f} us at {read / 1e12:.1f} TB/s, "
            "of which "
            f"{1e6 * t_bytes:.1f} us is the bytes at the read rate) the fixed cost must fall to about "
            f"{1e6 * (t_goal - t_bytes):.0f} us.")



#: How the batch block writes each fitted coefficient: its label and the value from the fit's row.
_BATCH_COEFS = {"t_op": ("t_op ms", lambda r: 1e3 * r.t_op), "c_u": ("1/c_u GB/s", lambda r: 1e-9 / r.c_u),
                "c_re": ("c_re/c_u", lambda r: r.c_re / r.c_u), "c_g": ("1/c_g GB/s", lambda r: 1e-9 / r.c_g),
                "c_t": ("c_t ms/token", lambda r: 1e3 * r.c_t), "c_n": ("c_n ms/token", lambda r: 1e3 * r.c_n)}


def _batch_coefs(r) -> str:
    """A fit's coefficients in readable units (a zero slope's bandwidth: "n/a")."""
    out = []
    for col, (label, value) in _BATCH_COEFS.items():
        v = getattr(r, col, float("nan"))
        if pd.isna(v):
            continue
        try:
            x = value(r)
        except ZeroDivisionError:   # a slope held at 0 by the non-negative fit
            x = None
        out.append(f"{label} {num(x, 2)}")
    return "; ".join(out)


@block("kernel-batch")
def kernel_batch(run: RunFiles, stamp: str, folder: str) -> str:
    """benchmarks/bench_batch_passes.py's run: the machine and reads beside the timings, the deduplicating
    over the per-slot kernel's time per (backend, B, k + 1), both kernels' shares of the read ceiling per
    B, and the fits' regimes (:func:`moespec.fit.regimes`)."""
    rows = run.repo_csv(f"{folder}/{stamp}_batch.csv")
    fits = run.repo_csv(f"{folder}/{stamp}_fits.csv")
    rec = _bench_record(run, f"{folder}/{stamp}.json")
    args, runs = rec["args"], rec["runs"]
    reads = "; ".join(f"{b}: ceiling {num(r['read_ceiling']['median_GBps'], 1)} GB/s ({r['read_ceiling']['probe']}), "
                      f"torch.sum {num(r['sum_read']['median_GBps'], 1)} GB/s, other processes "
                      f"{pct(r['other_load'], 0)} of the CPUs, {r['kept_passes']} of {r['passes']} rows kept, "
                      f"{r['wall_s'] / 60:.1f} min" for b, r in runs.items())
    started = f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}T{stamp[9:11]}:{stamp[11:13]}:{stamp[13:15]}"
    head = (f"Run `{folder}/{stamp}*` ({when(started)}, {machine(rec['provenance'])}, torch "
            f"{rec['provenance']['versions']['torch']}; {rec['model']} {rec['fmt']}, layer {args['layers']}, "
            f"{args['reps']} rounds after one warm-up, one torch thread, a {rows['flush_bytes'].iloc[0] / 2**20:.0f} "
            f"MiB read flush before every call, {args['passes']} pass per (B, k + 1) from {rec['trace']}; "
            f"{rec['wall_s'] / 60:.1f} min). The machine was shared with other jobs while it ran, so these timings "
            f"are noisy. Per backend: {reads}.")
    both = rows.pivot_table(index=["backend", "B", "k_plus_1", "pass_id"], columns="kernel",
                            values="t_median_s").reset_index()
    both["ratio"] = both["dedup"] / both["slot"]
    ks = sorted(set(rows["k_plus_1"]))
    ratio = [[b, B] + [num(g.loc[g["k_plus_1"] == k, "ratio"].median(), 2) for k in ks]
             for (b, B), g in both.groupby(["backend", "B"], sort=False)]
    share = [[b, k, B, span(g["beta_over_read"], 2), span(1e3 * g["t_median_s"], 0)]
             for (b, k, B), g in rows.groupby(["backend", "kernel", "B"], sort=False)]
    found = []
    for (b, k), g in fits[fits["regime"] != "single fit"].groupby(["backend", "kernel"], sort=False):
        low, high = g[g["regime"] == "bytes"].iloc[0], g[g["regime"] != "bytes"]
        found.append(f"{b} {k}: bytes explain the time over n = {int(low.n_from)}–{int(low.n_to)}" + (
            "" if high.empty else f", the time per token from n = {int(high.n_from.iloc[0])} (there "
                                  f"{pct(high.excess_at_boundary.iloc[0], 0)} above the byte fit)"))
    head += " Regimes found: " + "; ".join(found) + "."
    reg = [[r.backend, r.kernel, r.regime, f"{int(r.n_from)}–{int(r.n_to)}", _batch_coefs(r),
            pct(r.fit_median_rel_err), "" if pd.isna(getattr(r, "excess_at_boundary", None))
            else pct(r.excess_at_boundary)] for r in fits[fits["regime"] != "single fit"].itertuples()]
    return (head + "\n\nTime of the deduplicating over the per-slot kernel on the same pass (same rounds), by B "
            "(rows) and k + 1 (columns):\n\n" + md_table(["backend", "B"] + [str(k) for k in ks], ratio)
            + "\n\nEffective bandwidth over the read ceiling of the same group (per-slot n·m·b, deduplicating "
              "U·b) and median time (ms), over k + 1 = " + f"{ks[0]}..{ks[-1]}:\n\n"
            + md_table(["backend", "kernel", "B", "share of read", "ms"], share)
            + "\n\nFits (4)/(E.1) over the range, or the two regimes `moespec.fit.regimes` finds (eq. (4)/(E.1) "
              "below a split and t = t_op + c_n·n from it, chosen by BIC, where the passes from the split also "
              "take longer than the byte fit predicts):\n\n"
            + md_table(["backend", "kernel", "regime", "n", "coefficients", "median \\|rel. error\\|",
                        "time above bytes at the split"], reg))


@block("batch-notebook-run")
def batch_notebook_run(run: RunFiles, folder: str) -> str:
    """A recorded run of notebook 09 (its run's ``manifest.json``, ``batch_run.json``,
    ``batch_runs.csv`` and ``batch_terms.csv`` copied into ``folder``): the wall time, each machine
    state's share of it, the cells' runs in it and the range of their reference reads, and per state
    the verify pass at B = 1 timed in the terms' blocks (their mean over the places in the text, as the
    prediction takes it) over the same pass inside the runs (their median), per k."""
    man = run.repo_json(f"{folder}/manifest.json")
    states = run.repo_json(f"{folder}/batch_run.json")["machine_states"]
    runs = run.repo_csv(f"{folder}/batch_runs.csv")
    terms = run.repo_csv(f"{folder}/batch_terms.csv")
    nb = next(n for n in man["notebooks"] if n["name"].startswith("09"))
    per_state = "; ".join(f"{s} {d['seconds'] / 60:.1f} min, of which the cells' runs "
                          f"{runs.loc[runs.state == s, 'time_s'].sum() / 60:.1f} min, the reference reads before "
                          f"the cells {span(runs.loc[runs.state == s, 'read_GBps'], 1)} GB/s"
                          for s, d in states.items())
    ratios = []
    for s in states:
        t = terms[(terms.state == s) & (terms.B == 1) & (terms.term == "verify") & (terms.k > 0)]
        r = runs[(runs.state == s) & (runs.B == 1) & (runs.k > 0)].groupby("k")["t_verify_mean_s"].median()
        v = t.groupby("k")["t_median_s"].mean() / r
        ratios.append(f"{s} {span(v, 2)} over k = {int(v.index.min())}..{int(v.index.max())}")
    where = (f"mean over {terms['offset'].nunique()} places in the text" if "offset" in terms
             else "at the prompts' end")
    return (f"Run `{folder}/` (notebook 09, {man['profile']} profile, {when(man['started'][:19])}, "
            f"{machine(man)}; its commit in `manifest.json`): **{nb['wall_s'] / 60:.1f} min**; per machine state: "
            f"{per_state}. The verify pass at B = 1 timed in the terms' blocks ({where}) over the same pass inside the "
            f"runs (median): {'; '.join(ratios)}.")
