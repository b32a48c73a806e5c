"""``moespec advise --batch-sizes``: the best draft length k*(B) at each batch size B and the per-batch
schedules engines take (vLLM's ``num_speculative_tokens_per_batch_size``, SGLang's adaptive config;
:mod:`.settings`).

At batch B each of B sequences drafts k tokens and one verify pass checks n = B(k + 1) tokens
(:mod:`moespec.theory.batch`). The step time is V(k, B) = t_draft(k) + tau_p(B, k) + h(k), with:

* tau_p(B, k) at B = 1: the source's verify time tau_p(k + 1) (a run's measured round, a bandwidth
  table's or an engine benchmark's row), so that B = 1 is the single-sequence decision, number for number;
* at B >= 2 where the source has a row at n = B(k + 1) (n <= 9): that row, moved to the union of the
  B sequences' experts by paper 1's fit (4)/(E.1) of the rows (its slope in U at that n);
* beyond the rows: the fit (4)/(E.1) at (n, U(B, k + 1)), plus the fit's residual at the last row.

The fit is :func:`moespec.fit.fit_one` on the source's own rows (per-slot kernel: n = 1..9; the
deduplicating kernel: n = 2..9; whole passes: U the distinct (expert, layer) pairs of a pass, m the
slots per token over all layers, b = 1, so that the coefficients are seconds per pair), with U of each
row from the run's routing term (the calibration's own passes), else the source's byte share ubar(n),
else the trace's mean union. The union of B sequences, U(B, k + 1), is the trace's
(:func:`moespec.routing.batch_union`: B independent sequences): B >= 2 needs a routing trace of the model.
What the rows and the fit do not hold is stated with the answer: the key-value reads of the other
B - 1 sequences, and the draft's and host's time of a batch (the one-sequence terms are used).
"""

from __future__ import annotations

import math

import numpy as np

from moespec import theory as th
from moespec.fit import fit_one, fitted_time
from moespec.predict.round_model import ENGINES
from moespec.routing import batch_union, mean_union

from .curves import VerifyCurves
from .errors import AdviceInputError
from .settings import batch_schedule_settings

#: Batch sizes are whole numbers of sequences from 1 to this (vLLM's and SGLang's ranges are ints).
MAX_BATCH = 4096


def check_batch_sizes(batch_sizes) -> list[int]:
    """The batch sizes as sorted distinct ints >= 1, with 1 added (the schedules start at 1)."""
    out = set()
    for B in batch_sizes:
        if isinstance(B, bool) or not isinstance(B, (int, np.integer)) or not 1 <= B <= MAX_BATCH:
            raise AdviceInputError(f"--batch-sizes {B!r}: expected whole numbers of sequences in [1, {MAX_BATCH}]; "
                                   f"found {B!r}", where="--batch-sizes", expected=f"[1, {MAX_BATCH}]", found=B)
        out.add(int(B))
    return sorted(out | {1})


def _rows_union(curves: VerifyCurves, trace, slots: int) -> tuple[np.ndarray, str]:
    """U of each source row n = 1..n_max (distinct (expert, layer) pairs per pass) and what it is."""
    rm = curves.round_model
    n = np.arange(1, rm.n_max + 1)
    if rm.routing is not None:
        U = np.asarray(rm.routing.distinct, float)
        if not math.isclose(U[0], slots):
            raise AdviceInputError(f"--trace {trace.label}: {trace.num_layers} MoE layers x m = {trace.top_k} = "
                                   f"{slots} (expert, layer) pairs per token; the run's round model counts "
                                   f"{U[0]:g} at n = 1: the trace is not of the run's model", where="--trace",
                                   expected=U[0], found=slots)
        return U, "the rows' own routing (the round model's routing term)"
    if curves.ubar is not None:
        return np.asarray(curves.ubar, float) * n * slots, "the source's byte share ubar(n) of the rows"
    return mean_union(trace, rm.n_max).sum(axis=0), "the trace's mean union (the rows record no routing)"


def _fits(curves: VerifyCurves, U_rows: np.ndarray, slots: int) -> dict:
    """Fit (4) (per-slot, rows n = 1..n_max) and (E.1) (deduplicating, rows n = 2..n_max) to the rows."""
    rm = curves.round_model
    n = np.arange(1, rm.n_max + 1)
    out = {}
    for p, first in (("slot", 0), ("dedup", 1)):
        t = rm.verify[p].values_s
        try:
            out[p] = fit_one(p, n[first:], slots, U_rows[first:], 1.0, t[first:])
        except ValueError as err:
            raise AdviceInputError(f"--batch-sizes: the {p} kernel's rows n = {first + 1}..{rm.n_max} do not "
                                   f"determine fit {'(4)' if p == 'slot' else '(E.1)'}: {err}",
                                   where="--batch-sizes") from None
    return out


def _tau(curves, fits, U_rows, U_B, B: int, slots: int) -> tuple[dict, list[str]]:
    """tau_p(B, k), k = 0..kmax, per kernel, and where each k's value comes from."""
    rm = curves.round_model
    K, n_max = rm.kmax + 1, rm.n_max
    n = B * np.arange(1, K + 1)
    tau = {}
    for p in ("slot", "dedup"):
        rows = rm.verify[p].values_s
        if B == 1:
            tau[p] = rows[:K].copy()
            continue
        fit = fitted_time(p, fits[p], n, slots, U_B, 1.0)
        at_rows = fitted_time(p, fits[p], np.minimum(n, n_max), slots, U_rows[np.minimum(n, n_max) - 1], 1.0)
        last = rows[n_max - 1] - fitted_time(p, fits[p], np.array([n_max]), slots, U_rows[-1:], 1.0)[0]
        tau[p] = np.where(n <= n_max, rows[np.minimum(n, n_max) - 1] + fit - at_rows, fit + last)
    where = ["row" if B == 1 else "row moved to the B sequences' union by the fit" if x <= n_max else
             "fit (4)/(E.1) plus its residual at the last row" for x in n]
    return tau, where


