"""benchmarks/step_terms.py on a hand-made state: the routing-moved verify term, each term's ratio,
the verify spread over draft costs of one k, the summary and the refusals."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from bench_scripts import load_benchmark
from moespec.predict.calibration import draft_name

steps = load_benchmark("step_terms")


def _runs(verify, draft, distinct, costs=(0.0, 0.1)) -> pd.DataFrame:
    """One k = 1 run per draft cost (seconds), plus a per-slot run and a plain run that are not counted."""
    rows = [{"draft_cost": c, "k": 1, "dedup": True, "t_verify_mean_s": v, "t_draft_mean_s": d,
             "t_host_mean_s": 0.0003, "t_step_mean_s": v + d + 0.0003, "distinct_experts": n}
            for c, v, d, n in zip(costs, verify, draft, distinct)]
    rows.append({**rows[0], "dedup": False, "t_verify_mean_s": 1.0})
    rows.append({"draft_cost": float("nan"), "k": 0, "dedup": True, "t_verify_mean_s": 0.009, "t_draft_mean_s": 0.0,
                 "t_host_mean_s": 0.0002, "t_step_mean_s": 0.0092, "distinct_experts": 8})
    return pd.DataFrame(rows)


def _terms() -> pd.DataFrame:
    return pd.DataFrame({"draft": [draft_name(0.0), draft_name(0.1)], "k": [1, 1], "tau_dedup_ms": [10.0, 10.0],
                         "t_draft_ms": [2.0, 2.5], "host_ms": [0.3, 0.3]})


def test_terms_by_hand():
    cal = _runs([0.010, 0.010], [0.002, 0.0025], [10, 10])
    test = _runs([0.0105, 0.011], [0.002, 0.003], [12, 12])
    rows = steps.state_rows(cal, test, _terms(), slope_ms=0.25).set_index("draft_cost")
    # verify term: tau 10 ms moved by 0.25 ms per pair over 2 more pairs than the calibration's
    assert rows["verify_model_ms"].tolist() == pytest.approx([10.5, 10.5])
    assert rows["verify_ratio"].tolist() == pytest.approx([1.0, 11.0 / 10.5])
    assert rows["draft_ratio"].tolist() == pytest.approx([1.0, 1.2])
    assert rows["host_ratio"].tolist() == pytest.approx([1.0, 1.0])
    assert rows.loc[0.1, "step_model_ms"] == pytest.approx(10.5 + 2.5 + 0.3)
    assert rows.loc[0.1, "step_ratio"] == pytest.approx(14.3 / 13.3)
    # the same tokens at both draft costs: the verify spread is the machine's, 11 / 10.5 - 1
    assert rows["verify_spread"].tolist() == pytest.approx([0.5 / 10.5] * 2)
    s = steps.summary(rows.reset_index(), plain_ratio=0.99)
    assert s["verify_ratio"] == pytest.approx((1.0 + 11.0 / 10.5) / 2) and s["draft_ratio_k1"] == pytest.approx(1.1)
    assert math.isnan(s["draft_ratio_k2_up"]) and s["plain_step_ratio"] == 0.99
    assert s["verify_spread_largest"] == pytest.approx(0.5 / 10.5) and s["verify_spread_largest_k"] == 1
    # one routing slope per draft (amendment 2026-12-06 g: each draft its own verify term)
    own = steps.state_rows(cal, test, _terms(), slope_ms={0.0: 0.25, 0.1: 0.5}).set_index("draft_cost")
    assert own["verify_model_ms"].tolist() == pytest.approx([10.5, 11.0])
    assert own.loc[0.1, "verify_ratio"] == pytest.approx(1.0)


def test_refusals():
    # round terms of another draft than the runs' are not theirs
    cal = _runs([0.010, 0.010], [0.002, 0.0025], [10, 10])
    test = _runs([0.0105, 0.011], [0.002, 0.003], [12, 12])
    other = _terms().assign(draft=[draft_name(0.0), "oracle draft"])
    with pytest.raises(ValueError, match=r"no calibration runs or round terms for \(draft cost, k\) \[\[0.1, 1"):
        steps.state_rows(cal, test, other, slope_ms=0.25)
    with pytest.raises(ValueError, match=r"no routing slope for draft cost\(s\) \[0.1\]"):
        steps.state_rows(cal, test, _terms(), slope_ms={0.0: 0.25})
    cal = _runs([0.010], [0.002], [10], costs=(0.0,))
    test = _runs([0.0105, 0.011], [0.002, 0.003], [12, 12])
    with pytest.raises(ValueError, match=r"no calibration runs or round terms for \(draft cost, k\) \[\[0.1, 1"):
        steps.state_rows(cal, test, _terms(), slope_ms=0.25)
