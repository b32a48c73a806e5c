"""Notebook 09's sections: speculative decoding of B sequences together on one subject, the round
model's prediction of it at each batch size, and the schedule k*(B) (issue 56; paper 1's round model
and byte model over the tokens of B sequences, :mod:`moespec.theory.batch`).

Order of a run:

0. the routing of the prompts' greedy continuations (untimed): the union share U/N against the
   tokens of a pass, n, for one sequence's window and for B sequences x n/B tokens
   (:func:`moespec.routing.union_share_curves`), and the union ratio U(B, k + 1) / U(B, 1): the
   experts a pass of B(k + 1) tokens reads over those of a plain pass of B tokens;
1. per machine state (``quiet``, then ``loaded``: :func:`moespec.measure.load.machine_state`), one
   interleaved run: every repetition runs, in a seeded shuffled order, each (B, k) cell's batched
   speculative decoding (:func:`moespec.engine.batch_speculative.batch_generate` from the B prompts
   prefilled once per state, each cell after a reference read and one untimed plain pass) and one
   block of the round terms at every (B, k)
   (:func:`moespec.engine.batch_speculative.time_round_terms`: the verify pass at n = B(k + 1) and,
   with the real draft, the draft's k tokens for B sequences), so that the runs and the terms that
   predict them meet the same stretch of the machine; each block times its rounds at its share of
   ``term_positions`` places spread over the runs' text
   (:func:`moespec.engine.batch_speculative.text_positions`), since a pass's experts, and so its
   time, depend on the tokens it holds, each call after the previous round's pass over the text
   just before it, as a round of a decode loop follows the one before it;
2. the predictions (:func:`prediction_table`): per (state, B, k) the measured throughput per sequence
   over plain decoding's at the same B beside G(k) V(0, B) / V(k, B), V(k, B) = verify + draft +
   host, G(k) at the runs' measured acceptance; the measured best k per B against k*(B) and its
   regret (:func:`best_k_table`); whether the speedup first rises with B (:func:`rise_with_batch`);
   the goals (:func:`batch_goals`), with notebook 05's B = 1 numbers where the run folder has them
   (:func:`b1_against_05`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from moespec import io
from moespec.engine.batch_speculative import (BatchModelDraft, BatchOracleDraft, batch_generate, round_setup,
                                              summarize_batch_steps, text_positions, time_round_terms)
from moespec.engine.runs import prompt_reference
from moespec.measure.load import machine_state
from moespec.measure.regimes import ReferenceRead
from moespec.measure.timing import FLUSH_FLOOR_BYTES, MachineMonitor
from moespec.notebook_profiles import resolve
from moespec.progress import tqdm
from moespec.plots.batch import batch_predictions_figure, schedule_figure
from moespec.plots.routing import union_share_figure
from moespec.routing import RoutingTrace, union_share, union_share_curves
from moespec.runstats import regret_interval
from moespec.theory import batch_speedup, speedup
from moespec.validate import run_identity

from . import goals as G
from .result import Result, table

#: The largest |relative error| of a prediction the goals accept, per machine state.
TOLERANCE = {"quiet": 0.05, "loaded": 0.10}
#: The regret of the predicted k the goals accept (the share of the measured best speedup lost).
REGRET_GOAL = 0.02
#: Predicted speedups of notebook 05 recomputed here count as equal within this (float rounding).
EQUAL_ATOL = 1e-9
KEYS = ["state", "B", "k"]


def tolerance(state: str) -> float:
    """The goals' tolerance in machine state ``state`` (:data:`TOLERANCE`; another state: the loaded one's)."""
    return TOLERANCE.get(state, TOLERANCE["loaded"])


def run_sizes(profile: str, sizes: dict | None = None) -> tuple[dict, list]:
    """(P, from_profile): notebook 09's run sizes (:func:`moespec.notebook_profiles.resolve`), checked:
    batch sizes >= 1, draft lengths 0..kmax without a gap (k = 0, plain decoding, is the reference),
    an oracle acceptance in [0, 1]."""
    P, from_profile = resolve("09", profile, sizes)
    Bs, ks = [int(b) for b in P["batch_sizes"]], sorted(int(k) for k in P["ks"])
    if not Bs or min(Bs) < 1:
        raise ValueError(f"sizes: field batch_sizes: expected batch sizes >= 1; found {P['batch_sizes']}")
    if ks != list(range(len(ks))):
        raise ValueError(f"sizes: field ks: expected the draft lengths 0..kmax without a gap; found {P['ks']}")
    if not int(P["reps"]) <= int(P["term_positions"]) <= int(P["n_tokens"]):
        raise ValueError(f"sizes: field term_positions: expected at least one position per repetition ({P['reps']}) "
                         f"and at most n_tokens ({P['n_tokens']}); found {P['term_positions']}")
    if P["draft_kind"] not in ("oracle", "real"):
        raise ValueError(f"sizes: field draft_kind: expected 'oracle' or 'real'; found {P['draft_kind']!r}")
    if not 0.0 <= float(P["oracle_a"]) <= 1.0:
        raise ValueError(f"sizes: field oracle_a: expected the oracle's acceptance in [0, 1]; found {P['oracle_a']}")
    P["batch_sizes"], P["ks"] = sorted(set(Bs)), ks
    return P, from_profile


# --- the arithmetic -------------------------------------------------------------------------------
def with_ratios(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with ``ratio``: each run's throughput per sequence over the plain run (k = 0) of its
    state, B and repetition."""
    plain = runs[runs["k"] == 0].set_index(["state", "B", "rep"])["throughput_per_seq"]
    if plain.index.has_duplicates:
        raise ValueError("runs: more than one plain run (k = 0) per (state, B, rep)")
    idx = list(zip(runs["state"], runs["B"], runs["rep"]))
    missing = [i for i in idx if i not in plain.index]
    if missing:
        raise ValueError(f"runs: no plain run (k = 0) at (state, B, rep) = {missing[0]}")
    return runs.assign(ratio=runs["throughput_per_seq"].to_numpy() / plain.loc[idx].to_numpy())