def _engine_tau(tau: dict, engine: str, n_switch, B: int) -> np.ndarray:
    if engine != "switch":
        return tau[engine]
    if n_switch is None:
        return tau["slot"]
    n = B * np.arange(1, len(tau["slot"]) + 1)
    return np.where(n < n_switch, tau["slot"], tau["dedup"])


def batch_schedule(curves: VerifyCurves, advice: dict, batch_sizes, trace=None, method: str = "draft_model",
                   target: str = "<target-model>", draft: str = "<draft-model>",
                   sglang_config: str = "adaptive_config.json") -> dict:
    """k*(B) for each batch size, for the first acceptance item of ``advice`` (:func:`.decide.decide`'s
    output on ``curves``), and the schedules that carry it into vLLM and SGLang (JSON-ready dict)."""
    Bs = check_batch_sizes(batch_sizes)
    rm = curves.round_model
    K = rm.kmax + 1
    item = advice["acceptance"][0]
    E = np.asarray(item["tokens_per_step"], float)[:K]
    n_switch = advice["dedup"]["from_n"]
    rec1 = item["recommended"]
    if max(Bs) > 1 and trace is None:
        raise AdviceInputError("--batch-sizes with B >= 2 needs the union of B sequences' experts: give --trace "
                               "T.npz, a routing trace of the model (notebook 01's, moespec import-routing's, or "
                               "synthetic)", where="--trace")
    slots = None if trace is None else trace.top_k * trace.num_layers
    fits = U_rows = None
    rows_note = ""
    if max(Bs) > 1:
        U_rows, rows_note = _rows_union(curves, trace, slots)
        fits = _fits(curves, U_rows, slots)
    one_path = curves.subject.get("kernel_paths") == "one"
    rows = []
    for B in Bs:
        U_B = None if B == 1 else batch_union(trace, B, K).sum(axis=0)
        tau, where = _tau(curves, fits, U_rows, U_B, B, slots)
        engines = {}
        for e in ENGINES:
            V = rm.draft.term.values_s[:K] + _engine_tau(tau, e, n_switch, B) + rm.host.values_s[:K]
            T = E / V
            k = int(np.argmax(T))
            engines[e] = {"k": k, "throughput_per_sequence": float(T[k]), "speedup": float(T[k] / T[0]),
                          "step_ms": [1e3 * float(v) for v in V]}
        if B == 1:   # the single-sequence decision, number for number
            best = rec1["engine"]
            engines[best].update(k=rec1["k"], speedup=rec1["speedup"],
                                 throughput_per_sequence=item["engines"][best]["throughput_per_s"])
        elif one_path:   # one kernel path timed per pass size: no engine to choose between
            best = rec1["engine"]
        else:
            top = max(x["throughput_per_sequence"] for x in engines.values())
            tied = [e for e in ENGINES if engines[e]["throughput_per_sequence"] == top]
            best = rec1["engine"] if rec1["engine"] in tied else tied[0]
        x = engines[best]
        rows.append({"B": B, "engine": best, "k": x["k"], "speedup": x["speedup"],
                     "throughput_per_sequence": x["throughput_per_sequence"],
                     "throughput_per_batch": B * x["throughput_per_sequence"],
                     "pass_tokens": [B * (k + 1) for k in range(K)], "verify_from": where,
                     "union_pairs": None if U_B is None else [float(u) for u in U_B], "engines": engines})
    assumptions = [f"V(k, B) = t_draft(k) + tau(B, k) + h(k), n = B(k + 1) tokens per verify pass; tokens per "
                   f"step E(k) of {item['label']} for every sequence",
                   "t_draft(k) and h(k): the one-sequence terms (a batch's draft and host time not measured)",
                   "key-value reads of the other B - 1 sequences not in the rows or the fit (each sequence reads its "
                   "own cache: V(k, B) leaves them out)"]
    if one_path:
        assumptions.append(f"one kernel path timed per pass size: the B = 1 decision's engine ({rec1['engine']}) "
                           "at every B")
    if max(Bs) > 1:
        assumptions += [f"union of B sequences: {trace.label}, B independent sequences (moespec.routing.batch)",
                        f"rows' union: {rows_note}; beyond n = {rm.n_max}: fit (4)/(E.1) of the rows plus its "
                        "residual at the last row"]
    stop = None          # the smallest B from which k*(B) = 0 through the largest B given (theory.stops_paying)
    for r in reversed(rows):
        if r["k"] > 0:
            break
        stop = r["B"]
    out = {"acceptance": item["label"], "a": item["a"], "batch_sizes": Bs, "rows": rows, "assumptions": assumptions,
           "speculation_stops_from": stop,
           "fits": None if fits is None else {p: {c: float(v) for c, v in f.items() if isinstance(v, float)}
                                                 for p, f in fits.items()}}
    out.update(batch_schedule_settings({r["B"]: r["k"] for r in rows}, method, target, draft, sglang_config))
    return out


__all__ = ["batch_schedule", "check_batch_sizes", "MAX_BATCH"]
