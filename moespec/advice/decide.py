"""The decision of ``moespec advise``, from a round model and acceptance rates, by the theory of
paper 1 (Section 3; Table 2's bounds): from which pass size the deduplicating kernel is faster,
the best draft length k*(a) and its speedup per kernel, the error band of every speedup per k
(bound (21) with delta_k from the round model's terms, :meth:`RoundModel.speedups`), the share of
throughput a wrong choice loses, and how the answer changes between the machine states the run
measured. Every step time is the round model's (:mod:`moespec.predict.round_model`); every other
number a call into :mod:`moespec.theory`.

Three engines are compared: per-slot kernel at every pass size ("slot"), deduplicating kernel
from n = 2 ("dedup", n = 1 runs the per-slot kernel either way), and "switch": per-slot below the
predicted crossover, deduplicating from it (what an engine with a configurable cap does).

One decision: the kernel decision's own engine (:func:`own_engine`: the per-slot kernel where
deduplication never pays, the deduplicating kernel where it pays from n = 2, the switch otherwise)
is recommended wherever it is among the fastest, and the kernel switch printed with a
recommendation is that engine's (:func:`switch_for`); another engine is recommended only where it
is strictly faster at the recommended draft length, and then its switch is printed.
"""

from __future__ import annotations

import numpy as np

from moespec import theory as th
from moespec.predict.round_model import ENGINES
from moespec.theory import crossover

from .curves import VerifyCurves

ENGINE_NAMES = {"slot": "per-slot kernel at every n", "dedup": "deduplicating kernel from n = 2",
                "switch": "per-slot below the crossover, deduplicating from it"}
SCHEMA_ID = "moespec.advice/2"


def engine_name(engine: str, n_switch: int | None) -> str:
    """How the answer names ``engine``; the switch with its crossover where there is one."""
    if engine == "switch" and n_switch is not None:
        return f"per-slot kernel up to n = {n_switch - 1}, deduplicating from n = {n_switch}"
    return ENGINE_NAMES[engine]


def _opt(x):
    return None if x is None else int(x)


def kernel_decision(curves: VerifyCurves) -> dict:
    """The pass size from which deduplication is faster: the predicted crossover (smallest n from
    which S(n) > 0 through n_max), and its interval from the saving interval (earliest: where the
    upper end stays positive; latest, i.e. guaranteed: where the lower end does)."""
    S = curves.saving
    rows = []
    for i in range(curves.n_max):
        row = {"n": i + 1, "tau_slot_ms": 1e3 * curves.tau["slot"][i], "tau_dedup_ms": 1e3 * curves.tau["dedup"][i],
               "saving_ms": 1e3 * S[i], "saving_lo_ms": 1e3 * curves.S_lo[i], "saving_hi_ms": 1e3 * curves.S_hi[i],
               "dedup_faster": bool(S[i] > 0), "sign_certain": bool(curves.S_lo[i] > 0 or curves.S_hi[i] < 0)}
        if curves.ubar is not None and curves.r is not None and curves.eps is not None:
            row.update(ubar=float(curves.ubar[i]), r=float(curves.r[i]))
            if i > 0:
                row["kernels_agree_19"] = bool(th.kernels_agree(curves.ubar[i], curves.r[i], curves.eps))
                if curves.log_gap_range is not None:  # (19) over the rounding of the table read
                    row["margin_19_verdict"] = th.margin_verdict(*curves.log_gap_range[i], curves.eps)
        rows.append(row)
    return {"from_n": _opt(crossover(S)), "earliest_n": _opt(crossover(curves.S_hi)),
            "guaranteed_from_n": _opt(crossover(curves.S_lo)), "interval": curves.interval, "pass_sizes": rows}


