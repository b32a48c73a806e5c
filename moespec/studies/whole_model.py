"""Notebook 05's sections: the whole-model runs of paper 1 (Section 4, Appendices D-E) on one
subject, and the round model that predicts them.

Order of a run (recorded in ``run.json`` and in the round-model file, so that a reader can check
that every input of a prediction was measured on other prompts than the runs that test it, in the
same shuffled sweep):

0. where a decode step's time goes (one interleaved run);
1. the output checks (dedup off/on, and a widened subject against the unwidened model);
2. the verify grid: tau_p(n) in the shuffled grid, each pass after an unrelated pass (the second
   protocol, shown beside the decode loops' in step 4);
3. per machine state (``quiet``, then ``loaded``: :func:`moespec.measure.load.machine_state`):
   a. the oracle draft: at each depth, the round calibration's teacher-forced decode loops on
      prompts the oracle runs do not use and the oracle runs in one shuffled order
      (:func:`moespec.engine.calibration.depth_sweep`); the depth's round model from every loop
      (:func:`moespec.predict.calibration.from_verify_loops`) against the oracle grid
      (:func:`moespec.predict.speculative.oracle_predictions`);
   b. the real draft on the test MT-Bench turns at every draft cost and k, and its round calibration
      on MT-Bench turns the test does not use, in one shuffled sweep
      (:func:`moespec.engine.draftcost.interleaved_sweep`), so that both meet the same stretch of a
      shared machine. Every run of the sweep gets its machine factor
      (:mod:`moespec.runstats.machine_adjust`): the round models (fitted from the calibration turns,
      :func:`moespec.predict.calibration.from_draft_runs`) and the measured speedups are the runs' at
      the sweep's typical machine state; the files keep the runs as measured. Every run records its
      verify passes' routing; each prompt's prediction puts its verify pass at its own distinct
      experts and its draft at its own catch-up share
      (:func:`moespec.predict.speculative.real_draft_predictions`);
4. the two verify protocols side by side; the goals; the round-model file ``05_round_model.json``
   and ``run.json`` (:data:`RUN_SCHEMA_VERSION`, read back by :func:`read_run`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from moespec import io, provenance
from moespec.acceptance import runs as ACC
from moespec.engine import breakdown as B
from moespec.engine.byte_shares import byte_shares
from moespec.engine import draftcost as DC
from moespec.engine.calibration import depth_sweep
from moespec.engine.runs import greedy_agreement
from moespec.engine.subject import load_subject
from moespec.engine.verify import measure_verify_times, regime_summaries
from moespec.engine.widen import attention_and_head_in_format
from moespec.measure.load import machine_state
from moespec.measure.regimes import ReferenceRead
from moespec.measure.timing import FLUSH_FLOOR_BYTES
from moespec.notebook_profiles import default_depths, resolve
from moespec.plots.engine import breakdown_figure, draft_cost_figure
from moespec.plots.predictions import oracle_figure, real_draft_figure, verify_time_figure
from moespec.plots.rounds import predictions_figure, protocols_figure, round_terms_figure
from moespec.predict import calibration as CAL
from moespec.predict import noise as NOISE
from moespec.predict import speculative as SP
from moespec.predict.round_model import RoundModels
from moespec.predict.rules import load_rules
from moespec.routing import RoutingTrace
from moespec.runstats import machine_adjust as MA
from moespec.tables.predictions import oracle_cells
from moespec.tables.rounds import protocol_table, round_terms_table
from moespec.validate import run_identity

from . import goals as G
from . import summaries as SM
from .result import Result, table

ROUND_MODEL_FILE = "05_round_model.json"
RUN_FILE = "run.json"
#: The version of ``run.json`` this package writes and reads (:func:`read_run`).
RUN_SCHEMA_VERSION = 1


def real_draft_file(state: str) -> str:
    """The file of machine state ``state``'s real-draft test runs in a notebook-05 results folder."""
    return "real_draft.csv" if state == "quiet" else f"real_draft_{state}.csv"


def read_run(folder) -> dict:
    """Notebook 05's run record (``<folder>/run.json``); a folder without one, or with a record of
    another schema version than :data:`RUN_SCHEMA_VERSION`, is refused in one line."""
    path = Path(folder) / RUN_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no run record; run notebook 05 with this out_dir first")
    record = json.loads(path.read_text())
    found = record.get("schema_version") if isinstance(record, dict) else None
    if found != RUN_SCHEMA_VERSION:
        raise ValueError(f"{path}: field schema_version: expected {RUN_SCHEMA_VERSION}; found {found} "
                         f"(rerun notebook 05 with this version of moespec)")
    return record


