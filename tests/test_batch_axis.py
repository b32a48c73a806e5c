"""Notebook 09's arithmetic on hand-made rows (exact values), its goals and report part on hand
cases (the notebook itself: tests/test_batch_notebook.py)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from moespec.studies import batch_axis as BA
from moespec.runstats import regret_interval


def _runs() -> pd.DataFrame:
    """Two repetitions of B = 1, k = 0, 1 on the quiet machine."""
    rows = [(0, 0, 100.0, 0, 0, 10, 10), (0, 1, 150.0, 3, 1, 14, 10),
            (1, 0, 200.0, 0, 0, 10, 10), (1, 1, 250.0, 5, 3, 16, 8)]
    return pd.DataFrame([{"state": "quiet", "rep": rep, "B": 1, "k": k, "throughput_per_seq": t, "accepted": acc,
                          "rejections": rej, "emitted": em, "rounds": rounds, "t_verify_mean_s": 0.01,
                          "t_draft_mean_s": 0.001 * k, "t_host_mean_s": 0.0005 * (rep + 1), "read_GBps": 10.0,
                          "other_load": 0.1} for rep, k, t, acc, rej, em, rounds in rows])


def test_cell_summary_exact():
    c = BA.cell_summary(_runs()).set_index("k")
    assert c.loc[0, "measured"] == 1.0
    assert c.loc[1, "measured"] == pytest.approx(200 / 150, rel=1e-12)         # ratio of medians
    # per-repetition ratios 1.5 and 1.25: quartiles by linear interpolation
    assert c.loc[1, "measured_q25"] == pytest.approx(1.3125, rel=1e-12)
    assert c.loc[1, "measured_q75"] == pytest.approx(1.4375, rel=1e-12)
    assert c.loc[1, "a_measured"] == pytest.approx(8 / 12, rel=1e-12)          # pooled over repetitions
    assert np.isnan(c.loc[0, "a_measured"])
    assert c.loc[1, "tokens_per_round"] == pytest.approx(30 / 18, rel=1e-12)
    assert c.loc[1, "t_host_run_s"] == pytest.approx(0.00075, rel=1e-12)
    with pytest.raises(ValueError, match=r"no plain run \(k = 0\) at \(state, B, rep\) = \('quiet', 1, 1\)"):
        BA.cell_summary(_runs().drop(index=2))


def test_regret_interval_from_paired_repetitions():
    runs = _runs()
    by_rep = BA.ratios_by_rep(runs)
    assert list(by_rep) == [("quiet", 1)]
    np.testing.assert_allclose(by_rep[("quiet", 1)], [[1.0, 1.0], [1.5, 1.25]], rtol=1e-12)
    # k = 1 beats plain decoding in every repetition: running k = 1 loses nothing in any resample
    assert regret_interval(by_rep[("quiet", 1)], 1) == (0.0, 0.0)
    # k = 0 loses 1 - 1/S(1), S(1) the median of two resampled repetitions: 1.25, 1.375 or 1.5
    lo, hi = regret_interval(by_rep[("quiet", 1)], 0, resamples=2000)
    assert lo == pytest.approx(1 - 1 / 1.25) and hi == pytest.approx(1 - 1 / 1.5)
    assert all(np.isnan(regret_interval(np.ones((2, 1)), 0)))


def test_round_terms_take_verify_from_the_blocks_and_draft_host_from_the_runs():
    """verify_s: the mean over the blocks' places in the text ((0.010 + 0.012 + 0.020) / 3 at k = 0)."""
    cells = BA.cell_summary(_runs())
    blocks = pd.DataFrame([{"state": "quiet", "rep": r, "offset": j, "B": 1, "k": k, "term": "verify", "t_median_s": t}
                           for r, j, k, t in [(0, 2, 0, 0.010), (1, 6, 0, 0.012), (1, 10, 0, 0.020), (0, 2, 1, 0.013),
                                              (1, 6, 1, 0.015)]])
    t = BA.round_terms(blocks, cells).set_index("k")
    assert t.loc[0, "verify_s"] == pytest.approx(0.014) and t.loc[1, "verify_s"] == pytest.approx(0.014)
    assert t.loc[0, "draft_s"] == 0.0 and t.loc[1, "draft_s"] == pytest.approx(0.001)
    assert t["draft_from"].tolist() == ["none (k = 0)", "runs"]
    drafts = pd.concat([blocks, pd.DataFrame([{"state": "quiet", "rep": 0, "B": 1, "k": 1, "term": "draft",
                                               "t_median_s": 0.004}])])
    t = BA.round_terms(drafts, cells).set_index("k")
    assert t.loc[1, "draft_s"] == pytest.approx(0.004) and t.loc[1, "draft_from"] == "round terms"
    with pytest.raises(ValueError, match=r"no verify pass timed at \(state, B, k\) = \('quiet', 1, 1\)"):
        BA.round_terms(blocks[blocks.k == 0], cells)