def _engine_at(rm, engine: str, n_switch, a: float, E=None) -> dict:
    """One engine's best draft length and speedups at acceptance ``a`` (geometric, G_a(k)) or, where
    ``E`` is given, at those tokens per step E(k), k = 0..kmax (a measured acceptance profile)."""
    V = rm.step_times(engine, n_switch)
    if E is None:
        T = np.asarray(th.throughput(V, a), float)
        k = int(th.best_draft_length(V, a))
    else:
        T = np.asarray(E, float)[: len(V)] / V
        k = int(np.argmax(T))          # the smallest maximizer, as best_draft_length
    sp = rm.speedups(a if E is None else np.asarray(E, float)[: len(V)], engine, n_switch)
    delta = rm.delta_by_k(engine, n_switch)
    neighbours = [j for j in (k - 1, k + 1) if 0 <= j < len(V)]
    dmax = float(np.max(delta))
    if E is None:
        certain = bool(dmax < 1 and th.separation_holds(V, a, dmax))
    else:   # the separation condition of (20) on these throughputs
        certain = bool(dmax < 1 and np.all((1 + dmax) / (1 - dmax) * np.delete(T, k) < T[k]))
    return {"k_star": k, "speedup": float(sp["speedup"][k]), "speedup_lo": float(sp["speedup_lo"][k]),
            "speedup_hi": float(sp["speedup_hi"][k]), "throughput_per_s": float(T[k]),
            "k_star_certain": certain,
            "loss_k_off_by_one": float(max(1 - T[j] / T[k] for j in neighbours)) if neighbours else 0.0,
            "speedup_by_k": [float(x) for x in sp["speedup"]], "speedup_lo_by_k": [float(x) for x in sp["speedup_lo"]],
            "speedup_hi_by_k": [float(x) for x in sp["speedup_hi"]], "delta_by_k": [float(x) for x in delta],
            "step_ms_by_k": [1e3 * float(x) for x in V]}


def own_engine(n_switch: int | None) -> str:
    """The engine the kernel decision alone describes: per-slot at every n where deduplication never
    pays (``n_switch`` None), deduplicating from n = 2 where it pays from 2, the switch otherwise."""
    return "slot" if n_switch is None else "dedup" if n_switch == 2 else "switch"


def switch_for(engine: str, n_switch: int | None) -> int | None:
    """The pass size from which ``engine`` runs the deduplicating kernel (None: never)."""
    return {"slot": None, "dedup": 2, "switch": n_switch}[engine]


def _recommend(rm, a: float, n_switch, E=None) -> tuple[str, dict]:
    """(best engine, every engine's numbers): the fastest engine; of engines equally fast, the kernel
    decision's own (:func:`own_engine`) where it drafts, else the simpler (order of ENGINES: plain
    decoding runs the per-slot kernel in every engine)."""
    engines = {e: _engine_at(rm, e, n_switch, a, E) for e in ENGINES}
    top = max(x["throughput_per_s"] for x in engines.values())
    tied = [e for e in ENGINES if engines[e]["throughput_per_s"] == top]
    own = own_engine(n_switch)
    return (own if own in tied and engines[own]["k_star"] > 0 else tied[0]), engines


def kernel_switch_of(item: dict, n_switch: int | None) -> int | None:
    """The kernel switch printed with one acceptance rate's recommendation (``item`` of
    :func:`decide`): the kernel decision's crossover ``n_switch``, unless another engine than the
    decision's own is strictly faster at the recommended draft length; then that engine's."""
    best = item["recommended"]["engine"]
    own = own_engine(n_switch)
    if best == own or item["recommended"]["k"] == 0 or item["engines"][own]["throughput_per_s"] == \
            item["engines"][best]["throughput_per_s"]:
        return n_switch
    return switch_for(best, n_switch)


def _items(acceptance) -> list[dict]:
    """Acceptance as items {a, label, tokens, how}: a float or (a, label) is geometric (tokens None);
    a dict with ``tokens`` (E(k), k = 0..kmax) is a measured profile, ``a`` its geometric fit."""
    out = []
    for x in acceptance:
        if isinstance(x, dict):
            out.append({"a": float(x["a"]), "label": str(x["label"]), "tokens": x.get("tokens"),
                        "how": x.get("how", "")})
        elif isinstance(x, (tuple, list)):
            out.append({"a": float(x[0]), "label": str(x[1]), "tokens": None, "how": ""})
        else:
            out.append({"a": float(x), "label": "given", "tokens": None, "how": ""})
    return out


