"""Where notebook 05's real-draft step predictions part from the runs, term by term (issue 27: the
quiet machine's points outside 5 %).

Reads a notebook-05 results folder (:mod:`moespec.engine.results_folder`) and the run's figures
(``05_round_terms.csv``, ``05_draft_cost_predictions.csv``, ``05_plain_step.csv``). Per machine state, draft cost and
k >= 1 (the deduplicating kernel), the test runs' mean verify, draft and host time per step (as notebook 05
analysed them: adjusted by their machine factors where the run has them, :mod:`moespec.engine.machine_adjust`) beside
the round model's terms for that draft (named by :func:`moespec.predict.calibration.draft_name`):

* verify: tau_dedup(k) moved by the routing term to the test runs' routing,
  tau + s (distinct_test - distinct_calibration), with s the draft's ``ms_per_distinct_expert`` (one
  per draft since each draft has its own verify term, amendment of 2026-12-06 g) and the
  distinct (expert, layer) pairs per pass the means over the test and the calibration runs at k;
* draft: t_draft(k) = a k + b of the draft's round terms;
* host: the terms' host time;

and the plain step (k = 0) as notebook 05 scored it: ``05_plain_step.csv``'s measured V(0) of the
real-draft runs over its predicted one.

The draft widening is function-preserving, so at one k every draft cost runs the same tokens and
routing: the spread of the measured verify time over the draft costs (``verify_spread``, largest
over smallest minus 1) is the machine's alone.

Writes ``<out>/<stamp>_step_terms.csv`` (one row per state, draft cost and k) and ``.json``: per
state, each term's mean measured/model ratio (the draft's at k = 1 and at k >= 2 apart), the verify
spread's median and largest over k, the plain step's ratio, and the run it comes from. Measures
nothing: it reads what the run measured and what its round model said.

Run: ``.venv/bin/python benchmarks/step_terms.py --data <clone>/data/engine/full --figures <clone>/figures``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from moespec.engine.results_folder import read_real_draft_folder
from moespec.predict.calibration import draft_name


def _means(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (draft cost, k >= 1), the deduplicating runs' mean verify, draft, host and step time (ms) and
    distinct pairs per pass."""
    runs = runs[(runs["k"] >= 1) & runs["dedup"].astype(bool)]
    return runs.groupby(["draft_cost", "k"]).agg(
        verify_ms=("t_verify_mean_s", "mean"), draft_ms=("t_draft_mean_s", "mean"), host_ms=("t_host_mean_s", "mean"),
        step_ms=("t_step_mean_s", "mean"), distinct=("distinct_experts", "mean")).mul(
        [1e3, 1e3, 1e3, 1e3, 1.0]).reset_index()


def state_rows(cal: pd.DataFrame, test: pd.DataFrame, terms: pd.DataFrame, slope_ms: float | dict) -> pd.DataFrame:
    """The rows of one state (module docstring): ``cal`` and ``test`` its calibration and test runs,
    ``terms`` its chat round terms (``draft``, ``k``, ``tau_dedup_ms``, ``t_draft_ms``, ``host_ms``),
    ``slope_ms`` the routing term's ms per distinct pair: one for every draft, or per draft cost."""
    got, calib = _means(test), _means(cal)[["draft_cost", "k", "distinct"]]
    names = {draft_name(c): c for c in got["draft_cost"].unique()}
    terms = terms[terms["draft"].isin(names)]
    terms = terms.assign(draft_cost=terms["draft"].map(names))
    rows = got.merge(calib, on=["draft_cost", "k"], suffixes=("", "_calibration"), how="left")
    model = terms[["draft_cost", "k", "tau_dedup_ms", "t_draft_ms", "host_ms"]].rename(
        columns={"t_draft_ms": "draft_model_ms", "host_ms": "host_model_ms"})
    rows = rows.merge(model, on=["draft_cost", "k"], how="left", validate="one_to_one")
    if rows[["distinct_calibration", "tau_dedup_ms"]].isna().any().any():
        lost = rows[rows[["distinct_calibration", "tau_dedup_ms"]].isna().any(axis=1)][["draft_cost", "k"]]
        raise ValueError(f"no calibration runs or round terms for (draft cost, k) {lost.values.tolist()[:4]}")
    if isinstance(slope_ms, dict):
        if missing := sorted(set(rows["draft_cost"]) - set(slope_ms)):
            raise ValueError(f"no routing slope for draft cost(s) {missing}")
        slope_ms = rows["draft_cost"].map(slope_ms)
    rows["verify_model_ms"] = rows["tau_dedup_ms"] + slope_ms * (rows["distinct"] - rows["distinct_calibration"])
    rows["step_model_ms"] = rows["verify_model_ms"] + rows["draft_model_ms"] + rows["host_model_ms"]
    for term in ("verify", "draft", "host", "step"):
        rows[f"{term}_ratio"] = rows[f"{term}_ms"] / rows[f"{term}_model_ms"]
    spread = rows.groupby("k")["verify_ms"].agg(lambda v: v.max() / v.min() - 1.0)
    rows["verify_spread"] = rows["k"].map(spread)
    return rows.drop(columns=["tau_dedup_ms"])