def _terms() -> tuple[pd.DataFrame, pd.DataFrame]:
    terms = pd.DataFrame({"state": "quiet", "B": [1, 1, 1, 2, 2, 2], "k": [0, 1, 2] * 2,
                          "verify_s": [0.010, 0.012, 0.015, 0.020, 0.022, 0.024],
                          "draft_s": [0.0, 0.001, 0.002, 0.0, 0.0, 0.0],
                          "host_s": [0.0, 0.0, 0.0, 0.001, 0.001, 0.001]})
    acc = terms[BA.KEYS].assign(a_measured=[np.nan, 0.5, 0.5, np.nan, 0.5, 1.0],
                                tokens_per_round=[1.0, 1.4, 1.8, 1.0, 1.5, 3.0])
    return terms, acc


def test_predict_speedups_exact():
    terms, acc = _terms()
    p = BA.predict_speedups(terms, acc).set_index(["B", "k"])
    # V(., 1) = 10, 13, 17 ms; G_0.5 = 1, 1.5, 1.75
    assert p.loc[(1, 0), "predicted"] == 1.0
    assert p.loc[(1, 1), "predicted"] == pytest.approx(15 / 13, rel=1e-12)
    assert p.loc[(1, 2), "predicted"] == pytest.approx(35 / 34, rel=1e-12)
    assert p.loc[(1, 2), "predicted_realized"] == pytest.approx(1.8 * 10 / 17, rel=1e-12)
    # V(., 2) = 21, 23, 25 ms; a = 1 (every draft accepted) is capped as notebook 05 caps it: G -> 3
    assert p.loc[(2, 1), "predicted"] == pytest.approx(1.5 * 21 / 23, rel=1e-12)
    assert p.loc[(2, 2), "predicted"] == pytest.approx(3 * 21 / 25, rel=1e-9)
    assert p.loc[(2, 2), "V_s"] == pytest.approx(0.025, rel=1e-12)
    with pytest.raises(ValueError, match=r"expected 0..kmax; found \[0, 2\]"):
        BA.predict_speedups(terms[terms.k != 1], acc)


def test_prediction_table_best_k_and_rise():
    terms, acc = _terms()
    cells = acc.assign(measured=[1.0, 1.15, 1.0, 1.0, 1.40, 2.60], measured_q25=0.0, measured_q75=0.0,
                       throughput_per_seq=1.0, reps=2, read_GBps=10.0, other_load=0.0)
    union = pd.DataFrame({"B": [1, 1, 1, 2, 2, 2], "k": [0, 1, 2] * 2, "union_ratio": [1, 1.8, 2.4, 1, 1.5, 1.9]})
    pred = BA.prediction_table(terms, cells, union)
    row = pred.set_index(["B", "k"]).loc[(1, 1)]
    assert row.rel_error == pytest.approx((15 / 13) / 1.15 - 1, rel=1e-12) and row.union_ratio == 1.8
    best = BA.best_k_table(pred).set_index("B")
    assert best.loc[1, "k_best_measured"] == 1 and best.loc[1, "k_star_predicted"] == 1
    assert best.loc[1, "regret"] == 0.0
    assert best.loc[2, "k_best_measured"] == 2 and best.loc[2, "k_star_predicted"] == 2
    # a predicted k that is not the measured best: the share of the best lost
    pred2 = pred.copy()
    pred2.loc[(pred2.B == 1) & (pred2.k == 2), "predicted"] = 9.0
    b2 = BA.best_k_table(pred2).set_index("B")
    assert b2.loc[1, "k_star_predicted"] == 2 and b2.loc[1, "regret"] == pytest.approx(1 - 1.0 / 1.15, rel=1e-12)
    rise = BA.rise_with_batch(best.reset_index()).iloc[0]
    assert rise.B == [1, 2] and rise.best_measured == [1.15, 2.6]
    assert bool(rise.rises_measured) and rise.B_best_measured == 2
    assert rise.stops_paying_measured is None
    # plain decoding fastest at B = 2 and 4, not at B = 1: speculation stops paying from B = 2
    stop = pd.DataFrame({"state": "quiet", "B": [1, 2, 4], "measured_best": [1.3, 1.0, 1.0],
                         "predicted_at_k_star": [1.2, 1.1, 1.0]})
    r = BA.rise_with_batch(stop).iloc[0]
    assert r.stops_paying_measured == 2 and r.stops_paying_predicted == 4 and not r.rises_measured


