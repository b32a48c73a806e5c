"""Paper 1, Tables 3, 4, 7 and 8 for this engine, with the paper's published rows beside ours
(labelled :data:`moespec.paper_reference.PAPER1_LABEL`; never an input to our numbers)."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from moespec.paper_reference import paper1_table as paper_table
from moespec.theory import expected_tokens

OURS = "this run"


def _cross(c):
    return None if c is None or (isinstance(c, float) and np.isnan(c)) else int(c)


def table3(metrics: dict, engine: str, model: str, with_paper: bool = True) -> pd.DataFrame:
    """Table 3: per depth, the largest saving error of the prediction with window routing (wiki),
    with the verified text's routing (text) and of the measured-time version (op. time); the
    crossover measured and predicted by each; k̂* within one of the measured k* (over the run's acceptance values).
    ``metrics``: {(version, d): predict.evaluate(...)} with versions prediction, text, measured-time."""
    names = {"wiki": "prediction", "text": "text", "optime": "measured-time"}
    rows = []
    for d in sorted({d for _, d in metrics}):
        row = {"engine": engine, "model": model, "d": d, "source": OURS}
        for short, v in names.items():
            m = metrics.get((v, d))
            if m is None:
                continue
            row[f"saving_err_ms_{short}"] = round(m["saving_err_ms"], 3)
            row[f"crossover_{short}"] = _cross(m["crossover_pred"])
            row[f"kstar_within1_{short}"] = m["kstar_within1"]
            row["crossover_measured"] = _cross(m["crossover_meas"])
        rows.append(row)
    out = pd.DataFrame(rows)
    return pd.concat([out, paper_table("table3_predictions")], ignore_index=True) if with_paper else out


def table4(metrics: dict, engine: str, versions=("measured-time", "calibrated", "prediction"),
           with_paper: bool = True) -> pd.DataFrame:
    """Table 4: per version and depth, crossover predicted/measured, sign of S(n) where the
    interval excludes 0, saving error (ms), k̂* within one, largest throughput lost at k̂* (%,
    speculative runs), largest verify-time error (%, both kernels, n = 2..9) and delta. k̂* within one
    is counted over ``kstar_values`` acceptance values (the run's own count)."""
    rows = []
    for v in versions:
        for d in sorted({d for vv, d in metrics if vv == v}):
            m = metrics[(v, d)]
            rows.append({"engine": engine, "version": v, "d": d, "crossover_pred": _cross(m["crossover_pred"]),
                         "crossover_meas": _cross(m["crossover_meas"]), "sign_correct": m["sign_correct"],
                         "sign_total": m["sign_total"], "saving_err_ms": round(m["saving_err_ms"], 3),
                         "kstar_within1": m["kstar_within1"], "kstar_values": m["kstar_values"],
                         "loss_pct": round(100 * m["loss_runs"], 1),
                         "tau_err_pct": round(100 * m["tau_err"], 1), "delta": round(m["delta"], 3),
                         "speedup_inside_21": m["speedup_inside_bound21"], "source": OURS})
    out = pd.DataFrame(rows)
    if not with_paper:
        return out
    # the paper's table counts k-hat* within one over the acceptance values its column name gives
    paper = paper_table("table4_deepseek")
    counted = [c for c in paper.columns if re.fullmatch(r"kstar_within1_of(\d+)", c)]
    if counted:
        values = int(re.fullmatch(r"kstar_within1_of(\d+)", counted[0]).group(1))
        paper = paper.rename(columns={counted[0]: "kstar_within1"}).assign(kstar_values=values)
    return pd.concat([out, paper], ignore_index=True)


def table7(metrics: dict, engine: str, model: str, with_paper: bool = True) -> pd.DataFrame:
    """Table 7: amplification range of the saving bound (18) over n = 2..9 (|S| floored at
    0.05 ms), the bandwidth error the prediction's largest saving error implies against the
    engine's eps, and the largest relative verify-time error with deduplication on per version."""
    rows = []
    for d in sorted({d for _, d in metrics}):
        p = metrics.get(("prediction", d))
        if p is None:
            continue
        row = {"engine": engine, "model": model, "d": d, "amplification_min": round(p["amplification_min"], 1),
               "amplification_max": round(p["amplification_max"], 1), "implied_eps": round(p["implied_eps"], 3),
               "engine_eps": round(p["eps"], 3), "source": OURS}
        for v, col in (("prediction", "prediction"), ("measured-time", "optime"), ("calibrated", "calibrated")):
            if (v, d) in metrics:
                row[f"verify_err_pct_{col}"] = round(100 * metrics[(v, d)]["tau_err_dedup"], 1)
        rows.append(row)
    out = pd.DataFrame(rows)
    return pd.concat([out, paper_table("table7_error")], ignore_index=True) if with_paper else out


def table8(scores: pd.DataFrame, rules_commit: str | None, with_paper: bool = True) -> pd.DataFrame:
    """Table 8: each pre-registered rule with our value and verdict per depth (from
    :func:`moespec.predict.score`), the commit of the rules file, and the paper's published rows."""
    out = scores.assign(source=OURS, rules_commit=rules_commit or "not in git")
    return pd.concat([out, paper_table("table8_rules")], ignore_index=True) if with_paper else out


def oracle_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """The oracle grid per (d, k, a), pooled over prompts and repetitions: tokens per step against
    G_a(k), realized acceptance (accepted / (accepted + rejections)), median throughput, steps cut
    short (the batched verify argmax differs from the batch-one greedy token)."""

    cells = runs.groupby(["d", "k", "a"]).agg(
        emitted=("emitted", "sum"), steps=("steps", "sum"), accepted=("accepted", "sum"),
        rejections=("rejections", "sum"), cut_short=("cut_short", "sum"),
        throughput_median=("throughput", "median")).reset_index()
    cells["tokens_per_step"] = cells["emitted"] / cells["steps"]
    cells["G"] = expected_tokens(cells["a"].to_numpy(float), cells["k"].to_numpy(int))
    cells["tps_over_G"] = cells["tokens_per_step"] / cells["G"]
    judged = cells["accepted"] + cells["rejections"]
    cells["realized_a"] = np.where(judged > 0, cells["accepted"] / judged.where(judged > 0, 1), np.nan)
    return cells
