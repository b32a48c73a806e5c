"""The report's blocks: one function per marked block of README.md and docs/*.md, each writing its
text from a run's files (:class:`~moespec.report.run.RunFiles`) and committed benchmark results.

``@block(name, *files)`` registers a function ``fn(run, **params) -> str`` (Markdown); ``files`` are
the run's files it reads, ``{param}`` filled from the marker (a marker with ``if-present`` writes a
note instead of failing when one is missing). Marker parameters arrive as strings. Numbers are formatted here and nowhere typed.
"""

from __future__ import annotations

import math
from datetime import datetime
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import advice, theory
from moespec.measure.overhead_fit import fit, markdown, read_rows
from moespec.measure.regimes import classify
from moespec.predict import noise, speculative
from moespec.report.run import ReportError, RunFiles

#: name -> (function, run files it reads)
BLOCKS: dict[str, tuple] = {}


def block(name: str, *files: str):
    """Register the block ``name``, which reads ``files`` of the run."""
    def deco(fn):
        if name in BLOCKS:
            raise ValueError(f"report block {name!r} is defined twice")
        BLOCKS[name] = (fn, tuple(files))
        return fn
    return deco


# --- formatting ------------------------------------------------------------------------------
def num(x, digits: int = 3) -> str:
    """``x`` with ``digits`` decimals; "n/a" for a missing value."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    return f"{float(x):.{digits}f}"


def span(values, digits: int = 3) -> str:
    """"lo–hi" of ``values`` (one number when they agree at this precision)."""
    v = [float(x) for x in values if x is not None and not (isinstance(x, float) and math.isnan(x))]
    if not v:
        return "n/a"
    lo, hi = num(min(v), digits), num(max(v), digits)
    return lo if lo == hi else f"{lo}–{hi}"


def pct(x, digits: int = 1) -> str:
    return f"{100 * float(x):.{digits}f} %"


def md_table(header: list[str], rows: list[list]) -> str:
    """A Markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def frame_table(df: pd.DataFrame, digits: int = 3) -> str:
    """A DataFrame as a Markdown table, floats to ``digits`` decimals, NaN as empty."""
    def cell(v):
        if isinstance(v, float):
            if math.isnan(v):
                return ""
            if abs(v) >= 1e6:
                return f"{v:.4g}"
            text = f"{v:.{digits}f}"
            return text.rstrip("0").rstrip(".") if "." in text else text
        return str(v)
    return md_table([str(c) for c in df.columns], [[cell(v) for v in row] for row in df.itertuples(index=False)])


def short_commit(commit) -> str:
    return str(commit or "?")[:7]


def when(stamp: str) -> str:
    """``2026-11-29T17:58:09`` -> ``2026-11-29 17:58 UTC``."""
    try:
        return datetime.fromisoformat(str(stamp)).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        return str(stamp)


def machine(record: dict) -> str:
    """The machine of a provenance record in words, e.g. "AMD EPYC, 2 logical CPUs, 24 GiB, no GPU"."""
    hw = record.get("hardware", record)
    cpu = hw.get("cpu", {})
    mem = cpu.get("MemTotal", "")
    gib = f", {int(mem.split()[0]) / 2**20:.0f} GiB" if mem.endswith("kB") else ""
    gpus = hw.get("gpus") or []
    gpu = ", no GPU" if not gpus else ", " + ", ".join(str(g.get("name", g)) if isinstance(g, dict) else str(g)
                                                      for g in gpus)
    return f"{cpu.get('cpu_model', '?')}, {cpu.get('logical_cpus', '?')} logical CPUs{gib}{gpu}"


def run_folder_name(man: dict) -> str:
    """The run folder a manifest was written in (``runs/<stamp>-full``)."""
    if man.get("run_dir"):
        return f"runs/{Path(man['run_dir']).name}"
    for nb in man.get("notebooks", []):
        if nb.get("output"):
            return f"runs/{Path(nb['output']).parent.name}"
    return "?"