def ratios_by_rep(runs: pd.DataFrame) -> dict:
    """{(state, B): array [k, repetition]} of :func:`with_ratios`' ratios (k = 0..kmax in order; a
    repetition that lacks a cell is left out)."""
    wide = with_ratios(runs).pivot_table(index=["state", "B", "k"], columns="rep", values="ratio")
    return {(s, int(B)): g.sort_index().dropna(axis=1).to_numpy() for (s, B), g in wide.groupby(level=[0, 1])}


def cell_summary(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (state, B, k) of the runs (one row per cell and repetition: ``throughput_per_seq``,
    ``accepted``, ``rejections``, ``emitted``, ``rounds`` and the per-round means ``t_verify_mean_s``,
    ``t_draft_mean_s``, ``t_host_mean_s``): ``measured``, the median throughput per sequence over the
    median of plain decoding (k = 0) at the same state and B; ``measured_q25``/``measured_q75``, the
    quartiles of the per-repetition ratios (each repetition over its own plain run); ``a_measured``,
    the pooled acceptance (accepted drafts over accepted drafts plus rejections, NaN at k = 0);
    ``tokens_per_round``, emitted tokens per sequence per round; the medians of the round's parts."""
    g = with_ratios(runs).groupby(KEYS)
    out = g.agg(reps=("rep", "count"), throughput_per_seq=("throughput_per_seq", "median"),
                accepted=("accepted", "sum"), rejections=("rejections", "sum"), emitted=("emitted", "sum"),
                rounds=("rounds", "sum"), t_verify_run_s=("t_verify_mean_s", "median"),
                t_draft_run_s=("t_draft_mean_s", "median"), t_host_run_s=("t_host_mean_s", "median"),
                read_GBps=("read_GBps", "median"), other_load=("other_load", "median"),
                measured_q25=("ratio", lambda x: x.quantile(0.25)), measured_q75=("ratio", lambda x: x.quantile(0.75)))
    out = out.reset_index()
    base = out[out["k"] == 0].set_index(["state", "B"])["throughput_per_seq"]
    out["measured"] = out["throughput_per_seq"].to_numpy() / base.loc[list(zip(out["state"], out["B"]))].to_numpy()
    drafts = out["accepted"] + out["rejections"]
    out["a_measured"] = np.where(drafts > 0, out["accepted"] / drafts.where(drafts > 0, 1), np.nan)
    out["tokens_per_round"] = out["emitted"] / (out["B"] * out["rounds"])
    return out


def round_terms(term_rows: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """The round model's terms per (state, B, k), seconds: ``verify_s``, the mean over the blocks'
    positions along the text (``term_rows``: the rows of
    :func:`moespec.engine.batch_speculative.time_round_terms` with ``state`` and ``rep``, one per
    (rep, offset)) of the verify pass at n = B(k + 1): a run's time is the sum of its rounds, each at
    its own place in the text, so the mean over places predicts it; ``draft_s``, the draft's k tokens
    for B sequences from the same blocks where they were timed (the real draft), else the runs'
    per-round draft time (the oracle's proposal); ``host_s``, the runs' host work per round
    (acceptance, cache crops). k = 0 has no draft."""
    t = term_rows.groupby(KEYS + ["term"])["t_median_s"].mean().unstack("term")
    out = cells[KEYS + ["t_draft_run_s", "t_host_run_s"]].set_index(KEYS)
    missing = [i for i in out.index if i not in t.index]
    if missing:
        raise ValueError(f"term_rows: no verify pass timed at (state, B, k) = {missing[0]}")
    out["verify_s"] = t.loc[out.index, "verify"].to_numpy()
    timed = t["draft"].reindex(out.index) if "draft" in t else pd.Series(np.nan, index=out.index)
    out["draft_s"] = timed.fillna(out["t_draft_run_s"]).to_numpy()
    plain = out.index.get_level_values("k") == 0
    out.loc[plain, "draft_s"] = 0.0
    out["draft_from"] = np.where(plain, "none (k = 0)", np.where(timed.notna(), "round terms", "runs"))
    out["host_s"] = out["t_host_run_s"]
    return out.drop(columns=["t_draft_run_s", "t_host_run_s"]).reset_index()


def predict_speedups(terms: pd.DataFrame, acceptance: pd.DataFrame) -> pd.DataFrame:
    """Per (state, B, k): V_s = V(k, B) = verify_s + draft_s + host_s, and ``predicted`` =
    G(k) V(0, B) / V(k, B) (:func:`moespec.theory.speedup`, paper 1 eq. (9) with V(., B)), G(k) the
    geometric tokens per round at ``acceptance``'s ``a_measured`` of the cell (1 - 1e-12 where every
    draft was accepted, as notebook 05 caps a = 1); beside it ``predicted_realized``, the cell's
    measured ``tokens_per_round`` in place of G(k) (the prediction of time alone). k runs 0..kmax
    without a gap in every (state, B); k = 0 predicts 1."""
    df = terms.merge(acceptance[KEYS + ["a_measured", "tokens_per_round"]], on=KEYS, how="left", validate="one_to_one")
    df["V_s"] = df["verify_s"] + df["draft_s"] + df["host_s"]
    parts = []
    for (state, B), g in df.groupby(["state", "B"], sort=False):
        g = g.sort_values("k")
        if g["k"].tolist() != list(range(len(g))):
            raise ValueError(f"terms: draft lengths at state {state!r}, B = {B}: expected 0..kmax; "
                             f"found {g['k'].tolist()}")
        V = g["V_s"].to_numpy(dtype=float)
        pred = [1.0] + [float(batch_speedup(V, min(float(a), 1 - 1e-12), k))
                        for k, a in zip(g["k"].iloc[1:], g["a_measured"].iloc[1:])]
        parts.append(g.assign(predicted=pred, predicted_realized=g["tokens_per_round"].to_numpy() * V[0] / V))
    return pd.concat(parts, ignore_index=True)


def prediction_table(terms: pd.DataFrame, cells: pd.DataFrame, union_ratio: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`predict_speedups` beside the measured (:func:`cell_summary`): ``rel_error`` =
    predicted / measured - 1 (and ``rel_error_realized``); ``union_ratio`` (B, k), where given."""
    pred = predict_speedups(terms, cells)
    keep = ["measured", "measured_q25", "measured_q75", "throughput_per_seq", "reps", "read_GBps", "other_load"]
    out = pred.merge(cells[KEYS + keep], on=KEYS, how="left", validate="one_to_one")
    out["rel_error"] = out["predicted"] / out["measured"] - 1
    out["rel_error_realized"] = out["predicted_realized"] / out["measured"] - 1
    if union_ratio is not None:
        out = out.merge(union_ratio, on=["B", "k"], how="left", validate="many_to_one")
    return out


def best_k_table(pred: pd.DataFrame, by_rep: dict | None = None, seed: int = 0) -> pd.DataFrame:
    """Per (state, B): ``k_best_measured`` (the measured fastest k, plain decoding included),
    ``k_star_predicted`` (the smallest maximizer of the predicted speedup: k*(B)), their speedups,
    and ``regret`` = 1 - measured(k*(B)) / measured(best k): the share of the measured best lost by
    running the predicted k; with ``by_rep`` (:func:`ratios_by_rep`), its interval
    ``regret_lo``/``regret_hi`` (:func:`moespec.runstats.regret_interval`)."""
    rows = []
    for (state, B), g in pred.groupby(["state", "B"], sort=False):
        g = g.sort_values("k").reset_index(drop=True)
        best, star = int(g.loc[g["measured"].idxmax(), "k"]), int(g.loc[g["predicted"].idxmax(), "k"])
        m = g.set_index("k")["measured"]
        rows.append({"state": state, "B": int(B), "k_best_measured": best, "k_star_predicted": star,
                     "measured_best": float(m[best]), "measured_at_k_star": float(m[star]),
                     "predicted_at_k_star": float(g.set_index("k").loc[star, "predicted"]),
                     "regret": float(1 - m[star] / m[best])})
        ratios = (by_rep or {}).get((state, int(B)))
        lo, hi = regret_interval(ratios, star, seed=seed) if ratios is not None else (float("nan"),) * 2
        rows[-1].update(regret_lo=lo, regret_hi=hi, reps=0 if ratios is None else int(ratios.shape[1]))
    return pd.DataFrame(rows)


def _stops_paying(Bs: list, best: np.ndarray):
    """The smallest B from which no k >= 1 beats plain decoding at every larger B given (the best
    speedup, plain decoding included, is 1 there); None where speculation pays at the largest B
    (:func:`moespec.theory.stops_paying`'s rule on speedups)."""
    first = None
    for B, s in zip(reversed(Bs), best[::-1]):
        if s > 1.0:
            break
        first = int(B)
    return first


def rise_with_batch(best: pd.DataFrame) -> pd.DataFrame:
    """Per state: the best speedup per B (measured and predicted, each the largest over k) in order of
    B, whether it first rises with B (MoESD's claim: from the smallest B to the next, larger), and
    the batch size from which speculation stops paying (:func:`_stops_paying`), measured and predicted."""
    rows = []
    for state, g in best.groupby("state", sort=False):
        g = g.sort_values("B")
        meas, pred = g["measured_best"].to_numpy(), g["predicted_at_k_star"].to_numpy()
        rows.append({"state": state, "B": g["B"].tolist(), "best_measured": meas.round(4).tolist(),
                     "best_predicted": pred.round(4).tolist(),
                     "rises_measured": bool(len(meas) > 1 and meas[1] > meas[0]),
                     "rises_predicted": bool(len(pred) > 1 and pred[1] > pred[0]),
                     "B_best_measured": int(g["B"].iloc[int(np.argmax(meas))]),
                     "B_best_predicted": int(g["B"].iloc[int(np.argmax(pred))]),
                     "stops_paying_measured": _stops_paying(g["B"].tolist(), meas),
                     "stops_paying_predicted": _stops_paying(g["B"].tolist(), pred)})
    return pd.DataFrame(rows)


def union_ratios(trace: RoutingTrace, batch_sizes, kmax: int) -> pd.DataFrame:
    """Per (B, k): ``union_ratio`` = U(B, k + 1) / U(B, 1), the layer-mean distinct experts of a verify
    pass of B sequences x (k + 1) tokens over those of a plain pass of B tokens
    (:func:`moespec.routing.union_share`): the deduplicated expert bytes drafting k tokens adds, per
    byte of plain decoding at the same B (paper 1's byte model over B sequences' tokens)."""
    rows = []
    for B in batch_sizes:
        s = union_share(trace, int(B), kmax + 1)
        rows += [{"B": int(B), "k": k, "union_ratio": float(s[k] / s[0])} for k in range(kmax + 1)]
    return pd.DataFrame(rows)


def b1_against_05(nb05: pd.DataFrame, pred: pd.DataFrame) -> dict:
    """Notebook 05's B = 1 numbers beside this study's. ``recomputed_max_abs``: the largest
    |difference| between notebook 05's predicted speedups (``05_oracle_predictions.csv``:
    ``speedup_hat`` at each (state, d, a)) and this study's arithmetic (:func:`moespec.theory.speedup`
    on 05's own step times ``V_hat_ms`` at 05's a), over ``cells`` cells: the same prediction from the
    same terms. ``measured``: per state, this study's measured B = 1 speedups beside 05's oracle runs at
    the acceptance value of 05's grid nearest this run's and at each depth, the largest |relative
    difference| over the k both ran (different prompts and depths: reported, not required equal)."""
    diffs, n = [], 0
    for _, g in nb05.groupby(["state", "d", "a"]):
        g = g.sort_values("k")
        if g["k"].tolist() != list(range(len(g))):
            continue
        V, a = g["V_hat_ms"].to_numpy(dtype=float), min(float(g["a"].iloc[0]), 1 - 1e-12)
        mine = np.array([speedup(V, a, int(k)) for k in g["k"]])
        diffs.append(np.abs(mine - g["speedup_hat"].to_numpy()).max())
        n += len(g)
    out = {"cells": n, "recomputed_max_abs": float(max(diffs)) if diffs else float("nan"), "measured": []}
    ours = pred[pred["B"] == 1]
    for state, g in ours.groupby("state", sort=False):
        theirs = nb05[nb05["state"] == state]
        if theirs.empty:
            continue
        a_run = float(np.nanmedian(g["a_measured"]))
        a = float(theirs["a"].iloc[int(np.argmin(np.abs(theirs["a"].to_numpy() - a_run)))])
        t = theirs[theirs["a"] == a].groupby("k")["speedup_meas"].median()
        both = g.set_index("k")["measured"].reindex(t.index).dropna()
        if both.empty:
            continue
        rel = (both / t.loc[both.index] - 1).abs()
        out["measured"].append({"state": state, "a_05": a, "k": [int(k) for k in both.index],
                                "max_abs_rel_difference": float(rel.max())})
    return out


def batch_goals(pred: pd.DataFrame, best: pd.DataFrame, b1: dict | None = None) -> pd.DataFrame:
    """The goals of notebook 09 from the run's own tables: per state, the prediction within
    :data:`TOLERANCE` at every (B, k) with k <= 8; per (state, B), the measured best k equal to the
    predicted k*(B) or its regret at most :data:`REGRET_GOAL`; with notebook 05's numbers (``b1``:
    :func:`b1_against_05`), its B = 1 predicted speedups recomputed equal, and the measured B = 1
    speedups beside its oracle runs (reported beside the goals)."""
    rows = []
    for state, g in pred[pred["k"] <= 8].groupby("state", sort=False):
        tol = tolerance(state)
        err = g["rel_error"].abs()
        rows.append(G._row(f"predicted speedup within {100 * tol:.0f} % at every (B, k <= 8), {state} machine",
                           f"{int((err <= tol).sum())} of {len(g)} cells; largest |error| {100 * err.max():.1f} %",
                           f"all (<= {100 * tol:.0f} %)", bool((err <= tol).all()), False))
    for r in best.itertuples():
        rows.append(G._row(f"measured best k = predicted k*(B) or regret <= {100 * REGRET_GOAL:.0f} %, "
                           f"B = {r.B}, {r.state} machine",
                           f"best k {r.k_best_measured}, k*(B) {r.k_star_predicted}, regret {100 * r.regret:.1f} %",
                           f"equal, or regret <= {100 * REGRET_GOAL:.0f} %",
                           r.k_best_measured == r.k_star_predicted or r.regret <= REGRET_GOAL, False))
    if b1 is not None and b1["cells"]:
        rows.append(G._row("B = 1: notebook 05's predicted speedups recomputed by this notebook's arithmetic from "
                           "05's step times", f"largest |difference| {b1['recomputed_max_abs']:.3g} over "
                           f"{b1['cells']} cells", f"<= {EQUAL_ATOL:g}", b1["recomputed_max_abs"] <= EQUAL_ATOL, False))
        for m in b1["measured"]:
            tol = tolerance(m["state"])
            rows.append(G._row(f"B = 1: measured speedup beside notebook 05's oracle runs (a = {m['a_05']:g}, every "
                               f"depth), {m['state']} machine",
                               f"largest |relative difference| {100 * m['max_abs_rel_difference']:.1f} % over "
                               f"k = {m['k'][0]}..{m['k'][-1]}", f"reported (other prompts and depths; "
                               f"<= {100 * tol:.0f} %)", m["max_abs_rel_difference"] <= tol, False))
    return pd.DataFrame(rows, columns=["goal", "value", "target", "met", "preregistered"])


# --- the study ------------------------------------------------------------------------------------
class BatchAxisStudy:
    """The state of one notebook-09 run: the subject, its run sizes ``P`` (notebook "09" of
    :mod:`moespec.notebook_profiles`), the data folder ``out`` and figures folder ``fig_dir``, the
    prompts with their greedy continuations, and what the sections measured so far."""

    def __init__(self, sub, P: dict, out, fig_dir, profile: str, device: str = "cpu", seed: int = 0):
        self.sub, self.P, self.out, self.fig_dir = sub, P, out, fig_dir
        self.profile, self.device, self.seed, self.label = profile, device, seed, sub.label
        self.sub.engine.dedup = True              # the deduplicating kernel from n = 2, as notebook 05's oracle runs
        self.ref = ReferenceRead(FLUSH_FLOOR_BYTES if profile == "quick" else None, device=device)
        Bs, ks = P["batch_sizes"], P["ks"]
        self.kmax = max(ks)
        self.n_union = max(Bs) * (self.kmax + 1)
        self.prompts = [np.asarray(p) for p in sub.chat_prompts(max(Bs), P["prompt_tokens"], seed=seed)]
        length = max(P["n_tokens"] + self.kmax + 1, self.n_union)     # untimed: the oracle's text and the routing's
        self.refs = [prompt_reference(sub.engine, p, length)[1] for p in self.prompts]
        self.frames: dict = {"runs": [], "terms": []}
        self.states: dict = {}
        self.results: dict = {}

    def _write(self, name: str, df: pd.DataFrame) -> None:
        io.write_dataframe(self.fig_dir / name, run_identity.stamp_frame(df.assign(subject=self.label)))

    # --- 0. routing ---------------------------------------------------------------------------
    def routing(self) -> Result:
        """The routing of each prompt and its greedy continuation (one teacher-forced pass each,
        untimed): the union share against n, and the union ratio per (B, k)."""
        docs = []
        for p, ref in zip(self.prompts, self.refs):
            self.sub.engine.reset()
            docs.append(self.sub.engine.record_routing([int(t) for t in p] + ref))
        self.sub.engine.reset()
        trace = RoutingTrace(docs, num_experts=int(self.sub.description["expert_shape"][0]), model=self.label,
                             source="prompts and their greedy continuations")
        curves = union_share_curves(trace, self.P["batch_sizes"], n_max=self.n_union,
                                    resamples=self.P["union_resamples"], seed=self.seed)
        self.union = union_ratios(trace, self.P["batch_sizes"], self.kmax)
        trace.save(self.out / "routing.npz")
        self._write("09_union_share.csv", curves)
        self._write("09_union_ratio.csv", self.union)
        io.save_figure(union_share_figure(curves, title=f"union share against the pass's tokens: {self.label}"),
                       self.fig_dir / "09_union_share.png")
        at = self.union[self.union["k"] == self.kmax].set_index("B")["union_ratio"]
        share = curves[curves["j"] == 1].set_index("B")["share"]
        return Result([f"routing of {len(docs)} prompts with their greedy continuations ({sum(map(len, docs))} tokens)",
                       "union share of a plain pass (B tokens, one per sequence): "
                       + ", ".join(f"B = {B}: {share[B]:.3f}" for B in share.index),
                       f"experts a pass of B x {self.kmax + 1} tokens reads over a plain pass of B tokens: "
                       + ", ".join(f"B = {B}: {v:.2f}" for B, v in at.items())],
                      {"union ratio U(B, k + 1) / U(B, 1)": self.union.pivot(index="k", columns="B",
                                                                             values="union_ratio").round(3)
                       .reset_index()},
                      files=["09_union_share.csv", "09_union_ratio.csv", "09_union_share.png"])

    # --- 1. the interleaved run of one machine state -----------------------------------------
    def _drafter(self, k: int):
        if k == 0:
            return None
        if self.P["draft_kind"] == "real":
            return BatchModelDraft(self.sub.draft)
        return BatchOracleDraft(self.sub.engine, float(self.P["oracle_a"]), self.sub.vocab_size, seed=self.seed)

    def _cell(self, setup, k: int) -> dict:
        """One (B, k) cell's run from ``setup``'s prefilled prompts (a :class:`RoundSetup`), after a
        reference read and one untimed plain pass of its B sequences (the read evicts the machine's
        caches; a decode loop's round follows another round, as in the terms' blocks)."""
        B = setup.batch
        bw = self.ref()
        setup.restore()
        setup.target.forward([[int(f)] for f in setup.firsts])
        setup.restore()
        drafter = self._drafter(k)
        oracle = drafter is not None and self.P["draft_kind"] == "oracle"
        with MachineMonitor(self.device) as mon:
            _, steps = batch_generate(setup.target, self.prompts[:B], k, self.P["n_tokens"], drafter=drafter,
                                      references=self.refs[:B] if oracle else None, prefilled=setup.firsts)
        if oracle:   # a continuation the run extended (untimed, between rounds) serves every later run
            for b, ref in enumerate(drafter.references):
                if len(ref) > len(self.refs[b]) and list(ref[:len(self.refs[b])]) == list(self.refs[b]):
                    self.refs[b] = np.asarray(ref)
        acc = sum(sum(s.accepted) for s in steps)
        rej = sum(sum(j < k for j in s.accepted) for s in steps)
        return {**summarize_batch_steps(steps), "accepted": acc, "rejections": rej, "read_GBps": bw,
                **mon.state.row()}

    def run_state(self, state: str) -> Result:
        """In machine state ``state``: every repetition, the (B, k) cells and one block of the round
        terms in a seeded shuffled order (module docstring, step 1)."""
        P = self.P
        if P["draft_kind"] == "real" and self.sub.draft is None:
            raise ValueError(f"sizes: field draft_kind: 'real' needs the subject's draft; {self.label} has none")
        cells = [(B, k) for B in P["batch_sizes"] for k in P["ks"]]
        rng = np.random.default_rng([self.seed, len(self.states)])
        runs, terms = [], []
        with machine_state(state, pin=self.device == "cpu") as ms:
            draft = self.sub.draft if P["draft_kind"] == "real" else None
            oracle = None if draft is not None else (P["oracle_a"], self.sub.vocab_size, self.seed)
            setups = [round_setup(self.sub.engine, draft, self.prompts[:B],
                                  continuations=[r[1:] for r in self.refs[:B]], oracle=oracle)
                      for B in P["batch_sizes"]]
            by_batch = {s.batch: s for s in setups}       # each B's prompts prefilled once, for runs and terms
            order = [(rep, i) for rep in range(P["reps"]) for i in rng.permutation(len(cells) + 1)]
            places = text_positions(P["n_tokens"], P["term_positions"])   # block r: places[r::reps]
            for rep, i in tqdm(order, desc=f"batch runs {state}", unit="cell"):
                if i == len(cells):
                    rows = time_round_terms(setups, P["ks"], reps=1, warmup=0, read=(self.ref.fn, self.ref.nbytes),
                                            offsets=places[rep::P["reps"]])
                    terms.append(rows.assign(state=state, rep=rep))
                else:
                    B, k = cells[i]
                    runs.append({"state": state, "rep": rep, **self._cell(by_batch[B], k)})
        self.states[state] = ms.describe()
        runs, terms = pd.DataFrame(runs), pd.concat(terms, ignore_index=True)
        self.frames["runs"].append(runs)
        self.frames["terms"].append(terms)
        io.write_dataframe(self.out / "batch_runs.csv", pd.concat(self.frames["runs"], ignore_index=True))
        io.write_dataframe(self.out / "batch_terms.csv", pd.concat(self.frames["terms"], ignore_index=True))
        summ = cell_summary(runs)
        shown = summ.pivot(index="k", columns="B", values="measured").round(3).reset_index()
        return Result([f"[{state}] {ms.describe()['what']}",
                       f"[{state}] {len(runs)} runs of {P['n_tokens']} tokens per sequence ({P['reps']} repetitions of "
                       f"{len(cells)} cells) and {P['reps']} blocks of the round terms, interleaved; read "
                       f"{runs['read_GBps'].median():.2f} GB/s before the runs, {terms['read_GBps'].median():.2f} GB/s "
                       f"in the terms' blocks (medians); other processes' share of the CPUs: median "
                       f"{runs['other_load'].median():.2f}",
                       f"[{state}] measured acceptance per run: median "
                       f"{summ.loc[summ.k > 0, 'a_measured'].median():.3f} over the (B, k >= 1) cells"],
                      {f"measured speedup over plain decoding at the same B ({state})": shown})

    # --- 2. predictions, goals, files ---------------------------------------------------------
    def finish(self) -> Result:
        """The prediction table, the best k per B, the rise with B, the goals and the figures."""
        runs = pd.concat(self.frames["runs"], ignore_index=True)
        term_rows = pd.concat(self.frames["terms"], ignore_index=True)
        cells = cell_summary(runs)
        terms = round_terms(term_rows, cells)
        pred = prediction_table(terms, cells, getattr(self, "union", None))
        rank = {s: i for i, s in enumerate(self.P["states"])}          # the states in the order they ran
        pred = pred.sort_values(["state", "B", "k"], key=lambda c: c.map(rank) if c.name == "state" else c,
                                ignore_index=True)
        best = best_k_table(pred, ratios_by_rep(runs), seed=self.seed)
        rise = rise_with_batch(best)
        nb05 = self.fig_dir / "05_oracle_predictions.csv"
        b1 = b1_against_05(pd.read_csv(nb05), pred) if nb05.is_file() else None
        goals = batch_goals(pred, best, b1)
        cols = ["state", "B", "k", "n_pass", "predicted", "measured", "rel_error", "tolerance", "measured_q25",
                "measured_q75", "predicted_realized", "rel_error_realized", "a_measured", "tokens_per_round",
                "verify_s", "draft_s", "draft_from", "host_s", "V_s", "union_ratio", "throughput_per_seq", "reps",
                "read_GBps", "other_load"]
        pred = pred.assign(n_pass=pred["B"] * (pred["k"] + 1),
                           tolerance=[tolerance(s) for s in pred["state"]])
        self._write("09_batch_predictions.csv", pred[[c for c in cols if c in pred]])
        self._write("09_best_k.csv", best)
        self._write("09_rise_with_batch.csv", rise)
        self._write("09_goals.csv", goals)
        io.save_figure(batch_predictions_figure(pred, title=f"speedup at batch B, predicted and measured: "
                                                            f"{self.label}"), self.fig_dir / "09_batch_predictions.png")
        io.save_figure(schedule_figure(best, title=f"draft length per batch size: {self.label}"),
                       self.fig_dir / "09_schedule.png")
        io.write_json(self.out / "batch_run.json", {"profile": self.profile, "subject": self.label, "sizes": self.P,
                                                    "device": self.device, "seed": self.seed,
                                                    "machine_states": self.states})
        self.results.update(pred=pred, best=best, rise=rise, goals=goals, b1=b1)
        lines = []
        for state, g in pred.groupby("state", sort=False):
            err = g["rel_error"].abs()
            lines.append(f"[{state}] predicted within {100 * tolerance(state):.0f} % at "
                         f"{int((err <= tolerance(state)).sum())} of {len(g)} (B, k) cells; largest |error| "
                         f"{100 * err.max():.1f} % (with the runs' tokens per round in place of G(k): "
                         f"{100 * g['rel_error_realized'].abs().max():.1f} %)")
        for r in best.itertuples():
            lines.append(f"[{r.state}] B = {r.B}: measured best k = {r.k_best_measured} ({r.measured_best:.3f}), "
                         f"predicted k*(B) = {r.k_star_predicted} (measured there {r.measured_at_k_star:.3f}); "
                         f"regret {100 * r.regret:.1f} % [{100 * r.regret_lo:.1f}, {100 * r.regret_hi:.1f}] "
                         f"over {r.reps} repetitions")
        for r in rise.itertuples():
            lines.append(f"[{r.state}] best speedup per B {r.B}: measured {r.best_measured}, predicted "
                         f"{r.best_predicted}; first rises with B: measured {r.rises_measured}, predicted "
                         f"{r.rises_predicted}; speculation stops paying from B = {r.stops_paying_measured} measured, "
                         f"{r.stops_paying_predicted} predicted (None: it pays at the largest B)")
        lines.append("notebook 05's B = 1 numbers: " + ("not in this run folder" if b1 is None else
                     f"its predicted speedups recomputed here within {b1['recomputed_max_abs']:.3g} over {b1['cells']} "
                     "cells"))
        shown = table(pred, ["state", "B", "k", "predicted", "measured", "rel_error", "a_measured", "V_s",
                             "union_ratio"], 4)
        return Result(lines, {"predicted and measured speedup": shown, "best k per B": table(best, list(best)),
                              "goals": goals},
                      files=["09_batch_predictions.csv", "09_best_k.csv", "09_rise_with_batch.csv", "09_goals.csv",
                             "09_batch_predictions.png", "09_schedule.png"])

    def summary(self) -> str:
        """The notebook's closing paragraph, every number from this run's tables."""
        pred, best, rise = self.results["pred"], self.results["best"], self.results["rise"]
        out = [f"**{self.profile} profile, {self.label}**, B in {self.P['batch_sizes']}, k = 0..{self.kmax}, "
               f"{self.P['draft_kind']} draft."]
        for state, g in pred.groupby("state", sort=False):
            tol = tolerance(state)
            out.append(f"On the {state} machine the round model predicts the speedup within {100 * tol:.0f} % at "
                       f"{int((g.rel_error.abs() <= tol).sum())} of {len(g)} (B, k) cells (largest |error| "
                       f"{100 * g.rel_error.abs().max():.1f} %).")
        hit = best[(best.k_best_measured == best.k_star_predicted) | (best.regret <= REGRET_GOAL)]
        out.append(f"The predicted k*(B) is the measured best or within {100 * REGRET_GOAL:.0f} % of it at {len(hit)} "
                   f"of {len(best)} (state, B); the largest regret is {100 * best.regret.max():.1f} %.")
        for r in rise.itertuples():
            verdict = "rises" if r.rises_measured else "does not rise"
            out.append(f"On the {r.state} machine the best measured speedup {verdict} from B = {r.B[0]} to B = "
                       f"{r.B[1] if len(r.B) > 1 else r.B[0]} ({r.best_measured}; predicted {r.best_predicted}).")
        if "union_ratio" in pred:
            u = pred[(pred.k == self.kmax)].groupby("B")["union_ratio"].first()
            out.append(f"The byte model's reason: a pass of B x {self.kmax + 1} tokens reads "
                       + ", ".join(f"{v:.2f}x (B = {B})" for B, v in u.items())
                       + " the distinct experts of a plain pass of B tokens; where this ratio falls with B, drafted "
                         "tokens land on experts the batch already reads, and the verify pass's extra cost per drafted "
                         "token shrinks (MoESD's argument), while the once-per-pass bytes are shared either way.")
        if self.profile != "full":
            out.append("The quick profile runs tiny models at small sizes; set `profile = \"full\"` for the "
                       "measurements behind figures/.")
        return " ".join(out)
