"""Notebook 07's sections: paper 2 ("The Limits of Speculation") on one subject.

1. :meth:`SspOracleStudy.rounds`: speculative rounds (the engine's loop, greedy verification) on
   Spec-Bench first turns, K = 0..Kmax; per round T_T, T_D, m = K + 1, Ubar_r (eq. 5), context L,
   generation, category and the bandwidth of a reference read taken before the round's generation
   (its regime).
2. :meth:`~SspOracleStudy.regression`: eq. (4), per-K fits (Table A4), (A3), (A4) with clustered
   standard errors and GroupKFold(5) by generation, Table A2's factors, per bandwidth regime and
   over all rows; then Appendix A on the headline rows (:meth:`~SspOracleStudy.factors_by_category`,
   :meth:`~SspOracleStudy.model_by_category`, :meth:`~SspOracleStudy.budget_transfer`,
   :meth:`~SspOracleStudy.robustness`).
3. :meth:`~SspOracleStudy.oracle_inputs`: reference sequences and their junk tails (Section 4.2).
4. :meth:`~SspOracleStudy.analyses`: per cost model and per transition model, the Bellman oracle
   (eq. 8), the Lmax sweep (Figure 2), delta space (Figure 3), the alpha = 0 ablation, the online
   early-exit policy and paper 1's per-kernel cost (:func:`moespec.oracle.analysis.analyse_transitions`).
5. :meth:`~SspOracleStudy.figures`: the measured fixed-K rounds beside both oracles;
   :meth:`~SspOracleStudy.appendix_b`: where the oracle stops on our text.
6. :meth:`~SspOracleStudy.comparison`: ours beside paper 2's published scalars, the item map, the goals.

Each section writes its ``07_*`` files into the figures folder (its measurements into the data
folder ``out``) and returns a :class:`~moespec.studies.result.Result`.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io, paths, provenance
from moespec.engine import OracleDraft
from moespec.studies import goals as G
from moespec.engine.subject import routing_twin
from moespec.measure.regimes import ReferenceRead, classify, dominant, split_point
from moespec.measure.timing import FLUSH_FLOOR_BYTES
from moespec.oracle import analysis as A
from moespec.oracle import boundaries, budget, categories, gallery, robustness
from moespec.oracle import regression as R
from moespec.oracle.bellman import NegativeCostError
from moespec.oracle.junk import (junk_tails_summary, load_inputs, replayed_inputs, save_inputs,
                                 sequences_junk_tails)
from moespec.oracle.kernel_cost import bench_bandwidths, kernel_models
from moespec.oracle.record import (check_reused, load_questions, load_rounds, record_rounds, reference_sequences,
                                   save_rounds)
from moespec.oracle.rounds import fixed_k_speedups
from moespec.paper_reference import paper2_number, paper2_value
from moespec.plots import oracle as plots
from moespec.plots import oracle_appendix_a as plots_a
from moespec.plots import oracle_boundaries as plots_b
from moespec.predict.round_model import RoundModels
from moespec.tables import oracle as tables
from moespec.tables import oracle_appendix_a as tables_a
from moespec.tables.paper2_map import paper2_map
from moespec.threads import untimed_threads as untimed
from moespec.validate import run_identity

from .result import Result
from .whole_model import ROUND_MODEL_FILE

#: Share of the reference sequences held out for the online early-exit policy.
TEST_SHARE = 0.5
#: Per-kernel bandwidths (GB/s) of paper 1's cost model when no benchmark run is on disk, labelled ASSUMED.
ASSUMED_BANDWIDTHS = {"slot_GBps": 10.0, "dedup_GBps": 8.0}
#: The transition models every cost model is solved under.
TRANSITIONS = ("surrogate", "greedy")


def _span(table: pd.DataFrame, col: str) -> str:
    """``col``'s range over the reported categories (:func:`_range`), or why there is none."""
    cats = table[(table.status == "included") & (table.category != categories.POOL)]
    return _range(cats[col]) if len(cats) else "no category met the minimum"


def _category_summary(table: pd.DataFrame, col: str, what: str) -> pd.DataFrame:
    """One row: how many categories were reported and excluded, the range of ``col`` over them and the pool's value."""
    pool = table[table.category == categories.POOL]
    reported = (table.status == "included") & (table.category != categories.POOL)
    return pd.DataFrame([{"quantity": what, "categories reported": int(reported.sum()),
                          "excluded": int((table.status == "excluded").sum()),
                          "range over the categories": _span(table, col),
                          "full pool": float(pool[col].iloc[0]) if len(pool) else np.nan}])


def _ours(table: pd.DataFrame) -> pd.DataFrame:
    return table[table["source"].astype(str).str.startswith("ours")] if "source" in table else table


def _range(values) -> str:
    """'a-b' over the numeric values (4 significant digits), 'a' for one, '' for none."""
    v = pd.to_numeric(pd.Series(values), errors="coerce").dropna()
    return f"{v.min():.4g}-{v.max():.4g}" if len(v) > 1 else (f"{v.iloc[0]:.4g}" if len(v) else "")