def real_draft_parts(sub, P: dict, seed: int = 0) -> tuple:
    """The real draft's two sets of turns (:class:`moespec.engine.draftcost.SweepPart`): the round
    calibration's (``draft_cal_prompts`` MT-Bench turns the test does not use, once each, the lowest
    draft cost with the per-slot kernel too) and the test's (``real_prompts`` turns, ``real_reps``
    times), the calibration's with ``draft_cal_plain_runs`` plain runs per turn, the test's with
    ``plain_runs`` per prompt and repetition."""
    room = sub.context - P["real_tokens"] - 10
    cal = DC.SweepPart("calibration", sub.calibration_chat_prompts(P["draft_cal_prompts"], room, P["real_prompts"],
                                                                   seed=seed),
                       reps=1, slot_costs=(min(map(float, P["draft_costs"])),),
                       plain_runs=P["draft_cal_plain_runs"])
    test = DC.SweepPart("test", sub.chat_prompts(P["real_prompts"], max_tokens=room, seed=seed),
                        reps=P["real_reps"], plain_runs=P["plain_runs"])
    return cal, test


def state_sizes(P: dict, state: str) -> dict:
    """The run sizes of machine state ``state``: ``P``'s (a notebook-05 profile's, resolved), with
    the loaded state's own (``loaded_<key>``) where it has them."""
    P = dict(P)
    if state != "quiet":
        for key in ("oracle_prompts", "oracle_reps", "draft_costs", "real_prompts", "real_reps", "draft_cal_prompts"):
            if P.get(f"loaded_{key}") is not None:
                P[key] = P[f"loaded_{key}"]
    return P


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def run_sizes(profile: str, sizes: dict | None, sub, rules: dict) -> tuple[dict, list]:
    """(P, from_profile): notebook 05's run sizes of ``profile`` (:func:`moespec.notebook_profiles.resolve`
    with ``sizes``), the acceptance values and draft costs the profile leaves open from the scoring
    ``rules``, the depths from the subject's context (:func:`moespec.notebook_profiles.default_depths`)."""
    P, from_profile = resolve("05", profile, sizes)
    P["a_values"] = P["a_values"] or rules["acceptance_values"]
    P["draft_costs"] = (P["draft_costs"] if P["draft_costs"] is not None
                        else rules.get("draft_cost_grid", {}).get("values", [0.0]))
    P["depths"] = P["depths"] or default_depths(sub.context, P["n_tokens"])
    return P, from_profile


def work_units(P: dict) -> dict:
    """Per phase of :class:`WholeModelStudy`, a count proportional to its work at run sizes ``P``
    (decode passes, up to a constant per phase): what a full run's time is scaled by from a quick
    run's (:meth:`WholeModelStudy.full_estimate`)."""
    out = {"breakdown": P["breakdown_reps"], "agreement": P["agree_tokens"] * len(P["depths"]),
           "verify_grid": len(P["depths"]) * P["prompts_per_depth"] * P["verify_reps"]}
    for state in P["states"]:
        S = state_sizes(P, state)
        out[f"oracle_runs {state}"] = len(S["depths"]) * S["n_tokens"] * (
            len(S["oracle_ks"]) * len(S["a_values"]) * S["oracle_prompts"] * S["oracle_reps"]
            + S["cal_prompts"] * S["cal_reps"] * 9)
        ks, costs = len(S["real_ks"]), len(S["draft_costs"])
        out[f"real_draft {state}"] = S["real_tokens"] * (
            S["real_prompts"] * S["real_reps"] * (costs * ks + S["plain_runs"])
            + S["draft_cal_prompts"] * ((costs + 1) * ks + S["draft_cal_plain_runs"]))
    return out


def _timed(method):
    """Record the wall time of a phase of :class:`WholeModelStudy` (``elapsed``: phase -> seconds)."""
    @functools.wraps(method)
    def timed(self, *args, **kwargs):
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            self.elapsed[" ".join([method.__name__, *map(str, args)])] = time.perf_counter() - start
    return timed


