"""Notebooks 05 (whole-model runs) and 06 (prediction chain, Tables 3/4/7/8, Figures 4/5/6),
quick profile, on the byte-faithful-all default subject and on a replayed published shape: the files
they write and the numbers they print, each recomputed from the run's own rows."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest

from moespec import paths, predict
from moespec.engine.subject import load_subject
from moespec.predict import calibration as CAL
from moespec.predict import noise as NOISE
from moespec.predict import speculative as SP
from moespec.runstats import machine_adjust as MA
from moespec.studies.whole_model import RUN_SCHEMA_VERSION, read_run, real_draft_file

pytestmark = pytest.mark.notebook
RULES = paths.data_dir() / "preregistration" / "scoring_rules_byte_faithful_all.json"   # the default subject's (Subject.rules_file)


def test_whole_model_then_predictions(run_notebook, tmp_path):
    """Notebook 05 on its default subject at the quick profile's sizes with draft lengths up to 3 (the
    quick profile's k = 1..8 runs in tests/test_own_model.py, on a checkpoint), then 06."""
    out = tmp_path / "engine"
    _, figs, text = run_notebook("05_whole_model", out_dir=str(out), backend="torch",
                                 sizes={"oracle_ks": [0, 1, 2, 3], "real_ks": [1, 2, 3]})
    for f in ("05_breakdown.png", "05_breakdown.csv", "05_verify_time.png", "05_oracle_acceptance.png",
              "05_real_draft.png", "05_draft_cost.png", "05_agreement.csv", "05_function_preserved.csv",
              "05_verify_summary.csv", "05_verify_summary_all_rows.csv", "05_real_draft.csv", "05_oracle_cells.csv",
              "05_draft_cost_ratios.csv", "05_draft_cost_predictions.csv", "05_draft_cost_stop.json",
              "05_round_model.json", "05_round_terms.csv", "05_round_model.png", "05_verify_protocols.csv",
              "05_verify_protocols.png", "05_oracle_predictions.csv", "05_plain_step.csv", "05_predictions.png",
              "05_real_draft_acceptance.csv", "05_real_draft_acceptance_profile.csv", "05_goals.csv"):
        assert (figs / f).stat().st_size > 0, f
    assert re.search(r"^subject: .*byte-faithful-all", text, re.M)
    assert "scoring_rules_byte_faithful_all.json" in text and "pre-registered for this subject: True" in text
    # every table names the subject it was made on
    label = pd.read_csv(figs / "05_breakdown.csv")["label"].iloc[0]
    for f in ("05_verify_summary.csv", "05_oracle_cells.csv", "05_draft_cost_predictions.csv", "05_plain_step.csv"):
        assert (pd.read_csv(figs / f)["subject"] == label).all(), f
    # the dedup switch changes no output, and the widening changes no token
    g = re.search(r"greedy tokens equal with dedup off and on: (\d+) of (\d+)", text)
    v = re.search(r"verify argmax equal with dedup off and on: (\d+) of (\d+) rows", text)
    w = re.search(r"greedy tokens equal to the unwidened model in int8_b32: (\d+) of (\d+)", text)
    assert g and g.group(1) == g.group(2) == "72"   # 3 prompts x 12 tokens x 2 depths
    assert v and v.group(1) == v.group(2)
    assert w and w.group(1) == w.group(2) == "72"
    same = pd.read_csv(figs / "05_function_preserved.csv")
    assert (same.greedy_equal == same.tokens).all() and (same.max_abs_logit_diff <= 1e-4 * same.max_abs_logit).all()
    bd = pd.read_csv(figs / "05_breakdown.csv").iloc[0]
    assert bd.attention_ms > 0 and bd.lm_head_ms > 0 and "byte-faithful-all" in bd.label
    # each component's bytes beside its time and the published model's byte share
    parts = ("attention", "experts", "lm_head", "kv_cache", "other")
    assert sum(bd[f"{c}_share"] for c in parts) == pytest.approx(1)
    assert sum(bd[f"{c}_share_published"] for c in parts) == pytest.approx(1)
    assert bd.experts_GBps == pytest.approx(bd.experts_MB / bd.experts_ms)
    assert re.search(r"experts: [\d.]+ MB per step, share [\d.]+ \([^)]+: [\d.]+\); [\d.]+ ms alone", text)
    prov = predict.rules_provenance(RULES)
    if prov["commit"]:
        assert f"commit {prov['commit']}" in text and "unchanged on disk: True" in text
        assert re.search(r"before the speculative runs started .*: True", text)
    # the round model: every state, context and draft, calibrated in the sweeps of the runs it predicts
    models = predict.RoundModels.load(figs / "05_round_model.json")
    assert models.states == ["quiet", "loaded"]
    assert {m.key() for m in models.select(state="quiet")} == {
        ("quiet", "d=24", "oracle draft"), ("quiet", "d=48", "oracle draft"),
        ("quiet", "chat", "the run's own draft (as trained)"), ("quiet", "chat", "the run's draft widened to cost 0.3")}
    order = models.order
    for state in ("quiet", "loaded"):
        assert order[f"oracle runs {state}"] < order[f"real-draft runs {state}"]
    loops = pd.read_csv(out / "verify_loops.csv")
    assert set(loops["n"]) == set(range(1, 10)) and set(loops["dedup"]) == {True, False}
    assert (loops["ref_GBps"] > 0).all() and set(loops["state"]) == {"quiet", "loaded"}
    # the calibration's prompts are not the test runs' (the oracle runs use the first two per depth)
    assert set(loops["prompt"]) == {2}
    # the depth calibration ran in one shuffled order with the oracle runs of its depth
    runs = pd.read_csv(out / "oracle_runs.csv")
    for d in (24, 48):
        both = pd.concat([loops[(loops.state == "quiet") & (loops.d == d)].assign(part="loops"),
                          runs[runs.d == d].assign(part="runs")]).sort_values("seq")
        assert list(both["seq"]) == list(range(len(both)))
        assert int((both["part"] != both["part"].shift()).sum()) - 1 >= 2
    rm = models.get("quiet", "d=24", "oracle draft")
    V = rm.step_times("dedup")
    oracle_pred = pd.read_csv(figs / "05_oracle_predictions.csv")
    row = oracle_pred[(oracle_pred.state == "quiet") & (oracle_pred.d == 24) & (oracle_pred.k == 2)
                      & (oracle_pred.a == 0.8)].iloc[0]
    assert row.V_hat_ms == pytest.approx(1e3 * V[2])
    assert row.speedup_hat == pytest.approx((1 + 0.8 + 0.64) * V[0] / V[2])
    summary = pd.read_csv(out / "verify_summary.csv")
    assert sorted(summary["n"].unique()) == list(range(1, 10)) and sorted(summary["d"].unique()) == [24, 48]
    proto = pd.read_csv(figs / "05_verify_protocols.csv")
    assert len(proto) == 2 * 2 * 9 and (proto.tau_grid_ms > 0).all() and (proto.tau_loop_ms > 0).all()
    runs = pd.read_csv(out / "oracle_runs.csv")
    assert set(runs["prompt"]) == {0, 1}
    assert len(runs) == 2 * 2 * 4 * 3 and (runs.loc[runs["k"] == 0, "tokens_per_step"] == 1).all()
    real = pd.read_csv(out / "real_draft.csv")
    assert set(real["k"]) == {0, 1, 2, 3} and set(real["draft_cost"].dropna()) == {0.0, 0.3}
    assert (real[real.k == 0].groupby(["state", "prompt", "rep"]).size() == 2).all()   # quick: plain_runs = 2
    # quick: real_reps = 3 quiet, loaded_real_reps = 2
    assert {s: set(pd.read_csv(out / real_draft_file(s))["rep"]) for s in ("quiet", "loaded")} == {
        "quiet": {0, 1, 2}, "loaded": {0, 1}}
    # the real draft's round calibration ran in one shuffled sweep with its test runs, and its round
    # models are fitted from the calibration turns alone
    cal_rows = pd.read_csv(out / "draft_calibration.csv")
    assert (cal_rows[cal_rows.k == 0].groupby(["state", "prompt"]).size() == 3).all()    # draft_cal_plain_runs = 3
    for state in ("quiet", "loaded"):
        c = cal_rows[cal_rows.state == state]
        t = pd.read_csv(out / real_draft_file(state))
        assert c.seq.min() < t.seq.max() and t.seq.min() < c.seq.max()     # the parts overlap in time
        assert sorted([*c.seq, *t.seq]) == list(range(len(c) + len(t)))    # one sweep held both
        # the files hold the runs as measured with each run's machine factor over the whole sweep, and
        # the round models are fitted to the calibration runs adjusted by them
        both = pd.concat([c.assign(part="calibration"), t.assign(part="test")], ignore_index=True)
        refactored = MA.machine_factors(both.drop(columns=MA.FACTOR))
        assert np.allclose(refactored.factor.to_numpy(), both[MA.FACTOR].to_numpy())
        assert (both[MA.FACTOR] != 1).any()
        said = pd.read_csv(figs / "05_machine_adjustment.csv").set_index("state").loc[state]
        assert said.slope == pytest.approx(refactored.slope) and said.runs == len(both)
        assert said.noise_measured == pytest.approx(MA.run_noise(both))
        assert said.noise_adjusted == pytest.approx(MA.run_noise(MA.adjusted(both)))
        refit = CAL.from_draft_runs(MA.adjusted(c), label, state, n_boot=200, seed=0)
        for fitted in refit.values():
            saved = models.get(state, "chat", fitted.draft.name)
            assert np.allclose(saved.step_times("dedup"), fitted.step_times("dedup"))
            assert saved.draft.form == "catch-up" and np.allclose(saved.draft.catch_up_share, fitted.draft.catch_up_share)
            assert (saved.draft.catch_up_s, saved.draft.one_token_s) == pytest.approx(
                (fitted.draft.catch_up_s, fitted.draft.one_token_s))
        # the engine counted each run's catch-up rounds: never more than its fully accepted rounds
        drafted = t[t.k >= 1]
        assert (drafted.catch_up <= drafted.steps - drafted.rejections).all() and (t[t.k == 0].catch_up == 0).all()
    chat = models.select(state="quiet", context="chat")     # one verify term per draft, from its own runs
    assert len(chat) == 2 and not np.array_equal(chat[0].tau("dedup"), chat[1].tau("dedup"))
    assert chat[0].verify["dedup"].runs[1] == chat[0].verify["slot"].runs[1]   # its own runs, as many as per-slot
    pred = pd.read_csv(figs / "05_draft_cost_predictions.csv")
    assert len(pred) == 2 * 3 + 1 * 3 and set(pred.state) == {"quiet", "loaded"}
    # the predictions and their diagnostics, from the round models and the adjusted runs of each state
    for state, g in pred.groupby("state", sort=False):
        runs_of = MA.adjusted(pd.read_csv(out / real_draft_file(state)))
        cost = {m.draft.name: m for m in models.select(state=state, context="chat")}
        by_cost = {r: cost[CAL.draft_name(r)] for r in sorted(runs_of.draft_cost.dropna().unique())}
        again = SP.real_draft_predictions(by_cost, runs_of).merge(SP.real_draft_diagnostics(by_cost, runs_of),
                                                                   on=["draft_cost", "k"])
        for col in again.columns:
            if pd.api.types.is_numeric_dtype(again[col]) or pd.api.types.is_bool_dtype(again[col]):
                assert np.allclose(g[col].to_numpy(float), again[col].to_numpy(float)), (state, col)
            else:
                assert list(g[col]) == list(again[col]), (state, col)
    assert pred.predicted_measured_steps.to_numpy() == pytest.approx(
        (pred.tokens_per_step * pred.V0_meas_ms / pred.V_meas_ms).to_numpy())
    assert not {"predicted_pooled", "rel_error_as_measured", "read_GBps_runs"} & set(pred.columns)
    assert re.findall(r"\[(\w+)\] where the error comes from: with the runs' own step times in place of the "
                      r"round model's, within 5 % at \d+ of \d+", text) == ["quiet", "loaded"]
    lines = re.findall(r"\[(\w+)\] machine adjustment: read slope (-?[\d.]+) over the sweep, drafted -?[\d.]+, plain "
                       r"-?[\d.]+, 4 neighbours a side, factors", text)
    assert [state for state, _ in lines] == ["quiet", "loaded"]
    for state, slope in lines:
        assert float(slope) == pytest.approx(pd.read_csv(figs / "05_machine_adjustment.csv").set_index("state")
                                             .loc[state, "slope"], abs=0.006)
    # the measurement against itself: each repetition's speedups over its own plain runs, per state
    for state, g in pred.groupby("state"):
        runs_of = MA.adjusted(pd.read_csv(out / real_draft_file(state)))
        by_rep = SP.measured_by_rep(runs_of)
        assert SP.rep_columns(g) == list(by_rep.columns) == [f"rep{r}" for r in range(3 if state == "quiet" else 2)]
        mine = g.set_index(["draft_cost", "k"])[SP.rep_columns(g)]
        assert np.allclose(mine.loc[by_rep.index].to_numpy(), by_rep.to_numpy())
        n = SP.measurement_noise(by_rep)
        assert f"[{state}] the measurement against itself: its {by_rep.shape[1]} repetitions" in text
        assert f"about {n['expected_outside']:.1f} of {len(g)} by that noise alone" in text
    goals = pd.read_csv(figs / "05_goals.csv")
    assert goals["goal"].str.contains("plain step V\\(0\\) predicted within 3 %").sum() == 2
    assert goals["goal"].str.startswith("real-draft measurement resolves 5 %").sum() == 2
    # the prediction against its calibration (moespec.predict.noise): every point's noise, its line and goal row
    assert (pred.pred_rel_se >= 0).all() and (pred.noise_rel_sd >= pred.pred_rel_se).all()
    assert pred.noise_p_outside.between(0, 1).all() and pred.beyond_2sd.isin([True, False]).all()
    for state, g in pred.groupby("state"):
        n = NOISE.noise_summary(g)
        assert (f"[{state}] the prediction against its own calibration (turns resampled 10 times): "
                f"{NOISE.prediction_noise_phrase(n)}") in text
    assert goals["goal"].str.startswith("real-draft prediction and measurement together resolve 5 %").sum() == 2
    assert not goals["goal"].str.contains("added after|not pre-registered").any()
    assert set(goals.loc[~goals.preregistered, "goal"].str.split(",").str[0]) == {
        "real-draft measurement resolves 5 % (its repetitions against each other)",
        "real-draft prediction and measurement together resolve 5 % (the calibration turns resampled",
        "oracle-draft speedup with each cell's realized tokens per step (time alone) within 5 %"}
    # advise's acceptance: per state, the median over prompts of each prompt's rate (draft as trained)
    acc = pd.read_csv(figs / "05_real_draft_acceptance.csv").set_index("state")
    per = pd.read_csv(figs / "05_real_draft_acceptance_by_prompt.csv")
    assert set(acc.index) == {"quiet", "loaded"} == set(per.state)
    own = real[(real.k >= 1) & (real.draft_cost == 0)]
    for state, g in own.groupby("state"):
        counts = g.groupby("prompt")[["accepted", "rejections"]].sum()
        rates = counts.accepted / (counts.accepted + counts.rejections)
        assert acc.loc[state, "a"] == pytest.approx(float(rates.median()))
        assert acc.loc[state, "a_pooled"] == pytest.approx(counts.accepted.sum() / counts.to_numpy().sum())
        assert acc.loc[state, "prompts"] == len(counts) == len(per[per.state == state])
    # the per-position profile: per state, prompt and k the runs' steps and steps accepting at least i drafts
    prof = pd.read_csv(figs / "05_real_draft_acceptance_profile.csv", dtype={"prompt": str})
    for (state, prompt, k), g in own.groupby(["state", "prompt", "k"]):
        p = prof[(prof.state == state) & (prof.prompt == str(prompt)) & (prof.k == k)].sort_values("position")
        assert list(p.position) == list(range(1, k + 1)) and (p.steps == g.steps.sum()).all()
        assert p.accepted_at_least.sum() == g.accepted.sum()            # G(k) = 1 + sum p_i: the runs' tokens per step
        assert (np.diff(p.accepted_at_least.to_numpy()) <= 0).all() and p.accepted_at_least.iloc[0] <= p.steps.iloc[0]
    assert re.search(r"plain decoding fastest on \d of 2 prompts", text)
    record = read_run(out)
    assert record["schema_version"] == RUN_SCHEMA_VERSION and "draft_form" not in record
    assert record["subject_args"]["model"] == "byte-faithful-all" and "verify_reps" in record["from_profile"]
    assert set(record["machine_states"]) == {"quiet", "loaded"}
    assert record["machine_adjustment"] == MA.settings()

    _, figs, text = run_notebook("06_predictions", out_dir=str(out), backend="torch")
    for f in ("06_fig4_saving.png", "06_fig5_kstar_bounds.png", "06_fig6_preregistered.png", "06_fits.csv",
              "06_curves.csv", "06_curves_loaded.csv", "06_epsilon.csv", "06_epsilon_loaded.csv"):
        assert (figs / f).stat().st_size > 0, f
    # the fits' WikiText routing ran on the subject's narrow twin, with the subject's expert bytes
    assert "recorded by the engine (on its narrow twin, whose routing of the first segment is the engine's" in text
    from moespec.routing import RoutingTrace, distinct_share
    wiki = RoutingTrace.load(out / "routing_wikitext.npz")
    assert wiki.expert_bytes[0] == load_subject("byte-faithful-all", profile="quick").expert_bytes_per_token() / (
        wiki.num_layers * wiki.top_k)
    # Figure 3 (right): the verified text's distinct share against the WikiText routing, per depth and n
    shares = pd.read_csv(figs / "06_fig3_right.csv")
    assert (figs / "06_fig3_right.png").stat().st_size > 0
    assert set(shares["label"]) == {"verified at d=24", "verified at d=48"} and set(shares["n"]) == {2, 4, 6, 8}
    text24 = distinct_share(RoutingTrace.load(out / "routing_text_d24.npz"), 8)
    for r in shares[shares["label"] == "verified at d=24"].itertuples():
        assert r.share_text == pytest.approx(text24[r.n - 1])
        assert r.share_text_low <= r.share_text <= r.share_text_high and 1 / r.n <= r.share_text <= 1
    assert shares["difference"].to_numpy() == pytest.approx((shares.share_text - shares.share_reference).to_numpy())
    assert re.search(r"distinct share U/\(nm\), verified text against .*: largest \|difference\|", text)
    curves = pd.read_csv(figs / "06_curves.csv")
    assert {"measured", "measured-grid", "prediction", "text", "measured-time", "calibrated"} == set(curves.version)
    # the measured rows are the round model's loop times; the chain is anchored at its one-token pass
    meas = curves[(curves.version == "measured") & (curves.d == 24)].sort_values("n")
    assert meas.tau_slot_ms.to_numpy() == pytest.approx(1e3 * rm.tau("slot"))
    pr = curves[(curves.version == "prediction") & (curves.d == 24) & (curves.n == 1)].iloc[0]
    assert pr.tau_slot_ms == pytest.approx(1e3 * rm.tau("slot")[0])
    t3 = pd.read_csv(figs / "06_table3_predictions.csv")
    assert set(t3["source"]) == {"this run", "paper 1, published (their hardware)"}
    assert (t3["source"] == "this run").sum() == 2 and (t3["source"] != "this run").sum() == 12
    assert (t3.loc[t3["source"] == "this run", "model"] == label).all()
    t4 = pd.read_csv(figs / "06_table4_preregistered.csv")
    assert set(t4.loc[t4["source"] == "this run", "version"]) == {"measured-time", "calibrated", "prediction"}
    t8 = pd.read_csv(figs / "06_table8_rules.csv")
    ours = t8[t8["source"] == "this run"]
    assert len(ours) == 6 * 3 * 2 and ours["d24"].str.match(r".*, (holds|fails)$").all()   # two machine states
    metrics = json.loads((out / "metrics.json").read_text())
    assert len(metrics) == 4 * 2 and len(json.loads((out / "metrics_loaded.json").read_text())) == 4 * 2
    for key, m in metrics.items():
        # the proved bounds (20), (21) hold wherever the version predicts positive step times
        assert (m["loss_inside_bound20"] and m["speedup_inside_bound21"]) or not m["valid_step_times"], key
        assert m["kstar_values"] == 3 and 0 <= m["implied_eps"] < 1
    if prov["commit"]:
        assert f"read unchanged; commit {prov['commit']}" in text
    assert re.search(r"engine eps = \d+\.\d{3}", text)
    # notebook 06 refuses to predict another subject than notebook 05 ran, and a run record of another version
    with pytest.raises(Exception, match="field 'model' is 'default', notebook 05's run used 'byte-faithful-all'"):
        run_notebook("06_predictions", out_dir=str(out), backend="torch", subject={"model": "default"})
    (out / "run.json").write_text(json.dumps({**record, "schema_version": None}))
    with pytest.raises(Exception, match=f"run.json: field schema_version: expected {RUN_SCHEMA_VERSION}; found None"):
        run_notebook("06_predictions", out_dir=str(out), backend="torch")