def summary(rows: pd.DataFrame, plain_ratio: float) -> dict:
    """One state's ratios (module docstring)."""
    k1 = rows["k"] == 1
    spread = rows.groupby("k")["verify_spread"].first()
    return {"verify_ratio": float(rows["verify_ratio"].mean()), "draft_ratio_k1": float(rows.loc[k1, "draft_ratio"].mean()),
            "draft_ratio_k2_up": float(rows.loc[~k1, "draft_ratio"].mean()), "host_ratio": float(rows["host_ratio"].mean()),
            "step_ratio": float(rows["step_ratio"].mean()), "plain_step_ratio": float(plain_ratio),
            "verify_spread_median": float(spread.median()), "verify_spread_largest": float(spread.max()),
            "verify_spread_largest_k": int(spread.idxmax())}


def run(data: Path, figures: Path, out: Path | None = None) -> dict:
    folder = read_real_draft_folder(data)
    terms = pd.read_csv(Path(figures) / "05_round_terms.csv")
    predictions = pd.read_csv(Path(figures) / "05_draft_cost_predictions.csv")
    plain = pd.read_csv(Path(figures) / "05_plain_step.csv")
    tables, states = [], {}
    for state in folder.states:
        cal, test = folder.sweep(state, analysed=True)
        mine = terms[(terms["state"] == state) & (terms["context"] == "chat")]
        slopes = predictions[predictions["state"] == state].dropna(subset=["ms_per_distinct_expert"]).groupby(
            "draft_cost")["ms_per_distinct_expert"].unique()
        if (several := slopes[slopes.map(len) != 1]).size:
            raise ValueError(f"state {state}: expected one ms_per_distinct_expert per draft cost in "
                             f"05_draft_cost_predictions.csv; draft cost {several.index[0]} has {several.iloc[0].tolist()}")
        rows = state_rows(cal, test, mine[mine["k"] >= 1], {c: float(v[0]) for c, v in slopes.items()}).assign(state=state)
        v0 = plain[(plain["state"] == state) & (plain["context"] == "chat")]
        if len(v0) != 1:
            raise ValueError(f"state {state}: expected one chat row in 05_plain_step.csv; found {len(v0)}")
        tables.append(rows)
        states[state] = summary(rows, float(v0["V0_meas_ms"].iloc[0] / v0["V0_hat_ms"].iloc[0]))
    rows = pd.concat(tables, ignore_index=True)
    record = folder.write_record("step_terms", rows, {"figures": "the run's figures folder", "states": states}, out)
    print(pd.DataFrame(states).round(3).to_string())
    return record


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, type=Path, help="a notebook-05 results folder")
    ap.add_argument("--figures", required=True, type=Path, help="the same run's figures folder")
    ap.add_argument("--out", type=Path, default=None, help="where to write (default benchmarks/results/step_terms)")
    args = ap.parse_args()
    run(args.data, args.figures, args.out)


if __name__ == "__main__":
    main()
