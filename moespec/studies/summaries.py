"""What notebook 05 reports, computed from its run tables: the dedup-switch output check, the
function-preservation check of a widened subject, the verify times and saving per depth and
bandwidth regime, the oracle cells and the real-draft summary (paper 1, Section 4, Appendices D-E)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moespec.theory import crossover


def agreement_totals(agree: pd.DataFrame) -> dict:
    """Totals of :func:`moespec.engine.runs.greedy_agreement`'s rows."""
    return {"greedy_equal": int(agree["greedy_equal"].sum()), "tokens": int(agree["tokens"].sum()),
            "verify_argmax_equal": int(agree["verify_argmax_equal"].sum()), "verify_rows": int(agree["verify_rows"].sum()),
            "verify_matches_greedy": int(agree["verify_matches_greedy"].sum())}


def compare_engines(a, b, prompts: list, n_tokens: int) -> pd.DataFrame:
    """Greedy decoding of ``n_tokens`` per prompt on two engines (e.g. a widened subject and the
    same model unwidened in the same format): per prompt, the tokens that agree and the largest
    absolute difference of the logits along ``a``'s greedy text (teacher-forced on both)."""
    rows = []
    for pi, prompt in enumerate(prompts):
        d = len(prompt)
        seqs, logits = [], []
        for eng in (a, b):
            first = eng.prefill(prompt)
            seqs.append([first] + eng.greedy(first, n_tokens - 1))
            eng.crop(d)
        for eng in (a, b):
            eng.prefill(prompt)
            eng.forward(seqs[0][:-1])
            logits.append(eng.last_logits.float().cpu())
            eng.crop(d)
        rows.append({"prompt": pi, "tokens": n_tokens, "greedy_equal": int(sum(x == y for x, y in zip(*seqs))),
                     "max_abs_logit_diff": float((logits[0] - logits[1]).abs().max()),
                     "max_abs_logit": float(logits[1].abs().max())})
    return pd.DataFrame(rows)


def verify_report(summary: pd.DataFrame) -> list[dict]:
    """Per depth: tau(1), tau at n = 9 with each kernel, S(n) for n >= 2, its intervals and the
    measured crossover (:func:`moespec.theory.crossover`). Times in ms."""
    out = []
    for d, s in summary.groupby("d"):
        s = s.sort_values("n")
        S = s["S_s"].to_numpy()
        decided = ((s["S_lo_s"] > 0) | (s["S_hi_s"] < 0)).to_numpy()
        out.append({"d": int(d), "tau1_ms": 1e3 * float(s["tau_slot_s"].iloc[0]),
                    "tau_slot_last_ms": 1e3 * float(s["tau_slot_s"].iloc[-1]),
                    "tau_dedup_last_ms": 1e3 * float(s["tau_dedup_s"].iloc[-1]), "n_last": int(s["n"].iloc[-1]),
                    "S_ms": (1e3 * S[1:]).tolist(), "S_lo_ms": (1e3 * s["S_lo_s"].to_numpy()[1:]).tolist(),
                    "S_hi_ms": (1e3 * s["S_hi_s"].to_numpy()[1:]).tolist(),
                    "interval_excludes_zero": decided[1:].tolist(), "crossover": crossover(S)})
    return out


def oracle_report(oracle: pd.DataFrame, cells: pd.DataFrame) -> dict:
    """The oracle runs in numbers: runs, the largest |realized a - a| over drafted (d, k, a) cells,
    tokens per step over G_a(k) (median, range), steps cut short."""
    drafted = cells[cells["k"] > 0]
    return {"runs": int(len(oracle)), "max_abs_a_error": float(np.max(np.abs(drafted["realized_a"] - drafted["a"]))),
            "tps_over_G_median": float(drafted["tps_over_G"].median()),
            "tps_over_G_min": float(drafted["tps_over_G"].min()), "tps_over_G_max": float(drafted["tps_over_G"].max()),
            "cut_short": int(oracle["cut_short"].sum()), "steps": int(oracle["steps"].sum())}


def real_draft_report(runs: pd.DataFrame, draft_cost: float | None = None) -> tuple[pd.DataFrame, dict]:
    """Paper 1, Appendix D.3's numbers for one draft of a draft-cost sweep
    (:func:`moespec.engine.draftcost.draft_cost_sweep`; ``draft_cost`` None: the lowest cost):
    per k the median speedup, tokens per step and realized acceptance, and the prompts on which
    plain decoding is fastest."""
    costs = sorted(runs.loc[runs.k > 0, "draft_cost"].unique())
    r = costs[0] if draft_cost is None else float(draft_cost)
    sel = runs[(runs.k == 0) | np.isclose(runs.draft_cost.fillna(-1), r)]
    per = sel.groupby(["prompt", "k"])["throughput"].median().unstack("k")
    best_k = per.idxmax(axis=1)
    summ = sel.groupby("k").agg(speedup_median=("speedup", "median"), tokens_per_step=("tokens_per_step", "median"),
                                realized_a=("realized_a", "median")).reset_index()
    med = summ.set_index("k")["speedup_median"]
    ks = [k for k in med.index if k > 0]
    return summ.assign(draft_cost=r), {"draft_cost": r, "prompts": int(per.shape[0]),
                                       "plain_fastest": int((best_k == 0).sum()),
                                       "speedup_k1": float(med.get(1, np.nan)), "k_last": int(max(ks)),
                                       "speedup_k_last": float(med[max(ks)])}
