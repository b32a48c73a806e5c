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


def verify_by_turn(calibration: pd.DataFrame, test: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """How the deduplicating verify pass varies with the MT-Bench turn it verifies, from a real-draft
    calibration's rows and its test runs' (:func:`moespec.engine.draftcost.draft_cost_sweep` /
    ``interleaved_sweep`` rows of one machine state; k = 0: the plain step, a one-token pass).

    Returns (``turns``, ``by_k``). ``turns``: per part, turn and k, the turn's prompt length, its runs
    with deduplication on (every draft cost) and the mean of their ``t_verify_mean_s`` (ms). ``by_k``:
    per k, the calibration's mean over runs (the point estimate of the round model's pooled
    tau_dedup(k + 1), :func:`moespec.predict.calibration.from_draft_runs`) against the test runs' mean,
    their ratio, the range of the turns' means in each part, and the calibration's mean with each of
    its turns left out in turn (lowest and highest): how much one turn moves the term."""
    parts = []
    for name, rows in (("calibration", calibration), ("test", test)):
        missing = {"prompt", "prompt_tokens", "k", "dedup", "t_verify_mean_s"} - set(rows.columns)
        if missing:
            raise ValueError(f"{name} rows lack column(s) {sorted(missing)}")
        used = rows[rows["dedup"].astype(bool) | (rows["k"] == 0)]
        if used.empty:
            raise ValueError(f"{name} rows hold no run with deduplication on or plain")
        parts.append(used.assign(part=name, verify_ms=1e3 * used["t_verify_mean_s"].astype(float)))
    runs = pd.concat(parts, ignore_index=True)
    turns = (runs.groupby(["part", "prompt", "k"])
             .agg(prompt_tokens=("prompt_tokens", "first"), runs=("verify_ms", "size"), verify_ms=("verify_ms", "mean"))
             .reset_index())
    rows = []
    cal_runs, test_runs = (runs[runs["part"] == p] for p in ("calibration", "test"))
    for k in sorted(set(cal_runs["k"]) & set(test_runs["k"])):
        c, t = cal_runs[cal_runs["k"] == k], test_runs[test_runs["k"] == k]
        left_out = [c[c["prompt"] != p]["verify_ms"].mean() for p in sorted(c["prompt"].unique())]
        left_out = [v for v in left_out if np.isfinite(v)] or [float("nan")]
        ct, tt = (turns[(turns["part"] == p) & (turns["k"] == k)]["verify_ms"] for p in ("calibration", "test"))
        rows.append({"k": int(k), "calibration_ms": float(c["verify_ms"].mean()), "test_ms": float(t["verify_ms"].mean()),
                     "ratio": float(c["verify_ms"].mean() / t["verify_ms"].mean()),
                     "calibration_turn_min_ms": float(ct.min()), "calibration_turn_max_ms": float(ct.max()),
                     "test_turn_min_ms": float(tt.min()), "test_turn_max_ms": float(tt.max()),
                     "leave_one_turn_out_min_ms": float(min(left_out)), "leave_one_turn_out_max_ms": float(max(left_out))})
    return turns, pd.DataFrame(rows)