def appendix_a_values(fig_dir: Path) -> dict:
    """Our values of the Appendix A quantities paper 2's text publishes (rows of its scalars,
    :func:`moespec.paper_reference.paper2_scalars`), read back from the files section 2's
    Appendix A wrote, for :func:`moespec.tables.oracle.ours_vs_paper`: Table A3's and A5's ranges
    over the reported categories, the leave-one-K-out mean, Table A7's range over the robustness
    checks, A.9's ladder and corr(Ubar, L). A quantity whose file was not written is left out."""
    fig_dir = Path(fig_dir)
    out = {}

    def read(name):
        path = fig_dir / name
        return _ours(pd.read_csv(path)) if path.is_file() else None

    if (a3 := read("07_tableA3_factors_by_category.csv")) is not None:
        cats = a3[(a3.status == "included") & (a3.category != categories.POOL)]
        out["tableA3_ubar_only_oos_R2_range"] = _range(cats.oos_r2_ubar)
    if (a5 := read("07_tableA5_model_by_category.csv")) is not None:
        cats = a5[(a5.status == "included") & (a5.category != categories.POOL)]
        out["tableA5_alpha_ms_per_expert_range"] = _range(cats.alpha_ms_per_expert)
        out["tableA5_c_ms_per_token_range"] = _range(cats.c_ms_per_token)
    if (loko := read("07_leave_one_k_out.csv")) is not None:
        out["leave_one_K_out_MAPE_pct_mean"] = _range(loko[loko.K.astype(str) == "mean"].mape_pct)
    if (a7 := read("07_tableA7_robustness.csv")) is not None:
        out["robustness_alpha_ms_per_expert_K8_range"] = _range(a7.alpha_ms_per_expert)
        out["robustness_c_ms_per_token_K8_range"] = _range(a7.c_ms_per_token)
    if (ladder := read("07_tableA9_ladder.csv")) is not None:
        rung = ladder.set_index("specification")
        for key, spec in (("Ubar", "Ubar"), ("Ubar_L", "Ubar + L"), ("categorical", "categorical budget (4)")):
            if spec in rung.index:
                out[f"ladder_{key}_R2"] = _range([rung.loc[spec, "r2_in"]])
                out[f"ladder_{key}_cv_MAPE_pct"] = _range([rung.loc[spec, "cv_mape_pct"]])
    diag = fig_dir / "07_tableA7_diagnostics.csv"
    if diag.is_file():
        d = pd.read_csv(diag).set_index("quantity")
        if "corr_ubar_L" in d.index:
            out["corr_ubar_L"] = str(d.loc["corr_ubar_L", d.columns[0]])
    return out


def _prefix(name: str, headline: str) -> str:
    """The file prefix of a cost model's tables: ``07_`` for the headline, ``07_cf_`` for the
    sensitivity analysis, else ``07_<name>_``."""
    if name == headline:
        return "07_"
    return "07_cf_" if name.startswith("sensitivity") else "07_" + name.replace(" ", "_").replace(",", "") + "_"