def test_union_ratios_exact_on_hand_traces():
    from moespec.routing import RoutingTrace

    # every token selects experts {0, 1}: a pass reads them whatever its size
    same = RoutingTrace([np.tile([[[0, 1]]], (6, 1, 1)) for _ in range(3)], num_experts=4)
    assert (BA.union_ratios(same, [1, 2], 2)["union_ratio"] == 1.0).all()
    # tokens alternate {0, 1} and {2, 3}: one window of 2 tokens reads all 4, one token 2
    alt = RoutingTrace([np.array([[[0, 1]], [[2, 3]]] * 3) for _ in range(3)], num_experts=4)
    u = BA.union_ratios(alt, [1], 1).set_index("k")["union_ratio"]
    assert u[0] == 1.0 and u[1] == 2.0


def _pred(errors: dict) -> pd.DataFrame:
    return pd.DataFrame([{"state": s, "B": 1, "k": k, "rel_error": e} for s, es in errors.items()
                         for k, e in enumerate(es)])


def test_goals_on_hand_cases():
    pred = _pred({"quiet": [0.0, 0.05, -0.049], "loaded": [0.0, 0.08, 0.101]})
    best = pd.DataFrame([{"state": "quiet", "B": 1, "k_best_measured": 2, "k_star_predicted": 2, "regret": 0.0},
                         {"state": "quiet", "B": 2, "k_best_measured": 3, "k_star_predicted": 1, "regret": 0.02},
                         {"state": "quiet", "B": 4, "k_best_measured": 3, "k_star_predicted": 1, "regret": 0.021}])
    g = BA.batch_goals(pred, best)
    assert g["met"].tolist() == [True, False, True, True, False]
    assert g["value"].iloc[1] == "2 of 3 cells; largest |error| 10.1 %"
    assert list(g.columns) == ["goal", "value", "target", "met", "preregistered"]
    b1 = {"cells": 3, "recomputed_max_abs": 0.0,
          "measured": [{"state": "quiet", "a_05": 0.8, "k": [0, 1, 2], "max_abs_rel_difference": 0.06}]}
    g = BA.batch_goals(pred, best, b1)
    assert g["met"].tolist()[-2:] == [True, False]
    assert "B = 1: measured speedup beside notebook 05's oracle runs (a = 0.8" in g["goal"].iloc[-1]


def test_b1_against_05_recomputes_its_predictions():
    from moespec.theory import speedup

    V = np.array([10.0, 13.0, 17.0])
    nb05 = pd.DataFrame([{"state": "quiet", "d": d, "a": a, "k": k, "V_hat_ms": V[k],
                          "speedup_hat": float(speedup(V, a, k)), "speedup_meas": [1.0, 1.2, 1.3][k]}
                         for d in (24, 48) for a in (0.5, 0.8) for k in range(3)])
    ours = pd.DataFrame({"state": "quiet", "B": 1, "k": [0, 1, 2], "measured": [1.0, 1.26, 1.3],
                         "a_measured": [np.nan, 0.7, 0.9]})
    out = BA.b1_against_05(nb05, ours)
    assert out["cells"] == 12 and out["recomputed_max_abs"] == 0.0
    (m,) = out["measured"]
    assert m["a_05"] == 0.8 and m["k"] == [0, 1, 2]
    assert m["max_abs_rel_difference"] == pytest.approx(0.05, rel=1e-12)
    nb05.loc[1, "speedup_hat"] += 1e-6
    assert BA.b1_against_05(nb05, ours)["recomputed_max_abs"] == pytest.approx(1e-6, rel=1e-6)


def test_run_sizes_refuse_gaps_and_unknown_drafts():
    P, _ = BA.run_sizes("quick")
    assert P["ks"][0] == 0 and P["batch_sizes"][0] == 1
    with pytest.raises(ValueError, match=r"sizes: field ks: expected the draft lengths 0..kmax without a gap"):
        BA.run_sizes("quick", {"ks": [0, 2]})
    with pytest.raises(ValueError, match=r"sizes: field draft_kind: expected 'oracle' or 'real'; found 'x'"):
        BA.run_sizes("quick", {"draft_kind": "x"})
    with pytest.raises(ValueError, match=r"sizes: field term_positions: expected at least one position per "
                                         r"repetition \(2\) and at most n_tokens \(8\); found 1$"):
        BA.run_sizes("quick", {"term_positions": 1})
    assert BA.run_sizes("quick", {"term_positions": 8})[0]["term_positions"] == 8