class WholeModelStudy:
    """The state of one notebook-05 run: the subject, its run sizes ``P`` (``moespec.notebook_profiles``),
    the data folder ``out`` and figures folder ``fig_dir``, the reference read, and what the
    sections measured so far (round models, predictions, the order of the phases)."""

    def __init__(self, sub, P: dict, out, fig_dir, profile: str, device: str = "cpu", seed: int = 0,
                 backend: str = "auto", dtype: str = ""):
        self.sub, self.P, self.out, self.fig_dir = sub, P, out, fig_dir
        self.profile, self.device, self.seed, self.backend, self.dtype = profile, device, seed, backend, dtype
        self.label = sub.label
        # the regime read: the machine's cold size (quick: the paper's 256 MiB floor, for seconds)
        self.ref = ReferenceRead(FLUSH_FLOOR_BYTES if profile == "quick" else None, device=device)
        self.prompts_by_depth = {d: sub.depth_prompts(d, P["prompts_per_depth"], seed) for d in P["depths"]}
        self.order: dict = {}
        self.models: list = []
        self.states: dict = {}
        self.frames: dict = {"oracle_pred": [], "real_pred": [], "plain": [], "verify_loops": [], "real": [],
                             "draft_cal": [], "oracle": [], "adjustment": []}
        self.results: dict = {}
        self.widened: dict = {}
        self.elapsed: dict = {}

    # --- helpers -----------------------------------------------------------------------------
    def _fig(self, name: str):
        return self.fig_dir / name

    def _write(self, name: str, df: pd.DataFrame, figure: bool = True) -> None:
        io.write_dataframe((self.fig_dir if figure else self.out) / name,
                           run_identity.stamp_frame(df.assign(subject=self.label)) if figure else df)

    def _drafts(self, costs) -> dict:
        """The subject's draft widened to each draft cost, built once per cost (the calibration and
        the runs of every state draft with the same models)."""
        for r in map(float, costs):
            if r not in self.widened:
                self.widened[r] = self.sub.widened_draft(r, seed=self.seed + 1)
        return {float(r): self.widened[float(r)] for r in costs}

    def sizes(self, state: str) -> dict:
        """The run sizes of ``state`` (:func:`state_sizes`)."""
        return state_sizes(self.P, state)

    # --- 0. breakdown -------------------------------------------------------------------------
    @_timed
    def breakdown(self) -> Result:
        d0 = self.P["depths"][0]
        bd = B.decode_breakdown({self.sub.kind: self.sub}, {self.sub.kind: self.prompts_by_depth[d0][0]},
                                reps=self.P["breakdown_reps"], device=self.device)
        like, fmt = self.sub.description.get("like"), self.sub.description.get("fmt")
        byte_tables = {self.sub.kind: byte_shares(self.sub.engine, like, fmt, depths=(d0,))} if like else None
        shares = B.shares(bd, byte_tables).assign(label=self.label)
        if byte_tables is None:   # no published model to set its byte shares beside (a checkpoint is its own)
            shares = shares.assign(published=None)
        io.write_dataframe(self.out / "breakdown.csv", bd)
        io.write_dataframe(self._fig("05_breakdown.csv"), run_identity.stamp_frame(shares))
        io.save_figure(breakdown_figure(shares, title=f"decode step at d = {d0}: {self.label}"),
                       self._fig("05_breakdown.png"))
        s = shares.iloc[0]
        self.results["breakdown"] = s
        return Result([f"n = 1 step {s.step_ms:.3f} ms: expert operation {s.experts_ms:.3f} ms "
                       f"({100 * s.expert_share:.1f} %), without it {s.step_without_experts_ms:.3f} ms; one drafted "
                       f"token {s.draft_token_ms:.3f} ms ({s.draft_ratio:.3f} of a step); read {s.read_GBps:.1f} GB/s; "
                       f"peak memory {s.peak_memory_GiB:.2f} GiB", *B.bytes_lines(s)],
                      files=["05_breakdown.csv", "05_breakdown.png"])

    # --- 1. output checks ---------------------------------------------------------------------
    @_timed
    def agreement(self) -> Result:
        P = self.P
        agree = pd.concat([greedy_agreement(self.sub.engine, self.prompts_by_depth[d][:3], P["agree_tokens"]).assign(d=d)
                           for d in P["depths"]])
        io.write_dataframe(self.out / "agreement.csv", agree)
        self._write("05_agreement.csv", agree)
        tot = SM.agreement_totals(agree)
        self.results["agreement"] = tot
        lines = [f"greedy tokens equal with dedup off and on: {tot['greedy_equal']} of {tot['tokens']}",
                 f"verify argmax equal with dedup off and on: {tot['verify_argmax_equal']} of {tot['verify_rows']} rows",
                 f"verify argmax equal to batch-one greedy: {tot['verify_matches_greedy']} of {tot['verify_rows']} rows"]
        if self.sub.kind in ("byte-faithful", "byte-faithful-all"):
            unwidened = load_subject("default", profile=self.profile, device=self.device, backend=self.backend,
                                     fmt=self.sub.description["fmt"], dtype=self.dtype, seed=self.seed)
            if self.sub.kind == "byte-faithful-all":       # its attention and head in the format, unpadded
                attention_and_head_in_format(unwidened.target, self.sub.description["fmt"])
            same = pd.concat([SM.compare_engines(self.sub.engine, unwidened.engine, self.prompts_by_depth[d][:3],
                                                 P["agree_tokens"]).assign(d=d) for d in P["depths"]])
            self._write("05_function_preserved.csv", same)
            lines.append(f"greedy tokens equal to the unwidened model in {self.sub.description['fmt']}: "
                         f"{int(same.greedy_equal.sum())} of {int(same.tokens.sum())}; largest |logit difference| "
                         f"{same.max_abs_logit_diff.max():.3g} (logits up to {same.max_abs_logit.max():.3g})")
            del unwidened
        return Result(lines)

    # --- 2. the shuffled grid -----------------------------------------------------------------
    @_timed
    def verify_grid(self) -> Result:
        """Section 2: tau_p(n) in the shuffled grid of 18 passes and a reference read per repetition
        (each pass after an unrelated one: the protocol set beside the decode loops' in :meth:`finish`)."""
        self.order["verify_grid"] = _now()
        parts, argmax = [], {"rows": 0, "settings": 0, "greedy": 0}
        for d in self.P["depths"]:
            rows, info = measure_verify_times(self.sub.engine, self.prompts_by_depth[d], n_max=9,
                                              reps=self.P["verify_reps"], seed=self.seed, depth=d, reference=self.ref)
            parts.append(rows)
            argmax["rows"] += info["argmax_rows"]
            argmax["settings"] += info["argmax_agree_settings"]
            argmax["greedy"] += info["argmax_agree_greedy"]
        rows = pd.concat(parts, ignore_index=True)
        summary, summary_all, regimes = regime_summaries(rows, n_boot=self.P["n_boot"], seed=self.seed)
        io.write_dataframe(self.out / "verify_rows.csv", rows)
        io.write_dataframe(self.out / "verify_summary.csv", summary)
        io.write_dataframe(self.out / "verify_summary_all.csv", summary_all)
        self._write("05_verify_summary.csv", summary.assign(rows=regimes["dominant"], protocol="grid"))
        self._write("05_verify_summary_all_rows.csv", summary_all.assign(rows="all", protocol="grid"))
        io.save_figure(verify_time_figure(summary, title=f"shuffled grid: {self.label}; {self.device}, regime "
                                                         f"{regimes['dominant']} (threshold {regimes['threshold_GBps']} GB/s)"),
                       self._fig("05_verify_time.png"))
        self.grid, self.regimes, self.argmax = summary, regimes, argmax
        lines = [f"verify argmax (n = 9 passes) equal with dedup off and on: {argmax['settings']} of {argmax['rows']} rows",
                 f"other processes' share of the CPUs during the grid: median {rows['other_load'].median():.2f}, "
                 f"max {rows['other_load'].max():.2f}",
                 f"bandwidth regimes (reference read {self.ref.nbytes >> 20} MiB): {regimes['regimes']}; threshold "
                 f"{regimes['threshold_GBps']}; rules' regime {regimes['dominant']!r}"]
        for r in SM.verify_report(summary):
            lines.append(f"grid d={r['d']}: tau(1) = {r['tau1_ms']:.3f} ms; tau_slot(9) = {r['tau_slot_last_ms']:.3f} ms, "
                         f"tau_dedup(9) = {r['tau_dedup_last_ms']:.3f} ms; crossover {r['crossover']}")
        return Result(lines)

    # --- 3. round calibration with the runs it predicts -----------------------------------------
    def _cal_prompts(self, d: int, P: dict) -> list:
        """The depth's calibration prompts: the ``cal_prompts`` after the oracle runs' own."""
        n_oracle = self.P["oracle_prompts"]
        cal = self.prompts_by_depth[d][n_oracle:n_oracle + P["cal_prompts"]]
        if not cal:
            raise ValueError(f"prompts_per_depth = {len(self.prompts_by_depth[d])} leaves no prompt for the round "
                             f"calibration after the {n_oracle} oracle prompts; raise prompts_per_depth")
        return cal

    def _depth_models(self, state: str, loops: pd.DataFrame, P: dict) -> dict:
        """The oracle draft's round model per depth from ``state``'s verify loops (written first)."""
        self.frames["verify_loops"].append(loops)       # the rows are written before anything is built from them
        io.write_dataframe(self.out / "verify_loops.csv", pd.concat(self.frames["verify_loops"], ignore_index=True))
        by_depth = CAL.from_verify_loops(loops, self.label, state, n_boot=P["n_boot"], seed=self.seed)
        self.models += list(by_depth.values())
        self.results.setdefault(f"models {state}", {"depth": {}, "cost": {}})["depth"] = by_depth
        return by_depth

    def _draft_models(self, state: str, draft_rows: pd.DataFrame, P: dict) -> list:
        """The real draft's round models of ``state`` from its calibration rows (written first, as
        measured with their machine factors; the models from the runs adjusted by them,
        :mod:`moespec.runstats.machine_adjust`)."""
        self.frames["draft_cal"].append(draft_rows)
        io.write_dataframe(self.out / "draft_calibration.csv", pd.concat(self.frames["draft_cal"], ignore_index=True))
        self.results[f"draft calibration {state}"] = draft_rows
        by_cost = CAL.from_draft_runs(MA.adjusted(draft_rows), self.label, state, n_boot=P["n_boot"], seed=self.seed)
        self.models += list(by_cost.values())
        self.results.setdefault(f"models {state}", {"depth": {}, "cost": {}})["cost"] = by_cost
        return list(by_cost.values())

    def _prediction_se(self, state: str, real: pd.DataFrame, P: dict) -> pd.Series:
        """Each real-draft point's prediction noise (:func:`moespec.predict.noise.prediction_se`): the
        state's adjusted calibration turns resampled ``P["noise_resamples"]`` times, the round models
        refitted as :meth:`_draft_models` fits them (their intervals, not used, from 20 resamples)."""
        cal = MA.adjusted(self.results[f"draft calibration {state}"])
        return NOISE.prediction_se(cal, real, lambda rows: CAL.from_draft_runs(rows, self.label, state, n_boot=20,
                                                                               seed=self.seed),
                                   resamples=P["noise_resamples"], seed=self.seed, desc=f"prediction noise ({state})")

    @staticmethod
    def _models_result(state: str, models: list, lines: list) -> Result:
        """Each round model's V(0), V(1), V(kmax) and draft fit, and their terms as a table."""
        for rm in models:
            V = rm.step_times("dedup")
            lo, hi = rm.step_interval("dedup")
            fit = f"; {rm.draft.formula()}" if rm.draft.a_s is not None else ""
            lines.append(f"[{state}] {rm.context}, {rm.draft.name}: V(0) = {1e3 * V[0]:.3f} ms "
                         f"[{1e3 * lo[0]:.3f}, {1e3 * hi[0]:.3f}], V(1) = {1e3 * V[1]:.3f} ms, V({rm.kmax}) = "
                         f"{1e3 * V[-1]:.3f} ms{fit}")
        return Result(lines, {f"round model terms ({state})": table(round_terms_table(models), [
            "context", "draft", "k", "t_draft_ms", "tau_dedup_ms", "tau_slot_ms", "host_ms", "V_ms", "V_lo_ms",
            "V_hi_ms", "delta"])} if models else {})

    # --- 3a. the oracle-draft grid with its depth calibration ---------------------------------
    @_timed
    def oracle_runs(self, state: str) -> Result:
        """In machine state ``state``: at each depth, the verify loops of the round calibration and the
        oracle runs in one shuffled order (:func:`moespec.engine.calibration.depth_sweep`), the
        depth's round model from the loops, and the oracle runs against it."""
        P = self.sizes(state)
        self.order[f"oracle runs {state}"] = _now()
        parts, loops = [], []
        with machine_state(state, pin=self.device == "cpu") as ms:
            for d in P["depths"]:
                routing = [] if state == "quiet" else None
                cal, runs = depth_sweep(self.sub.engine, self._cal_prompts(d, P),
                                        self.prompts_by_depth[d][:P["oracle_prompts"]], P["oracle_ks"], P["a_values"],
                                        P["n_tokens"], n_max=9, cal_reps=P["cal_reps"],
                                        oracle_reps=P["oracle_reps"], cal_seed=self.seed + 7, oracle_seed=self.seed,
                                        seed=self.seed + 13, depth=d, reference=self.ref,
                                        first_cal_prompt=self.P["oracle_prompts"], routing_out=routing)
                loops.append(cal.assign(state=state))
                parts.append(runs.assign(state=state))
                if state == "quiet":
                    RoutingTrace(routing, num_experts=int(self.sub.description["expert_shape"][0]),
                                 source=f"greedy continuations verified at d={d}").save(
                                     self.out / f"routing_text_d{d}.npz")
        self.states[state] = ms.describe()
        oracle = pd.concat(parts, ignore_index=True)
        loops = pd.concat(loops, ignore_index=True)
        fitted = self._models_result(state, list(self._depth_models(state, loops, P).values()),
                                     [f"[{state}] {ms.describe()['what']}"])
        lines, tables = fitted.lines, fitted.tables
        lines.append(f"[{state}] the oracle draft's round calibration ran interleaved with the oracle runs; read "
                     f"{np.nanmedian(loops['ref_GBps']):.2f} GB/s in its loops, "
                     f"{np.nanmedian(oracle['ref_GBps']):.2f} GB/s in the runs (medians of the same-round reads)")
        models = self.results[f"models {state}"]["depth"]
        pred = SP.oracle_predictions(models, oracle)
        plain = [SP.plain_step(models[d], oracle[oracle["d"] == d], f"oracle runs d={d}") for d in P["depths"]]
        self.frames["oracle"].append(oracle)
        self.frames["oracle_pred"].append(pred)
        self.frames["plain"] += plain
        if state == "quiet":
            io.write_dataframe(self.out / "oracle_runs.csv", oracle)
            cells = oracle_cells(oracle)
            io.save_figure(oracle_figure(cells, title=f"oracle draft, {self.label}"), self._fig("05_oracle_acceptance.png"))
            self._write("05_oracle_cells.csv", cells)
            orc = SM.oracle_report(oracle, cells)
            self.results["oracle_report"] = orc
            lines += [f"oracle runs: {orc['runs']}; largest |realized a - a| over (d, k, a) cells: {orc['max_abs_a_error']:.3f}",
                      f"tokens per step / G_a(k): median {orc['tps_over_G_median']:.3f}, range {orc['tps_over_G_min']:.3f} "
                      f"to {orc['tps_over_G_max']:.3f}",
                      f"steps cut short (batched argmax differs from batch-one greedy): {orc['cut_short']} of {orc['steps']}"]
        else:
            io.write_dataframe(self.out / f"oracle_runs_{state}.csv", oracle)
        spec = pred[pred["k"] >= 1]
        lines += [f"[{state}] plain step V(0): " + "; ".join(f"{p['runs']}: predicted {p['V0_hat_ms']:.3f} ms, measured "
                                                             f"{p['V0_meas_ms']:.3f} ms ({100 * p['rel_error']:+.1f} %)"
                                                             for p in plain),
                  f"[{state}] oracle-draft speedup predicted within 5 % at {int((spec.speedup_rel_error.abs() <= 0.05).sum())} "
                  f"of {len(spec)} (d, k, a) cells; largest |error| {100 * spec.speedup_rel_error.abs().max():.1f} %; "
                  f"measured inside the predicted interval at {int(spec.speedup_inside.sum())}"]
        return Result(lines, tables)

    # --- 3b. the real draft with its round calibration -----------------------------------------
    @_timed
    def real_draft(self, state: str) -> Result:
        """In machine state ``state``: the real draft's calibration turns and test turns in one
        shuffled sweep, every run's machine factor, the round models from the adjusted calibration
        runs, and the adjusted test runs against them."""
        if self.sub.draft is None:
            return Result([f"no real draft for this subject ({self.sub.description['real']}); section skipped"])
        P = self.sizes(state)
        self.order[f"real-draft runs {state}"] = _now()
        drafts = self._drafts(P["draft_costs"])
        cal, test = real_draft_parts(self.sub, P, self.seed)
        with machine_state(state, pin=self.device == "cpu"):
            ratios = (DC.draft_cost_ratios(self.sub.engine, drafts, test.prompts[0], reps=P["ratio_reps"],
                                           reference=self.ref) if state == "quiet" else None)
            rows = DC.interleaved_sweep(self.sub.engine, drafts, [cal, test], P["real_ks"], P["real_tokens"],
                                        seed=self.seed, reference=self.ref,
                                        desc=f"real draft with its calibration ({state})").assign(state=state)
        swept, factors = MA.with_machine_factors(rows)
        draft_rows, measured = DC.split_parts(swept, [cal, test])
        calibrated = self._models_result(state, self._draft_models(state, draft_rows, P), [])
        models = self.results[f"models {state}"]["cost"]
        real = MA.adjusted(measured)                      # the runs at the sweep's typical machine state
        pred = SP.real_draft_predictions(models, real).merge(SP.real_draft_diagnostics(models, real),
                                                             on=["draft_cost", "k"], how="left", validate="one_to_one")
        pred = NOISE.with_noise(pred, self._prediction_se(state, real, P))
        plain = SP.plain_step(models[min(models)], real, "real-draft runs (MT-Bench)")
        adjustment = {"state": state, **MA.factor_summary(factors, swept)}     # over the whole sweep
        self.frames["adjustment"].append(adjustment)
        self.frames["real"].append(real)
        self.frames["real_pred"].append(pred)
        self.frames["plain"].append(plain)
        summ, rep = SM.real_draft_report(real)
        lines = [f"[{state}] plain step V(0), MT-Bench: predicted {plain['V0_hat_ms']:.3f} ms, measured "
                 f"{plain['V0_meas_ms']:.3f} ms ({100 * plain['rel_error']:+.1f} %)",
                 f"[{state}] real-draft speedup predicted within 5 % at {int((pred.rel_error.abs() <= 0.05).sum())} of "
                 f"{len(pred)} (cost, k) points; largest |error| {100 * pred.rel_error.abs().max():.1f} % (with the "
                 f"geometric G_a(k) instead of the measured tokens per step: "
                 f"{100 * pred.rel_error_geometric.abs().max():.1f} %); "
                 f"measured inside the predicted interval at {int(pred.inside.sum())}",
                 f"[{state}] where the error comes from: with the runs' own step times in place of the round model's, "
                 f"within 5 % at {int((pred.rel_error_measured_steps.abs() <= 0.05).sum())} of {len(pred)} (largest "
                 f"{100 * pred.rel_error_measured_steps.abs().max():.1f} %)",
                 SP.adjustment_line(adjustment, state),
                 *([SP.routing_line(pred, state)] if "predicted_unrouted" in pred else []),
                 *([SP.noise_line(pred, state)] if SP.rep_columns(pred) else []),
                 f"[{state}] the prediction against its own calibration (turns resampled "
                 f"{P['noise_resamples']} times): {NOISE.prediction_noise_phrase(NOISE.noise_summary(pred))}",
                 f"[{state}] draft cost {rep['draft_cost']:g}: plain decoding fastest on {rep['plain_fastest']} of "
                 f"{rep['prompts']} prompts; median speedup k=1 {rep['speedup_k1']:.3f}, k={rep['k_last']} "
                 f"{rep['speedup_k_last']:.3f}"]
        if state == "quiet":
            stop = SP.stop_paying(pred, ratios)
            io.write_dataframe(self.out / real_draft_file(state), measured)
            io.write_dataframe(self.out / "draft_cost_ratios.csv", ratios)
            self._write("05_draft_cost_ratios.csv", ratios)
            io.write_json(self._fig("05_draft_cost_stop.json"), run_identity.stamp_doc({**stop, "subject": self.label}))
            self._write("05_real_draft.csv", summ)
            refs = DC.paper_references()
            full = self.profile == "full"
            io.save_figure(draft_cost_figure(pred, ratios, refs if full else None,
                                             title=f"real draft on MT-Bench first turns at several draft costs: {self.label}"),
                           self._fig("05_draft_cost.png"))
            io.save_figure(real_draft_figure(real[(real.k == 0) | (real.draft_cost == rep["draft_cost"])],
                                             {1: refs["paper1_k1"]} if full else None,
                                             title=f"real draft (draft cost {rep['draft_cost']:g}), {self.label}"),
                           self._fig("05_real_draft.png"))
            self.results["stop"], self.results["real_report"] = stop, rep
            lines.append(f"drafting stops paying from draft cost {stop['stop_cost_measured']} (measured), "
                         f"{stop['stop_cost_predicted']} (predicted): {stop['grid_steps_apart']} grid steps apart; cost "
                         f"ratios {np.round(stop['cost_ratio'], 3).tolist()}")
        else:
            io.write_dataframe(self.out / real_draft_file(state), measured)
        shown = table(pred, ["draft_cost", "k", "tokens_per_step", "V_hat_ms", "V_meas_ms", "predicted", "predicted_lo",
                             "predicted_hi", "measured", "rel_error", "predicted_unrouted", "predicted_geometric"])
        return Result(calibrated.lines + lines, {**calibrated.tables, f"real draft: predicted vs measured ({state})": shown})

    # --- 4. side by side, goals, files ----------------------------------------------------------
    def finish(self, rules_prov: dict, **record_fields) -> Result:
        """The protocols side by side, every prediction table, the goals, the round-model file and
        ``run.json`` (with the order of the phases, and ``record_fields``: what the notebook adds,
        e.g. ``subject_args``, which notebook 06 reads)."""
        models = RoundModels(self.models, self.order)
        models.save(self._fig(ROUND_MODEL_FILE), run=run_identity.current().record())
        terms = round_terms_table(self.models).assign(fmt=self.sub.description.get("fmt"))
        io.write_dataframe(self._fig("05_round_terms.csv"), run_identity.stamp_frame(terms))
        quiet = self.results["models quiet"]["depth"]
        proto = protocol_table(self.grid, quiet)
        self._write("05_verify_protocols.csv", proto)
        io.save_figure(protocols_figure(proto, title=f"verify time: shuffled grid against decode loops, {self.label}"),
                       self._fig("05_verify_protocols.png"))
        io.save_figure(round_terms_figure([m for m in self.models if m.state == "quiet"],
                                          title=f"round model (quiet machine), {self.label}"),
                       self._fig("05_round_model.png"))
        oracle_pred = pd.concat(self.frames["oracle_pred"], ignore_index=True)
        real_pred = pd.concat(self.frames["real_pred"], ignore_index=True) if self.frames["real_pred"] else None
        plain = pd.DataFrame(self.frames["plain"])
        self._write("05_oracle_predictions.csv", oracle_pred)
        self._write("05_plain_step.csv", plain)
        if real_pred is not None:
            self._write("05_draft_cost_predictions.csv", real_pred)
            self._write("05_machine_adjustment.csv", pd.DataFrame(self.frames["adjustment"]))
            real = pd.concat(self.frames["real"], ignore_index=True)
            own = real[(real.k >= 1) & (real.draft_cost == real.loc[real.k >= 1, "draft_cost"].min())]
            acc, per_prompt = SP.median_prompt_acceptance(own)
            acc["label"] = [f"the run's draft as trained, {r.state} machine: median over {r.prompts} prompts of each "
                            f"prompt's accepted / (accepted + rejections), real-draft runs k = 1..{r.k_max} "
                            f"(pooled over prompts: {r.a_pooled:.3f})" for r in acc.itertuples()]
            self._write("05_real_draft_acceptance.csv", acc)
            self._write("05_real_draft_acceptance_by_prompt.csv", per_prompt)
            self._write(ACC.PROFILE_FILE, ACC.table_rows(own))
        io.save_figure(predictions_figure(oracle_pred, real_pred, title=f"round-model predictions against the runs, "
                                                                         f"{self.label}"),
                       self._fig("05_predictions.png"))
        goals = G.round_model_goals(plain, oracle_pred, real_pred)
        if "stop" in self.results:
            goals = pd.concat([goals, G.stop_paying_goal(self.results["stop"])], ignore_index=True)
        self._write("05_goals.csv", goals)
        record = {"schema_version": RUN_SCHEMA_VERSION, "profile": self.profile, "subject": self.label,
                  "subject_kind": self.sub.kind, "description": self.sub.description, "depths": self.P["depths"], "sizes": self.P,
                  "device": self.device, "backend": self.backend, "seed": self.seed, "started": self.order,
                  "finished": _now(),
                  "rules": rules_prov, "regimes": self.regimes, "verify_argmax": self.argmax,
                  "machine_states": self.states, "n_tokens": self.P["n_tokens"], "ks": self.P["oracle_ks"],
                  "a_values": list(self.P["a_values"]), "machine_adjustment": MA.settings(),
                  "provenance": provenance.full_record(), **record_fields}
        io.write_json(self.out / RUN_FILE, record)
        self.record = record
        first_test = self.order.get("oracle runs quiet")
        before = (rules_prov.get("committed_at") is not None and first_test is not None
                  and dt.datetime.fromisoformat(rules_prov["committed_at"]) < dt.datetime.fromisoformat(first_test))
        lines = [f"grid minus loop at n = 1: " + ", ".join(
            f"d = {d}: {g['grid_minus_loop_ms'].iloc[0]:+.3f} ms" for d, g in
            proto[(proto.n == 1) & (proto.kernel == "slot")].groupby("d")),
            f"measured in order (UTC): " + "; ".join(f"{k} {v[11:19]}" for k, v in self.order.items()),
            f"rules committed {rules_prov.get('committed_at')} before the speculative runs started {first_test}: {before}"]
        if self.profile != "full" and self.sub.kind == "checkpoint":   # the full profile's time on the same model
            full, _ = run_sizes("full", None, self.sub, load_rules(self.sub.rules_file))
            est = self.results["full_estimate"] = self.full_estimate(full)
            io.write_json(self.out / "full_estimate.json", {**est, "subject": self.label})
            lines.append(f"the full profile on {self.label}: about {est['minutes']:.0f} min (this run: "
                         f"{est['quick_minutes']:.1f} min; each phase scaled by its work at the full sizes, the "
                         f"phases at the depths {full['depths']} by x{est['depth_factor']:.2f}): "
                         + ", ".join(f"{k} {v:.1f}" for k, v in est["by_phase"].items()))
        return Result(lines, {"goals": goals})

    def full_estimate(self, full: dict) -> dict:
        """The full profile's time on this subject, estimated from this run: each phase's wall time
        scaled by its :func:`work_units` at the full sizes ``full`` over this run's, the phases at
        the depths also by the verify pass's time at the full depths over this run's (tau(1) linear
        in the depth through the grid's two depths). Minutes in all and per phase."""
        mine, theirs = work_units(self.P), work_units(full)
        taus = {r["d"]: r["tau1_ms"] for r in SM.verify_report(self.grid)}
        (d0, t0), (d1, t1) = sorted(taus.items())[0], sorted(taus.items())[-1]
        slope = max(0.0, (t1 - t0) / (d1 - d0)) if d1 != d0 else 0.0
        at = lambda depths: t0 + slope * (np.mean(depths) - d0)  # noqa: E731
        deeper = max(1.0, at(full["depths"]) / at(self.P["depths"]))
        minutes = {}
        for phase, seconds in self.elapsed.items():
            if phase in mine and phase in theirs and mine[phase]:
                depth = deeper if phase.startswith(("agreement", "verify_grid", "oracle_runs")) else 1.0
                minutes[phase] = seconds * theirs[phase] / mine[phase] * depth / 60
        return {"minutes": float(sum(minutes.values())), "by_phase": minutes, "depth_factor": float(deeper),
                "quick_minutes": float(sum(self.elapsed.values()) / 60), "full_depths": list(full["depths"])}

    def summary(self) -> str:
        """The notebook's closing paragraph, every number from this run's tables."""
        s, tot = self.results["breakdown"], self.results["agreement"]
        crossovers = {r["d"]: r["crossover"] for r in SM.verify_report(self.grid)}
        plain = pd.DataFrame(self.frames["plain"])
        out = (f"**{self.profile} profile, {self.label}.** A decode step at n = 1 spends {100 * s.expert_share:.0f} % of "
               f"its time in the expert operation and a drafted token costs {s.draft_ratio:.2f} of a step. Deduplication "
               f"off and on give the same greedy tokens ({tot['greedy_equal']} of {tot['tokens']}); the grid's saving makes "
               "deduplication faster from n = " + ", ".join(f"{c} (d = {d})" for d, c in crossovers.items()) + ". "
               f"The round model predicts the plain step within {100 * plain.rel_error.abs().max():.1f} % in every "
               f"context and state measured ({', '.join(sorted(set(plain.state)))}).")
        oracle = pd.concat(self.frames["oracle_pred"], ignore_index=True)
        spec = oracle[oracle.k >= 1]
        out += (f" Oracle draft: speedup within 5 % at {int((spec.speedup_rel_error.abs() <= 0.05).sum())} of "
                f"{len(spec)} (state, d, k, a) cells.")
        if self.frames["real_pred"]:
            real = pd.concat(self.frames["real_pred"], ignore_index=True)
            rep = self.results["real_report"]
            out += (f" Real draft: within 5 % at {int((real.rel_error.abs() <= 0.05).sum())} of {len(real)} (state, cost, k) "
                    f"points; at draft cost {rep['draft_cost']:g} plain decoding is fastest on {rep['plain_fastest']} of "
                    f"{rep['prompts']} prompts (median speedup {rep['speedup_k1']:.3f} at k = 1).")
        if self.profile != "full" and self.sub.kind == "checkpoint":
            est = self.results.get("full_estimate")
            out += (f" The quick profile runs {self.label} at small sizes (few prompts, tokens and repetitions); "
                    "the full profile's sizes"
                    + (f" would take about {est['minutes']:.0f} min on it (estimated from this run's "
                       f"{est['quick_minutes']:.1f} min, phase by phase)" if est else "")
                    + "; set `profile = \"full\"` for them.")
        elif self.profile != "full":
            out += " The quick profile runs tiny models; set `profile = \"full\"` for the measurements behind figures/."
        return out
