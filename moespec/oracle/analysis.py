"""Paper 2's analyses over a set of reference sequences: the oracle's speedup bound, the Lmax sweep
(Figure 2), delta space (Figure 3), the alpha = 0 ablation (Appendix B.4), and beyond the paper the
online early-exit policy on held-out sequences, the per-kernel cost of paper 1, and every analysis
under two transition models over the same junk-tail unions and costs (:func:`analyse_transitions`):
paper 2's surrogate p_j = P_draft(reference token) and greedy-exact p_j in {0, 1}
(``junk.OracleInputs.with_transitions``).

Totals over a set are sums over its sequences: S = sum Cost_AR / sum dp[0]; mean draft (accepted)
length = expected drafted (accepted) tokens / expected rounds, all under the sequence-conditioned
model (``bellman.evaluate_policy``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from moespec.predict.calibration import draft_name
from moespec.predict.round_model import RoundModels

from .bellman import PolicyValue, bellman, evaluate_policy, expected_cost, fixed_policy, q_values
from .cost import CostModel, RoundCostModel, cost_ar, cost_matrix
from .delta import boundary_slope, delta_points, quadrant_counts
from .junk import TRANSITIONS, OracleInputs
from .policy import EarlyExitPolicy, mean_union_by_k
from .regression import Fit, coefficient
from .transitions import acceptance_probs


def round_cost_model(models: RoundModels, fitted: CostModel, rounds: pd.DataFrame, state: str = "quiet",
                     label: str = "round model (notebook 05)"):
    """The oracle's cost model from a run's round models (``models``: its round model of machine
    ``state``, the real draft's prompts, the draft as trained), with ``fitted``'s alpha and c around
    the measured rounds' mean union per pass size (``rounds``: K -> ubar); None when ``models`` has
    no such round model (:class:`~moespec.oracle.cost.RoundCostModel`)."""
    found = models.select(state=state, context="chat", draft=draft_name(0.0))
    if len(found) != 1:
        return None
    U_bar = rounds.groupby("K")["ubar"].mean().sort_index()
    if list(U_bar.index[:1]) != [0]:
        raise ValueError("the rounds have no K = 0 (plain) rounds: their mean union per pass size starts at m = 1")
    U_bar = U_bar[U_bar.index == np.arange(len(U_bar))]   # m = K + 1 = 1, 2, ... without gaps
    return RoundCostModel.from_round_model(found[0], fitted, U_bar.to_numpy(float), label=label)


def cost_model_from_fits(target_fit: Fit, draft_fit: Fit, label: str = "fitted") -> CostModel:
    """CostModel from ``regression.fit_target_cost`` (beta0, alpha, c) and ``fit_draft`` (a, b)."""
    return CostModel(draft_a=coefficient(draft_fit, "K")[0], draft_b=coefficient(draft_fit, "Intercept")[0],
                     beta0=coefficient(target_fit, "Intercept")[0], alpha=coefficient(target_fit, "ubar")[0],
                     c=coefficient(target_fit, "L")[0], label=label)


@dataclass
class Solved:
    """The oracle on one sequence under one cost model."""
    inputs: OracleInputs
    cost: np.ndarray
    dp: np.ndarray
    policy: np.ndarray
    value: PolicyValue
    cost_ar: float


def solve(inputs: OracleInputs, model) -> Solved:
    cost = cost_matrix(inputs.U, inputs.L_prefix, model)
    dp, policy = bellman(inputs.p, cost)
    return Solved(inputs, cost, dp, policy, evaluate_policy(inputs.p, cost, policy),
                  cost_ar(inputs.L_prefix, inputs.top_k, model))


def totals(values, costs_ar) -> dict:
    """Speedup and mean lengths of a set from per-sequence ``PolicyValue``s and AR costs."""
    c = sum(v.cost for v in values)
    r = sum(v.rounds for v in values)
    return {"speedup": float(sum(costs_ar) / c), "mean_draft_length": sum(v.drafted for v in values) / r,
            "mean_accepted_length": sum(v.accepted for v in values) / r, "expected_cost_ms": c,
            "cost_ar_ms": float(sum(costs_ar))}


def oracle_summary(solved: list[Solved]) -> pd.DataFrame:
    """One row per sequence: N, Cost_AR, dp[0], speedup, mean draft / accepted length."""
    return pd.DataFrame([{"seq_id": s.inputs.seq_id, "category": s.inputs.category, "N": s.inputs.n,
                          "cost_ar_ms": s.cost_ar, "dp0_ms": s.dp[0], "speedup": s.cost_ar / s.dp[0],
                          "mean_draft_length": s.value.mean_draft_length,
                          "mean_accepted_length": s.value.mean_accepted_length} for s in solved])


def lmax_sweep(items: list[OracleInputs], model, lmaxes=range(1, 13)) -> pd.DataFrame:
    """Figure 2: the oracle's speedup, mean draft length and mean accepted length for each Lmax."""
    rows = []
    for lm in lmaxes:
        solved = [solve(it.truncated(lm), model) for it in items]
        rows.append({"lmax": int(lm), **totals([s.value for s in solved], [s.cost_ar for s in solved])})
    return pd.DataFrame(rows)


def fixed_k_sweep(solved: list[Solved], ks=None) -> pd.DataFrame:
    """Every fixed draft length k (default 1..Lmax) on all sequences under the oracle's own model
    (transitions and costs of ``solved``): speedup and mean accepted length, to set beside measured
    fixed-K rounds (:func:`moespec.oracle.rounds.fixed_k_speedups`) and the oracle."""
    ks = range(1, solved[0].inputs.lmax + 1) if ks is None else ks
    return pd.DataFrame([{"k": int(k), **totals([evaluate_policy(s.inputs.p, s.cost, fixed_policy(s.inputs.n, k))
                                                 for s in solved], [s.cost_ar for s in solved])} for k in ks])


def delta_space(solved: list[Solved]) -> tuple[pd.DataFrame, dict, dict]:
    """Figure 3: rejected candidates of every sequence, quadrant counts and the boundary slope."""
    pts = pd.concat([delta_points(s.inputs.p, s.cost, s.policy).assign(seq_id=s.inputs.seq_id) for s in solved],
                    ignore_index=True)
    return pts, quadrant_counts(pts), boundary_slope(pts)


def alpha0_ablation(items: list[OracleInputs], model: CostModel,
                    solved: list | None = None) -> tuple[pd.DataFrame, dict]:
    """Appendix B.4: re-solve with the expert term removed (alpha = 0) and compare decisions.

    Returns one row per position whose k changed (k_full, k_alpha0, the surrogate match probability
    of the first added token p_{k_full} when alpha = 0 drafts longer, Q(k_alpha0) - Q(k_full) under
    the full cost (>= 0) and under alpha = 0 (<= 0), the expected extra experts of the alpha = 0
    choice) and a summary: share of
    positions changed, share with k_alpha0 = k_full + 1, and the full-cost speedup of the alpha = 0
    policy (what ignoring the expert term costs).

    The ablation is defined only where the remaining terms are a time: when the fit's other terms
    (intercept, context, draft) predict a negative pass for some position, nothing is re-solved;
    the summary says ``defined: False`` with the most negative such cost, the shares are NaN and no
    position is listed (on a subject whose step is nearly all expert reads the fitted intercept can
    be below zero, as its standard error allows). ``solved``: the items already solved under
    ``model`` (:func:`solve`), when the caller has them.
    """
    solved = solved if solved is not None else [solve(it, model) for it in items]
    rows, full_vals, abl_vals, ar = [], [], [], []
    columns = {"seq_id": object, "i": object, "k_full": object, "k_alpha0": object, "p_added": float,
               "dQ_full_ms": float, "dQ_alpha0_ms": float, "dU_experts": float}
    costs0 = [cost_matrix(it.U, it.L_prefix, model.without_experts()) for it in items]
    worst = min((float(np.nanmin(c)) for c in costs0 if np.isfinite(c).any()), default=0.0)
    if worst < 0:
        return pd.DataFrame(columns=list(columns)).astype(columns), {
            "positions": sum(it.n for it in items), "defined": False, "changed": 0, "share_changed": float("nan"),
            "share_plus_one": float("nan"), "mean_shift": float("nan"),
            "speedup_full": totals([f.value for f in solved], [f.cost_ar for f in solved])["speedup"],
            "speedup_alpha0_policy_full_cost": float("nan"),
            "reason": (f"without the expert term the fitted cost predicts a negative pass time ({worst:.4g} ms; "
                       f"beta0 = {model.beta0:.4g} ms): the ablation is undefined for this fit")}
    for it, cost0, full in zip(items, costs0, solved):
        dp0, pol0 = bellman(it.p, cost0)
        abl_vals.append(evaluate_policy(it.p, full.cost, pol0))
        full_vals.append(full.value)
        ar.append(full.cost_ar)
        Q, Q0 = q_values(it.p, full.cost, full.dp), q_values(it.p, cost0, dp0)
        EU = expected_cost(acceptance_probs(it.p, it.lmax), np.nan_to_num(it.U))     # E_a[U(i, k, a)]
        for i in np.nonzero(pol0 != full.policy)[0]:
            k, k0 = int(full.policy[i]), int(pol0[i])
            j = i + k
            rows.append({"seq_id": it.seq_id, "i": int(i), "k_full": k, "k_alpha0": k0,
                         "p_added": float(it.p[j]) if k0 > k and j < it.n else float("nan"),
                         "dQ_full_ms": float(Q[i, k0 - 1] - Q[i, k - 1]),
                         "dQ_alpha0_ms": float(Q0[i, k0 - 1] - Q0[i, k - 1]),
                         "dU_experts": float(EU[i, k0 - 1] - EU[i, k - 1])})
    changed = pd.DataFrame(rows, columns=list(columns)).astype({k: v for k, v in columns.items() if v is float})
    n = sum(it.n for it in items)
    summary = {"positions": n, "defined": True, "changed": len(changed), "share_changed": len(changed) / n,
               "share_plus_one": float(np.sum(changed.k_alpha0 == changed.k_full + 1)) / n,
               "mean_shift": float((changed.k_alpha0 - changed.k_full).mean()) if len(changed) else 0.0,
               "speedup_full": totals(full_vals, ar)["speedup"],
               "speedup_alpha0_policy_full_cost": totals(abl_vals, ar)["speedup"]}
    return changed, summary


def split_sequences(items: list[OracleInputs], test_share: float = 0.5, seed: int = 0):
    """Held-out split by sequence (never by position): (train, test)."""
    if len(items) < 2:
        raise ValueError(f"need at least 2 sequences to hold some out; got {len(items)}")
    order = np.random.default_rng(seed).permutation(len(items))
    n_test = min(len(items) - 1, max(1, int(round(test_share * len(items)))))
    test = set(order[:n_test].tolist())
    return [it for s, it in enumerate(items) if s not in test], [it for s, it in enumerate(items) if s in test]


def online_evaluation(train: list[OracleInputs], test: list[OracleInputs], model,
                      percentile: float = 1.0) -> tuple[pd.DataFrame, dict]:
    """Learn the early-exit policy on ``train`` (delta-space slope, mean union per k) and evaluate on
    ``test`` against the oracle bound, every fixed k, the best fixed k chosen on train, and the
    best fixed k in hindsight on test. Speedups are sum Cost_AR / sum expected cost."""
    tr = [solve(it, model) for it in train]
    _, _, bound = delta_space(tr)
    ubar_k = np.mean([mean_union_by_k(it.U, it.p) for it in train], axis=0)
    policy = EarlyExitPolicy.fit(bound["slope_ms_per_token"], ubar_k, model)
    lmax = train[0].lmax
    te = [solve(it, model) for it in test]
    ar = [s.cost_ar for s in te]
    rows = [{"policy": "oracle (bound)", **totals([s.value for s in te], ar)}]
    online_vals = [evaluate_policy(s.inputs.p, s.cost, policy.decide(s.inputs.q)) for s in te]
    rows.append({"policy": "online early exit", **totals(online_vals, ar)})
    fixed_train = {k: totals([evaluate_policy(s.inputs.p, s.cost, fixed_policy(s.inputs.n, k)) for s in tr],
                             [s.cost_ar for s in tr])["speedup"] for k in range(1, lmax + 1)}
    k_train = max(fixed_train, key=fixed_train.get)
    for k in range(1, lmax + 1):
        rows.append({"policy": f"fixed k={k}",
                     **totals([evaluate_policy(s.inputs.p, s.cost, fixed_policy(s.inputs.n, k)) for s in te], ar)})
    df = pd.DataFrame(rows)
    fixed = df[df.policy.str.startswith("fixed")]
    best = fixed.loc[fixed.speedup.idxmax()]
    oracle_s = float(df.speedup[0])
    df["share_of_oracle"] = df.speedup / oracle_s
    df["share_of_oracle_gain"] = (df.speedup - 1) / (oracle_s - 1)
    info = {"slope_ms_per_token": bound["slope_ms_per_token"], "k_best_train": int(k_train),
            "k_best_hindsight": int(best.policy.split("=")[1]),
            "oracle": oracle_s, "online": float(df.speedup[1]),
            "fixed_best_train": float(df.loc[df.policy == f"fixed k={k_train}", "speedup"].iloc[0]),
            "fixed_best_hindsight": float(best.speedup), "train_sequences": len(train),
            "test_sequences": len(test), "ubar_by_k": ubar_k.tolist()}
    return df, info


def compare_cost_models(items: list[OracleInputs], models: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Solve the oracle under several cost models (e.g. single alpha, per-slot, dedup kernels).

    Returns a table per model (speedup vs its own AR baseline, mean draft / accepted length, the
    delta-space slope) and the pairwise share of positions where the chosen k differs.
    """
    solved = {name: [solve(it, m) for it in items] for name, m in models.items()}
    rows = []
    for name, ss in solved.items():
        _, quad, bound = delta_space(ss)
        rows.append({"cost_model": name, **totals([s.value for s in ss], [s.cost_ar for s in ss]),
                     "slope_ms_per_token": bound["slope_ms_per_token"], "quadrant_II": quad["II"],
                     "quadrant_IV": quad["IV"]})
    names = list(solved)
    n = sum(it.n for it in items)
    diff = [{"a": a, "b": b, "share_k_differs": sum(int(np.sum(x.policy != y.policy))
                                                     for x, y in zip(solved[a], solved[b])) / n,
             "mean_k_difference": sum(float(np.sum(y.policy - x.policy))
                                      for x, y in zip(solved[a], solved[b])) / n}
            for i, a in enumerate(names) for b in names[i + 1:]]
    return pd.DataFrame(rows), pd.DataFrame(diff)


@dataclass
class Paper2Analysis:
    """Everything notebook 07 reports for one cost model under one transition model (:func:`analyse`)."""
    label: str
    model: object
    solved: list
    summary: pd.DataFrame
    totals: dict
    sweep: pd.DataFrame
    points: pd.DataFrame
    quadrants: dict
    bound: dict
    changed: pd.DataFrame
    ablation: dict
    selected: pd.DataFrame
    online: pd.DataFrame
    online_info: dict
    kernels: pd.DataFrame | None = None
    kernel_differences: pd.DataFrame | None = None
    fixed: pd.DataFrame | None = None
    transitions: str = "surrogate"

    def tables(self) -> dict:
        """name -> table (or dict) of this analysis, as the notebook writes them; every table has a
        column ``transitions`` (and every dict a key) naming the transition model."""
        out = {"oracle_sequences": self.summary, "fig2_lmax_sweep": self.sweep,
               "fig3_delta_quadrants": pd.DataFrame([{**self.quadrants, **self.bound}]),
               "alpha0_changed_positions": self.changed, "alpha0_summary": self.ablation,
               "alpha0_selected": self.selected, "online_policy": self.online, "online_policy_info": self.online_info}
        if self.fixed is not None:
            out["fixed_k"] = self.fixed
        if self.kernels is not None:
            out["kernel_cost_models"] = self.kernels
            out["kernel_policy_differences"] = self.kernel_differences
        return {name: ({**t, "transitions": self.transitions} if isinstance(t, dict)
                       else t.assign(transitions=self.transitions)) for name, t in out.items()}


def _transitions_of(items: list[OracleInputs]) -> str:
    names = {it.transitions for it in items}
    if len(names) != 1:
        raise ValueError(f"the sequences use different transition models {sorted(names)}; analyse one at a time")
    return names.pop()


def analyse(items: list[OracleInputs], model, train: list[OracleInputs], test: list[OracleInputs],
            lmax: int, kernel_models: dict | None = None, label: str = "") -> Paper2Analysis:
    """Paper 2's analysis of the oracle inputs under one cost model: the oracle (Bellman (8)) per
    sequence and in total, the Lmax sweep (Figure 2), every fixed k, delta space (Figure 3), the
    alpha = 0 ablation (Appendix B.4) with the four changed positions whose added token is likeliest,
    the online early-exit policy learned on ``train`` and scored on ``test``, and, with
    ``kernel_models`` (name -> cost model, e.g. :func:`moespec.oracle.kernel_cost.kernel_models`), the
    oracle under paper 1's per-kernel costs beside this one. The transitions are those the inputs
    hold (``OracleInputs.with_transitions``; all of ``items``, ``train`` and ``test`` alike)."""
    transitions = _transitions_of(items + train + test)
    solved = [solve(it, model) for it in items]
    points, quad, bound = delta_space(solved)
    changed, abl = alpha0_ablation(items, model, solved)
    online, info = online_evaluation(train, test, model)
    kern = kdiff = None
    if kernel_models:
        kern, kdiff = compare_cost_models(items, {"one alpha (fitted)": model, **kernel_models})
    return Paper2Analysis(label or getattr(model, "label", ""), model, solved, oracle_summary(solved),
                          totals([s.value for s in solved], [s.cost_ar for s in solved]),
                          lmax_sweep(items, model, range(1, lmax + 1)), points, quad, bound, changed, abl,
                          changed[changed.k_alpha0 == changed.k_full + 1].nlargest(4, "p_added"),
                          online, info, kern, kdiff, fixed_k_sweep(solved), transitions)


def analyse_transitions(items: list[OracleInputs], model, train: list[OracleInputs], test: list[OracleInputs],
                        lmax: int, kernel_models: dict | None = None, label: str = "",
                        transitions=TRANSITIONS) -> dict[str, Paper2Analysis]:
    """:func:`analyse` once per transition model (name -> analysis), over the same junk-tail unions,
    costs and held-out split: paper 2's surrogate (eq. 7 with p_j = P_draft(reference token |
    reference prefix)) and greedy-exact (p_j = 1 exactly when the draft's argmax given the reference
    prefix is the reference token: the acceptance of moespec's greedy draft under greedy verification)."""
    def under(t, its):
        return [it.with_transitions(t) for it in its]
    return {t: analyse(under(t, items), model, under(t, train), under(t, test), lmax, kernel_models, label)
            for t in transitions}


def merged_tables(analyses) -> dict:
    """The tables of several analyses of one cost model (e.g. :func:`analyse_transitions`' values), one
    file each: tables concatenated (their ``transitions`` column tells them apart), dicts keyed by
    transition model."""
    analyses = list(analyses)
    out: dict = {}
    for r in analyses:
        for name, t in r.tables().items():
            out.setdefault(name, []).append(t)
    return {name: ({t["transitions"]: {k: v for k, v in t.items() if k != "transitions"} for t in parts}
                   if isinstance(parts[0], dict) else pd.concat(parts, ignore_index=True))
            for name, parts in out.items()}


def cost_models_overview(analyses: dict) -> pd.DataFrame:
    """One row per cost model and transition model: the model's draft and expert coefficients, the
    oracle's speedup and lengths, its Lmax plateau, delta space, the alpha = 0 ablation and the
    online policy on held-out sequences. ``analyses``: cost-model name -> {transitions -> analysis}."""
    return pd.DataFrame([{"cost_model": n, "transitions": t, "draft_a_ms": r.model.draft_a, "alpha_ms": r.model.alpha,
                          "speedup": r.totals["speedup"], "mean_draft_length": r.totals["mean_draft_length"],
                          "mean_accepted_length": r.totals["mean_accepted_length"],
                          "plateau": r.sweep.speedup.iloc[-1], "slope_ms_per_token": r.bound["slope_ms_per_token"],
                          "quadrant_II": r.quadrants["II"], "quadrant_IV": r.quadrants["IV"],
                          "alpha0_changed_share": r.ablation["share_changed"],
                          "online": r.online_info["online"], "oracle_heldout": r.online_info["oracle"],
                          "online_share_of_oracle": r.online_info["online"] / r.online_info["oracle"],
                          "fixed_best_train": r.online_info["fixed_best_train"]}
                         for n, by_t in analyses.items() for t, r in by_t.items()])
