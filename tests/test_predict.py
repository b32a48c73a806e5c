"""The prediction chain (paper 1, eq. (22), Section 4) and the scoring rules (Table 8) on
synthetic inputs with hand-checkable answers."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moespec import predict
from moespec.theory import expected_tokens

MS = 1e-3


def times(slot_row, dedup_row, layers=2):
    return {"slot": np.tile(np.array(slot_row, float) * MS, (layers, 1)),
            "dedup": np.tile(np.array(dedup_row, float) * MS, (layers, 1))}


def test_chain_eq22_by_hand():
    t = times([1, 2, 3, 4], [1, 2.5, 3.0, 3.5])  # dedup n=1 column is the slot time
    c = predict.chain("x", 10 * MS, t)
    # tau_p(n) = tau1 + sum_l (t_p,l(n) - t_l(1)); two equal layers double the growth
    assert np.allclose(c.tau["slot"] / MS, [10, 12, 14, 16])
    assert np.allclose(c.tau["dedup"] / MS, [10, 13, 14, 15])
    assert np.allclose(c.M["slot"] / MS, [2, 4, 6, 8])
    assert np.allclose(c.saving / MS, [0, -1, 0, 1])
    assert predict.crossover(c.saving) == 4


def test_calibrated_takes_growth_from_measured_slot_time():
    c = predict.chain("m", 10 * MS, times([1, 2, 3], [1, 2.5, 2.5]))
    meas_slot = np.array([10, 13, 17]) * MS  # grows faster than the expert operation alone
    cal = predict.calibrate(c, meas_slot)
    assert np.allclose(cal.tau["slot"], meas_slot)
    assert np.allclose(cal.saving, c.saving)  # the growth outside the expert op cancels in S
    assert np.allclose(cal.tau["dedup"] / MS, [10, 14, 16])


def test_crossover_and_distance():
    S = np.array([0, -1, -0.5, 0.2, -0.1, 0.3, 0.4])
    assert predict.crossover(S) == 6
    assert predict.crossover(-np.abs(S) - 1) is None
    assert predict.crossover(np.array([0, -1, 1])) == 3
    assert predict.crossover_distance(None, 9, 9) == 1  # measured at n = 9 is within one of none
    assert predict.crossover_distance(None, None, 9) == 0
    assert predict.crossover_distance(7, None, 9) == 3
    assert predict.crossover_distance(5, 4, 9) == 1


def test_layer_times_scale_and_missing():
    rows = [{"layer": l, "kernel": p, "n": n, "t_s": (n + l) * MS}
            for l in (0, 2) for p in ("slot", "dedup") for n in range(1, 4) if not (p == "dedup" and n == 1)]
    t = predict.layer_times(pd.DataFrame(rows), num_layers=4, n_max=3)
    assert t["scale"] == 2.0 and t["layers"] == [0, 2]
    c = predict.chain("m", 0.0, t)
    assert np.allclose(c.tau["slot"] / MS, [0, 4, 8])  # 2 x ((n-1) + (n-1))
    with pytest.raises(ValueError, match="layer 0 at n=3"):
        predict.layer_times(pd.DataFrame([r for r in rows if not (r["layer"] == 0 and r["n"] == 3)]), 4, 3)


def test_fitted_layer_times_affine_in_union():
    fits = pd.DataFrame([
        {"layer": 0, "kernel": "slot", "t_op": 1e-4, "c_u": 1e-9, "c_re": 5e-10},
        {"layer": 0, "kernel": "dedup", "t_op": 2e-4, "c_g": 2e-9, "c_t": 1e-5}])
    union = np.array([[4, 6, 7.5], [4, 5, 6]], float)  # layer 1 has no fit: takes layer 0's
    t = predict.fitted_layer_times(fits, union, m=4, expert_bytes=1000)
    n = np.arange(1, 4)
    slot0 = 1e-4 + 1e-9 * union[0] * 1000 + 5e-10 * (n * 4 - union[0]) * 1000
    dedup1 = 2e-4 + 2e-9 * union[1] * 1000 + 1e-5 * n
    assert np.allclose(t["slot"][0], slot0)
    assert np.allclose(t["dedup"][1, 1:], dedup1[1:])
    assert t["dedup"][1, 0] == t["slot"][1, 0]


def measured_from(tau_slot, tau_dedup, h, a_values, ci=0.1 * MS, eps=0.05):
    """Measurements whose round model has these verify times, host time h(k) and a free draft,
    and oracle throughputs exactly G_a(k) / V(k)."""
    rm = round_model(tau_slot, tau_dedup, h, ci)
    V = rm.step_times("dedup")
    a = np.asarray(a_values, float)
    T = expected_tokens(a[:, None], np.arange(len(V))[None, :]) / V[None, :]
    return predict.Measured(rm, a, T, eps)


def round_model(tau_slot, tau_dedup, h, ci=0.1 * MS):
    tau = {"slot": np.asarray(tau_slot, float), "dedup": np.asarray(tau_dedup, float)}
    S = tau["slot"] - tau["dedup"]
    n = len(S)
    verify = {p: predict.Term.exact(tau[p], "test", "loop") for p in tau}
    saving = predict.Term(S, S - ci, S + ci, np.ones(n, int), "test", "loop")
    return predict.RoundModel("test", "d=0", "quiet", verify, predict.Term.exact(np.asarray(h, float), "test", "loop"),
                              predict.DraftTime.free(n - 1), saving=saving)


A = [0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.98]


def test_evaluate_exact_prediction_scores_perfectly():
    t = times([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2.3, 3.1, 3.8, 4.4, 5.0, 5.5, 6.0, 6.4])
    c = predict.chain("m", 10 * MS, t)
    h = np.full(9, 0.5 * MS)
    meas = measured_from(c.tau["slot"], c.tau["dedup"], h, A)
    m = predict.evaluate(c, meas)
    assert m["saving_err_ms"] == 0 and m["delta"] == 0 and m["tau_err"] == 0
    assert m["kstar_within1"] == 11 and m["loss_runs"] == 0 and m["speedup_inside_bound21"]
    assert m["crossover_pred"] == m["crossover_meas"] == 4  # S = -0.6,-0.2,+0.4,... x2 from n = 4
    assert m["in_band"] == m["band_points"] == 8
    assert m["sign_correct"] == m["sign_total"] == 8


def test_evaluate_uniform_step_error_keeps_kstar_and_meets_bounds():
    t = times([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2.3, 3.1, 3.8, 4.4, 5.0, 5.5, 6.0, 6.4])
    c = predict.chain("m", 10 * MS, t)
    h = np.zeros(9)
    meas = measured_from(c.tau["slot"] / 1.1, c.tau["dedup"] / 1.1, h, A)  # every time 10% low
    m = predict.evaluate(c, meas)
    assert m["delta"] == pytest.approx(0.1)
    assert m["k_hat"] == m["k_V"]  # a common factor on every V(k) leaves k* unchanged (Sec. 3.5)
    assert m["speedup_err"] == pytest.approx(0, abs=1e-12) and m["loss_V"] == 0
    assert m["tau_err"] == pytest.approx(0.1)
    # saving error: |S_hat - S| = |S_hat| (1 - 1/1.1), largest at n = 9 (S_hat = 2 x 2.6 ms)
    assert m["saving_err_ms"] == pytest.approx(5.2 * (1 - 1 / 1.1))
    # implied eps: the smallest eps whose band (18) covers every point
    x = max(abs(c.saving[i]) * (1 - 1 / 1.1) / (c.M["slot"][i] + c.M["dedup"][i]) for i in range(1, 9))
    assert m["implied_eps"] == pytest.approx(x / (1 + x))


def metrics(**kw):
    base = {"crossover_pred": None, "crossover_meas": None, "crossover_distance": 0, "kstar_within1": 11,
            "loss_runs": 0.01, "sign_correct": 3, "sign_total": 3, "tau_err": 0.05, "delta": 0.05,
            "speedup_inside_bound21": True}
    base.update(kw)
    return base


@pytest.mark.parametrize("rule_id, bad, value", [
    ("crossover", {"crossover_pred": 6, "crossover_meas": 4, "crossover_distance": 2}, "6/4"),
    ("kstar", {"kstar_within1": 8}, "8"),
    ("loss", {"loss_runs": 0.061}, "6.1%"),
    ("sign", {"sign_correct": 2}, "2 of 3"),
    ("verify_time", {"tau_err": 0.151}, "15.1%"),
    ("speedup", {"speedup_inside_bound21": False, "delta": 0.2}, "delta=0.200"),
])
def test_each_rule_holds_and_fails(rule_id, bad, value):
    rules = predict.load_rules()
    rule = next(r for r in rules["rules"] if r["id"] == rule_id)
    one = {**rules, "rules": [rule], "versions_scored": ["measured-time"]}
    table = predict.score({("measured-time", 512): metrics(), ("measured-time", 1024): metrics(**bad)}, one)
    assert table["d512"].iloc[0].endswith("holds")
    assert table["d1024"].iloc[0] == f"{value}, fails"
    assert not table["holds_all"].iloc[0]


def test_boundary_values_hold():
    rules = predict.load_rules()
    table = predict.score({("calibrated", 512): metrics(kstar_within1=9, loss_runs=0.06, tau_err=0.15,
                                                        crossover_pred=None, crossover_meas=9,
                                                        crossover_distance=1)}, rules)
    assert table["holds_all"].all(), table


def test_rules_file_is_committed_and_unchanged(tmp_path):
    prov = predict.rules_provenance()
    if prov["commit"] is None:
        pytest.skip("not a git checkout")
    assert len(prov["commit"]) == 40 and prov["unchanged"] is True
    copy = tmp_path / "rules.json"
    copy.write_text(json.dumps(predict.load_rules()))
    assert predict.rules_provenance(copy)["commit"] is None


def test_bad_rules_file_is_named(tmp_path):
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"rules": []}))
    with pytest.raises(ValueError, match="r.json: missing field 'versions_scored'"):
        predict.load_rules(bad)


def test_bounds_vacuous_from_delta_one():
    t = times([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2.3, 3.1, 3.8, 4.4, 5.0, 5.5, 6.0, 6.4])
    c = predict.chain("m", 10 * MS, t)
    meas = measured_from(c.tau["slot"] / 2.5, c.tau["dedup"] / 2.5, np.zeros(9), A)  # delta = 1.5
    m = predict.evaluate(c, meas)
    assert m["delta"] == pytest.approx(1.5) and m["bounds_vacuous"]
    assert m["speedup_inside_bound21"] and m["loss_inside_bound20"]


def test_non_positive_predicted_step_time_predicts_nothing():
    t = times([1, 2, 3, 4, 5, 6, 7, 8, 9], [1, 2.3, 3.1, 3.8, 4.4, 5.0, 5.5, 6.0, 6.4])
    c = predict.chain("m", 10 * MS, t)
    meas = measured_from(c.tau["slot"].copy(), c.tau["dedup"].copy(), np.zeros(9), A)
    c.tau["dedup"][3] = -1 * MS
    m = predict.evaluate(c, meas)
    assert not m["valid_step_times"] and m["kstar_within1"] == 0
    assert not m["speedup_inside_bound21"] and not m["loss_inside_bound20"]
    rules = predict.load_rules()
    table = predict.score({("measured-time", 512): m}, rules)
    verdict = dict(zip([r["id"] for r in rules["rules"]], table["holds_all"]))
    assert not verdict["kstar"] and not verdict["loss"] and not verdict["speedup"]


def test_inside_band_counts_the_ends_to_floating_point():
    """Every comparison of a measurement with a predicted band (notebook 05's predictions, notebook
    08's advise against the runs) goes through one rule: ends included, to a relative 1e-9."""
    from moespec.predict.speculative import inside_band

    assert inside_band(1.0, 1.0, 2.0) and inside_band(2.0, 1.0, 2.0)
    assert inside_band(1.0 * (1 - 1e-12), 1.0, 2.0) and inside_band(2.0 * (1 + 1e-12), 1.0, 2.0)
    assert not inside_band(0.99, 1.0, 2.0) and not inside_band(2.01, 1.0, 2.0)
    got = inside_band(np.array([0.5, 1.5, 3.0]), np.array([1.0, 1.0, 1.0]), np.array([2.0, 2.0, 4.0]))
    assert got.tolist() == [False, True, True]