class SspOracleStudy:
    """The state of one notebook-07 run: the subject ``sub``, its run sizes ``P``
    (``moespec.notebook_profiles``, notebook "07"), the data folder ``out`` (rounds and junk tails,
    reused with ``P["reuse"]``) and figures folder ``fig_dir``, and what the sections computed so far.

    ``oracle_a``: the oracle draft's acceptance where the subject has no draft model;
    ``draft_scale``: the sensitivity analysis' factor on the draft's time."""

    def __init__(self, sub, P: dict, out, fig_dir, profile: str, device: str = "cpu", seed: int = 0, threads: int = 1,
                 untimed_threads: int = 0, backend: str = "auto", oracle_a: float = 0.7, draft_scale: float = 0.1):
        self.sub, self.P, self.out, self.fig_dir = sub, dict(P), Path(out), Path(fig_dir)
        self.profile, self.device, self.seed, self.threads = profile, device, seed, threads
        self.untimed_threads, self.backend = untimed_threads, backend
        self.oracle_a, self.draft_scale = oracle_a, draft_scale
        self.label = sub.label
        self.started = dt.datetime.now(dt.timezone.utc)
        self.notes = []
        if sub.draft is None and self.P["repeats"] > 1:
            self.notes.append(f"repeats = 1 (profile value {self.P['repeats']} does not apply: the oracle draft's "
                              "draws cannot be re-run)")
            self.P["repeats"] = 1
        qs = load_questions(per_category=self.P["round_questions_per_category"])[:self.P["round_categories"]]
        oq = load_questions(self.P["oracle_categories"], per_category=self.P["oracle_questions"])
        self.round_prompts = [{**q, "ids": ids} for q, ids in zip(
            qs, sub.question_prompts([q["text"] for q in qs], self.P["prompt_tokens"], seed))]
        self.oracle_prompts = [{**q, "ids": ids} for q, ids in zip(
            oq, sub.question_prompts([q["text"] for q in oq], self.P["prompt_tokens"], seed + 1))]
        # the regime read: the machine's cold size (quick: the paper's 256 MiB floor, for seconds)
        self.ref = ReferenceRead(FLUSH_FLOOR_BYTES if self.profile == "quick" else None, device=device)
        self.hw = provenance.hardware_record()
        self.sensitivity = f"sensitivity: draft x{draft_scale:g}"

    # --- helpers -----------------------------------------------------------------------------
    def _write(self, name: str, df: pd.DataFrame) -> str:
        io.write_dataframe(self.fig_dir / name, run_identity.stamp_frame(df))
        return name

    def _figure(self, name: str, fig) -> str:
        io.save_figure(fig, self.fig_dir / name)
        return name

    def describe(self) -> list[str]:
        """The subject, its shape and the run sizes, one line each."""
        cfg = self.sub.target.config
        return [f"subject: {self.label}", *(f"  {key}: {value}" for key, value in self.sub.description.items()),
                f"profile={self.profile}; N={self.sub.description['expert_shape'][0]}, m={cfg.num_experts_per_tok}, "
                f"{self.sub.engine.num_layers} MoE layers, context {self.sub.context}; torch threads {self.threads}",
                *self.notes]

    # --- 1. rounds ---------------------------------------------------------------------------
    def rounds(self) -> Result:
        """Speculative rounds at every K (reused from ``rounds.csv`` with ``P["reuse"]``), their
        bandwidth regimes and ``07_rounds_summary.csv``."""
        P, lines = self.P, []
        rounds_path = self.out / "rounds.csv"
        if P["reuse"] and rounds_path.is_file():
            rounds = load_rounds(rounds_path)
            check_reused(rounds_path, zip(rounds.question_id, rounds.K),
                         [(q["question_id"], k) for q in self.round_prompts for k in P["round_ks"]], "rounds")
            lines.append(f"rounds reused from {rounds_path} (delete it or pass reuse=False to measure again)")
        else:
            t0 = time.perf_counter()
            drafter = (OracleDraft(self.sub.engine, self.oracle_a, self.sub.vocab_size, seed=self.seed)
                       if self.sub.draft is None else None)
            rounds, _ = record_rounds(self.sub.engine, self.sub.draft, self.round_prompts, ks=P["round_ks"],
                                      n_tokens=P["round_tokens"], repeats=P["repeats"], threads=self.threads,
                                      dedup=True, reference=self.ref, drafter=drafter)
            save_rounds(rounds, rounds_path)
            io.write_json(self.out / "rounds_provenance.json", {
                **provenance.full_record(), "started": self.started.isoformat(), "wall_s": time.perf_counter() - t0,
                "dedup": True, "repeats": P["repeats"], "threads": self.threads, "subject": self.label})
            lines.append(f"measured {len(rounds)} rounds in {time.perf_counter() - t0:.0f} s")
        bw = rounds["ref_GBps"].to_numpy(float) if "ref_GBps" in rounds else np.full(len(rounds), np.nan)
        threshold = None if np.isnan(bw).all() else split_point(bw)
        rounds["regime"] = "one" if threshold is None else classify(bw, threshold)
        self.main = dominant(rounds["regime"])
        self.rounds_table = rounds
        summary = rounds.groupby(["regime", "K"]).agg(
            rounds=("T_T_ms", "size"), generations=("gen_id", "nunique"), T_T_median_ms=("T_T_ms", "median"),
            T_D_median_ms=("T_D_ms", "median"), ubar_mean=("ubar", "mean"), accepted_mean=("accepted", "mean"))
        files = [self._write("07_rounds_summary.csv", summary.reset_index().assign(subject=self.label))]
        lines.append(f"rounds: {len(rounds)} in {rounds.gen_id.nunique()} generations; categories "
                     f"{rounds.category.nunique()}; bandwidth regimes (threshold {threshold} GB/s): "
                     f"{rounds.groupby('regime').gen_id.nunique().to_dict()} generations; dominant {self.main!r}")
        medians = rounds.groupby("K")[["T_T_ms", "T_D_ms", "ubar", "accepted"]].median().round(3).reset_index()
        return Result(lines, {"medians per K": medians}, files)

    # --- 2. cost regression ------------------------------------------------------------------
    def regression(self) -> Result:
        """Eq. (4), Table A4, (A3), (A4) and Table A2 per bandwidth regime and over all rows; the
        headline fit is the dominant regime's (all rows where there is one regime)."""
        rounds, label, lines = self.rounds_table, self.label, []
        fits = {"all rows": R.fit_rounds(rounds, "all rows")}
        for regime in sorted(set(rounds["regime"]) - {"one"}):
            try:
                fits[f"regime {regime}"] = R.fit_rounds(rounds[rounds.regime == regime], f"regime {regime}")
            except ValueError as exc:
                lines.append(f"regime {regime}: no regression ({exc})")
        headline = fits.get(f"regime {self.main}", fits["all rows"])
        self.fits, self.headline = fits, headline
        regression = pd.DataFrame([f.summary() for f in fits.values()]).assign(subject=label)
        files = [self._write("07_regression_by_regime.csv", regression),
                 self._write("07_tableA4_per_k.csv", pd.concat([f.per_k.assign(rows=k) for k, f in fits.items()],
                                                               ignore_index=True).assign(subject=label)),
                 self._write("07_eq4_categorical.csv",
                             R.categorical_table(headline.categorical).assign(rows=headline.label)),
                 self._write("07_tableA6_models.csv", tables.model_comparison(
                     [headline.categorical, headline.pooled, headline.target_cost, headline.draft])
                     .assign(rows=headline.label)),
                 self._write("07_tableA2_factors.csv", headline.factors.assign(rows=headline.label)),
                 self._write("07_coefficients.csv", pd.concat(
                     [tables.coefficients(f) for f in (headline.pooled, headline.target_cost, headline.draft)],
                     ignore_index=True).assign(rows=headline.label))]
        # the headline fit's rows, and their speculative rounds (Appendix A's rows)
        self.headline_rounds = rounds if headline.label == "all rows" else rounds[rounds.regime == self.main]
        self.spec_rounds = self.headline_rounds[self.headline_rounds.K >= 1]
        a_d, b_d = R.coefficient(headline.draft, "K")[0], R.coefficient(headline.draft, "Intercept")[0]
        self.draft_ms_per_token = a_d
        files += [self._figure("07_fig1_rounds_by_k.png", plots.fig_rounds_by_k(
                      self.spec_rounds, headline.per_k, title=f"T_T vs Ubar_r per K ({headline.label}) — {label}")),
                  self._figure("07_figA6_draft_time.png", plots.fig_draft_time(self.spec_rounds, a_d, b_d))]
        for f in fits.values():
            lines.append(f"[{f.label}] eq. (4) in-sample R2 = {f.categorical.r2:.4f}, GroupKFold MAPE = "
                         f"{f.categorical.cv.mape_pct.mean():.2f}%; draft (A4): T_D = "
                         f"{R.coefficient(f.draft, 'K')[0]:.4f} K + {R.coefficient(f.draft, 'Intercept')[0]:.4f} ms")
            for fit in (f.target_cost, f.draft):
                if fit.held_at_zero:
                    lines.append(f"[{f.label}] {fit.name}: held at 0 (a time cannot be negative): " + ", ".join(
                        f"{term} (OLS alone gives {value:.4g})" for term, value in fit.held_at_zero.items()))
        ar = self.headline_rounds[self.headline_rounds.K == 0]
        if len(ar):
            tc = headline.target_cost
            pred = (R.coefficient(tc, "Intercept")[0] + R.coefficient(tc, "ubar")[0] * ar.ubar
                    + R.coefficient(tc, "L")[0] * ar.L)
            lines += [f"autoregressive passes (K = 0, {headline.label}): measured median T_T {ar.T_T_ms.median():.3f} "
                      f"ms, t_target predicts {pred.median():.3f} ms",
                      f"a drafted token over a target pass ({headline.label}): {a_d:.4f} ms / "
                      f"{ar.T_T_ms.median():.3f} ms = {a_d / ar.T_T_ms.median():.3f}"]
        per_k = headline.per_k[["K", "alpha_ms_per_expert", "alpha_se", "beta0_ms", "c_ms_per_token", "r2_in",
                                "cv_mape_pct"]].round(5)
        shown = regression.drop(columns="subject").round(4).set_index("rows").T.reset_index(names="quantity")
        return Result(lines, {"fits by rows": shown, f"Table A4 ({headline.label})": per_k,
                              f"Table A2 ({headline.label})": headline.factors.round(4)}, files)

    # --- 2b. Appendix A on the headline rows --------------------------------------------------
    def factors_by_category(self) -> Result:
        """Table A1 (``07_tableA1_dataset.csv``), Table A3 (``07_tableA3_factors_by_category.csv``)
        and Figure A1 (``07_figA1_r2_by_category.png``)."""
        spec, subject = self.spec_rounds, self.label
        files = [self._write("07_tableA1_dataset.csv", tables_a.table_a1(spec, subject))]
        a3 = categories.factor_importance_by_category(spec)
        files += [self._write("07_tableA3_factors_by_category.csv", tables_a.table_a3(a3.assign(subject=subject))),
                  self._figure("07_figA1_r2_by_category.png", plots_a.fig_a1_r2_by_category(a3))]
        return Result(tables={"Table A3": _category_summary(a3, "oos_r2_ubar", "Table A3: held-out R2 of T_T ~ Ubar")},
                      files=files)

    def model_by_category(self) -> Result:
        """Table A5 (``07_tableA5_model_by_category.csv``), Figures A3 and A4."""
        a5 = categories.model_by_category(self.spec_rounds)
        files = [self._write("07_tableA5_model_by_category.csv", tables_a.table_a5(a5.assign(subject=self.label))),
                 self._figure("07_figA3_alpha_by_category.png", plots_a.fig_a3_alpha_by_category(a5)),
                 self._figure("07_figA4_metrics_by_category.png", plots_a.fig_a4_metrics_by_category(a5))]
        summary = pd.concat([
            _category_summary(a5, "alpha_ms_per_expert", "Table A5: alpha at the largest K (ms per expert)"),
            _category_summary(a5, "cv_mape_pct", "Table A5: held-out MAPE (%)")], ignore_index=True)
        return Result(tables={"Table A5": summary}, files=files)

    def budget_transfer(self) -> Result:
        """Figure A5 and its table (``07_figA5_pooled_vs_per_k.png``, ``07_figA5_pooled_by_k.csv``)
        and leave-one-K-out of the pooled form (``07_leave_one_k_out.csv``)."""
        spec, subject = self.spec_rounds, self.label
        per_k = budget.pooled_by_k(spec)
        files = [self._write("07_figA5_pooled_by_k.csv", tables_a.table_pooled_by_k(per_k.assign(subject=subject))),
                 self._figure("07_figA5_pooled_vs_per_k.png", plots_a.fig_a5_pooled_vs_per_k(spec, per_k))]
        loko = budget.leave_one_k_out(spec)
        files.append(self._write("07_leave_one_k_out.csv",
                                 tables_a.table_leave_one_k_out(loko.assign(subject=subject))))
        return Result(tables={"leave one K out": loko[["K", "rounds_held_out", "mape_pct", "mape_lo", "mape_hi"]]},
                      files=files)

    def robustness(self, n_boot: int = robustness.N_BOOT) -> Result:
        """Table A7 and Figure A7 (``07_tableA7_robustness.csv``, ``07_figA7_robustness.png``), the
        binned residuals (``07_tableA7_residual_bins.csv``, ``07_figA7_residual_bins.png``), the
        Breusch-Pagan tests (eq. (4) on all speculative rounds, the per-K model on the largest-K
        rounds) and corr(Ubar_r, L) (``07_tableA7_diagnostics.csv``), and A.9's ladder on all
        speculative rounds (``07_tableA9_ladder.csv``)."""
        spec, subject = self.spec_rounds, self.label
        robust = robustness.robustness_table(spec, n_boot=n_boot, seed=self.seed)
        files = [self._write("07_tableA7_robustness.csv", tables_a.table_a7(robust.assign(subject=subject))),
                 self._figure("07_figA7_robustness.png", plots_a.fig_a7_robustness(robust))]
        top = robustness.largest_k_rounds(spec)
        bins = robustness.binned_residuals(top)
        files += [self._write("07_tableA7_residual_bins.csv", bins.assign(subject=subject)),
                  self._figure("07_figA7_residual_bins.png", plots_a.fig_binned_residuals(bins))]
        diagnostics = tables_a.diagnostics(robustness.breusch_pagan(spec, robustness.CATEGORICAL_WITH_CONSTANT),
                                           robustness.breusch_pagan(top), int(top.K.iloc[0]),
                                           float(np.corrcoef(spec.ubar, spec.L)[0, 1]))
        files += [self._write("07_tableA7_diagnostics.csv", diagnostics.assign(subject=subject)),
                  self._write("07_tableA9_ladder.csv", tables_a.table_ladder(
                      robustness.specification_ladder(spec).assign(subject=subject)))]
        shown = robust[["method", "alpha_ms_per_expert", "alpha_ms_per_expert_lo", "alpha_ms_per_expert_hi",
                        "c_ms_per_token", "c_ms_per_token_lo", "c_ms_per_token_hi"]]
        return Result(tables={"Table A7": shown}, files=files)

    # --- 3. the oracle's inputs --------------------------------------------------------------
    def oracle_inputs(self) -> Result:
        """The reference sequences' junk tails (reused from ``oracle_inputs.npz`` with
        ``P["reuse"]``; from the trace for a replayed subject), split into the online policy's
        training and held-out sequences."""
        P, sub, lines = self.P, self.sub, []
        inputs_path = self.out / "oracle_inputs.npz"
        if P["reuse"] and inputs_path.is_file():
            items = load_inputs(inputs_path)
            check_reused(inputs_path, [(it.seq_id, it.n, it.lmax) for it in items],
                         [(str(p["question_id"]), P["oracle_tokens"], P["lmax"]) for p in self.oracle_prompts],
                         "oracle inputs")
            lines.append(f"junk tails reused from {inputs_path}")
        elif sub.replay is not None:
            items = []
            for p in self.oracle_prompts:
                sub.engine.prefill(p["ids"])        # selects the prompt's trace document
                items.append(replayed_inputs(sub.replay, len(p["ids"]), P["oracle_tokens"], P["lmax"], self.oracle_a,
                                             seq_id=str(p["question_id"]), category=p["category"]))
            save_inputs(items, inputs_path)
            lines.append(f"replayed routing: U from the trace, draft confidence a = {self.oracle_a} at every position; "
                         "the oracle draft replaces each drafted token independently with probability 1 - a, so its "
                         "exact (greedy-verification) transitions are the surrogate's: greedy = a")
        else:
            t0 = time.perf_counter()
            threads = untimed(self.untimed_threads)
            refs = reference_sequences(sub.engine, self.oracle_prompts, P["oracle_tokens"], threads=threads)
            twin = routing_twin(sub, self.profile, backend=self.backend)
            items, agreement = sequences_junk_tails(sub.target, sub.draft, self.oracle_prompts, refs, lmax=P["lmax"],
                                                    seed=self.seed, threads=threads,
                                                    twin=None if twin is None else twin.model)
            save_inputs(items, inputs_path)
            io.write_json(self.out / "junk_tails_provenance.json", {
                **provenance.full_record(), "subject": self.label, "wall_s": time.perf_counter() - t0,
                "twin_agreement": agreement})
            lines.append(junk_tails_summary(items, agreement, time.perf_counter() - t0, threads))
        self.items = items
        self.train, self.test = A.split_sequences(items, test_share=TEST_SHARE, seed=self.seed)
        p, greedy = (np.mean(np.concatenate([getattr(it, name) for it in items])) for name in ("p", "greedy"))
        lines.append(f"{len(items)} sequences, {sum(it.n for it in items)} positions; mean draft confidence p = "
                     f"{p:.3f} (surrogate), share of positions where the draft's argmax is the reference token "
                     f"{greedy:.3f} (greedy-exact); held out {len(self.test)} of them")
        return Result(lines)

    # --- 4. the analysis per cost model ------------------------------------------------------
    def _kernel_bandwidths(self) -> dict:
        """Per-kernel bandwidths of paper 1's cost model: this run's engine benchmark, else the
        newest expert-operation run of the subject's shape, else :data:`ASSUMED_BANDWIDTHS`."""
        found = (bench_bandwidths(prefer=("engine-" + self.sub.kind,),
                                  folder=paths.run_data_dir() / "engine" / self.profile / "bench")
                 or bench_bandwidths(prefer=(self.sub.description.get("like", "default"), "default", "olmoe")))
        return found or {**ASSUMED_BANDWIDTHS, "source": "ASSUMED values (no benchmark run on disk)"}

    def analyses(self) -> Result:
        """Every cost model (the fitted one of each regime, notebook 05's round model when this
        run has one, and the sensitivity analysis of a draft ``draft_scale`` times as expensive)
        solved under both transition models; each analysis' tables written with its prefix
        (:func:`_prefix`) and ``07_cost_models_overview.csv``."""
        sub, headline, lines, files = self.sub, self.headline, [], []
        bw = self._kernel_bandwidths()
        expert_bytes = float(sub.description["expert_bytes"])
        models = {name: A.cost_model_from_fits(f.target_cost, f.draft, label=f"fitted, {name}")
                  for name, f in self.fits.items()}
        round_model_path = self.fig_dir / ROUND_MODEL_FILE
        if round_model_path.exists():   # notebook 05's file of this run, not one copied from another
            run_identity.check_of_this_run([run_identity.of_file(round_model_path)])
        round_cost = (A.round_cost_model(RoundModels.load(round_model_path), models[headline.label],
                                         self.headline_rounds) if round_model_path.exists() else None)
        self.oracle_headline = round_cost.label if round_cost is not None else headline.label
        if round_cost is not None:
            models[self.oracle_headline] = round_cost
            lines.append(f"the oracle's cost model: {self.oracle_headline} (levels tau(m) + h(m - 1) and t_draft(k) "
                         f"from notebook 05's round model; alpha = {round_cost.alpha:.4g} ms and c = "
                         f"{round_cost.c:.3g} ms/token from the regression, around the rounds' mean union per m)")
        else:
            lines.append(f"the oracle's cost model: {self.oracle_headline} (no round model of notebook 05 in this "
                         "run: the regression's fitted levels)")
        models[self.sensitivity] = models[self.oracle_headline].with_draft_scale(self.draft_scale)
        analyses = {}
        for name, cm in models.items():
            kernels = kernel_models(cm, sub.engine.num_layers, expert_bytes, sub.target.config.num_experts_per_tok,
                                    bw["slot_GBps"], bw["dedup_GBps"])
            try:
                analyses[name] = A.analyse_transitions(self.items, cm, self.train, self.test, self.P["lmax"], kernels,
                                                       label=name)
            except NegativeCostError as exc:       # a regime's fit on few rounds can predict a negative time
                if name in (self.oracle_headline, self.sensitivity):
                    raise
                lines.append(f"cost model {name!r} not solved: {exc}")
                continue
            prefix = _prefix(name, self.oracle_headline)
            for tname, table in A.merged_tables(analyses[name].values()).items():
                if isinstance(table, dict):
                    io.write_json(self.fig_dir / f"{prefix}{tname}.json", run_identity.stamp_doc(
                        {**table, "subject": self.label, "analysis": name}))
                    files.append(f"{prefix}{tname}.json")
                else:
                    files.append(self._write(f"{prefix}{tname}.csv", table.assign(subject=self.label, analysis=name)))
        self.analyses_by_model = analyses
        lines.append(f"per-kernel bandwidths: slot {bw['slot_GBps']:.3g} GB/s, dedup {bw['dedup_GBps']:.3g} GB/s — "
                     f"{bw['source']}")
        overview = A.cost_models_overview(analyses)
        files.append(self._write("07_cost_models_overview.csv", overview.assign(subject=self.label)))
        return Result(lines, {"cost models": overview.round(4)}, files)

    # --- 5. figures and the measured fixed-K rounds ------------------------------------------
    def figures(self) -> Result:
        """The measured fixed-K rounds (``07_measured_fixed_k.csv``) and, for the measured cost
        model and the sensitivity analysis, Figures 2 and 3, the online policy and the measured
        rounds beside the oracle; per transition model the oracle's totals, its Lmax sweep, fixed
        k, delta space and the held-out online policy."""
        label, lmax, lines, tables_shown = self.label, self.P["lmax"], [], {}
        paper_plateau = {"speedup": paper2_number("oracle_speedup_plateau"),
                         "mean_draft_length": paper2_number("oracle_mean_draft_length"),
                         "mean_accepted_length": paper2_number("oracle_mean_accepted_length")}
        measured = fixed_k_speedups(self.headline_rounds, seed=self.seed)
        self.measured = measured
        files = [self._write("07_measured_fixed_k.csv", measured.assign(subject=label, rows=self.headline.label))]
        lines.append(f"measured fixed-K rounds ({self.headline.label}; host time included: "
                     f"{bool(measured.host_included.iloc[0])}): table 'measured fixed K'")
        tables_shown["measured fixed K"] = measured.drop(columns="host_included").round(3)
        for name, prefix, what in ((self.oracle_headline, "07_", f"measured cost ({self.oracle_headline})"),
                                   (self.sensitivity, "07_cf_",
                                    f"sensitivity analysis: draft time x{self.draft_scale:g}, not a measurement")):
            by_t = self.analyses_by_model[name]
            merged = A.merged_tables(by_t.values())
            files += [
                self._figure(f"{prefix}fig2_lmax_sweep.png", plots.fig_lmax_sweep(
                    merged["fig2_lmax_sweep"], paper_plateau, title=f"Oracle vs Lmax, {what} — {label}")),
                self._figure(f"{prefix}fig3_delta_space.png", plots.fig_delta_space(
                    {t: r.points for t, r in by_t.items()}, {t: r.bound for t, r in by_t.items()}, seed=self.seed,
                    title=f"Delta space, {what}")),
                self._figure(f"{prefix}online_policy.png", plots.fig_online_policy(
                    merged["online_policy"], title=f"Online early exit vs oracle, {what} (held-out)")),
                self._figure(f"{prefix}oracle_vs_measured.png", plots.fig_oracle_vs_measured(
                    merged["fig2_lmax_sweep"], measured, merged["fixed_k"],
                    title=f"Measured fixed-K rounds beside the oracle, {what} — {label}"))]
            for t, r in by_t.items():
                o = r.online_info
                lines += [
                    f"[{what}, {t}] oracle speedup (Lmax={lmax}): {r.totals['speedup']:.3f}; mean draft length "
                    f"{r.totals['mean_draft_length']:.2f}; mean accepted length {r.totals['mean_accepted_length']:.2f}",
                    f"[{what}, {t}] quadrant I {r.quadrants['I']}, II {r.quadrants['II']}, III {r.quadrants['III']}, "
                    f"IV {r.quadrants['IV']}; slope {r.bound['slope_ms_per_token']:.4f} ms/token, quadrant-III "
                    f"crossing {r.bound['q3_crossing_line']} of {r.bound['n_q3']}; "
                    + (f"alpha = 0 changes k at {100 * r.ablation['share_changed']:.1f}% of positions"
                       if r.ablation["defined"] else f"alpha = 0 ablation: {r.ablation['reason']}"),
                    f"[{what}, {t}] held-out ({o['test_sequences']} sequences): oracle {o['oracle']:.3f}, online early "
                    f"exit {o['online']:.3f} ({100 * o['online'] / o['oracle']:.1f}% of the oracle), best fixed k on "
                    f"train (k={o['k_best_train']}) {o['fixed_best_train']:.3f}"]
                tables_shown[f"[{what}, {t}] Lmax sweep"] = r.sweep.round(3)
                fixed = f"[{what}, {t}] fixed k on all sequences (the model's own prediction of fixed-K rounds)"
                tables_shown[fixed] = r.fixed[["k", "speedup", "mean_accepted_length"]].round(3)
                tables_shown[f"[{what}, {t}] per-kernel cost models"] = r.kernels.round(4)
        return Result(lines, tables_shown, files)

    # --- 5b. Appendix B ----------------------------------------------------------------------
    def appendix_b(self, n_boot: int = 999) -> Result:
        """Appendix B for the headline cost model under both transition models: the label counts,
        Figure B3's and B5's tables, the B4 cases and the gallery (``07_tableB*``, ``07_figB*``).
        Inputs without tokens (replayed routing) have no text: ``07_tableB_status.json`` says why."""
        items, lmax, subject = self.items, self.P["lmax"], self.label
        by_transitions = self.analyses_by_model[self.oracle_headline]
        without = [it for it in items if it.tokens is None or it.draft_chain is None]
        if without:
            try:
                without[0].require_tokens("Appendix B (the text of the reference)")
            except ValueError as exc:
                io.write_json(self.fig_dir / "07_tableB_status.json",
                              run_identity.stamp_doc({"computed": False, "reason": str(exc), "subject": subject}))
                return Result(["wrote 07_tableB_status.json", f"Appendix B not computed: {exc}"],
                              files=["07_tableB_status.json"])
        B = boundaries.appendix_b(items, by_transitions, self.sub.tokenizer, n_boot=n_boot, seed=self.seed)
        io.write_json(self.fig_dir / "07_tableB_status.json", run_identity.stamp_doc({
            "computed": True, "tokenizer": self.sub.tokenizer is not None, "lmax": lmax, "n_boot": n_boot,
            "seed": self.seed, "responses": len(items), "decisions": sum(it.n for it in items), "subject": subject}))
        surrogate = {it.seq_id: it.p for it in items}
        cases = {t: gallery.b4_cases(a.changed, surrogate=surrogate) for t, a in by_transitions.items()}
        picks = {t: gallery.gallery(B.decisions[t], lmax) for t in by_transitions}
        new = {it.seq_id: boundaries.new_experts(it.U, it.top_k)[:, :, it.lmax] for it in items}
        reasons = {t: a.ablation.get("reason", "") for t, a in by_transitions.items()
                   if not a.ablation.get("defined", True)}
        files = ["07_tableB_status.json"] + [self._write(name, df.assign(subject=subject)) for name, df in (
            ("07_tableB_label_counts.csv", B.label_counts), ("07_tableB3_k_by_context.csv", B.b3),
            ("07_tableB5_new_experts.csv", B.b5),
            ("07_tableB4_cases.csv", pd.concat([c.assign(transitions=t) for t, c in cases.items()], ignore_index=True)),
            ("07_tableB_gallery.csv", pd.concat([p.assign(transitions=t) for t, p in picks.items()],
                                                ignore_index=True)))]
        files += [self._figure("07_figB3_k_by_context.png",
                               plots_b.fig_b3(B.b3, title=f"Figure B3 analogue (Lmax = {lmax}) — {subject}")),
                  self._figure("07_figB5_new_experts.png",
                               plots_b.fig_b5(B.b5, title=f"Figure B5 analogue — {subject}")),
                  self._figure("07_figB4_alpha0_cases.png", plots_b.fig_b4(
                      B, cases, new, lmax, title=f"Figure B4 analogue — {subject}", reasons=reasons)),
                  self._figure("07_figB_gallery.png", plots_b.fig_gallery(
                      B, picks, lmax, title=f"Gallery (B1/B2/B6/B7 analogues, Lmax = {lmax}) — {subject}"))]
        counts = B.label_counts
        lines = [f"wrote {', '.join(files)}",
                 "positions per context label: " + "; ".join(f"{r.label} {r.positions}" for r in counts.itertuples())]
        if absent := [r.label for r in counts.itertuples() if r.positions == 0]:
            lines.append(f"no such position in our text: {', '.join(absent)}")
        for r in B.b5.itertuples():
            lines.append(f"B5 {r.comparison} [{r.transitions}]: " + (
                f"event {r.event:.2f} vs {r.other:.2f}, difference {r.difference:+.2f} [{r.difference_lo:+.2f}, "
                f"{r.difference_hi:+.2f}] ({r.events} events)" if r.events else r.note))
        lines.append("B4 cases drawn (alpha = 0 drafts k* + 1): " + "; ".join(f"{t} {len(c)}" for t, c in cases.items())
                     + f"; gallery cases: {sum(len(p) for p in picks.values())}")
        summary = B.b3[["transitions", "label", "decisions", "responses", "share_k1", "share_k4plus", "mean_k"]]
        return Result(lines, {"k* by context": summary[summary.decisions > 0].round(3)}, files)

    # --- 6. ours beside paper 2 --------------------------------------------------------------
    def comparison(self) -> Result:
        """``07_paper2_comparison.csv`` (our per-K fits beside paper 2's per-K ranges, our pooled
        fits beside its full-pool values, Appendix A's values read back from section 2's files),
        ``07_paper2_map.csv`` (every paper 2 item: our file, ours vs theirs, the verdict) and
        ``07_goals.csv``."""
        headline, label = self.headline, self.label
        hl = self.analyses_by_model[self.oracle_headline]
        ours = {**tables.paper2_comparison_values(headline, {t: r.sweep for t, r in hl.items()}, self.P["lmax"]),
                **appendix_a_values(self.fig_dir)}
        cmp = tables.ours_vs_paper(ours).assign(subject=label, rows=headline.label)
        files = [self._write("07_paper2_comparison.csv", cmp)]
        item_map = paper2_map(self.fig_dir, cmp)     # the files this run wrote for each item
        files.append(self._write("07_paper2_map.csv", item_map.assign(subject=label)))
        goals = pd.concat([G.paper2_goals(headline.summary(), hl["surrogate"].online_info),
                           G.oracle_bound_goal(hl["greedy"].totals["speedup"], self.measured)],
                          ignore_index=True).assign(subject=label)
        files.append(self._write("07_goals.csv", goals))
        lines = [f"machine: {self.hw['cpu'].get('cpu_model', 'unknown CPU')}; finished "
                 f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"]
        return Result(lines, {"ours beside paper 2": cmp.drop(columns=["subject", "rows"]),
                              "paper 2 items": item_map[["paper 2 item", "verdict"]],
                              "goals": goals.drop(columns="subject")}, files)

    # --- closing summary ---------------------------------------------------------------------
    def summary(self) -> str:
        """What the run shows, in one paragraph of markdown, every number from this run's tables."""
        headline, hl, lmax = self.headline, self.analyses_by_model[self.oracle_headline], self.P["lmax"]
        per_k = headline.per_k
        cf = self.analyses_by_model[self.sensitivity]["surrogate"]
        spec = self.measured[self.measured.K >= 1]
        best = spec.loc[spec.speedup.idxmax()]
        s, g = hl["surrogate"], hl["greedy"]
        return (
            f"**{self.profile} profile, {self.label}.** Paper 2 on this machine: {headline.rounds} measured rounds; "
            f"the verification-cost regression's in-sample R² per K is {per_k.r2_in.min():.2f}-"
            f"{per_k.r2_in.max():.2f} and its out-of-sample MAPE {per_k.cv_mape_pct.min():.1f}-{per_k.cv_mape_pct.max():.1f} % (paper 2 per "
            f"K: {paper2_value('in_sample_R2_per_K')} and {paper2_value('oos_MAPE_per_K_pct')} %); pooled over K, "
            f"R² {headline.categorical.r2:.3f} and MAPE {headline.categorical.cv.mape_pct.mean():.1f} % (paper 2 on "
            f"its full pool: {paper2_value('pooled_eq4_R2')} and {paper2_value('pooled_eq4_cv_MAPE_pct')} %). A "
            f"drafted token costs {self.draft_ms_per_token:.2g} ms. With paper 2's surrogate transitions the Bellman "
            f"oracle's speedup reaches {s.sweep.speedup.iloc[-1]:.3f} at Lmax = {lmax} (mean draft length "
            f"{s.sweep.mean_draft_length.iloc[-1]:.2f}, accepted {s.sweep.mean_accepted_length.iloc[-1]:.2f}); with "
            f"the greedy-exact transitions, what the engine's greedy verification of a greedy draft accepts, "
            f"{g.sweep.speedup.iloc[-1]:.3f} (draft length {g.sweep.mean_draft_length.iloc[-1]:.2f}, accepted "
            f"{g.sweep.mean_accepted_length.iloc[-1]:.2f}). The measured fixed-K rounds reach at best "
            f"{best.speedup:.3f} [{best.speedup_lo:.3f}, {best.speedup_hi:.3f}] at K = {int(best.K)} (accepted "
            f"{best.accepted_per_round:.2f} per round). The online early-exit policy reaches "
            f"{100 * s.online_info['online'] / s.online_info['oracle']:.0f} % (surrogate) and "
            f"{100 * g.online_info['online'] / g.online_info['oracle']:.0f} % (greedy-exact) of the oracle on "
            f"held-out sequences (with the draft time scaled by {self.draft_scale:g}, a labelled sensitivity "
            f"analysis, the surrogate oracle reaches {cf.sweep.speedup.iloc[-1]:.3f}).")
