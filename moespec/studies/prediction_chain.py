"""Notebook 06's sections: chain (22) of paper 1 (Section 4 and 4.4; Tables 3, 4, 7, 8; Figures 4-6)
against notebook 05's whole-model runs, in every machine state notebook 05 measured.

Per state: the expert operation of each of the engine's own layers timed alone (chosen ids and
windows of recorded WikiText routing; :func:`moespec.engine.operation.bench_engine`) under the same
declared load (:func:`moespec.measure.load.machine_state`), the fits (4)/(E.1) and eps, then the
chain's four versions scored against that state's round models (verify passes timed inside decode
loops; :mod:`moespec.predict.scoring`). The scoring rules are read unchanged from the subject's
pre-registration.
"""

from __future__ import annotations


import numpy as np
import pandas as pd

from moespec import corpus, fit, io, predict
from moespec.engine.operation import bench_engine, record_trace_on_twin
from moespec.engine.subject import routing_twin
from moespec.measure import discard
from moespec.measure.expert_op import load_rows
from moespec.measure.load import machine_state
from moespec.plots.predictions import figure4_saving, figure5_kstar, figure6_verify
from moespec.plots.routing import figure3_right
from moespec.predict.round_model import RoundModels
from moespec.routing import RoutingTrace, distinct_share_against, mean_union
from moespec.tables import predictions as T
from moespec.threads import torch_threads
from moespec.threads import untimed_threads as threads_for_untimed
from moespec.validate import run_identity
from moespec.validate.run_identity import stamp_frame as stamp

from . import goals as G
from .result import Result, table
from .whole_model import ROUND_MODEL_FILE, read_run