def _ours(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of this run (not the papers' published rows)."""
    return df[df["source"] == "this run"] if "source" in df.columns else df


# --- the run as a whole ------------------------------------------------------------------------
@block("run-identity")
def run_identity(run: RunFiles) -> str:
    """Which run the tables come from: start time, folder, commit, machine, torch."""
    man = run.manifest
    torch_v = man.get("versions", {}).get("torch", "?")
    what = "`make reproduce`" if man.get("publish") else "`moespec reproduce`"
    if not run.status.complete:   # written with --allow-incomplete: say so, and what finished
        what = f"unfinished {what} ({run.status.describe()})"
    return (f"The {what} run of {when(man.get('started'))} (run folder `{run_folder_name(man)}`, commit "
            f"{short_commit(man.get('git_commit'))}, profile {man.get('profile', '?')}) on {machine(man)}, torch "
            f"{torch_v}; its manifest is `figures/MANIFEST.json`.")


@block("notebook-times")
def notebook_times(run: RunFiles) -> str:
    """Wall time of each notebook of the run (manifest)."""
    man = run.manifest
    parts = [f"{nb['name'][:2]} {nb['wall_s']:.0f} s" for nb in man.get("notebooks", []) if nb.get("wall_s") is not None]
    total = sum(nb.get("wall_s") or 0 for nb in man.get("notebooks", []))
    return (f"Notebook wall times of that run ({when(man.get('started'))}): "
            f"{', '.join(parts)}; {total / 60:.1f} min in all.")


@block("table", "{file}")
def table(run: RunFiles, file: str, columns: str = "", digits: str = "3") -> str:
    """Any table of the run as it is (``columns``: a comma-separated subset, in that order)."""
    return _named_table(run.csv(file), file, columns, digits)


def _named_table(df: pd.DataFrame, file: str, columns: str, digits: str) -> str:
    """``df`` (the file ``file``) as a markdown table under its name, ``columns`` (comma-separated) only."""
    if columns:
        want = [c.strip() for c in columns.split(",")]
        missing = [c for c in want if c not in df.columns]
        if missing:
            raise ReportError(f"{file} has no columns {missing} (it has {list(df.columns)})")
        df = df[want]
    return f"`{file}`:\n\n" + frame_table(df, int(digits))


@block("goals", "{notebook}_goals.csv")
def goals(run: RunFiles, notebook: str) -> str:
    """A notebook's goals table (``NN_goals.csv``: goal, value, target, met), whatever rows it holds."""
    file = f"{notebook}_goals.csv"
    df = run.csv(file)
    need = ["goal", "value", "target", "met"]
    missing = [c for c in need if c not in df.columns]
    if missing:
        raise ReportError(f"{file} has no columns {missing} (it has {list(df.columns)})")
    met = df["met"].astype(str).str.lower().isin(["true", "1"])
    subject = f" (subject: {', '.join(map(str, dict.fromkeys(df['subject'])))})" if "subject" in df.columns else ""
    rows = [[r.goal, r.value, r.target, "met" if m else "**not met**"] for r, m in zip(df.itertuples(), met)]
    return (f"Goals of notebook {notebook}{subject}, `{file}`: {int(met.sum())} of {len(df)} met.\n\n"
            + md_table(["goal", "value", "target", "verdict"], rows))


# --- advise ---------------------------------------------------------------------------------------
def _advice_text(result: dict) -> str:
    """``moespec advise``'s table without the trailing inputs and citations (paths and sources)."""
    text = advice.format_text(result)
    return text.split("\nInputs:")[0].rstrip()


@block("advise-example", "05_round_model.json", "05_real_draft_acceptance.csv")
def advise_example(run: RunFiles, a: str = "measured") -> str:
    """``moespec advise figures -a A`` as printed; ``a=measured``: at the run's own measured
    acceptance on the quiet machine (``05_real_draft_acceptance.csv``, three decimals)."""
    if a == "measured":
        acc = advice.measured.measured_acceptance(run.tables)
        a = f"{float(acc.loc[acc['state'] == 'quiet', 'a'].iloc[0]):.3f}"
    result = advice.advise(run.tables, [float(a)])
    return f"```\n$ moespec advise figures -a {a}\n{_advice_text(result)}\n```"


def draft_fit(run: RunFiles) -> tuple[float, float]:
    """Notebook 07's fit of the draft time, T_D = a K + b ms (``07_paper2_comparison.csv``)."""
    df = run.csv("07_paper2_comparison.csv")
    row = df[df["quantity"] == "draft_time_ms"]
    if row.empty:
        raise ReportError("07_paper2_comparison.csv has no draft_time_ms row")
    text = str(row.iloc[0]["ours (this machine)"]).replace(" ", "")
    slope, rest = text.split("*K+")
    return float(slope), float(rest)


def _answer(rec: dict) -> str:
    if rec["k"] == 0:
        return "plain decoding (k = 0)"
    return (f"draft k = {rec['k']} with the {rec['engine_name']}, speedup {num(rec['speedup'])} "
            f"[{num(rec['speedup_lo'])}, {num(rec['speedup_hi'])}]")


@block("advise-followups", "05_round_model.json", "05_real_draft_acceptance.csv")
def advise_followups(run: RunFiles, engine: str = "llama.cpp CUDA", model: str = "OLMoE", a: str = "0.7") -> str:
    """advise at the run's own measured acceptance in every machine state it measured, and on paper
    1's published row (with a free draft, asked for by name: the table has no draft of its own)."""
    acc = advice.measured.measured_acceptance(run.tables)
    parts = []
    for r in acc.itertuples():
        res = advice.advise(run.tables, [float(r.a)], state=r.state)
        parts.append(f"in the {r.state} machine state at its measured acceptance a = {num(r.a)} "
                     f"(`05_real_draft_acceptance.csv`): {_answer(res['acceptance'][0]['recommended'])}")
    table1 = RunFiles.repo_path("data/paper_reference/paper1_table1_bandwidth.csv")
    paper = advice.advise(bandwidth=table1, acceptance=[float(a)], engine=engine, model=model, free_draft=True)
    rec, dd = paper["acceptance"][0]["recommended"], paper["dedup"]
    kernel = "per-slot" if rec["engine"] == "slot" else "deduplicating" if rec["engine"] == "dedup" else rec["engine_name"]
    return ("`moespec advise figures --acceptance-table figures/05_real_draft_acceptance.csv` answers "
            + "; ".join(parts) + f". `moespec advise --bandwidth data/paper_reference/paper1_table1_bandwidth.csv "
            f"--engine \"{engine}\" --model {model} --free-draft -a {a}` decides on paper 1's published row, labelled "
            f"\"paper 1, published (their hardware)\" with their ε = {paper['error']['eps']:g} and a free draft: "
            f"deduplication from n = {dd['from_n']} (earliest {dd['earliest_n']}, guaranteed from "
            f"{dd['guaranteed_from_n']}), k = {rec['k']} with the {kernel} kernel, speedup {num(rec['speedup'])} "
            f"[{num(rec['speedup_lo'])}, {num(rec['speedup_hi'])}].")


@block("advise-vs-measured", "08_advise_vs_measured.csv", "08_goals.csv")
def advise_vs_measured(run: RunFiles) -> str:
    """Notebook 08: advise's speedup at the run's measured acceptance, per k and state, beside the
    real-draft runs' measured speedup, and its goals."""
    t = run.csv("08_advise_vs_measured.csv")
    rows = [[r.state, num(r.a), int(r.k), f"{num(r.advise_speedup)} [{num(r.advise_lo)}, {num(r.advise_hi)}]",
             num(r.measured_speedup), f"{100 * r.rel_error:+.1f} %", "yes" if str(r.inside).lower() == "true" else "no"]
            for r in t.itertuples()]
    return ("`08_advise_vs_measured.csv` (advise at the measured acceptance, deduplicating kernel from n = 2, beside "
            "the real-draft runs of the draft as trained):\n\n"
            + md_table(["state", "a", "k", "advise: speedup [band]", "measured (median over prompts)", "error",
                        "band holds it"], rows) + "\n\n" + goals(run, "08"))


# --- the round model (notebook 05) ---------------------------------------------------------------
@block("round-model", "05_round_terms.csv", "05_plain_step.csv")
def round_model(run: RunFiles) -> str:
    """Notebook 05's round models: per state, context and draft, V(0), V(1) and V(kmax) with their
    intervals, the draft's fit, and the plain step predicted against the measured one."""
    t = run.csv("05_round_terms.csv")
    rows = []
    for (state, ctx, draft), g in t.groupby(["state", "context", "draft"], sort=False):
        g = g.sort_values("k")
        first, one, last = g.iloc[0], g.iloc[1], g.iloc[-1]
        fit_ = (f"{num(first.draft_a_ms)} k + {num(first.draft_b_ms)}" if not pd.isna(first.draft_a_ms)
                else f"measured ({num(one.t_draft_ms)} at k = 1)")
        rows.append([state, ctx, draft, f"{num(first.V_ms)} [{num(first.V_lo_ms)}, {num(first.V_hi_ms)}]",
                     f"{num(one.V_ms)} [{num(one.V_lo_ms)}, {num(one.V_hi_ms)}]",
                     f"{num(last.V_ms)} (k = {int(last.k)})", fit_, num(one.host_ms), num(first.read_GBps, 1)])
    plain = run.csv("05_plain_step.csv")
    prow = [[r.state, r.runs, f"{num(r.V0_hat_ms)} [{num(r.V0_lo_ms)}, {num(r.V0_hi_ms)}]", num(r.V0_meas_ms),
             f"{100 * r.rel_error:+.1f} %"] for r in plain.itertuples()]
    return ("Round models (`05_round_terms.csv`; ms, 95 % intervals; draft time a k + b ms per round):\n\n"
            + md_table(["state", "context", "draft", "V(0)", "V(1)", "V(kmax)", "t_draft(k)", "h(1)", "read GB/s"], rows)
            + "\n\nThe plain step V(0) predicted against the measured one (`05_plain_step.csv`):\n\n"
            + md_table(["state", "measured in", "V(0) predicted", "measured", "error"], prow))


@block("verify-protocols", "05_verify_protocols.csv")
def verify_protocols(run: RunFiles) -> str:
    """The shuffled grid's verify times against the decode loops' (notebook 05), per depth."""
    t = run.csv("05_verify_protocols.csv")
    parts = []
    for d, g in t.groupby("d"):
        one = g[(g.n == 1) & (g.kernel == "slot")].iloc[0]
        two = g[(g.n == 2) & (g.kernel == "dedup")].iloc[0]
        parts.append(f"d = {int(d)}: tau(1) {num(one.tau_grid_ms, 2)} ms in the grid, {num(one.tau_loop_ms, 2)} ms in "
                     f"the loop ({pct(one.grid_over_loop - 1)}); tau_dedup(2) {num(two.tau_grid_ms, 2)} against "
                     f"{num(two.tau_loop_ms, 2)} ms; tau_dedup(2)/tau(1) {num(two.tau_grid_ms / one.tau_grid_ms)} in "
                     f"the grid, {num(two.tau_loop_ms / one.tau_loop_ms)} in the loop; grid minus loop over n = 1..9 "
                     f"{span(g['grid_minus_loop_ms'], 2)} ms")
    return "`05_verify_protocols.csv`: " + "; ".join(parts) + "."


@block("grid-vs-loop")
def grid_vs_loop(run: RunFiles, stamp: str, folder: str = "benchmarks/results/engine") -> str:
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


def _noise_clause(rr: pd.DataFrame) -> str:
    """The real-draft measurement against itself (:func:`moespec.predict.speculative.measurement_noise`),
    where the run kept each repetition's speedups, and the prediction against its calibration
    (:mod:`moespec.predict.noise`) where the run reported it."""
    reps = speculative.rep_columns(rr)
    if len(reps) < 2:
        return ""
    clause = "; " + speculative.noise_phrase(speculative.measurement_noise(rr[reps]))
    if "noise_p_outside" in rr:          # runs since the prediction's own noise is reported (moespec.predict.noise)
        clause += "; the prediction against its calibration: " + noise.prediction_noise_phrase(noise.noise_summary(rr))
    return clause


def _routing_clause(rr: pd.DataFrame) -> str:
    """The routing term's part of a state's real-draft predictions (routed runs only)."""
    if "rel_error_unrouted" not in rr:
        return ""
    last = rr[rr.k == rr.k.max()].iloc[0]
    return (f"; the scored prediction puts each prompt's verify pass at its own routing (one distinct (expert, layer) "
            f"pair {num(last.ms_per_distinct_expert)} ms; at k = {int(last.k)} the test prompts' median pass reads "
            f"{num(last.distinct_test, 1)} pairs, the calibration's mean pass {num(last.distinct_calibration, 1)}); at "
            f"the calibration's mean routing instead: within 5 % at {int((rr.rel_error_unrouted.abs() <= 0.05).sum())}, "
            f"largest {pct(rr.rel_error_unrouted.abs().max())}")


def _as_measured_clause(rr: pd.DataFrame) -> str:
    """Against the runs as measured (a run with the machine adjustment of 2026-12-06 d), and with
    the verify terms at the runs' read (of the runs the predictions were scored on)."""
    out = ""
    if "rel_error_as_measured" in rr:
        e = rr.rel_error_as_measured.abs()
        out += (f"; against the runs as measured (no machine adjustment): within 5 % at {int((e <= 0.05).sum())}, "
                f"largest {pct(e.max())}")
    col = next((c for c in ("rel_error_at_runs_read_as_measured", "rel_error_at_runs_read") if c in rr), None)
    if col is not None and rr[col].notna().all():
        out += (f"; with the verify terms at the runs' read ({num(rr.read_GBps_runs.iloc[0], 2)} GB/s, calibration "
                f"{num(rr.read_GBps_model.iloc[0], 2)}{', runs as measured' if col.endswith('_as_measured') else ''}): "
                f"within 5 % at {int((rr[col].abs() <= 0.05).sum())}, largest {pct(rr[col].abs().max())}")
    return out


@block("round-predictions", "05_oracle_predictions.csv", "05_draft_cost_predictions.csv")
def round_predictions(run: RunFiles) -> str:
    """The round model's predictions of the speculative runs against their measurements, per state."""
    o = run.csv("05_oracle_predictions.csv")
    r = run.csv("05_draft_cost_predictions.csv")
    parts = []
    for state in dict.fromkeys(list(o["state"]) + list(r["state"])):
        oo, rr = o[(o.state == state) & (o.k >= 1)], r[r.state == state]
        parts.append(f"{state} machine: oracle draft within 5 % at {int((oo.speedup_rel_error.abs() <= 0.05).sum())} of "
                     f"{len(oo)} (d, k, a) cells (largest |error| {pct(oo.speedup_rel_error.abs().max())}, measured inside "
                     f"the predicted interval at {int(oo.speedup_inside.astype(str).str.lower().eq('true').sum())}); "
                     f"real draft within 5 % at {int((rr.rel_error.abs() <= 0.05).sum())} of {len(rr)} (draft cost, k) "
                     f"points (largest |error| {pct(rr.rel_error.abs().max())}; with the geometric G_a(k) instead of "
                     f"the measured tokens per step {pct(rr.rel_error_geometric.abs().max())}"
                     + (f"; with the runs' pooled tokens per step instead of the median prompt's: within 5 % at "
                        f"{int((rr.rel_error_pooled.abs() <= 0.05).sum())}, largest {pct(rr.rel_error_pooled.abs().max())}"
                        if "rel_error_pooled" in rr else "; E(k) = the runs' pooled tokens per step")
                     + (f"; with the runs' own step times: within 5 % at "
                        f"{int((rr.rel_error_measured_steps.abs() <= 0.05).sum())}, largest "
                        f"{pct(rr.rel_error_measured_steps.abs().max())}" if "rel_error_measured_steps" in rr else "")
                     + _as_measured_clause(rr) + _routing_clause(rr) + _noise_clause(rr) + f"); best measured median "
                     f"speedup {num(rr.measured.max())} (draft cost {rr.loc[rr.measured.idxmax(), 'draft_cost']:g}, k = "
                     f"{int(rr.loc[rr.measured.idxmax(), 'k'])})")
    return "; ".join(parts) + " (`05_oracle_predictions.csv`, `05_draft_cost_predictions.csv`)."


# --- routing and models (notebooks 00, 01) ---------------------------------------------------
@block("reuse-sources", "00_reuse_sources.csv")
def reuse_sources(run: RunFiles) -> str:
    """rho_hat(2) and rho_hat(9) with their 95 % intervals per routing source, beside independent
    uniform routing (rho(n) = 1 - (1 - m/N)^(n-1)) and paper 1's published values."""
    df = run.csv("00_reuse_sources.csv")
    rows = []
    mine = df[~df["source"].str.startswith("paper 1, published")]
    for r in mine.itertuples():
        rows.append([r.source, f"{num(r.rho_hat_2)} [{num(r.rho_hat_2_low)}, {num(r.rho_hat_2_high)}]",
                     f"{num(r.rho_hat_9)} [{num(r.rho_hat_9_low)}, {num(r.rho_hat_9_high)}]"])
    shares = sorted({(int(r.N), int(r.m)) for r in mine.itertuples() if not pd.isna(r.N)})
    for N, m in shares:
        q = m / N
        rows.append([f"independent uniform routing, m/N = {Fraction(m, N)}", num(q), num(1 - (1 - q) ** 8)])
    paper = df[df["source"].str.startswith("paper 1, published")]
    if len(paper):
        names = " / ".join(s.split(": ", 1)[-1] for s in paper["source"])
        rows.append([f"paper 1, published (their traces): {names}", " / ".join(num(v) for v in paper["rho_hat_2"]),
                     " / ".join(num(v) for v in paper["rho_hat_9"])])
    docs = "; ".join(f"{r.model}: {int(r.docs):,} documents, {int(r.tokens):,} tokens" for r in mine.itertuples())
    return (md_table(["routing source", "rho_hat(2) [95 %]", "rho_hat(9) [95 %]"], rows)
            + f"\n\n(`00_reuse_sources.csv`; {docs}.)")


# --- benchmark files (benchmarks/results/) ----------------------------------------------------
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
        return (f"`make reproduce` on a fresh clone of {short_commit(rec['commit'])} exited with {rec['rc']} after "
                f"{total:.1f} min (`{file}`).")
    before = rec.get("before_notebooks_s")
    nbs = ", ".join(f"{nb['name'][:2]} {nb['wall_s'] / 60:.1f}" for nb in rec["notebooks"] if nb.get("wall_s"))
    verdict = "met" if total <= float(limit_min) else "**not met**"
    return (f"`make reproduce` on a fresh clone of commit {short_commit(rec['commit'])}, started "
            f"{when(rec['started_utc'][:19])}, took **{total:.1f} min** end to end on {machine(rec['provenance'])} "
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
    return (f"`make test` on a fresh clone of commit {short_commit(rec['commit'])}, started "
            f"{when(rec['started_utc'][:19])}, exited with {rec['rc']} after **{total:.1f} min** end to end on "
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
                     f"{pct(p['largest_abs_error'])}, mean {100 * p['mean_error']:+.1f} %, measured inside the predicted "
                     f"interval at {p['inside_interval']}); with the runs' own step times within 5 % at "
                     f"{p['within_5pct_measured_steps']}; V(0) predicted {num(p['V0_hat_ms'], 2)} ms, measured "
                     f"{num(p['V0_meas_ms'], 2)} ms; reads {num(p['read_GBps_model'], 2)} GB/s (calibration), "
                     f"{num(p['read_GBps_runs'], 2)} GB/s (test){se}; {p['wall_s'] / 60:.1f} min")
    return (f"Real draft, {rec['state']} machine, {rec['profile']} profile's sizes ({rec['calibration_prompts']} "
            f"calibration turns, {rec['test_prompts']} test turns x {rec['test_reps']}, draft costs "
            f"{', '.join(f'{r:g}' for r in rec['draft_costs'])}, k = {min(rec['ks'])}..{max(rec['ks'])}), both protocols "
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
    return (f"`{file}` ({rec['date_utc']} UTC, {machine(rec['provenance'])}, commit "
            f"{short_commit(rec['provenance']['git_commit'])}): " + "; ".join(parts) + ".")


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


@block("bellman-speed")
def bellman_speed(run: RunFiles, file: str) -> str:
    rec = _bench_record(run, file)
    return (f"Bellman solve of N = {rec['n']:,} positions x Lmax = {rec['lmax']} in {rec['median_s']:.3f} s "
            f"(median of {rec['reps']}, IQR {rec['q25_s']:.3f}–{rec['q75_s']:.3f} s; `{file}`, {rec['date_utc']} UTC, "
            f"{machine(rec['provenance'])}).")


# --- CPU kernel benchmarks (benchmarks/bench_kernels.py rows) -----------------------------------
def kernel_blocks(run: RunFiles, runs: str, folder: str = "benchmarks/results/kernels") -> pd.DataFrame:
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
    return _named_table(run.repo_csv(file), file, columns, digits)


@block("kernel-breadth")
def kernel_breadth(run: RunFiles, stamp: str, folder: str = "benchmarks/results/kernels") -> str:
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
def kernel_shares(run: RunFiles, runs: str, model: str = "olmoe", regime: str = "low") -> str:
    """The CPU kernels' shares of the read bandwidth, r(n) and the in-run peers, over the steady
    blocks of the given regime of bench_kernels.py runs, with the issue's targets."""
    df = kernel_blocks(run, runs)
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
            f"{reads} GB/s): {used} (`benchmarks/results/kernels/<run>.csv`).")


@block("kernel-regimes")
def kernel_regimes(run: RunFiles, runs: str, model: str = "olmoe") -> str:
    """The same kernels' dedup shares in the other (high-bandwidth) regime of the same runs."""
    df = kernel_blocks(run, runs)
    hi = df[(df["model"] == model) & (df["regime"] == "high") & (df["backend"] == "cpp") & (df["kernel"] == "dedup")]
    if hi.empty:
        return "None of these runs' blocks fell in a faster bandwidth regime."
    parts = [f"{FMT_NAMES[f]} {span(g['beta_over_read'], 2)}" for f, g in hi.groupby("fmt", sort=False)]
    return (f"In the machine's fast regime (reads of {span(hi['read_GBps'], 0)} GB/s, blocks of the same runs) the "
            f"dedup kernel reaches a lower share of the read: {', '.join(parts)}.")


# --- notebooks 02/03: the expert-operation benchmark and the fits ------------------------------
def _paper_table1(run: RunFiles) -> pd.DataFrame:
    return run.repo_csv("data/paper_reference/paper1_table1_bandwidth.csv")


def _paper_scalar(run: RunFiles, quantity: str) -> pd.DataFrame:
    df = run.repo_csv("data/paper_reference/paper1_scalars.csv")
    return df[df["quantity"] == quantity]


def _reread_span(values) -> str:
    """Re-read costs, some written as ranges ("0.18-0.22": paper 1's published values, and ours when
    the layers' fits differ): the span of every bound."""
    nums = []
    for v in values.dropna().astype(str):
        nums += [float(x) for x in v.split("-") if x]
    return span(nums, 2)


@block("expert-op-fits", "02_table1_bandwidth.csv", "02_bandwidth_by_n.csv", "03_epsilon.csv", "03_fig7_transfer.csv")
def expert_op_fits(run: RunFiles) -> str:
    """Notebooks 02/03 against paper 1: r(n) and ubar(n) at n = 2 and 8, the re-read cost, epsilon,
    and the transfer test of Figure 7, with the paper's published ranges where it has them."""
    t1 = run.csv("02_table1_bandwidth.csv")
    ours = t1[~t1["source"].str.startswith("paper 1")].iloc[0]
    paper = _paper_table1(run)
    eps = run.csv("03_epsilon.csv").iloc[0]
    peps = _paper_scalar(run, "epsilon")
    tr = run.csv("03_fig7_transfer.csv")
    med = tr.assign(err=tr["r_rel_err"].abs()).groupby("model")["err"].median().sort_values()
    transfer = ", ".join(f"{100 * v:.1f} % ({m})" for m, v in med.items())
    by_engine = paper.groupby("engine", sort=False)["reread_cost"]
    rows = [
        ["r(2), ubar(2)", f"{num(ours.n2_r)}, {num(ours.n2_ubar)}",
         f"r {span(paper.n2_r, 2)}, ubar {span(paper.n2_ubar, 2)}"],
        ["r(8), ubar(8)", f"{num(ours.n8_r)}, {num(ours.n8_ubar)}",
         f"r {span(paper.n8_r, 2)}, ubar {span(paper.n8_ubar, 2)}"],
        ["re-read cost c_re/c_u", _reread_span(pd.Series([ours.reread_cost])),
         ", ".join(f"{_reread_span(v)} {e}" for e, v in by_engine if v.notna().any())],
        ["epsilon (slot, dedup, engine)", f"{num(eps.eps_slot)}, {num(eps.eps_dedup)}, {num(eps.eps_engine)}",
         "engine " + ", ".join(f"{float(r.value):g} {r.model_or_engine}" for r in peps.itertuples())],
        ["transfer (Fig. 7), median error of r per held-out model", transfer, ""],
    ]
    bw = run.csv("02_bandwidth_by_n.csv")
    nb = run.notebook("02_expert_op_benchmark")["parameters"]
    return (md_table(["", "here", "paper 1 (their hardware)"], rows)
            + f"\n\n({ours.source}; {ours.engine}, model shape {ours.model}, read bandwidth of the run "
            f"{span(bw['read_GBps'], 1)} GB/s; notebook 02 ran with backend {nb.get('backend')}, format "
            f"{nb.get('fmt')}. Files: `02_table1_bandwidth.csv`, "
            f"`02_bandwidth_by_n.csv`, `03_epsilon.csv`, `03_fig7_transfer.csv`; the paper's: "
            f"`data/paper_reference/paper1_table1_bandwidth.csv`, `paper1_scalars.csv`.)")


@block("discard-rule", "02_discard_groups.csv", "02_discard_rule.csv", "03_discard_rule.csv",
       "03_bandwidth_all_models.csv")
def discard_rule(run: RunFiles) -> str:
    """Notebooks 02/03: the discard rule's share, the groups' read departures from their run's
    median, the read bandwidth between the benchmark runs of notebook 03, and the groups and rows
    kept and discarded per table."""
    groups = run.csv("02_discard_groups.csv")
    counts = pd.concat([run.csv("02_discard_rule.csv"), run.csv("03_discard_rule.csv")], ignore_index=True)
    reads = run.csv("03_bandwidth_all_models.csv").groupby("model", sort=False)["read_GBps"].first()
    share = float(counts["share"].iloc[0])
    table = md_table(["table", "groups kept", "groups discarded", "timed rows kept", "timed rows discarded"],
                     [[r.table, r.groups_kept, r.groups_discarded, r.rows_kept, r.rows_discarded]
                      for r in counts.itertuples()])
    return (f"Share {pct(share, 0)}. Notebook 02's {len(groups)} group(s) read {span(groups['read_GBps'], 2)} GB/s, "
            f"departing from their run's median by at most {pct(groups['departure'].abs().max(), 2)} "
            f"(`02_discard_groups.csv`); the runs of notebook 03, minutes apart, read {span(reads, 2)} GB/s "
            f"(medians per run, `03_bandwidth_all_models.csv`).\n\n" + table
            + "\n\n(`02_discard_rule.csv`, `03_discard_rule.csv`.)")


@block("fit-variants", "03_fit_variants.csv", "03_epsilon_variants.csv")
def fit_variants(run: RunFiles) -> str:
    """Notebook 03: the non-negative and the unconstrained fits (4)/(E.1), on the kept rows and on
    every row: the fixed times t_op, how many bounds bind, and epsilon."""
    fits, eps = run.csv("03_fit_variants.csv"), run.csv("03_epsilon_variants.csv")
    rows = []
    for (subset, how), g in fits.groupby(["rows", "fit"], sort=False):
        e = eps[(eps["rows"] == subset) & (eps["fit"] == how)].iloc[0]
        coefs = g[["t_op", "c_u", "c_re", "c_g", "c_t"]]
        rows.append([how, subset, span(1e3 * g["t_op"], 3), int((coefs == 0).sum().sum()),
                     int((coefs < 0).sum().sum()), f"{num(e.eps_slot, 4)}, {num(e.eps_dedup, 4)}, {num(e.eps_engine, 4)}"])
    return (md_table(["fit", "rows", "t_op (ms)", "coefficients at the bound 0", "negative coefficients",
                      "epsilon (slot, dedup, engine)"], rows)
            + "\n\n(`03_fit_variants.csv`, `03_epsilon_variants.csv`; the default consumers read the non-negative "
            "fit on the kept rows.)")


# --- notebooks 05/06: the whole model and the prediction chain -----------------------------------
def _count_span(pairs) -> str:
    """"a–b of c" over (value, total) pairs (totals equal), e.g. "2–5 of 8"."""
    vals, tots = [p[0] for p in pairs], {p[1] for p in pairs}
    lo, hi = min(vals), max(vals)
    body = str(lo) if lo == hi else f"{lo}–{hi}"
    return f"{body} of {'/'.join(str(t) for t in sorted(tots))}"


def band_hits(curves: pd.DataFrame, version: str, d) -> tuple[int, int]:
    """(points n >= 2 where the measured saving lies inside the version's band of bound (18), points)."""
    meas = curves[(curves.version == "measured") & (curves.d == d)].set_index("n")
    pred = curves[(curves.version == version) & (curves.d == d)].set_index("n")
    ns = [n for n in pred.index if n >= 2 and n in meas.index and not pd.isna(pred.loc[n, "band_ms"])]
    inside = sum(abs(meas.loc[n, "S_ms"] - pred.loc[n, "S_ms"]) <= pred.loc[n, "band_ms"] for n in ns)
    return int(inside), len(ns)


#: Issue 16's targets for the byte-faithful subject's decode step (docs/engine.md).
BREAKDOWN_TARGETS = {"expert_share": (">=", 0.6), "draft_ratio": ("<=", 0.1), "peak_memory_GiB": ("<=", 16.0)}


@block("breakdown-goals", "05_breakdown.csv")
def breakdown_goals(run: RunFiles) -> str:
    """Notebook 05's decode-step breakdown against issue 16's targets: the expert operation's share
    of an n = 1 step, one drafted token over a step, the run's peak memory."""
    df = run.csv("05_breakdown.csv")

    def verdict(value: float, op: str, target: float) -> str:
        return "met" if (value >= target if op == ">=" else value <= target) else "**not met**"

    subjects = [f"{r.subject}: " + "; ".join(
        f"{col.replace('_', ' ')} {float(getattr(r, col)):.3g} ({op} {target:g}: {verdict(float(getattr(r, col)), op, target)})"
        for col, (op, target) in BREAKDOWN_TARGETS.items()) for r in df.itertuples()]
    return ("Issue 16's targets (`05_breakdown.csv`, one interleaved run at n = 1, read "
            + ", ".join(f"{float(v):.1f}" for v in df["read_GBps"]) + " GB/s): " + "; ".join(subjects) + ".")


@block("whole-model", "05_agreement.csv", "05_oracle_cells.csv", "05_real_draft.csv",
       "06_curves.csv", "06_table4_preregistered.csv", "06_table8_rules.csv")
def whole_model(run: RunFiles) -> str:
    """Notebooks 05/06: agreement of the two kernels, verify times and savings (the round model's,
    timed in decode loops: ``06_curves.csv``'s measured rows), the oracle draft, the prediction
    chain's errors and the pre-registered rules (quiet machine), the real draft."""
    ag = run.csv("05_agreement.csv")
    cells = run.csv("05_oracle_cells.csv")
    real = run.csv("05_real_draft.csv")
    curves = run.csv("06_curves.csv")
    t4 = _ours(run.csv("06_table4_preregistered.csv"))
    t8 = _ours(run.csv("06_table8_rules.csv"))
    if "rows" in t8.columns:
        t8 = t8[t8["rows"].astype(str).str.contains("quiet")] if t8["rows"].astype(str).str.contains("quiet").any() else t8
    vs = curves[curves.version == "measured"].rename(columns={"tau_slot_ms": "tau_slot", "S_ms": "S", "S_lo_ms": "S_lo",
                                                              "S_hi_ms": "S_hi"})
    depths = sorted(int(d) for d in vs["d"].unique())
    dtext = " / ".join(str(d) for d in depths)
    tau1 = " / ".join(num(vs[(vs.d == d) & (vs.n == 1)]["tau_slot"].iloc[0], 1) for d in depths)
    s = vs[vs.n >= 2].assign(S_s=lambda f: f.S / 1e3)
    positive = bool((s["S_s"] > 0).all())
    crosses = {d: [int(n) for n in s[(s.d == d) & (s.S_lo < 0) & (s.S_hi > 0)]["n"]] for d in depths}
    cross_text = "; ".join(f"d = {d}: n = {', '.join(map(str, v))}" if v else f"d = {d}: none" for d, v in crosses.items())
    meas_cross = " / ".join(str(int(x)) if not pd.isna(x) else "none"
                            for x in t4.drop_duplicates("d").sort_values("d")["crossover_meas"])
    judged = cells[(cells.k > 0) & cells["realized_a"].notna()]
    realized = float((judged["realized_a"] - judged["a"]).abs().max())
    tps = float(judged["tps_over_G"].median())
    versions = list(dict.fromkeys(t4["version"]))
    vcol = "kstar_values" if "kstar_values" in t4.columns else None
    kvals = (lambda r: int(r[vcol])) if vcol else (lambda r: 11 if "kstar_within1_of11" in t4.columns else "?")
    kcol = "kstar_within1" if "kstar_within1" in t4.columns else "kstar_within1_of11"
    tau = "; ".join(f"{span(t4[t4.version == v]['tau_err_pct'], 1)} % ({v})" for v in versions)
    kstar = _count_span([(int(r[kcol]), kvals(r)) for _, r in t4.iterrows()])
    bands = _count_span([band_hits(curves, v, d) for v in versions if v in set(curves.version) for d in depths])
    cross_ok = all(abs(r.crossover_pred - r.crossover_meas) <= 1 for r in t4.itertuples()
                   if not pd.isna(r.crossover_pred) and not pd.isna(r.crossover_meas))
    b21 = bool(t4["speedup_inside_21"].astype(str).str.lower().eq("true").all())
    eps = _ours(run.csv("06_table7_error.csv"))["engine_eps"].iloc[0] if run.has("06_table7_error.csv") else None
    rules = []
    for rule, g in t8.groupby("rule", sort=False):
        held = [v for v, h in zip(g["version"], g["holds_all"]) if str(h).lower() == "true"]
        who = "every version" if len(held) == len(g) else ("no version" if not held else ", ".join(held) + " only")
        rules.append(f"\"{rule}\": {who}")
    all_six = [v for v, g in t8.groupby("version", sort=False) if g["holds_all"].astype(str).str.lower().eq("true").all()]
    commit = short_commit(t8["rules_commit"].iloc[0]) if "rules_commit" in t8 else "?"
    k_last = int(real["k"].max())
    rd = real.set_index("k")["speedup_median"]
    return (f"Depths d = {dtext}. Dedup off and on give the same greedy tokens "
            f"({int(ag.greedy_equal.sum())}/{int(ag.tokens.sum())}) and verify argmax "
            f"({int(ag.verify_argmax_equal.sum())}/{int(ag.verify_rows.sum())}). In decode loops (the round "
            f"model) tau(1) = {tau1} ms (d = {dtext}). The measured saving S(n) is {'positive at every' if positive else 'not positive at every'} "
            f"n = 2..{int(s.n.max())} ({span(1e3 * s['S_s'], 3)} ms); its 95 % interval crosses zero at {cross_text}; "
            f"the measured crossover is {meas_cross}. The oracle draft realizes acceptance within {realized:.3f} of a "
            f"in every cell; tokens per step {tps:.3f} x G_a(k) (median). Prediction chain (22)"
            + (f", engine epsilon {num(eps)}" if eps is not None else "")
            + f": crossover predicted {'within one at every depth' if cross_ok else 'off by more than one somewhere'}; "
            f"saving inside the band of bound (18) at {bands} points; verify time within {tau}; k̂* within one of "
            f"the measured k* at {kstar} acceptance values; the best speedup inside bound (21) "
            f"{'at every depth and version' if b21 else 'not everywhere'}. Pre-registered rules (committed in `{commit}`): "
            + "; ".join(rules) + f". Versions meeting all six: {', '.join(all_six) if all_six else 'none'}. "
            f"Real draft: median speedup {num(rd.get(1))} at k = 1 and {num(rd.get(k_last))} at k = {k_last} "
            f"(`05_real_draft.csv`).")


# --- notebook 07: paper 2's oracle --------------------------------------------------------------
def _paper2(run: RunFiles, quantity: str) -> tuple[str, str]:
    df = run.csv("07_paper2_comparison.csv")
    row = df[df["quantity"] == quantity]
    if row.empty:
        raise ReportError(f"07_paper2_comparison.csv has no row {quantity!r}")
    return str(row.iloc[0].iloc[1]), str(row.iloc[0].iloc[2])


def _paper2_published(run: RunFiles, quantity: str) -> str:
    """One of paper 2's published scalars as the paper states it (``data/paper_reference/paper2_scalars.csv``)."""
    df = run.repo_csv("data/paper_reference/paper2_scalars.csv")
    row = df[df["quantity"] == quantity]
    if row.empty:
        raise ReportError(f"data/paper_reference/paper2_scalars.csv has no row {quantity!r}")
    return str(row.iloc[0]["value"])


def _under(table: pd.DataFrame, transitions: str, file: str) -> pd.DataFrame:
    """The rows of one transition model (column ``transitions``); a run from before the greedy-exact
    model has surrogate rows only, without the column."""
    if "transitions" in table.columns:
        rows = table[table["transitions"] == transitions]
        if rows.empty:
            raise ReportError(f"{file} has no rows with transitions = {transitions!r}")
        return rows
    if transitions != "surrogate":
        raise ReportError(f"{file} has no column 'transitions' (the run predates the greedy-exact transitions)")
    return table


@block("oracle", "07_rounds_summary.csv", "07_tableA6_models.csv", "07_paper2_comparison.csv", "07_fig2_lmax_sweep.csv",
       "07_cf_fig2_lmax_sweep.csv", "07_cf_online_policy.csv", "07_cf_kernel_cost_models.csv",
       "07_cf_kernel_policy_differences.csv")
def oracle(run: RunFiles) -> str:
    """Notebook 07: the rounds, eq. (4)'s fit per K beside paper 2's per-K values and pooled beside
    its full-pool values, the oracle's Lmax sweep (paper 2's surrogate transitions) as measured and
    under the labelled draft-cost counterfactual, the online policy and paper 1's per-kernel cost."""
    rs = run.csv("07_rounds_summary.csv")
    a6 = run.csv("07_tableA6_models.csv")
    cat = a6[a6["model"].str.startswith("categorical")].iloc[0]
    r2_per_k, mape_per_k = _paper2(run, "in_sample_R2_per_K")[0], _paper2(run, "oos_MAPE_per_K_pct")[0]
    paper = {q: _paper2_published(run, q) for q in ("in_sample_R2_per_K", "oos_MAPE_per_K_pct", "pooled_eq4_R2",
                                                    "pooled_eq4_cv_MAPE_pct", "oracle_speedup_plateau")}
    slope, _ = draft_fit(run)
    t_target = float(rs[rs.K == rs.K.min()]["T_T_median_ms"].iloc[0])
    sweep = _under(run.csv("07_fig2_lmax_sweep.csv"), "surrogate", "07_fig2_lmax_sweep.csv")
    cf = _under(run.csv("07_cf_fig2_lmax_sweep.csv"), "surrogate", "07_cf_fig2_lmax_sweep.csv")
    online = _under(run.csv("07_cf_online_policy.csv"), "surrogate", "07_cf_online_policy.csv").set_index("policy")
    models = _under(run.csv("07_cf_kernel_cost_models.csv"), "surrogate",
                    "07_cf_kernel_cost_models.csv").set_index("cost_model")
    diffs = _under(run.csv("07_cf_kernel_policy_differences.csv"), "surrogate", "07_cf_kernel_policy_differences.csv")
    one_alpha = [r for r in diffs.itertuples() if r.a.startswith("one alpha")]
    kernels = [r for r in diffs.itertuples() if not r.a.startswith("one alpha")]
    scale = run.notebook("07_ssp_oracle")["parameters"].get("draft_scale")
    online_share = float(online.loc["online early exit", "share_of_oracle"]) if "online early exit" in online.index else None
    return (f"{int(rs.rounds.sum()):,} measured rounds, K = {int(rs.K.min())}..{int(rs.K.max())} "
            f"({int(rs.generations.max())} generations per K). The verification-cost regression (eq. (4)) fitted per K "
            f"(Table A4) has in-sample R² {r2_per_k} and GroupKFold MAPE {mape_per_k} % (paper 2, per K: R² "
            f"{paper['in_sample_R2_per_K']}, MAPE {paper['oos_MAPE_per_K_pct']} %, Section 3.5); in its {cat.model} "
            f"form pooled over the speculative rounds, R² {num(cat.r2_in)} and MAPE {num(cat.cv_mape_pct, 1)} % (paper 2 "
            f"on its full pool: R² {paper['pooled_eq4_R2']}, MAPE {paper['pooled_eq4_cv_MAPE_pct']} %, Appendix A.9). "
            f"A drafted token costs {slope:g} ms against a {t_target:.1f} ms target pass; with paper 2's surrogate "
            f"transitions the oracle's mean draft length is at most {cf_len(sweep)} (speedup {span(sweep['speedup'], 3)} "
            f"over Lmax = {int(sweep.lmax.min())}..{int(sweep.lmax.max())}; paper 2: {paper['oracle_speedup_plateau']}). "
            f"With the draft cost scaled by {scale} (a labelled counterfactual, not a measurement) the oracle reaches "
            f"{num(cf['speedup'].max())}"
            + (f"; the online early-exit policy reaches {100 * online_share:.0f} % of it on held-out sequences"
               if online_share is not None else "")
            + f"; paper 1's per-kernel cost in place of one alpha changes the chosen k at "
            f"{span([100 * r.share_k_differs for r in one_alpha], 0)} % of positions (speedup "
            + ", ".join(f"{num(models.loc[m, 'speedup'])} {m}" for m in models.index)
            + "; the per-kernel costs disagree with each other at "
            + ", ".join(f"{100 * r.share_k_differs:.1f} %" for r in kernels) + " of positions).")


@block("oracle-transitions", "07_measured_fixed_k.csv", "07_fig2_lmax_sweep.csv", "07_fixed_k.csv",
       "07_cost_models_overview.csv")
def oracle_transitions(run: RunFiles) -> str:
    """Notebook 07: the oracle under paper 2's surrogate and the greedy-exact transitions beside the
    measured fixed-K rounds (speedup with its bootstrap interval) and each model's own fixed k."""
    measured = run.csv("07_measured_fixed_k.csv")
    spec = measured[measured.K >= 1]
    best = spec.loc[spec.speedup.idxmax()]
    sweeps = {t: _under(run.csv("07_fig2_lmax_sweep.csv"), t, "07_fig2_lmax_sweep.csv") for t in ("surrogate", "greedy")}
    fixed = {t: _under(run.csv("07_fixed_k.csv"), t, "07_fixed_k.csv").set_index("k") for t in sweeps}
    K = int(best.K)

    def oracle_text(t: str) -> str:
        sw = sweeps[t]
        return (f"{num(sw.speedup.iloc[-1])} at Lmax = {int(sw.lmax.iloc[-1])} (from {num(sw.speedup.iloc[0])} at "
                f"Lmax = {int(sw.lmax.iloc[0])}; mean draft length {num(sw.mean_draft_length.iloc[-1], 2)}, accepted "
                f"{num(sw.mean_accepted_length.iloc[-1], 2)} per round)")

    def model_k(t: str) -> str:
        return (f"{num(fixed[t].loc[K, 'speedup'])} with {num(fixed[t].loc[K, 'mean_accepted_length'], 2)} accepted"
                if K in fixed[t].index else "n/a (K beyond the oracle's Lmax)")

    host = "+ host time " if bool(measured.host_included.iloc[0]) else ""
    # notebook 07 solves the oracle on the round model's costs when the run has notebook 05's round model
    on_round = run.csv("07_cost_models_overview.csv")["cost_model"].astype(str).str.startswith("round model").any()
    baseline = ("the oracle's costs are notebook 05's round model (its plain baseline the plain step measured there), "
                "the measured speedups' the K = 0 rounds." if on_round else
                "the oracle's speedups use the fitted cost model's plain baseline, the measured ones the measured K = 0 "
                "rounds.")
    return (f"The measured fixed-K rounds (tokens per round over T_T + T_D {host}against the K = 0 rounds' time per "
            f"token, `07_measured_fixed_k.csv`) reach at best {num(best.speedup)} [{num(best.speedup_lo)}, "
            f"{num(best.speedup_hi)}] at K = {K} ({num(best.accepted_per_round, 2)} drafts accepted per round; 95 % "
            f"bootstrap interval over generations). The oracle on its reference sequences reaches {oracle_text('surrogate')} "
            f"with paper 2's surrogate transitions (p = P_draft(reference token)) and {oracle_text('greedy')} with the "
            f"greedy-exact transitions (p = 1 exactly when the draft's argmax is the reference token: what greedy "
            f"verification of a greedy draft accepts). At K = {K} the models' own fixed-k policies predict "
            f"{model_k('surrogate')} (surrogate) and {model_k('greedy')} (greedy-exact); " + baseline)


def cf_len(sweep: pd.DataFrame) -> str:
    """The largest mean draft length of an Lmax sweep, as text."""
    return f"{float(sweep['mean_draft_length'].max()):g}"


# --- the GPU run (scripts/gpu_check.sh) -------------------------------------------------------------
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
    return (f"One lent {gpu} (`{folder}/`, torch {prov['versions'].get('torch')}, commit "
            f"{short_commit(prov.get('git_commit'))}): the torch-free harness says \"{harness}\"; the CUDA tests: "
            f"\"{tests}\". Bandwidth (CUDA events, {int(df.reps.iloc[0])} repetitions, random routing, read bandwidth "
            f"{span(df['beta_read_GBps'] / 1e3, 1)} TB/s by `torch.sum` in the same run): at n = 1 the per-slot kernel "
            f"reaches {slot1} of the read; r(n) = {rr} over the presets and n = 1..9 (OLMoE: {ol}); under uniform "
            f"routing ubar(n) < r(n) at {win_text}. At n = 1 the f32 and bf16 points stream "
            f"{span(stream['beta_slot_GBps'] / 1e3, 1)} TB/s (per-slot bytes / time; `bench_kernels_cuda.csv`; the "
            f"per-call fixed cost is fitted in `overhead_fit.md` there).")


# --- where a call's time goes, the micro-kernels, the read patterns, two builds -------------------
def _repo_csvs(run: RunFiles, files: str, folder: str = "benchmarks/results/kernels") -> pd.DataFrame:
    return pd.concat([run.repo_csv(f"{folder}/{f.strip()}").assign(file=f.strip()) for f in files.split(",")],
                     ignore_index=True)


@block("call-stages")
def call_stages(run: RunFiles, files: str) -> str:
    """bench_call_stages.py runs: the fixed work of a call and the work stage's pace, per protocol."""
    df = _repo_csvs(run, files)
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


@block("microkernel")
def microkernel(run: RunFiles, file: str) -> str:
    """bench_microkernel.py: one core's pace of the dot micro-kernels, weights in L1/L2."""
    df = run.repo_csv(f"benchmarks/results/kernels/{file}")
    Ts = sorted(df["T"].unique())
    picks = [t for t in (1, 4) if t in Ts] or Ts[:2]
    parts = [f"{span(df[df['T'] == t]['weights_GBps_per_core'], 0)} GB/s of weights at T = {t}" for t in picks]
    return (f"The micro-kernels' own pace (`bench_microkernel.py`, `{file}`, one thread, weights in "
            f"{'/'.join(df['size'].unique())}, formats {', '.join(df['fmt'].unique())}): one core keeps up with "
            + ", ".join(parts) + ".")


@block("training-speed")
def training_speed(run: RunFiles, file: str) -> str:
    """bench_training.py: tokens/s of the previous and the current training path of each embedded
    model, interleaved in one run, with the speed-up (ratio of median step times) and the
    issue's 3x goal."""
    df = run.repo_csv(f"benchmarks/results/training/{file}")
    prov = run.repo_json(f"benchmarks/results/training/{file.replace('.csv', '_provenance.json')}")
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
                     short_commit(meta["provenance"]["git_commit"]), machine(meta["provenance"])])
    return md_table(["model", "tokens trained", "minutes", "tokens/s", "path", "last training loss (nats/token)",
                     "fingerprint (nats/token)", "commit", "machine"], rows)


@block("router-recipes")
def router_recipes(run: RunFiles, file: str) -> str:
    """benchmarks/router_recipes.py: each router recipe's evaluation points (perplexity, reuse,
    load spread) as JSON lines."""
    df = pd.read_json(run.repo_path(f"benchmarks/results/training/{file}"), lines=True)
    rows = [[r.name, f"{r.tokens / 1e6:.2f} M", num(r.ppl_token, 1), num(r.rho2), num(r.rho9), num(r.cv_max, 2),
             num(r.minload, 3), num(r.maxload, 2)] for r in df.itertuples()]
    return md_table(["run", "tokens", "perplexity", "rho_hat(2)", "rho_hat(9)", "load CV", "idlest / mean",
                     "busiest / mean"], rows)


@block("read-patterns")
def read_patterns(run: RunFiles, files: str) -> str:
    """bench_read_patterns.py: each read pattern of the kernels against torch.sum, per regime."""
    df = _repo_csvs(run, files)
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
def build_compare(run: RunFiles, file: str) -> str:
    """compare_cpu_builds.py: this tree's CPU extension against a base revision's, bitwise and timed."""
    df = run.repo_csv(f"benchmarks/results/kernels/{file}")
    new = df[df.build == "new"]
    rows = []
    for (fmt, kernel), g in new.groupby(["fmt", "kernel"], sort=False):
        geo = float(np.exp(np.log(g["t_over_other"]).mean()))
        base = df[(df.build == "base") & (df.fmt == fmt) & (df.kernel == kernel)]
        rows.append([fmt, kernel, num(geo), span(g["t_over_other"]), span(g["beta_over_read"]),
                     span(base["beta_over_read"])])
    blocks = df.drop_duplicates("fmt")
    flags = "; ".join(f"{r.fmt}: {r.flags}" for r in blocks.itertuples() if isinstance(r.flags, str) and r.flags)
    return (f"`{file}` ({df['date'].iloc[0]}, base revision {df['base_rev'].iloc[0]}; {int(df['checked_outputs'].iloc[0])} "
            f"outputs compared bit for bit before timing, none differed; {int(df['reps'].iloc[0])} rounds, "
            f"{int(df['threads'].iloc[0])} kernel thread(s), protocol {df['protocol'].iloc[0]}, model {df['model'].iloc[0]}, read "
            f"{span(blocks['read_GBps'], 1)} GB/s, other load {span(blocks['other_load'], 2)}"
            + (f"; flagged {flags}" if flags else "") + "):\n\n"
            + md_table(["format", "kernel", "time new/base, geometric mean over n", "range over n = 1..9",
                        "new: share of read", "base: share of read"], rows))


@block("theory-timings")
def theory_timings(run: RunFiles, file: str) -> str:
    """benchmarks/bench_theory.py's record as a table: every function and step-time vector."""
    rec = _bench_record(run, file)
    names = [k for k in next(iter(rec["results"].values())) if isinstance(next(iter(rec["results"].values()))[k], dict)]
    rows = []
    for vec, res in rec["results"].items():
        rows.append([vec] + [f"{1e3 * res[k]['t_median_s']:.2f} ms ({1e3 * res[k]['t_q25_s']:.2f}–"
                             f"{1e3 * res[k]['t_q75_s']:.2f})" for k in names])
    return (f"k*(a) for {rec['values']:,} acceptance values with kmax = {rec['kmax']} (`{file}`, {rec['date_utc']} UTC, "
            f"{machine(rec['provenance'])}, numpy {rec['provenance']['versions'].get('numpy')}):\n\n"
            + md_table(["step time"] + [f"`{k}`" for k in names], rows))


@block("advise-summary", "05_round_model.json")
def advise_summary(run: RunFiles, a: str = "0.7") -> str:
    """``moespec advise RUN -a A``'s decision in one sentence."""
    res = advice.advise(run.tables, [float(a)])
    rec, dd = res["acceptance"][0]["recommended"], res["dedup"]
    return (f"`moespec advise figures -a {a}` says: deduplication is faster from n = {dd['from_n']} (earliest "
            f"{dd['earliest_n']}, guaranteed from n = {dd['guaranteed_from_n']}), {_answer(rec)} (band of bound (21) "
            f"at the round model's delta_k).")


@block("fit-intercepts", "03_fit_coefficients.csv", "03_window_errors.csv")
def fit_intercepts(run: RunFiles) -> str:
    """The fits' intercepts t_op against the operation times they describe (notebook 03)."""
    fits = run.csv("03_fit_coefficients.csv")
    win = run.csv("03_window_errors.csv")
    return (f"The fits' intercepts t_op are {span(1e3 * fits['t_op'], 2)} ms against operation times of "
            f"{span(1e3 * win['t_median_s'], 1)} ms (`03_fit_coefficients.csv`, `03_window_errors.csv`): the operation "
            f"here is nearly pure bandwidth, with little fixed cost.")


@block("decode-breakdown")
def decode_breakdown(run: RunFiles, stamp: str, folder: str = "benchmarks/results/breakdown") -> str:
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
def decode_components(run: RunFiles, stamp: str, folder: str = "benchmarks/results/breakdown") -> str:
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


@block("breakdown-bytes", "05_breakdown.csv")
def breakdown_bytes(run: RunFiles) -> str:
    """Notebook 05's breakdown per component: its time alone, its bytes per step, the bandwidth
    that makes, its share of the step's bytes beside the published model's (from its config, at the
    subject's layers; :func:`moespec.engine.breakdown.shares` with byte tables)."""
    from moespec.engine.byte_shares import COMPONENTS

    df = run.csv("05_breakdown.csv")
    if "published" not in df.columns:
        raise ReportError("05_breakdown.csv has no byte columns (written before notebook 05 counted each "
                          "component's bytes)")
    rows, steps = [], []
    for _, r in df[df["published"].notna()].iterrows():
        for c in COMPONENTS:
            share, pub = r[f"{c}_share"], r[f"{c}_share_published"]
            rows.append([r["subject"], c.replace("_", " "), num(r.get(f"{c}_ms"), 2), num(r[f"{c}_MB"], 2),
                         num(r.get(f"{c}_GBps"), 1), num(share), num(pub), num(share / pub if pub else float("nan"))])
        steps.append(f"{r['subject']}: step {num(r['step_ms'], 2)} ms at n = 1, read {num(r['read_GBps'], 1)} GB/s "
                     f"in the same run")
    first = df[df["published"].notna()].iloc[0]
    return (f"`05_breakdown.csv` (notebook 05, cache depth {int(first['bytes_depth'])}; the published model "
            f"{first['published']} at the subject's layers, from its config):\n\n"
            + md_table(["subject", "component", "time alone (ms)", "bytes per step (MB)", "GB/s alone",
                        "share of the step's bytes", "published share", "share ratio"], rows)
            + "\n\n" + "; ".join(steps) + ".")


@block("prediction-tables", "06_table4_preregistered.csv", "06_table7_error.csv")
def prediction_tables(run: RunFiles) -> str:
    """Notebook 06's Table 4 and Table 7 rows of this run (the paper's rows are in the CSVs)."""
    t4 = _ours(run.csv("06_table4_preregistered.csv")).drop(columns=["source"], errors="ignore")
    t7 = _ours(run.csv("06_table7_error.csv")).drop(columns=["source"], errors="ignore")
    return ("Table 4 (`06_table4_preregistered.csv`, this run's rows):\n\n" + frame_table(t4, 3)
            + "\n\nTable 7 (`06_table7_error.csv`, this run's rows):\n\n" + frame_table(t7, 3))


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
            f"({model} bf16: {nbytes / 1e6:.1f} MB in at most {1e6 * t_goal:.1f} us at {read / 1e12:.1f} TB/s, of which "
            f"{1e6 * t_bytes:.1f} us is the bytes at the read rate) the fixed cost must fall to about "
            f"{1e6 * (t_goal - t_bytes):.0f} us.")