def test_replayed_published_shape_through_05_06_07(run_notebook, tmp_path):
    out = tmp_path / "replay"
    small = dict(verify_reps=2, oracle_ks=[0, 1, 2], a_values=[0.8])
    _, figs, text = run_notebook("05_whole_model", out_dir=str(out), backend="torch", subject={"model": "replay"},
                                 sizes=small)
    assert re.search(r"^subject: .*routing replayed from synthetic sticky routing", text, re.M)
    assert "no real draft for this subject" in text and "pre-registered for this subject: False" in text
    assert not (figs / "05_draft_cost.png").exists()
    _, figs, text = run_notebook("06_predictions", out_dir=str(out), backend="torch")
    assert "routing of the fits: the replayed trace itself" in text
    assert len(json.loads((out / "metrics.json").read_text())) == 4 * 2
    _, figs, text = run_notebook("07_ssp_oracle", out_dir=str(tmp_path / "oracle"), backend="torch",
                                 subject={"model": "replay"}, oracle_a=0.6)
    assert "replayed routing: U from the trace, draft confidence a = 0.6" in text
    assert (figs / "07_fig2_lmax_sweep.csv").is_file()
    status = json.loads((figs / "07_tableB_status.json").read_text())   # a trace has routing, not text
    assert status["computed"] is False and "needs tokens and draft_chain" in status["reason"]
    assert "Appendix B not computed" in text