def test_report_part_renders_exactly(tmp_path):
    """The report's batch-axis part over hand-made tables: quiet B = 1 with errors 1 % and -6 % (one of
    two within 5 %), loaded B = 2 with 8 % (within 10 %)."""
    from moespec import report
    from moespec.report.run import RunFiles

    (tmp_path / "MANIFEST.json").write_text(json.dumps({"started": "2026-12-02T10:00:00", "profile": "full",
                                                        "notebooks": [{"name": "09_batch", "wall_s": 60.0}]}))
    (tmp_path / "09_batch_predictions.csv").write_text(
        "state,B,k,rel_error,tolerance\nquiet,1,0,0.01,0.05\nquiet,1,1,-0.06,0.05\nloaded,2,1,0.08,0.1\n")
    (tmp_path / "09_best_k.csv").write_text(
        "state,B,k_best_measured,k_star_predicted,measured_best,measured_at_k_star,regret,regret_lo,regret_hi\n"
        "quiet,1,1,1,1.25,1.25,0.0,,\nloaded,2,1,0,1.5,1.0,0.3333333,0.2,0.4\n")
    (tmp_path / "09_rise_with_batch.csv").write_text(
        'state,B,best_measured,best_predicted,rises_measured,rises_predicted\nquiet,"[1, 2]","[1.25, 1.5]",'
        '"[1.3, 1.4]",True,True\n')
    out = report.render_text("<!-- moespec-report:batch-axis -->\n<!-- /moespec-report:batch-axis -->\n",
                             RunFiles(tmp_path))
    assert "| quiet | 1 | 1 of 2 (<= 5.0 %) | 6.0 % | 1 (1.250) | 1 (1.250) | 0.0 % |" in out
    assert "| loaded | 2 | 1 of 1 (<= 10.0 %) | 8.0 % | 1 (1.500) | 0 (1.000) | 33.3 % [20.0 %, 40.0 %] |" in out
    assert ("quiet: best speedup per B [1, 2] measured [1.25, 1.5], predicted [1.3, 1.4] (first rises with B: "
            "measured True, predicted True).") in " ".join(out.split())


def test_recorded_run_block_renders_the_hand_numbers(tmp_path, monkeypatch):
    """The docs' block over a hand-made notebook-09 record: 90 s of wall time, a quiet state of 60 s
    with 24 s of runs, and B = 1 verify terms of 0.12 / 0.30 s against in-run passes of 0.10 / 0.20 s
    (ratios 1.2 and 1.5)."""
    from moespec import paths, report
    from moespec.report.run import RunFiles

    rec = tmp_path / "rec"
    rec.mkdir()
    (rec / "manifest.json").write_text(json.dumps({
        "profile": "full", "git_commit": "abcdef0123456789", "started": "2026-12-07T18:37:43",
        "hardware": {"cpu": {"cpu_model": "Test CPU", "logical_cpus": 2}, "gpus": []},
        "notebooks": [{"name": "09_batch", "wall_s": 90.0}]}))
    (rec / "batch_run.json").write_text(json.dumps({"machine_states": {"quiet": {"seconds": 60.0}}}))
    (rec / "batch_runs.csv").write_text("state,B,k,time_s,t_verify_mean_s,read_GBps\nquiet,1,0,6.0,0.05,8.0\n"
                                        "quiet,1,1,6.0,0.10,9.5\nquiet,1,1,6.0,0.10,12.0\nquiet,1,2,6.0,0.20,10.0\n")
    (rec / "batch_terms.csv").write_text("state,B,k,term,t_median_s\nquiet,1,0,verify,0.05\nquiet,1,1,verify,0.12\n"
                                         "quiet,1,2,verify,0.30\nquiet,2,1,verify,9.0\n")
    monkeypatch.setattr(paths, "ROOT", tmp_path)
    (tmp_path / "figs").mkdir()
    out = report.render_text("<!-- moespec-report:batch-notebook-run folder=rec -->\n"
                             "<!-- /moespec-report:batch-notebook-run -->\n", RunFiles(tmp_path / "figs"))
    text = " ".join(out.split())
    assert "Test CPU, 2 logical CPUs, no GPU; its commit in `manifest.json`): **1.5 min**" in text
    assert ("quiet 1.0 min, of which the cells' runs 0.4 min, the reference reads before the cells "
            "8.0–12.0 GB/s") in text
    assert "quiet 1.20–1.50 over k = 1..2" in text