_KERNEL_TABLES = (
    ("r(n) = beta_dedup / beta_slot (paired per round)", "dedup", "cpp", "r_n"),
    ("per-slot beta / read bandwidth (requested bytes n*m*b)", "slot", "cpp", "beta_over_read"),
    ("dedup beta / read bandwidth (distinct bytes U*b)", "dedup", "cpp", "beta_over_read"),
    ("ggml MUL_MAT_ID beta / read bandwidth (distinct bytes, ggml's own b)", "dedup", "ggml", "beta_over_read"),
    ("moespec dedup / ggml MUL_MAT_ID, effective bandwidth (paired per round)", "dedup", "cpp", "dedup_over_ggml"),
)


@block("kernel-run-tables")
def kernel_run_tables(run: RunFiles, runs: str) -> str:
    """bench_kernels.py runs block by block: the read, the regime (``unsteady`` for a block whose
    reads changed regime) and, per n, r(n), the shares of the read and the peer's."""
    df = kernel_blocks(run, runs)
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
    return "\n\n".join(out) + f"\n\n(`benchmarks/results/kernels/<run>.csv`, {span(df['reps'], 0)} rounds.)"


@block("kernel-crossover")
def kernel_crossover(run: RunFiles, runs: str) -> str:
    """Where ubar(n) < r(n) (deduplication faster, paper 1, eq. (7)) in bench_kernels.py runs' ``_ubar.csv``."""
    frames = [run.repo_csv(f"benchmarks/results/kernels/{s.strip()}_ubar.csv").assign(run=s.strip())
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


@block("call-stages-table")
def call_stages_table(run: RunFiles, files: str) -> str:
    """bench_call_stages.py runs as a table: per protocol, format and n = 1 / n >= 2, the ranges
    over the runs of each stage's median and the call's, op's and work stage's share of the read."""
    df = _repo_csvs(run, files)
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


@block("microkernel-table")
def microkernel_table(run: RunFiles, file: str) -> str:
    """bench_microkernel.py: ns per 64 weight bytes and token, per format and T, L1 / L2."""
    df = run.repo_csv(f"benchmarks/results/kernels/{file}")
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