class PredictionChainStudy:
    """One notebook-06 run on notebook 05's run (``out`` holds its ``run.json`` and rows; its
    figures folder ``fig_dir`` holds the round-model file)."""

    def __init__(self, sub, P: dict, out, fig_dir, profile: str, device: str = "cpu", seed: int = 0,
                 backend: str = "auto", untimed_threads: int = 0):
        self.sub, self.P, self.out, self.fig_dir = sub, P, out, fig_dir
        self.untimed_threads = threads_for_untimed(untimed_threads)   # threads of the untimed routing record
        self.profile, self.device, self.seed, self.backend = profile, device, seed, backend
        self.label = sub.label
        self.run = read_run(out)
        self.round_models = RoundModels.load(fig_dir / ROUND_MODEL_FILE)
        run_identity.check_of_this_run([run_identity.of_file(fig_dir / ROUND_MODEL_FILE)])   # not another run's
        self.rules = predict.load_rules(sub.rules_file)
        self.rules_prov = predict.rules_provenance(sub.rules_file)
        self.m = sub.target.config.num_experts_per_tok
        self.engine_label = f"moespec {device}"
        self.states = [s for s in self.run.get("sizes", {}).get("states", ["quiet"]) if s in self.round_models.states]
        self.results: dict = {}

    def wiki_routing(self) -> Result:
        """The routing of the fits: WikiText test fit documents recorded through the engine (or the
        replayed trace itself)."""
        if self.sub.replay is not None:
            self.wiki = self.sub.replay.trace
            line = f"routing of the fits: the replayed trace itself ({self.wiki.label})"
        else:
            if self.sub.tokenizer is not None:
                arts = corpus.articles("test")
                docs = corpus.tokenize([arts[i] for i in corpus.fit_documents(arts)], self.sub.tokenizer)[:self.P["wiki_docs"]]
            else:
                rng = np.random.default_rng(self.seed + 1)
                docs = [rng.integers(1, self.sub.vocab_size, size=60) for _ in range(self.P["wiki_docs"])]
            with torch_threads(self.untimed_threads):
                twin = routing_twin(self.sub, self.profile, self.backend)
                self.wiki, ran = record_trace_on_twin(self.sub.engine, twin, docs, self.P["context"] or self.sub.context,
                                                      source="WikiText test fit documents, recorded by the engine")
            on = {"twin": " (on its narrow twin, whose routing of the first segment is the engine's, expert for "
                          "expert)", "engine": " (its narrow twin routed the first segment otherwise: not used)",
                  None: ""}[ran]
            line = (f"routing of the fits: {self.wiki.num_docs} WikiText test fit documents recorded by the engine"
                    f"{on} on {self.untimed_threads} torch thread(s) (not timed)")
        self.wiki.save(self.out / "routing_wikitext.npz")
        return Result([line])

    def distinct_share(self, ns=(2, 4, 6, 8), resamples: int = 2000) -> Result:
        """Figure 3 (right) of paper 1: the distinct share U/(nm) of the text notebook 05's oracle
        runs verified (its ``routing_text_d*.npz``, recorded in the quiet state) against that of
        the fits' WikiText routing (:meth:`wiki_routing`), per depth and n, with document-level
        bootstrap intervals; writes 06_fig3_right.csv and .png."""
        files = sorted(self.out.glob("routing_text_d*.npz"), key=lambda f: int(f.stem.rsplit("_d", 1)[1]))
        if not files:
            raise FileNotFoundError(f"{self.out}: no routing_text_d*.npz; notebook 05's oracle runs (quiet state) "
                                    f"record the routing of the text they verify")
        texts = {f"verified at d={f.stem.rsplit('_d', 1)[1]}": RoutingTrace.load(f) for f in files}
        shares = distinct_share_against(texts, self.wiki, ns=ns, resamples=resamples, seed=self.seed)
        io.write_dataframe(self.fig_dir / "06_fig3_right.csv", stamp(shares.assign(subject=self.label)))
        io.save_figure(figure3_right(shares, title=f"Figure 3 (right), {self.label}"), self.fig_dir / "06_fig3_right.png")
        widest = shares.loc[shares["difference"].abs().idxmax()]
        lines = [f"distinct share U/(nm), verified text against {self.wiki.label}: largest |difference| "
                 f"{widest['difference']:+.3f} [{widest['difference_low']:+.3f}, {widest['difference_high']:+.3f}] at "
                 f"{widest['label']}, n = {int(widest['n'])}; {int((shares['difference_high'] < 0).sum())} of "
                 f"{len(shares)} (depth, n) points below the reference's, {int((shares['difference_low'] > 0).sum())} "
                 f"above (95 % intervals excluding 0)"]
        return Result(lines, {"Figure 3 (right)": table(shares, ["label", "n", "share_reference", "share_text",
                                                                   "difference", "difference_low", "difference_high"])},
                      files=["06_fig3_right.csv", "06_fig3_right.png"])

    def bench(self, state: str) -> Result:
        """The expert operation alone in ``state``: timings, fits (4)/(E.1) and eps."""
        reps = self.P["bench_reps"] if state == "quiet" else (self.P.get("loaded_bench_reps") or self.P["bench_reps"])
        cfg = {k: self.P[k] for k in ("u_count", "windows_per_n", "flush_bytes", "membw_bytes") if self.P[k] is not None}
        with machine_state(state, pin=self.device == "cpu"):
            bench_dir = bench_engine(self.sub.engine, f"engine-{self.sub.kind}", self.wiki,
                                     out_dir=self.out / ("bench" if state == "quiet" else f"bench_{state}"),
                                     backend=self.backend, reps=reps, warmup=1, **cfg)
        decision = discard.apply_rule(load_rows(bench_dir), source=str(bench_dir / "rows.csv"))
        rows = decision.kept
        kept = decision.counts("fits (4)/(E.1)")
        fits = fit.fit_layers(rows)
        eps_table = fit.epsilon(fit.window_errors(fits, rows))
        eps = float(eps_table["eps_engine"].iloc[0])
        b = float(rows.loc[rows["kind"] == "window", "expert_bytes"].iloc[0])
        suffix = "" if state == "quiet" else f"_{state}"
        io.write_dataframe(self.fig_dir / f"06_fits{suffix}.csv", stamp(fits.assign(subject=self.label, state=state)))
        io.write_dataframe(self.fig_dir / f"06_epsilon{suffix}.csv",
                          stamp(eps_table.assign(subject=self.label, state=state)))
        self.results[state] = {"rows": rows, "fits": fits, "eps": eps, "b": b, "bench_dir": bench_dir}
        return Result([f"[{state}] bench run {bench_dir.name}: {int((rows['kind'] == 'chosen').sum())} chosen-id and "
                       f"{int((rows['kind'] == 'window').sum())} window timings over {rows['layer'].nunique()} layers, "
                       f"b = {b:.0f} bytes; eps: per-slot {eps_table['eps_slot'].iloc[0]:.3f}, deduplicating "
                       f"{eps_table['eps_dedup'].iloc[0]:.3f}; engine eps = {eps:.3f}",
                       f"[{state}] discard rule (read within {decision.share:.0%} of the run's median, no swap or "
                       f"GPU throttle): {kept['groups_kept']} group(s) kept, {kept['groups_discarded']} discarded"])

    def chain(self, state: str) -> Result:
        """Chain (22) in its four versions per depth, scored against ``state``'s round models; the
        benchmark windows of notebook 05's rules regime where it has one."""
        r = self.results[state]
        rows, fits, eps, b = r["rows"], r["fits"], r["eps"], r["b"]
        regime, threshold = self.run["regimes"]["dominant"], self.run["regimes"]["threshold_GBps"]
        windows_all = rows[rows["kind"] == "window"].rename(columns={"t_median_s": "t_s"})
        windows, same = predict.in_regime(windows_all, predict.bench_regimes(rows, threshold)[windows_all.index], regime)
        models = {int(m.context.split("=")[1]): m for m in self.round_models.select(state=state)
                  if m.context.startswith("d=")}
        oracle = self._oracle_runs(state)
        text_union = {d: mean_union(RoutingTrace.load(self.out / f"routing_text_d{d}.npz"), 9) for d in models}
        grid = pd.read_csv(self.out / "verify_summary.csv") if state == "quiet" else None
        metrics, curves = predict.evaluate_depths(models, oracle, fits, windows, mean_union(self.wiki, 9), text_union,
                                                  self.sub.engine.num_layers, self.m, b, eps, grid=grid)
        r.update(metrics=metrics, curves=curves)
        suffix = "" if state == "quiet" else f"_{state}"
        io.write_dataframe(self.fig_dir / f"06_curves{suffix}.csv",
                           stamp(curves.assign(subject=self.label, state=state)))
        io.write_json(self.out / f"metrics{suffix}.json", {f"{v}|{d}": mm for (v, d), mm in metrics.items()})
        lines = [f"[{state}] benchmark windows {'of regime ' + repr(regime) if same else 'of every regime'}: "
                 f"{len(windows)} of {len(windows_all)}"]
        for (v, d), mm in metrics.items():
            lines.append(f"[{state}] d={d} {v:>13}: saving error {mm['saving_err_ms']:.3f} ms, in band {mm['in_band']}/"
                         f"{mm['band_points']}, crossover {mm['crossover_pred']}/{mm['crossover_meas']}, sign "
                         f"{mm['sign_correct']}/{mm['sign_total']}, k* within one {mm['kstar_within1']}/"
                         f"{mm['kstar_values']}, loss {100 * mm['loss_runs']:.1f}%, tau error {100 * mm['tau_err']:.1f}%, "
                         f"delta {mm['delta']:.3f}")
        return Result(lines)

    def _oracle_runs(self, state: str) -> pd.DataFrame:
        name = "oracle_runs.csv" if state == "quiet" else f"oracle_runs_{state}.csv"
        return pd.read_csv(self.out / name)

    def tables(self) -> Result:
        """Tables 3, 4, 7, 8 (ours first, then the paper's published rows, labelled), scored per
        state; the goals; Figures 4, 5 and 6 (quiet state)."""
        scores_by_state, lines, goals = {}, [], []
        for state in self.states:
            metrics = self.results[state]["metrics"]
            scores = predict.score(metrics, self.rules)
            scores_by_state[state] = scores
            goals.append(pd.concat([G.chain_goals(metrics), G.rules_goal(scores)], ignore_index=True).assign(state=state))
            for v in self.rules["versions_scored"]:
                ok = bool(scores.loc[scores["version"] == v, "holds_all"].all())
                lines.append(f"[{state}] {v}: meets all six pre-registered rules at every depth: {ok}")
        q = self.results["quiet"]["metrics"]
        t8 = pd.concat([T.table8(scores_by_state[s].assign(subject=self.label, rows=f"loops, {s} machine"),
                                 self.rules_prov["commit"], with_paper=(s == self.states[-1]))
                        for s in self.states], ignore_index=True)
        for name, tab in (("06_table3_predictions", T.table3(q, self.engine_label, self.label)),
                          ("06_table4_preregistered", T.table4(q, self.engine_label)),
                          ("06_table7_error", T.table7(q, self.engine_label, self.label)), ("06_table8_rules", t8)):
            io.write_dataframe(self.fig_dir / f"{name}.csv", stamp(tab))
        goals = pd.concat(goals, ignore_index=True).assign(subject=self.label)
        io.write_dataframe(self.fig_dir / "06_goals.csv", stamp(goals))
        curves, eps = self.results["quiet"]["curves"], self.results["quiet"]["eps"]
        title = f"{self.engine_label}, {self.label}; eps = {eps:.3f}, verify passes timed in decode loops (quiet machine)"
        scores = scores_by_state["quiet"]
        io.save_figure(figure4_saving(curves, q, title=f"Figure 4 analogue: saving S(n). {title}"),
                       self.fig_dir / "06_fig4_saving.png")
        io.save_figure(figure5_kstar(q, title=f"Figure 5 analogue: best draft length and bounds (20), (21). {title}"),
                       self.fig_dir / "06_fig5_kstar_bounds.png")
        io.save_figure(figure6_verify(curves, title=f"Figure 6 analogue: pre-registered versions. {title}", scores=scores,
                                      rules_commit=self.rules_prov["commit"]), self.fig_dir / "06_fig6_preregistered.png")
        self.scores = scores_by_state
        lines.append(f"rules file {self.rules_prov['path']} read unchanged; commit {self.rules_prov['commit']}, committed "
                     f"{self.rules_prov['committed_at']}; speculative runs started "
                     f"{self.run['started'].get('oracle runs quiet')}")
        return Result(lines, {"rules (quiet machine)": scores, "goals": table(goals.drop(columns="subject"),
                                                                             list(goals.columns))})

    def summary(self) -> str:
        q = self.results["quiet"]["metrics"]
        depths = sorted({d for _, d in q})
        best = {s: [v for v in self.rules["versions_scored"]
                    if bool(sc.loc[sc["version"] == v, "holds_all"].all())] for s, sc in self.scores.items()}
        return (f"**{self.profile} profile, {self.label}.** Chain (22) against the whole-model runs, verify passes "
                f"timed in decode loops, engine eps = {self.results['quiet']['eps']:.3f}: "
                + "; ".join(f"d = {d}: crossover predicted {q[('prediction', d)]['crossover_pred']}, measured "
                            f"{q[('prediction', d)]['crossover_meas']}" for d in depths)
                + ". Versions meeting all six pre-registered rules: "
                + "; ".join(f"{s} machine: {', '.join(v) or 'none'}" for s, v in best.items())
                + ". Notebook 08 turns the round model into settings.")
