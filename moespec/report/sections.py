"""The run's report, ``REPORT.md`` beside its figures: one section per notebook, each written from
the run's own tables (and the papers' reference tables in ``data/paper_reference/`` where a part
sets a result beside the paper's).

A section is a list of parts; a part is a registered block (:func:`moespec.report.blocks.block`),
so a page of ``docs/`` can quote any part with a marker. :func:`report_text` writes a section for
each notebook the run has files of, and a part whose files the run lacks is named as missing
instead of failing (a run of some notebooks, or of the quick profile, has fewer tables).
"""

from __future__ import annotations

import contextlib
import textwrap

from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import pandas as pd

from moespec import advice, io, paper_reference, paths
from moespec.report.blocks import BLOCKS, block
from moespec.report.format import (frame_table, machine, md_table, named_table, num, pct, run_folder_name,
                                   short_commit, span, verdict, when)
from moespec.report.run import ReportError, RunFiles

#: The report's file name, written beside the run's figures and tables.
REPORT_NAME = "REPORT.md"


def _ours(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of this run (not the papers' published rows)."""
    return df[df["source"] == "this run"] if "source" in df.columns else df


@block("run-identity")
def run_identity(run: RunFiles) -> str:
    """Which run the tables come from: start time, folder, profile, machine, torch."""
    man = run.manifest
    torch_v = man.get("versions", {}).get("torch", "?")
    what = "`make reproduce`" if man.get("publish") else "`moespec reproduce`"
    if not run.status.complete:   # written with --allow-incomplete: say so, and what finished
        what = f"unfinished {what} ({run.status.describe()})"
    return (f"The {what} run of {when(man.get('started'))} (run folder `{run_folder_name(man)}`, profile "
            f"{man.get('profile', '?')}) on {machine(man)}, torch "
            f"{torch_v}; its manifest is `figures/MANIFEST.json`.")


@block("table", "{file}")
def table(run: RunFiles, file: str, columns: str | tuple = "", digits: str = "3") -> str:
    """Any table of the run as it is (``columns``: a comma-separated subset, in that order, or a tuple
    of names). A ``subject`` column with one value is said once under the table instead."""
    df = run.csv(file)
    wanted = columns.split(",") if isinstance(columns, str) else list(columns)
    note = ""
    if "subject" in df.columns and df["subject"].nunique() == 1 and "subject" not in wanted:
        note = f"\n\n(Subject: {df['subject'].iloc[0]}.)"
        df = df.drop(columns=["subject"])
    return named_table(df, file, columns, digits) + note


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


@block("advise-vs-measured", "08_advise_vs_measured.csv", "08_advise_regret.csv", "08_goals.csv")
def advise_vs_measured(run: RunFiles) -> str:
    """Notebook 08: advise's speedup at the run's measured acceptance profile, per k and state,
    beside the real-draft runs' measured speedup; the regret of its k (and of the geometric answer
    at the measured a) with its interval; and its goals."""
    t = run.csv("08_advise_vs_measured.csv")
    rows = [[r.state, int(r.k), num(r.tokens_per_step),
             f"{num(r.advise_speedup)} [{num(r.advise_lo)}, {num(r.advise_hi)}]", num(r.measured_speedup),
             f"{100 * r.rel_error:+.1f} %", "yes" if str(r.inside).lower() == "true" else "no"]
            for r in t.itertuples()]
    g = run.csv("08_advise_regret.csv")
    regret = [[r.state, r.acceptance, int(r.advise_k), int(r.measured_best_k),
               f"{100 * r.regret:.1f} % [{100 * r.regret_lo:.1f}, {100 * r.regret_hi:.1f}]", r.interval]
              for r in g.itertuples()]
    return ("`08_advise_vs_measured.csv` (advise at the run's measured acceptance profile, tokens per step G(k) of the "
            "runs at each k; deduplicating kernel from n = 2; beside the real-draft runs of the draft as trained):\n\n"
            + md_table(["state", "k", "G(k)", "advise: speedup [band]", "measured (median over prompts)", "error",
                        "band holds it"], rows)
            + "\n\n`08_advise_regret.csv` (regret: the share of the measured best speedup lost by running advise's k):"
            "\n\n" + md_table(["state", "acceptance", "advise k", "measured best k", "regret [95 % interval]",
                                 "interval from"], regret) + "\n\n" + goals(run, "08"))


def _draft_form(row) -> str:
    """A real draft's fitted time per round, its one-token and catch-up terms where the run has them."""
    text = f"{num(row.draft_a_ms)} k + {num(row.draft_b_ms)}"
    c, e = getattr(row, "draft_one_token_ms", float("nan")), getattr(row, "draft_catch_up_ms", float("nan"))
    if not pd.isna(c):
        text += f" {'-' if c < 0 else '+'} {num(abs(c))} [k = 1]"
    if not pd.isna(e):
        text += f" + {num(e)} s"
    return text


@block("round-model", "05_round_terms.csv", "05_plain_step.csv")
def round_model(run: RunFiles) -> str:
    """Notebook 05's round models: per state, context and draft, V(0), V(1) and V(kmax) with their
    intervals, the draft's fit, and the plain step predicted against the measured one."""
    t = run.csv("05_round_terms.csv")
    rows = []
    for (state, ctx, draft), g in t.groupby(["state", "context", "draft"], sort=False):
        g = g.sort_values("k")
        first, one, last = g.iloc[0], g.iloc[1], g.iloc[-1]
        fit_ = _draft_form(first) if not pd.isna(first.draft_a_ms) else f"measured ({num(one.t_draft_ms)} at k = 1)"
        rows.append([state, ctx, draft, f"{num(first.V_ms)} [{num(first.V_lo_ms)}, {num(first.V_hi_ms)}]",
                     f"{num(one.V_ms)} [{num(one.V_lo_ms)}, {num(one.V_hi_ms)}]",
                     f"{num(last.V_ms)} (k = {int(last.k)})", fit_, num(one.host_ms), num(first.read_GBps, 1)])
    plain = run.csv("05_plain_step.csv")
    prow = [[r.state, r.runs, f"{num(r.V0_hat_ms)} [{num(r.V0_lo_ms)}, {num(r.V0_hi_ms)}]", num(r.V0_meas_ms),
             f"{100 * r.rel_error:+.1f} %"] for r in plain.itertuples()]
    return ("Round models (`05_round_terms.csv`; ms, 95 % intervals; the draft's time per round t_draft(k) = "
            "a k + b + c [k = 1] + e s(k), s(k) the share of rounds whose draft began with two tokens):\n\n"
            + md_table(["state", "context", "draft", "V(0)", "V(1)", "V(kmax)", "t_draft(k)", "h(1)", "read GB/s"],
                       rows)
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


def _paper_table1(run: RunFiles) -> pd.DataFrame:
    return paper_reference.read("table1_bandwidth")


def _paper_scalar(run: RunFiles, quantity: str) -> pd.DataFrame:
    df = paper_reference.paper1_scalars()
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
    read = ("read bandwidth" if "read_probe" not in bw
            else f"read ceiling ({', '.join(dict.fromkeys(bw['read_probe'].astype(str)))})")
    return (md_table(["", "here", "paper 1 (their hardware)"], rows) + _above_read_note(bw)
            + f"\n\n({ours.source}; {ours.engine}, model shape {ours.model}, {read} of the run "
            f"{span(bw['read_GBps'], 1)} GB/s; notebook 02 ran with backend {nb.get('backend')}, format "
            f"{nb.get('fmt')}. Files: `02_table1_bandwidth.csv`, "
            f"`02_bandwidth_by_n.csv`, `03_epsilon.csv`, `03_fig7_transfer.csv`; the paper's: "
            f"`data/paper_reference/paper1_table1_bandwidth.csv`, `paper1_scalars.csv`.)")


def _above_read_note(bw: pd.DataFrame) -> str:
    """The check of a share of the read ceiling above 1 (``above_read``, where the table has it)."""
    if "above_read" not in bw:
        return ""
    hit = bw[bw["above_read"].fillna("").astype(str) != ""]
    if hit.empty:
        return "\n\nEvery share of the read ceiling is at most 1 within the probe's spread (`above_read`)."
    return ("\n\n**Shares of the read ceiling above 1 beyond the probe's spread** (not results): "
            + "; ".join(f"n = {int(r.n)} {r.above_read_cause}" for r in hit.itertuples()) + ".")


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
                     int((coefs < 0).sum().sum()),
                     f"{num(e.eps_slot, 4)}, {num(e.eps_dedup, 4)}, {num(e.eps_engine, 4)}"])
    return (md_table(["fit", "rows", "t_op (ms)", "coefficients at the bound 0", "negative coefficients",
                      "epsilon (slot, dedup, engine)"], rows)
            + "\n\n(`03_fit_variants.csv`, `03_epsilon_variants.csv`; the default consumers read the non-negative "
            "fit on the kept rows.)")


@block("fit-intercepts", "03_fit_coefficients.csv", "03_window_errors.csv")
def fit_intercepts(run: RunFiles) -> str:
    """The fits' intercepts t_op against the operation times they describe (notebook 03)."""
    fits = run.csv("03_fit_coefficients.csv")
    win = run.csv("03_window_errors.csv")
    return (f"The fits' intercepts t_op are {span(1e3 * fits['t_op'], 2)} ms against operation times of "
            f"{span(1e3 * win['t_median_s'], 1)} ms (`03_fit_coefficients.csv`, `03_window_errors.csv`): the operation "
            f"here is nearly pure bandwidth, with little fixed cost.")


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

    def judged(value: float, op: str, target: float) -> str:
        return verdict(value >= target if op == ">=" else value <= target)

    subjects = [f"{r.subject}: " + "; ".join(
        f"{col.replace('_', ' ')} {float(getattr(r, col)):.3g} "
        f"({op} {target:g}: {judged(float(getattr(r, col)), op, target)})"
        for col, (op, target) in BREAKDOWN_TARGETS.items()) for r in df.itertuples()]
    return ("Issue 16's targets (`05_breakdown.csv`, one interleaved run at n = 1, read "
            + ", ".join(f"{float(v):.1f}" for v in df["read_GBps"]) + " GB/s): " + "; ".join(subjects) + ".")


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
    if df["published"].isna().all():   # a subject not embedded in a published model (a user's checkpoint)
        return ("`05_breakdown.csv` (notebook 05): " + "; ".join(
            f"{r['label'] if 'label' in df.columns else r['subject']}: step {num(r['step_ms'], 2)} ms at n = 1, "
            f"read {num(r['read_GBps'], 1)} GB/s in the same run" for _, r in df.iterrows())
            + ". The subject is not embedded in a published model, so no published byte shares are set beside it.")
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
        quiet = t8["rows"].astype(str).str.contains("quiet")
        t8 = t8[quiet] if quiet.any() else t8
    vs = curves[curves.version == "measured"].rename(columns={"tau_slot_ms": "tau_slot", "S_ms": "S", "S_lo_ms": "S_lo",
                                                              "S_hi_ms": "S_hi"})
    depths = sorted(int(d) for d in vs["d"].unique())
    dtext = " / ".join(str(d) for d in depths)
    tau1 = " / ".join(num(vs[(vs.d == d) & (vs.n == 1)]["tau_slot"].iloc[0], 1) for d in depths)
    s = vs[vs.n >= 2].assign(S_s=lambda f: f.S / 1e3)
    positive = bool((s["S_s"] > 0).all())
    crosses = {d: [int(n) for n in s[(s.d == d) & (s.S_lo < 0) & (s.S_hi > 0)]["n"]] for d in depths}
    cross_text = "; ".join(f"d = {d}: n = {', '.join(map(str, v))}" if v else f"d = {d}: none"
                           for d, v in crosses.items())
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
    all_six = [v for v, g in t8.groupby("version", sort=False)
               if g["holds_all"].astype(str).str.lower().eq("true").all()]
    commit = short_commit(t8["rules_commit"].iloc[0]) if "rules_commit" in t8 else "?"
    k_last = int(real["k"].max())
    rd = real.set_index("k")["speedup_median"]
    return (f"Depths d = {dtext}. Dedup off and on give the same greedy tokens "
            f"({int(ag.greedy_equal.sum())}/{int(ag.tokens.sum())}) and verify argmax "
            f"({int(ag.verify_argmax_equal.sum())}/{int(ag.verify_rows.sum())}). In decode loops (the round "
            f"model) tau(1) = {tau1} ms (d = {dtext}). The measured saving S(n) is "
            f"{'positive at every' if positive else 'not positive at every'} "
            f"n = 2..{int(s.n.max())} ({span(1e3 * s['S_s'], 3)} ms); its 95 % interval crosses zero at {cross_text}; "
            f"the measured crossover is {meas_cross}. The oracle draft realizes acceptance within {realized:.3f} of a "
            f"in every cell; tokens per step {tps:.3f} x G_a(k) (median). Prediction chain (22)"
            + (f", engine epsilon {num(eps)}" if eps is not None else "")
            + f": crossover predicted {'within one at every depth' if cross_ok else 'off by more than one somewhere'}; "
            f"saving inside the band of bound (18) at {bands} points; verify time within {tau}; k̂* within one of "
            f"the measured k* at {kstar} acceptance values; the best speedup inside bound (21) "
            f"{'at every depth and version' if b21 else 'not everywhere'}. Pre-registered rules (committed in "
            f"`{commit}`): "
            + "; ".join(rules) + f". Versions meeting all six: {', '.join(all_six) if all_six else 'none'}. "
            f"Real draft: median speedup {num(rd.get(1))} at k = 1 and {num(rd.get(k_last))} at k = {k_last} "
            f"(`05_real_draft.csv`).")


@block("prediction-tables", "06_table4_preregistered.csv", "06_table7_error.csv")
def prediction_tables(run: RunFiles) -> str:
    """Notebook 06's Table 4 and Table 7 rows of this run (the paper's rows are in the CSVs)."""
    t4 = _ours(run.csv("06_table4_preregistered.csv")).drop(columns=["source"], errors="ignore")
    t7 = _ours(run.csv("06_table7_error.csv")).drop(columns=["source"], errors="ignore")
    return ("Table 4 (`06_table4_preregistered.csv`, this run's rows):\n\n" + frame_table(t4, 3)
            + "\n\nTable 7 (`06_table7_error.csv`, this run's rows):\n\n" + frame_table(t7, 3))


def draft_fit(run: RunFiles) -> tuple[float, float]:
    """Notebook 07's fit of the draft time, T_D = a K + b ms (``07_paper2_comparison.csv``)."""
    df = run.csv("07_paper2_comparison.csv")
    row = df[df["quantity"] == "draft_time_ms"]
    if row.empty:
        raise ReportError("07_paper2_comparison.csv has no draft_time_ms row")
    text = str(row.iloc[0]["ours (this machine)"]).replace(" ", "")
    slope, rest = text.split("*K+")
    return float(slope), float(rest)


def _paper2(run: RunFiles, quantity: str) -> tuple[str, str]:
    df = run.csv("07_paper2_comparison.csv")
    row = df[df["quantity"] == quantity]
    if row.empty:
        raise ReportError(f"07_paper2_comparison.csv has no row {quantity!r}")
    return str(row.iloc[0].iloc[1]), str(row.iloc[0].iloc[2])


def _paper2_published(run: RunFiles, quantity: str) -> str:
    """One of paper 2's published scalars as the paper states it (``data/paper_reference/paper2_scalars.csv``)."""
    try:
        return paper_reference.paper2_value(quantity)
    except KeyError as exc:
        raise ReportError(str(exc)) from None


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
    online_share = (float(online.loc["online early exit", "share_of_oracle"]) if "online early exit" in online.index
                    else None)
    return (f"{int(rs.rounds.sum()):,} measured rounds, K = {int(rs.K.min())}..{int(rs.K.max())} "
            f"({int(rs.generations.max())} generations per K). The verification-cost regression (eq. (4)) fitted per K "
            f"(Table A4) has in-sample R² {r2_per_k} and GroupKFold MAPE {mape_per_k} % (paper 2, per K: R² "
            f"{paper['in_sample_R2_per_K']}, MAPE {paper['oos_MAPE_per_K_pct']} %, Section 3.5); in its {cat.model} "
            f"form pooled over the speculative rounds, R² {num(cat.r2_in)} and MAPE {num(cat.cv_mape_pct, 1)} % "
            "(paper 2 "
            f"on its full pool: R² {paper['pooled_eq4_R2']}, MAPE {paper['pooled_eq4_cv_MAPE_pct']} %, Appendix A.9). "
            f"A drafted token costs {slope:g} ms against a {t_target:.1f} ms target pass; with paper 2's surrogate "
            f"transitions the oracle's mean draft length is at most {cf_len(sweep)} (speedup "
            f"{span(sweep['speedup'], 3)} over Lmax = {int(sweep.lmax.min())}..{int(sweep.lmax.max())}; paper 2: "
            f"{paper['oracle_speedup_plateau']}). "
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
    sweeps = {t: _under(run.csv("07_fig2_lmax_sweep.csv"), t, "07_fig2_lmax_sweep.csv")
              for t in ("surrogate", "greedy")}
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
                "the oracle's speedups use the fitted cost model's plain baseline, the measured ones the measured "
                "K = 0 "
                "rounds.")
    return (f"The measured fixed-K rounds (tokens per round over T_T + T_D {host}against the K = 0 rounds' time per "
            f"token, `07_measured_fixed_k.csv`) reach at best {num(best.speedup)} [{num(best.speedup_lo)}, "
            f"{num(best.speedup_hi)}] at K = {K} ({num(best.accepted_per_round, 2)} drafts accepted per round; 95 % "
            f"bootstrap interval over generations). The oracle on its reference sequences reaches "
            f"{oracle_text('surrogate')} "
            f"with paper 2's surrogate transitions (p = P_draft(reference token)) and {oracle_text('greedy')} with the "
            f"greedy-exact transitions (p = 1 exactly when the draft's argmax is the reference token: what greedy "
            f"verification of a greedy draft accepts). At K = {K} the models' own fixed-k policies predict "
            f"{model_k('surrogate')} (surrogate) and {model_k('greedy')} (greedy-exact); " + baseline)


def cf_len(sweep: pd.DataFrame) -> str:
    """The largest mean draft length of an Lmax sweep, as text."""
    return f"{float(sweep['mean_draft_length'].max()):g}"



# --- the answer (the README's example) ------------------------------------------------------------
@block("advise")
def advise_output(run: RunFiles, a: str = "") -> str:
    """``moespec advise RUN`` as it prints (the run's own measured acceptance profile; ``a``: a
    what-if rate, ``-a A``), RUN being this run's folder (paths shown relative to the repository)."""
    folder = run.folder.resolve()
    shown = folder.relative_to(paths.ROOT) if folder.is_relative_to(paths.ROOT) else folder
    try:
        with contextlib.chdir(paths.ROOT):     # the paths advise prints, and so its line breaks, as a user sees them
            text = advice.format_text(advice.advise(shown, [float(a)] if a else None))
    except ValueError as exc:      # AdviceInputError and InputError: the run lacks what advise reads
        raise ReportError(f"moespec advise {run.folder}: {exc}") from None
    return f"```\n$ moespec advise {shown}{f' -a {a}' if a else ''}\n{text.rstrip()}\n```"


@block("advise-regret", "08_advise_regret.csv")
def advise_regret(run: RunFiles) -> str:
    """One line: the regret of advise's k at the run's measured profile per state, beside the
    geometric answer's, with the intervals and what they rest on."""
    g = run.csv("08_advise_regret.csv")
    def say(r):
        return (f"{r.state}: k = {int(r.advise_k)} (measured best {int(r.measured_best_k)}), regret "
                f"{100 * r.regret:.1f} % [{100 * r.regret_lo:.1f}, {100 * r.regret_hi:.1f} %]")
    own = g[~g["acceptance"].str.startswith("geometric")]
    geo = g[g["acceptance"].str.startswith("geometric")]
    return textwrap.fill(
        "Following advise costs (regret: the share of the measured best speedup lost by running its k; 95 % "
        "interval from a paired bootstrap over the repetitions): " + "; ".join(say(r) for r in own.itertuples())
        + ". At the geometric acceptance of the measured a instead: "
        + "; ".join(say(r) for r in geo.itertuples()) + ".", 100, break_on_hyphens=False)


# --- notebook 05: the speculative runs against the round model's predictions -------------------------
def _within(errors: pd.Series, limit: float = 0.05) -> int:
    return int((errors.abs() <= limit).sum())


def _true(values: pd.Series) -> int:
    return int(values.astype(str).str.lower().eq("true").sum())


@block("real-draft", "05_draft_cost_predictions.csv")
def real_draft(run: RunFiles) -> str:
    """The real draft's scored predictions per machine state: points within 5 %, the largest and
    mean error, the measured speedup inside the predicted interval, the measurement's and the
    prediction's noise where the run reports them, the best measured point, and two diagnostics
    (the geometric G_a(k) in place of the measured tokens per step; the runs' own step times)."""
    df = run.csv("05_draft_cost_predictions.csv")
    rows = []
    for state, g in df.groupby("state", sort=False):
        best = g.loc[g["measured"].idxmax()]
        noise = "n/a"
        if "noise_p_outside" in g:
            noise = (f"{num(g['noise_p_outside'].sum(), 1)} (prediction se {pct(g['pred_rel_se'].median())}, "
                     f"measurement se {pct(g['measured_rel_se'].median())}; {_true(g['beyond_2sd'])} beyond 2 sd)")
        rows.append([state, len(g), _within(g["rel_error"]), pct(g["rel_error"].abs().max()),
                     f"{100 * g['rel_error'].mean():+.1f} %",
                     _true(g["inside"]) if "inside" in g else "n/a",
                     noise,
                     f"{num(best['measured'])} (cost {best['draft_cost']:g}, k = {int(best['k'])})",
                     pct(g["rel_error_geometric"].abs().max()) if "rel_error_geometric" in g else "n/a",
                     _within(g["rel_error_measured_steps"]) if "rel_error_measured_steps" in g else "n/a"])
    return ("Real draft, every (draft cost, k) point per machine state (`05_draft_cost_predictions.csv`; the "
            "prediction is the median over test prompts of E_p(k) V(0) / V_p(k), each prompt at its own tokens "
            "per step, routing and share of catch-up rounds):\n\n"
            + md_table(["state", "points", "within 5 %", "largest error", "mean error", "inside the interval",
                        "perfect prediction outside 5 % by noise (expected points)", "best measured",
                        "with geometric G_a(k): largest error", "with the runs' step times: within 5 %"], rows))


@block("oracle-grid", "05_oracle_predictions.csv")
def oracle_grid(run: RunFiles) -> str:
    """The oracle-draft grid per machine state: cells within 5 %, the largest error, the measured
    speedup inside the predicted interval, the same with each cell's realized tokens per step."""
    o = run.csv("05_oracle_predictions.csv")
    rows = []
    for state, g in o[o.k >= 1].groupby("state", sort=False):
        realized = "n/a"
        if "speedup_rel_error_realized" in g:
            errors = g["speedup_rel_error_realized"]
            realized = f"{_within(errors)}, largest {pct(errors.abs().max())}"
        rows.append([state, len(g), _within(g["speedup_rel_error"]), pct(g["speedup_rel_error"].abs().max()),
                     _true(g["speedup_inside"]), realized])
    return ("Oracle draft, every (d, k, a) cell with k >= 1 (`05_oracle_predictions.csv`):\n\n"
            + md_table(["state", "cells", "within 5 %", "largest error", "inside the interval",
                        "with the cell's realized tokens per step: within 5 %"], rows))


@block("draft-stop", "05_draft_cost_stop.json")
def draft_stop(run: RunFiles) -> str:
    """The best speedup over k >= 1 at each draft cost of the grid, measured and predicted, and the
    cost from which drafting stops paying (best speedup at most 1) by each."""
    rec = run.json("05_draft_cost_stop.json")
    need = ["grid", "best_measured", "best_predicted", "stop_cost_measured", "stop_cost_predicted"]
    missing = [k for k in need if k not in rec]
    if missing:
        raise ReportError(f"05_draft_cost_stop.json has no fields {missing}")
    rows = [[f"{c:g}", num(m), num(p)] for c, m, p in zip(rec["grid"], rec["best_measured"], rec["best_predicted"])]
    return ("The best speedup over k >= 1 at each draft cost (quiet machine, `05_draft_cost_stop.json`); drafting "
            f"stops paying from cost {rec['stop_cost_measured']:g} measured and {rec['stop_cost_predicted']:g} "
            "predicted:\n\n" + md_table(["draft cost", "best measured", "best predicted"], rows))


# --- notebook 09: speculation at batch B ------------------------------------------------------------
@block("batch-axis", "09_batch_predictions.csv", "09_best_k.csv", "09_rise_with_batch.csv")
def batch_axis(run: RunFiles) -> str:
    """Notebook 09 per machine state and batch size: the (B, k) cells within the state's tolerance and
    the largest error, the measured best k beside the predicted k*(B) and its regret; then whether the
    best speedup first rises with B, measured and predicted."""
    pred, best = run.csv("09_batch_predictions.csv"), run.csv("09_best_k.csv")
    rise = run.csv("09_rise_with_batch.csv")
    rows = []
    for r in best.itertuples():
        g = pred[(pred["state"] == r.state) & (pred["B"] == r.B)]
        limit = float(g["tolerance"].iloc[0])
        lo = getattr(r, "regret_lo", None)
        interval = f" [{pct(lo)}, {pct(r.regret_hi)}]" if pd.notna(lo) else ""
        rows.append([r.state, int(r.B), f"{_within(g['rel_error'], limit)} of {len(g)} (<= {pct(limit)})",
                     pct(g["rel_error"].abs().max()), f"{int(r.k_best_measured)} ({num(r.measured_best)})",
                     f"{int(r.k_star_predicted)} ({num(r.measured_at_k_star)})", pct(r.regret) + interval])
    said = "; ".join(f"{r.state}: best speedup per B {r.B} measured {r.best_measured}, predicted {r.best_predicted} "
                     f"(first rises with B: measured {r.rises_measured}, predicted {r.rises_predicted})"
                     for r in rise.itertuples())
    return ("Throughput per sequence over plain decoding at the same B, predicted G(k) V(0, B) / V(k, B) from the "
            "round terms timed at n = B(k + 1) in the same interleaved run (`09_batch_predictions.csv`), and the "
            "measured best k per B beside the predicted k*(B) (`09_best_k.csv`; in brackets the measured speedup at "
            "each; the regret's 95 % interval from a paired bootstrap over the repetitions):\n\n"
            + md_table(["state", "B", "cells within tolerance", "largest error", "measured best k",
                        "predicted k*(B)", "regret"], rows)
            + "\n\n" + textwrap.fill(f"MoESD's claim, as found (`09_rise_with_batch.csv`): {said}.", 100,
                                      break_on_hyphens=False))


# --- the report -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Section:
    """One notebook's section: its number, title and parts ``(block name, marker parameters)``."""
    notebook: str
    title: str
    parts: tuple = field(default_factory=tuple)


SECTIONS = (
    Section("00", "Embedded models and routing sources", (
        ("table", {"file": "00_perplexity.csv", "digits": "1"}), ("table", {"file": "00_quality.csv"}),
        ("reuse-sources", {}), ("table", {"file": "00_reuse_layers.csv"}))),
    Section("01", "Routing reuse (paper 1, Figure 1)", (
        ("table", {"file": "01_table_reuse.csv", "columns": "source,rho_hat_2,rho_hat_9,ubar_2,ubar_8",
                   "digits": "4"}),)),
    Section("02", "Expert-operation benchmark (paper 1, Figure 2, Table 1)", (
        ("expert-op-fits", {}),
        ("table", {"file": "02_bandwidth_by_n.csv",
                   "columns": "n,beta_slot_GBps,beta_dedup_GBps,r,ubar,read_probe?,slot_over_read,dedup_over_read,"
                              "above_read?,slot_over_sum?,dedup_over_sum?"}),
        ("discard-rule", {}))),
    Section("03", "Fits (4)/(E.1), epsilon and the transfer test", (
        ("fit-intercepts", {}), ("fit-variants", {}),
        ("table", {"file": "03_epsilon_engines.csv", "columns": "engine,eps_slot,eps_dedup,eps_engine,read_GBps"}),
        ("table", {"file": "03_fit_coefficients_engines.csv",
                   "columns": "engine,layer,kernel,t_op_ms,c_u_GBps,reread_cost,c_g_GBps,c_t_ms,"
                              "window_median_abs_err"}))),
    Section("04", "Theory (paper 1, Section 3; Tables 2, 5, 6)", ()),
    Section("05", "The whole model: the round model and the speculative runs", (
        ("breakdown-bytes", {}), ("breakdown-goals", {}), ("round-model", {}), ("verify-protocols", {}),
        ("oracle-grid", {}), ("real-draft", {}), ("draft-stop", {}), ("goals", {"notebook": "05"}))),
    Section("06", "The prediction chain (22) and the pre-registered rules", (
        ("whole-model", {}), ("prediction-tables", {}), ("goals", {"notebook": "06"}))),
    Section("07", "Paper 2: verification-cost regression and the Bellman oracle", (
        ("oracle", {}), ("oracle-transitions", {}),
        ("table", {"file": "07_rounds_summary.csv", "digits": "2"}),
        ("table", {"file": "07_tableA6_models.csv"}),
        ("table", {"file": "07_paper2_comparison.csv",
                   "columns": ("quantity", "ours (this machine)", "paper 2, published (their hardware)")}),
        ("table", {"file": "07_online_policy.csv", "columns": "policy,transitions,speedup,mean_draft_length,"
                                                              "mean_accepted_length,share_of_oracle"}),
        ("table", {"file": "07_kernel_cost_models.csv", "columns": "cost_model,transitions,speedup,mean_draft_length,"
                                                                   "mean_accepted_length,slope_ms_per_token"}),
        ("goals", {"notebook": "07"}),
        ("table", {"file": "07_paper2_map.csv", "columns": "paper 2 item,section,our files,verdict"}))),
    Section("08", "advise against what the run measured", (("advise-vs-measured", {}),)),
    Section("09", "Speculation under concurrency: the batch-size axis", (
        ("batch-axis", {}), ("goals", {"notebook": "09"}))),
)


def _notebooks(run: RunFiles) -> dict[str, str]:
    """``{"05": "05_whole_model", ...}``: the notebooks the run's manifest says finished."""
    return {nb["name"][:2]: nb["name"] for nb in run.manifest.get("notebooks", []) if nb.get("name")}


def _files_of(run: RunFiles, notebook: str) -> list[str]:
    return sorted(p.name for p in run.tables.glob(f"{notebook}_*") if p.is_file())


def _part(run: RunFiles, name: str, params: dict) -> str:
    fn, needs = BLOCKS[name]
    missing = [f for f in (n.format(**params) for n in needs) if not run.has(f)]
    if missing:
        return f"*(This run has no {', '.join(f'`{f}`' for f in missing)}.)*"
    try:
        return fn(run, **params).strip("\n")
    except ReportError as exc:
        raise ReportError(f"{REPORT_NAME}, part {name!r}: {exc}") from exc


def _header(run: RunFiles) -> str:
    man = run.manifest
    what = "`make reproduce`" if man.get("publish") else "`moespec reproduce`"
    if not run.status.complete:
        what = f"unfinished {what} ({run.status.describe()})"
    nbs = [nb for nb in man.get("notebooks", []) if nb.get("wall_s") is not None]
    total = sum(nb["wall_s"] for nb in nbs)
    times = md_table(["notebook", "wall time (min)"], [[f"`{nb['name']}`", f"{nb['wall_s'] / 60:.1f}"] for nb in nbs]
                     + [["all", f"{total / 60:.1f}"]])
    return (f"# Report of the run {run_folder_name(man)}\n\n"
            f"Written by `moespec report` from this run's own files; nothing here is typed by hand. The "
            f"{what} run started {when(man.get('started'))} on {machine(man)}, torch "
            f"{man.get('versions', {}).get('torch', '?')}, profile {man.get('profile', '?')}, commit "
            f"{short_commit(man.get('git_commit'))}; its manifest holds the package versions, hardware, parameters "
            f"and seeds. The papers' published numbers appear only beside ours, labelled as theirs.\n\n" + times)


def report_text(run: RunFiles) -> str:
    """The run's report: a header (which run, its notebooks' wall times) and a section per notebook."""
    finished = _notebooks(run)
    out = [_header(run)]
    for sec in SECTIONS:
        files = _files_of(run, sec.notebook)
        if sec.notebook not in finished and not files:
            continue
        body = [f"## {sec.notebook}. {sec.title}"]
        if sec.notebook in finished:
            body.append(f"Notebook `{finished[sec.notebook]}`.")
        body += [_part(run, name, params) for name, params in sec.parts]
        figures = [f for f in files if f.endswith(".png")]
        if figures:
            body.append("Figures: " + ", ".join(f"[`{f}`]({f})" for f in figures) + ".")
        tables = [f for f in files if not f.endswith(".png")]
        if tables:
            body.append("Tables: " + ", ".join(f"`{f}`" for f in tables) + ".")
        out.append("\n\n".join(body))
    return "\n\n".join(out) + "\n"


def report_path(run: RunFiles) -> Path:
    """Where the run's report goes: beside its figures and tables."""
    return run.tables / REPORT_NAME


def write_report(run_dir: str | Path, allow_incomplete: bool = False) -> Path:
    """Write ``REPORT.md`` beside the run's figures (``runs/<run>/figures/`` or ``figures/``); returns it."""
    run = RunFiles(run_dir, allow_incomplete)
    path = report_path(run)
    io.write_text(path, report_text(run))
    return path