def decide(curves: VerifyCurves, acceptance) -> dict:
    """The advice for acceptance rates ``acceptance`` (floats in [0, 1) or (a, label) pairs:
    geometric acceptance; or dicts {a, label, tokens, how}: tokens per step E(k), k = 0..kmax, of a
    measured profile, a its geometric fit), as a JSON-ready dict (schema
    :data:`moespec.advice.report.ADVICE_SCHEMA`)."""
    items = _items(acceptance)
    if not items:
        raise ValueError("acceptance: give at least one acceptance rate")
    th.expected_tokens(np.array([x["a"] for x in items]), 0)  # theory's check: every a in [0, 1)
    rm = curves.round_model
    kd = kernel_decision(curves)
    n_switch = kd["from_n"]
    per_a = []
    for x in items:
        a, label, E = x["a"], x["label"], x["tokens"]
        best, engines = _recommend(rm, a, n_switch, E)
        top = engines[best]["throughput_per_s"]
        rec = engines[best]
        dmax = float(np.max(rec["delta_by_k"]))
        lo_by_k, hi_by_k = rec["speedup_lo_by_k"], rec["speedup_hi_by_k"]
        # drafting may pay or may not, by the bands: the best k's interval holds 1, or (plain decoding
        # recommended) some k's interval reaches above 1
        undecided = (rec["k_star"] > 0 and rec["speedup_lo"] <= 1.0) or (
            rec["k_star"] == 0 and any(h > 1.0 for h in hi_by_k[1:]))
        states = {}
        for state, other in curves.other_states.items():
            o_best, o_eng = _recommend(other, a, _opt(other.crossover()), E)
            o = o_eng[o_best]
            states[state] = {"engine": o_best, "k": o["k_star"], "speedup": o["speedup"], "speedup_lo": o["speedup_lo"],
                             "speedup_hi": o["speedup_hi"], "read_GBps": other.read_GBps,
                             "differs": (o_best, o["k_star"]) != (best, rec["k_star"]) and not (
                                 o["k_star"] == 0 and rec["k_star"] == 0)}
        per_a.append({
            "a": a, "label": label, "engines": engines,
            "acceptance_model": "geometric" if E is None else "profile",
            "tokens_per_step": [float(t) for t in (th.expected_tokens(a, np.arange(rm.kmax + 1)) if E is None
                                                   else np.asarray(E, float)[: rm.kmax + 1])],
            "tokens_per_step_from": x["how"] or (f"geometric acceptance: G_a(k) = (1 - a^(k+1)) / (1 - a) at "
                                                 f"a = {a:.3f}"),
            "recommended": {"engine": best, "engine_name": engine_name(best, n_switch), "k": rec["k_star"],
                            "speculate": rec["k_star"] > 0, "speedup": rec["speedup"],
                            "speedup_lo": rec["speedup_lo"], "speedup_hi": rec["speedup_hi"],
                            "verify_pass_tokens": rec["k_star"] + 1, "k_certain": rec["k_star_certain"],
                            "interval_contains_1": bool(undecided)},
            "other_states": states,
            "loss_if_wrong": {
                "per_slot_kernel_only": 1 - engines["slot"]["throughput_per_s"] / top,
                "dedup_kernel_only": 1 - engines["dedup"]["throughput_per_s"] / top,
                "draft_length_off_by_one": rec["loss_k_off_by_one"],
                "plain_decoding": 1 - 1 / rec["speedup"],
                "bound_20": float(th.throughput_loss_bound(min(dmax, 1 - 1e-12)))}})
    dmax = float(max(np.max(x["engines"][x["recommended"]["engine"]]["delta_by_k"]) for x in per_a))
    lo, hi = th.speedup_interval(min(dmax, 1 - 1e-12))
    eps = curves.eps
    K = rm.kmax + 1
    return {"schema": SCHEMA_ID, "subject": dict(curves.subject), "inputs": list(curves.inputs),
            "assumptions": list(curves.assumptions), "band_covers": list(curves.covers),
            "error": {"eps": eps, "delta": dmax,
                      "verify_time_rel_17": None if eps is None else float(th.delta_from_eps(eps)),
                      "margin_19": None if eps is None else float(th.faster_kernel_margin(eps)),
                      "loss_bound_20": float(th.throughput_loss_bound(min(dmax, 1 - 1e-12))),
                      "speedup_factor_21": [float(lo), float(hi)]},
            "draft_time_ms": [1e3 * float(x) for x in rm.draft.term.values_s[:K]],
            "host_time_ms": [1e3 * float(x) for x in rm.host.values_s[:K]],
            "draft": {"name": rm.draft.name, "source": rm.draft.term.source, "protocol": rm.draft.term.protocol,
                      "a_ms_per_token": None if rm.draft.a_s is None else 1e3 * rm.draft.a_s,
                      "b_ms_per_round": None if rm.draft.b_s is None else 1e3 * rm.draft.b_s,
                      "form": rm.draft.form, "one_token_ms": 1e3 * rm.draft.one_token_s,
                      "catch_up_ms": 1e3 * rm.draft.catch_up_s},
            "dedup": kd, "acceptance": per_a, **({"sources": dict(curves.sources)} if curves.sources else {})}
