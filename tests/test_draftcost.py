"""Bandwidth regimes, the draft-cost sweep and its prediction, the decode-step breakdown, the
profile defaults and the package functions notebooks 05/06/07 call."""

from __future__ import annotations


import numpy as np
import pandas as pd
import pytest
import torch

from moespec.engine import draftcost as DC
from moespec.engine.breakdown import decode_breakdown, shares
from moespec.engine.subject import load_subject
from moespec.engine.verify import measure_verify_times, regime_summaries
from moespec.measure.regimes import ReferenceRead, classify, dominant, regime_summary, split_point
from moespec.notebook_profiles import DEFAULTS, default_depths, resolve
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.runstats import speedup_over_plain
from moespec.theory import expected_tokens


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores


@pytest.fixture(scope="module")
def subject():
    return load_subject("byte-faithful", profile="quick", backend="torch")


def test_regimes_split_two_groups_and_keep_one():
    rng = np.random.default_rng(0)
    two = np.concatenate([rng.normal(35, 1.5, 40), rng.normal(60, 2, 25)])
    t = split_point(two)
    assert 38 < t < 55
    lab = classify(two, t)
    assert (lab[:40] == "low").all() and (lab[40:] == "high").all()
    assert dominant(lab) == "low"
    one = rng.normal(40, 2, 60)
    assert split_point(one) is None and set(classify(one)) == {"one"}
    assert split_point([30, 60]) is None                       # too few readings to call two regimes
    s = regime_summary(two, lab)
    assert [r["rows"] for r in s] == [40, 25] and s[0]["ref_GBps_max"] < s[1]["ref_GBps_min"]
    assert dominant(["high", "low", "high", "low"]) == "high"  # ties: the high-bandwidth regime
    with pytest.raises(ValueError, match="no rows"):
        dominant([])


def test_reference_read_reports_gb_per_s():
    ref = ReferenceRead(2**20, timer=lambda fn: (fn(), 1e6)[1])
    assert ref() == pytest.approx(2**20 / 1e6)              # bytes per ns = GB/s


def test_profiles_keep_what_the_caller_set():
    values, defaulted = resolve("05", "quick", verify_reps=7, depths=None)
    assert values["verify_reps"] == 7 and "verify_reps" not in defaulted
    assert values["depths"] == DEFAULTS["05"]["quick"]["depths"] and "depths" in defaulted
    assert resolve("07", "full", repeats=1)[0]["repeats"] == 1
    assert resolve("05", "quick", {"verify_reps": 7})[0] == values        # the sizes dict, as a notebook passes it
    with pytest.raises(ValueError, match=r"sizes \['no_such'\] are not sizes of the quick profile"):
        resolve("05", "quick", {"no_such": 1})
    with pytest.raises(ValueError, match="profile"):
        resolve("05", "medium")
    assert default_depths(256, 48) == [64, 198]
    with pytest.raises(ValueError, match="no room"):
        default_depths(64, 48)
    # the loaded state takes its own sizes where the profile has them (full: 3 quiet and 5 loaded
    # repetitions; the quick profile 3 and 2)
    from moespec.studies.whole_model import state_sizes
    full = resolve("05", "full")[0]
    assert (state_sizes(full, "quiet")["real_reps"], state_sizes(full, "loaded")["real_reps"]) == (3, 5)
    quick = resolve("05", "quick")[0]
    assert (state_sizes(quick, "quiet")["real_reps"], state_sizes(quick, "loaded")["real_reps"]) == (3, 2)
    assert state_sizes(full, "loaded")["real_prompts"] == full["loaded_real_prompts"] == 6
    own = dict(full, loaded_real_prompts=5)        # a loaded size of its own is the loaded state's, not the quiet one's
    assert (state_sizes(own, "loaded")["real_prompts"], state_sizes(own, "quiet")["real_prompts"]) == (5, 6)
    # the round calibration's turns: 8 in each state; quick 2 and 2
    assert (state_sizes(full, "quiet")["draft_cal_prompts"], state_sizes(full, "loaded")["draft_cal_prompts"]) == (8, 8)
    assert (state_sizes(quick, "quiet")["draft_cal_prompts"], state_sizes(quick, "loaded")["draft_cal_prompts"]) == (2, 2)


def test_subject_spec_defaults_refusals_and_the_runs_subject():
    """The notebooks' ``subject`` dict read by SubjectSpec: unset fields take load_subject's defaults,
    an unknown field or a wrong type is refused in one line, and a later notebook's given fields must
    match the ones notebook 05's run recorded."""
    import inspect

    from moespec.engine.subject import load_subject as load
    from moespec.notebook_profiles import SubjectSpec

    defaults = {k: v.default for k, v in inspect.signature(load).parameters.items() if k in SubjectSpec.types()}
    assert SubjectSpec.from_dict({}).args() == defaults and SubjectSpec.from_dict(None) == SubjectSpec()
    spec = SubjectSpec.from_dict({"model": "byte-faithful", "draft_cost": 1, "layers": 2})
    assert (spec.model, spec.draft_cost, spec.layers, spec.fmt) == ("byte-faithful", 1.0, 2, "")
    assert isinstance(spec.draft_cost, float)
    with pytest.raises(ValueError, match=r"^subject: unknown field 'modle'; expected one of \['draft', "):
        SubjectSpec.from_dict({"modle": "x"})
    with pytest.raises(ValueError, match=r"^subject: field 'layers': expected int; found True$"):
        SubjectSpec.from_dict({"layers": True})
    with pytest.raises(ValueError, match=r"^subject: field 'draft_cost': expected float; found '0.1'$"):
        SubjectSpec.from_dict({"draft_cost": "0.1"})
    recorded = SubjectSpec.from_dict({"model": "byte-faithful", "draft_cost": 0.1}).args()
    assert SubjectSpec.from_run(recorded, {}) == SubjectSpec.from_dict(recorded)
    assert SubjectSpec.from_run(recorded, {"model": "byte-faithful", "fmt": ""}).draft_cost == 0.1
    with pytest.raises(ValueError, match="field 'model' is 'default', notebook 05's run used 'byte-faithful'"):
        SubjectSpec.from_run(recorded, {"model": "default"})


def _runs(a: float, t_verify: dict, t_draft: dict, h: float, prompts: int = 3, slot: float = 1.2,
          ks=(1, 2, 4)) -> pd.DataFrame:
    """Synthetic sweep rows whose times and acceptance follow the theory exactly: verify t_verify[k]
    (per-slot: ``slot`` times it, draft cost 0 only), draft a_d k + b_d, host h per round; a share
    a^k of the rounds begins its draft with two tokens (the catch-up form's fit of these times is the
    line itself, c = e = 0)."""
    rows = []
    for p in range(prompts):
        rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": np.nan, "k": 0, "dedup": True,
                     "accepted": 0, "rejections": 0, "steps": 100, "emitted": 100, "tokens_per_step": 1.0, "catch_up": 0,
                     "t_verify_mean_s": t_verify[0], "t_draft_mean_s": 0.0, "t_host_mean_s": h,
                     "t_step_mean_s": t_verify[0] + h, "throughput": 1 / (t_verify[0] + h), "speedup": 1.0,
                     "ref_GBps": 10.0})
        for r, (ad, bd) in t_draft.items():
            for k in ks:
                for dedup in (True, False) if r == min(t_draft) else (True,):
                    G = expected_tokens(a, k)
                    tv = t_verify[k] * (1 if dedup else slot)
                    V = ad * k + bd + tv + h
                    acc = 1000 * a                              # accepted / (accepted + rejections) = a
                    rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": r, "k": k, "dedup": dedup,
                                 "accepted": acc, "rejections": 1000 - acc, "steps": 1000, "emitted": 1000 * G,
                                 "catch_up": 1000 * a ** k,
                                 "tokens_per_step": G, "t_verify_mean_s": tv, "t_draft_mean_s": ad * k + bd,
                                 "t_host_mean_s": h, "t_step_mean_s": V, "throughput": G / V,
                                 "speedup": G / V * (t_verify[0] + h), "ref_GBps": 10.0})
    return pd.DataFrame(rows)


def test_round_model_on_every_run_of_both_read_regimes():
    """The calibration runs (taken to their sweep's typical machine state) are fitted whole: every
    run of both read regimes enters each term, and the model says so."""
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3, 4: 20e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3)}
    fast = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3, 4))
    slow = fast.assign(ref_GBps=5.0, rep=1)                       # the same cells in a slow read regime, 30 % slower
    for col in ("t_verify_mean_s", "t_draft_mean_s", "t_host_mean_s", "t_step_mean_s"):
        slow[col] = slow[col] * 1.3
    rows = pd.concat([fast, fast.assign(rep=2), slow], ignore_index=True)   # the fast regime dominates, 2 : 1
    whole = CAL.from_draft_runs(rows, "synthetic", n_boot=50)[0.2]
    assert whole.verify["dedup"].values_s[0] == pytest.approx((2 * 10e-3 + 13e-3) / 3)  # every run
    assert whole.verify["dedup"].values_s[3] == pytest.approx((2 * 18e-3 + 1.3 * 18e-3) / 3)
    assert whole.host.values_s[0] == pytest.approx((2 * 0.5e-3 + 0.65e-3) / 3)
    assert whole.regime == "all rows" and CAL.from_draft_runs(fast, "synthetic", n_boot=50)[0.2].regime == "one"


def test_verify_term_per_draft_cost():
    """Where the target's pass is slower after a costlier draft, each draft's verify term comes from
    its own runs: runs whose verify time is exactly t_k + c_k r recover it exactly for every r."""
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3}
    slope = {1: 5e-3, 2: 2e-3, 3: 0.0}                        # seconds per unit of draft cost, per k
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3), 0.4: (4e-3, 0.1e-3)}
    rows = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3))
    spec = rows["k"] >= 1
    rows.loc[spec, "t_verify_mean_s"] += rows.loc[spec, "k"].map(slope) * rows.loc[spec, "draft_cost"]
    for r, model in CAL.from_draft_runs(rows, "synthetic", n_boot=50).items():
        want = [tv[0]] + [tv[k] + slope[k] * r for k in (1, 2, 3)]
        assert np.allclose(model.verify["dedup"].values_s, want), r


def test_prediction_equals_the_theory_on_runs_that_follow_it():
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3, 4: 20e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3), 0.4: (4e-3, 0.1e-3)}
    cal = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3, 4))       # the calibration: every k = 1..4
    models = CAL.from_draft_runs(cal, "synthetic", n_boot=50)
    test = _runs(0.6, tv, {r: ab for r, ab in drafts.items()}, h=0.5e-3)[lambda f: f.dedup]
    pred = SP.real_draft_predictions(models, test)
    assert np.allclose(pred.rel_error, 0, atol=1e-9)
    assert np.allclose(SP.real_draft_diagnostics(models, test).rel_error_geometric, 0, atol=1e-9)
    row = pred[(pred.draft_cost == 0.2) & (pred.k == 2)].iloc[0]
    V = 2e-3 * 2 + 0.1e-3 + 16e-3 + 0.5e-3
    assert row.predicted == pytest.approx((1 + 0.6 + 0.36) * 10.5e-3 / V)
    # the draft fit keeps the intercept: t_draft(k) = a k + b exactly, t_draft(0) = 0
    rm = models[0.2]
    assert rm.draft.a_s == pytest.approx(2e-3) and rm.draft.b_s == pytest.approx(0.1e-3)
    assert rm.draft.term.values_s[0] == 0 and rm.draft.term.values_s[3] == pytest.approx(6.1e-3)
    assert rm.tau("slot")[2] == pytest.approx(1.2 * 16e-3)         # per-slot from the draft-cost-0 runs
    stop = SP.stop_paying(pred)
    best = pred.groupby("draft_cost").predicted.max()
    first = next(i for i, r in enumerate(sorted(best.index)) if best[r] <= 1)
    assert stop["stop_index_measured"] == stop["stop_index_predicted"] == first and stop["grid_steps_apart"] == 0
    assert SP.acceptance_by_k(test).round(9).eq(0.6).all()
    plain = SP.plain_step(models[0.0], test, "synthetic")
    assert plain["rel_error"] == pytest.approx(0, abs=1e-12)


def test_every_term_is_each_drafts_own():
    """tau_dedup(k + 1), h(k) and t_draft(k) of each draft's round model come from that draft's runs
    (and the plain runs at k = 0); tau_slot from the per-slot runs of the draft as trained. Hand
    case: at k = 2 the three drafts' runs (3 prompts each) time the pass at 16, 18 and 15 ms."""
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3, 4: 20e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3), 0.4: (4e-3, 0.1e-3)}
    cal = _runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3, 4))
    at2 = cal.dedup & (cal.k == 2)
    cal.loc[at2 & (cal.draft_cost == 0.2), "t_verify_mean_s"] = 18e-3
    cal.loc[at2 & (cal.draft_cost == 0.4), "t_verify_mean_s"] = 15e-3
    cal.loc[(cal.draft_cost == 0.4) & (cal.k >= 1), "t_host_mean_s"] = 0.7e-3
    models = CAL.from_draft_runs(cal, "synthetic", n_boot=50)
    for r, want in ((0.0, 16e-3), (0.2, 18e-3), (0.4, 15e-3)):
        rm = models[r]
        assert rm.tau("dedup")[2] == pytest.approx(want)
        assert rm.tau("dedup")[1] == pytest.approx(14e-3) and rm.tau("dedup")[0] == pytest.approx(10e-3)
        assert rm.verify["dedup"].runs[2] == 3 and rm.verify["dedup"].runs[0] == 3   # 3 prompts; plain
        assert "this draft's runs" in rm.verify["dedup"].source
        assert rm.tau("slot")[2] == pytest.approx(1.2 * 16e-3)    # the per-slot runs: draft cost 0 only
    assert models[0.4].host.values_s[2] == pytest.approx(0.7e-3) and models[0.0].host.values_s[2] == pytest.approx(0.5e-3)
    assert models[0.2].draft.a_s == pytest.approx(2e-3)


def test_where_the_error_comes_from():
    """Calibration runs at reads 14, 16, 18 GB/s (one prompt each) whose verify pass takes
    base_k + bytes_k / B; test runs at 22 GB/s, faster. The round model, averaged over the
    calibration runs, misses the test's speedups; the diagnostics' prediction from the runs' own
    step times (``predicted_measured_steps``) is exact, and the geometric G_a(k) is exact too on
    runs whose acceptance is geometric."""
    base = {k: 4e-3 + 1e-3 * k for k in range(5)}
    nbytes = {k: 0.1 + 0.02 * k for k in range(5)}           # GB read per pass: time = bytes / (GB/s)
    drafts = {0.0: (0.4e-3, 0.1e-3), 0.2: (2e-3, 0.1e-3)}

    def at(reads):                       # prompt i at read reads[i]: every time and throughput as it ran there
        return pd.concat([_runs(0.6, {k: base[k] + nbytes[k] / b for k in range(5)}, drafts, h=0.5e-3, prompts=1,
                                ks=(1, 2, 3, 4)).assign(prompt=i, ref_GBps=b) for i, b in enumerate(reads)],
                         ignore_index=True)

    models = CAL.from_draft_runs(at([14.0, 16.0, 18.0]), "synthetic", n_boot=50)
    test = at([22.0, 22.0])[lambda f: f.dedup]
    pred = SP.real_draft_predictions(models, test)
    diag = SP.real_draft_diagnostics(models, test)
    assert list(diag[["draft_cost", "k"]].itertuples(index=False)) == list(pred[["draft_cost", "k"]].itertuples(index=False))
    assert np.allclose(diag.rel_error_measured_steps, 0, atol=1e-9)
    assert (pred.rel_error.abs() > 1e-3).all()                  # the calibration's average state is not the test's
    assert np.allclose(diag.rel_error_geometric, pred.rel_error, atol=1e-9)   # geometric acceptance: G_a(k) = E(k)
    V = diag.set_index(["draft_cost", "k"])
    assert V.loc[(0.2, 2), "V_hat_ms"] == pytest.approx(1e3 * models[0.2].step_times()[2])
    assert V.loc[(0.2, 2), "V_meas_ms"] == pytest.approx(1e3 * (2e-3 * 2 + 0.1e-3 + base[2] + nbytes[2] / 22 + 0.5e-3))
    assert "predicted_pooled" not in pred and "predicted_unrouted" not in diag   # no routing term: no unrouted column


def test_prediction_is_the_median_prompts_when_one_prompt_rarely_accepts():
    """The measured speedup is a median over prompts; a prompt whose drafts are rarely accepted
    takes many steps and would pull a pooled tokens per step down, not the median. The prediction
    uses each prompt's own tokens per step and takes the median (exact here)."""
    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3, 4: 20e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3)}
    models = CAL.from_draft_runs(_runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3, 4)), "synthetic", n_boot=50)
    test = _runs(0.6, tv, drafts, h=0.5e-3, prompts=3)[lambda f: f.dedup].copy()
    bad = (test.prompt == 2) & (test.k >= 1)     # one token per step: 10 times the steps of a good prompt
    V = test.loc[bad, "t_step_mean_s"]
    test.loc[bad, "steps"] = 10_000
    test.loc[bad, "emitted"] = 10_000
    test.loc[bad, "tokens_per_step"] = 1.0
    test.loc[bad, "speedup"] = 1.0 / V * (tv[0] + 0.5e-3)
    pred = SP.real_draft_predictions(models, test)
    assert np.allclose(pred.rel_error, 0, atol=1e-9)                       # the median prompt's E(k): exact
    assert pred[pred.k == 2].iloc[0].tokens_per_step == pytest.approx(1 + 0.6 + 0.36)


def test_acceptance_is_the_median_prompts():
    """Three prompts at k = 1, 2: rates 9/10, 8/10 and 1/10 (the rare one drafted over many more
    rounds). The median prompt's rate is 0.8, the pooled one (9 + 8 + 10) / (10 + 10 + 100)."""
    runs = pd.DataFrame({"state": "quiet", "prompt": [0, 0, 1, 1, 2, 2, 0], "k": [1, 2, 1, 2, 1, 2, 0],
                         "accepted": [4, 5, 3, 5, 4, 6, 0], "rejections": [1, 0, 1, 1, 40, 50, 0]})
    acc, per = SP.median_prompt_acceptance(runs)
    assert per.set_index("prompt")["a"].to_dict() == pytest.approx({0: 0.9, 1: 0.8, 2: 0.1})
    row = acc.iloc[0]
    assert row.a == pytest.approx(0.8) and row.a_pooled == pytest.approx(27 / 120)
    assert (row.prompts, row.accepted_total, row.rejections_total, row.k_max) == (3, 27, 93, 2)
    never = runs.assign(accepted=0, rejections=0)
    with pytest.raises(ValueError, match="no drafted token accepted or rejected"):
        SP.median_prompt_acceptance(never)


def test_stop_paying_counts_grid_steps_and_never():
    pred = pd.DataFrame({"draft_cost": [0.0, 0.1, 0.2, 0.3], "k": 1, "measured": [1.2, 1.05, 0.98, 0.9],
                         "predicted": [1.3, 1.2, 1.1, 1.05]})
    s = SP.stop_paying(pred)
    assert (s["stop_cost_measured"], s["stop_cost_predicted"]) == (0.2, None)
    assert s["grid_steps_apart"] == 2                       # never on the grid counts as the next step (4)


def test_draft_cost_sweep_on_the_engine(subject):
    drafts = {r: subject.widened_draft(r) for r in (0.0, 0.5)}
    prompts = [np.random.default_rng(i).integers(1, 256, size=16) for i in range(2)]
    ratios = DC.draft_cost_ratios(subject.engine, drafts, prompts[0], reps=3, warmup=0, reference=ReferenceRead(2**20))
    assert list(ratios.draft_cost) == [0.0, 0.5] and (ratios.cost_ratio > 0).all() and (ratios.ref_GBps > 0).all()
    runs = DC.draft_cost_sweep(subject.engine, drafts, prompts, [1, 2], 8, reference=ReferenceRead(2**20),
                               progress=False, plain_runs=3)
    assert len(runs) == 2 * (3 + 2 * 2) and set(runs.regime) <= {"one", "low", "high"}
    assert (runs[runs.k == 0].groupby("prompt").size() == 3).all()      # three plain runs per prompt
    plain = runs[runs.k == 0].groupby(["prompt", "regime"])["throughput"].median()
    checked = 0
    for _, row in runs[runs.k > 0].iterrows():        # the speedup's denominator: their median in the run's regime
        if (row.prompt, row.regime) in plain.index:
            assert row.speedup == pytest.approx(row.throughput / plain[(row.prompt, row.regime)])
            checked += 1
    assert checked > 0
    assert (runs.loc[runs.k == 0, "tokens_per_step"] == 1).all()
    # a function-preserving widening changes no token: same accepted drafts at every cost
    acc = runs[runs.k > 0].pivot_table(index=["prompt", "k"], columns="draft_cost", values="accepted")
    assert (acc[0.0] == acc[0.5]).all()
    cal = DC.draft_cost_sweep(subject.engine, drafts, prompts[:1], [1, 2, 3], 8, progress=False, slot_costs=[0.0])
    assert len(cal) == 1 + 2 * 3 + 3 and (~cal.dedup).sum() == 3   # plain, two drafts x three k, per-slot x three k
    pred = SP.real_draft_predictions(CAL.from_draft_runs(cal, "quick", n_boot=20), runs)
    assert set(pred.k) == {1, 2} and np.isfinite(pred.predicted).all()
    with pytest.raises(ValueError, match="draft length >= 1"):
        DC.draft_cost_sweep(subject.engine, drafts, prompts, [0], 4, progress=False)
    with pytest.raises(ValueError, match="plain_runs must be at least 1"):
        DC.draft_cost_sweep(subject.engine, drafts, prompts, [1], 4, progress=False, plain_runs=0)


def test_decode_breakdown_components(subject):
    bd = decode_breakdown({"bf": subject}, {"bf": np.arange(1, 30)}, n_values=(1, 3), reps=3, warmup=0,
                          read_bytes=2**20)
    sh = shares(bd).iloc[0]
    t = bd[bd["pass"] == "n=1"].set_index("component")
    # timings of a tiny model under load may cross; the derived rows follow from the measured ones
    assert sh.step_ms > 0 and sh.experts_ms > 0 and sh.draft_token_ms > 0
    assert sh.expert_share == pytest.approx(sh.experts_ms / sh.step_ms)
    assert sh.draft_ratio == pytest.approx(sh.draft_token_ms / sh.step_ms)
    assert t.t_median_s["rest"] == pytest.approx(t.t_median_s["step"] - t.t_median_s["experts"])
    assert {"n=3 slot", "n=3 dedup"} <= set(bd["pass"]) and sh.peak_memory_GiB > 0
    # each component's bytes beside its time and the published model's share (05_breakdown.csv)
    from moespec.engine.byte_shares import COMPONENTS, byte_shares
    table = byte_shares(subject.engine, subject.description["like"], subject.description["fmt"], depths=(29,))
    wide = shares(bd, {"bf": table}).iloc[0]
    by = table.set_index("component")
    assert wide.published == by.published.iloc[0] and wide.bytes_depth == 29
    assert sum(wide[f"{c}_share"] for c in COMPONENTS) == pytest.approx(1)
    assert sum(wide[f"{c}_share_published"] for c in COMPONENTS) == pytest.approx(1)
    assert wide.experts_MB == pytest.approx(by.subject_bytes["experts"] / 1e6)
    assert wide.kv_cache_MB > 0 and wide.lm_head_share_published == pytest.approx(by.published_share["lm_head"])
    assert wide.experts_GBps == pytest.approx(wide.experts_MB / wide.experts_ms)
    assert "kv_cache_GBps" not in wide.index
    from moespec.engine.breakdown import bytes_lines
    lines = bytes_lines(wide)
    assert len(lines) == len(COMPONENTS) and lines[1].startswith(f"experts: {wide.experts_MB:.2f} MB per step")
    assert bytes_lines(sh) == []
    with pytest.raises(ValueError, match="one depth expected"):
        shares(bd, {"bf": byte_shares(subject.engine, "olmoe", "int8_b32", depths=(0, 8))})
    with pytest.raises(ValueError, match="n_values"):
        decode_breakdown({"bf": subject}, {"bf": np.arange(1, 30)}, n_values=(2,), reps=1)


def test_verify_times_carry_their_regime(subject):
    prompts = [np.random.default_rng(0).integers(1, 256, size=16)]
    rows, _ = measure_verify_times(subject.engine, prompts, n_max=3, reps=4, warmup=0, progress=False,
                                   reference=ReferenceRead(2**20))
    assert rows.ref_GBps.notna().all() and rows.groupby("rep").ref_GBps.nunique().eq(1).all()
    # a synthetic two-regime run: the rules use the dominant regime, a depth without it keeps all rows
    rng = np.random.default_rng(1)
    synth = []
    for d, bws in ((10, [35] * 8 + [60] * 2), (20, [60] * 5 + [35] * 1)):   # 9 low, 7 high repetitions
        for rep, bw in enumerate(bws):
            reading = bw + rng.normal(0, .5)                 # one reference read per repetition
            for n in (1, 2):
                for dd in (False, True):
                    synth.append({"prompt": 0, "d": d, "n": n, "dedup": dd, "rep": rep, "ref_GBps": reading,
                                  "t_s": (2.0 if bw < 50 else 1.0) * (1 + n) * (0.8 if dd else 1.0)})
    for_rules, all_rows, info = regime_summaries(pd.DataFrame(synth), n_boot=20, min_share=0.25)
    assert info["dominant"] == "low" and info["depths"][10]["regime"] == "low"
    assert info["depths"][20]["regime"].startswith("all rows")
    t10 = for_rules[(for_rules.d == 10) & (for_rules.n == 1)].tau_slot_s.iloc[0]
    assert t10 == pytest.approx(4.0, abs=0.01)            # only the low-bandwidth (slow) repetitions
    assert len(all_rows) == len(for_rules) == 4


def test_replayed_oracle_inputs_are_the_traces_unions():
    from moespec.engine.replay import ReplayRouting
    from moespec.oracle.junk import replayed_inputs
    from moespec.routing.stats import union_sizes
    from moespec.routing import synthetic

    trace = synthetic.sticky(2, 40, 2, 16, 4, keep=0.4, seed=2)
    routing = ReplayRouting(trace, doc=1)
    x = replayed_inputs(routing, 8, 10, 3, 0.7)
    ids = trace.docs[1]
    assert np.all(x.p == 0.7) and x.U.shape == (10, 3, 4)
    for i in (0, 5, 9):
        for k in (1, 2, 3):
            u = union_sizes(ids[7 + i:7 + i + k + 1], 16)[-1].mean()
            assert np.all(x.U[i, k - 1, :k + 1] == u) and np.all(np.isnan(x.U[i, k - 1, k + 1:]))
    with pytest.raises(ValueError, match="need"):
        replayed_inputs(routing, 8, 40, 3, 0.7)


def test_record_rounds_with_a_reference_and_an_oracle_draft(subject):
    from moespec.engine import OracleDraft
    from moespec.oracle.record import record_rounds

    prompts = [{"question_id": 1, "category": "a", "ids": [5, 17, 33, 2]}]
    drafter = OracleDraft(subject.engine, 0.8, subject.vocab_size, seed=0)
    df, _ = record_rounds(subject.engine, None, prompts, ks=[0, 2], n_tokens=6, repeats=1, backend="torch",
                          progress=False, reference=ReferenceRead(2**20), drafter=drafter)
    assert "ref_GBps" in df and (df.ref_GBps > 0).all() and df.groupby("gen_id").ref_GBps.nunique().eq(1).all()


def test_analyse_bundles_paper2s_analysis():
    from moespec.oracle import analysis as A
    from moespec.oracle.cost import CostModel
    from moespec.oracle.junk import synthetic_inputs

    items = [synthetic_inputs(n=40, lmax=4, seed=s, seq_id=str(s)) for s in range(4)]
    train, test = A.split_sequences(items, seed=0)
    model = CostModel(0.3, 0.1, 5.0, 0.08, 1e-3)
    res = A.analyse(items, model, train, test, 4, label="synthetic")
    direct = A.totals([s.value for s in (A.solve(it, model) for it in items)],
                      [A.solve(it, model).cost_ar for it in items])
    assert res.totals["speedup"] == pytest.approx(direct["speedup"])
    assert list(res.sweep.lmax) == [1, 2, 3, 4] and res.sweep.speedup.iloc[-1] == pytest.approx(direct["speedup"])
    assert res.online_info["oracle"] >= res.online_info["online"] - 1e-12
    assert set(res.tables()) >= {"fig2_lmax_sweep", "online_policy", "alpha0_summary"} and res.kernels is None


def test_goals_are_decided_from_the_numbers():
    from moespec.studies import goals as G

    metrics = {("prediction", 64): {"sign_correct": 5, "sign_total": 5, "tau_err": 0.08},
               ("prediction", 198): {"sign_correct": 4, "sign_total": 6, "tau_err": 0.12}}
    g = G.chain_goals(metrics)
    assert list(g.met) == [True, True, False, False]
    scores = pd.DataFrame({"version": ["measured-time"] * 6, "holds_all": [True] * 5 + [False]})
    assert not G.rules_goal(scores).met.iloc[0] and G.rules_goal(scores.assign(holds_all=True)).met.iloc[0]
    pred = pd.DataFrame({"rel_error": [0.05, -0.09, 0.11]})
    d = G.draft_cost_goals(pred, {"stop_cost_measured": 0.2, "stop_cost_predicted": 0.3, "grid_steps_apart": 1})
    assert list(d.met) == [False, True]
    p2 = G.paper2_goals({"rows": "regime high", "eq4_r2_in": 0.93, "eq4_cv_mape_pct": 11.0},
                        {"online": 0.95, "oracle": 1.0})
    assert list(p2.met) == [True, False, True]
    assert g.preregistered.all() and d.preregistered.all() and p2.preregistered.all()


def _two_rep_runs() -> pd.DataFrame:
    """Two prompts, two repetitions, plain runs and one (draft cost 0, k = 1) cell. Repetition 0:
    plain 10 and 10 tokens/s, drafted 12 and 14 (speedups 1.2, 1.4: median 1.3). Repetition 1: the
    second prompt's plain runs read 20 tokens/s (a slow stretch in the other repetition would not
    reach them), drafted 11 and 26 (1.1, 1.3: median 1.2)."""
    rows = []
    for rep, plain, spec in ((0, (10.0, 10.0), (12.0, 14.0)), (1, (10.0, 20.0), (11.0, 26.0))):
        for p in (0, 1):
            rows.append({"prompt": p, "rep": rep, "k": 0, "draft_cost": np.nan, "regime": "one", "throughput": plain[p]})
            rows.append({"prompt": p, "rep": rep, "k": 1, "draft_cost": 0.0, "regime": "one", "throughput": spec[p]})
    return pd.DataFrame(rows)


def test_the_measurement_against_itself_by_hand():
    """Each repetition's measured speedup divides by its own plain runs: 1.3 and 1.2. The relative
    standard error of their mean is sd / (sqrt(2) mean) = (0.1 / sqrt 2) / (sqrt 2 x 1.25) = 0.04;
    a perfect prediction misses 5 % with probability 2 (1 - Phi(1.25)) = 0.2113; half a point
    expected outside at one point needs se = 0.05 / Phi^-1(0.75) = 0.0741, which one repetition
    already gives; the repetitions are 8.3 % apart."""
    by_rep = SP.measured_by_rep(_two_rep_runs())
    assert by_rep.loc[(0.0, 1)].to_dict() == pytest.approx({"rep0": 1.3, "rep1": 1.2})
    n = SP.measurement_noise(by_rep, 0.05)
    assert n["se"] == pytest.approx(0.04) and n["rel_se"] == pytest.approx([0.04])
    assert n["expected_outside"] == pytest.approx(0.21130, abs=1e-4)
    assert n["se_needed"] == pytest.approx(0.05 / 0.67449, rel=1e-4) and n["reps_needed"] == 1
    assert (n["apart"], n["largest_apart"]) == (1, pytest.approx(1.3 / 1.2 - 1))
    # standard errors shrink as 1 / sqrt(R): se 0.16 from two repetitions needs 2 x (0.16 / 0.0741)^2 = 9.3 -> 10
    wide = pd.DataFrame({"rep0": [1.45], "rep1": [1.05]})            # mean 1.25, sd 0.4 / sqrt 2: se 0.16
    assert SP.measurement_noise(wide)["se"] == pytest.approx(0.16)
    assert SP.measurement_noise(wide)["reps_needed"] == 10
    with pytest.raises(ValueError, match="at least 2 repetitions"):
        SP.measurement_noise(by_rep[["rep0"]])
    with pytest.raises(ValueError, match="finite and positive"):
        SP.measurement_noise(by_rep.assign(rep1=np.nan))
    with pytest.raises(ValueError, match=r"no plain run \(k = 0\) for prompts \[1\]"):
        speedup_over_plain(_two_rep_runs()[lambda f: ~((f.prompt == 1) & (f.k == 0))])


def test_predictions_carry_the_repetitions_and_the_goal_row():
    from moespec.studies.goals import round_model_goals

    tv = {0: 10e-3, 1: 14e-3, 2: 16e-3, 3: 18e-3, 4: 20e-3}
    drafts = {0.0: (0.4e-3, 0.1e-3)}
    models = CAL.from_draft_runs(_runs(0.6, tv, drafts, h=0.5e-3, ks=(1, 2, 3, 4)), "synthetic", n_boot=50)
    test = _runs(0.6, tv, drafts, h=0.5e-3)[lambda f: f.dedup]
    one = SP.real_draft_predictions(models, test)
    assert not SP.rep_columns(one) and "measured_rel_se" not in one          # one repetition: nothing to compare
    again = test.assign(rep=1, throughput=test.throughput * 0.9)              # a uniformly slower repetition
    pred = SP.real_draft_predictions(models, pd.concat([test, again], ignore_index=True).assign(regime="one"))
    assert SP.rep_columns(pred) == ["rep0", "rep1"]
    assert np.allclose(pred.rep0, pred.rep1) and np.allclose(pred.measured_rel_se, 0)   # speedups over own plain runs
    assert np.allclose(pred.rep0, pred.measured)
    plain = pd.DataFrame([{"context": "chat", "state": "quiet", "rel_error": 0.0}])
    noisy = pred.assign(state="quiet", rep1=pred.rep0 * 1.2)
    g = round_model_goals(plain, None, noisy).set_index("goal")
    row = g.loc["real-draft measurement resolves 5 % (its repetitions against each other), quiet"]
    n = SP.measurement_noise(noisy[["rep0", "rep1"]])
    assert not row.met and f"about {n['expected_outside']:.1f} of {len(pred)}" in row.value
    assert not row.preregistered and g.loc["plain step V(0) predicted within 3 %, every context, quiet"].preregistered
    assert SP.noise_line(noisy, "quiet").startswith("[quiet] the measurement against itself: its 2 repetitions")
    # two states' rows with 3 and 2 repetitions: the second's rep2 is empty and not one of its repetitions
    third = pred.assign(state="quiet", rep2=pred.rep0 * 1.1)
    both = pd.concat([third, pred.assign(state="loaded")], ignore_index=True)
    assert SP.rep_columns(both) == ["rep0", "rep1", "rep2"]
    assert SP.rep_columns(both[both.state == "loaded"]) == ["rep0", "rep1"]
    assert SP.measurement_noise(both[both.state == "loaded"][SP.rep_columns(both[both.state == "loaded"])])["reps"] == 2
    with pytest.raises(ValueError, match="finite and positive"):          # a partly empty repetition is refused
        SP.measurement_noise(both[["rep0", "rep1", "rep2"]])


def test_interleaved_sweep_mixes_the_parts_and_changes_no_token(subject):
    """A calibration part (one prompt, once, per-slot runs of draft 0) and a test part (another
    prompt, twice, two plain runs) in one shuffled order: each part's rows are what its own sweep
    would run (same cells, same tokens: the order changes no token), the parts alternate in time,
    and each run's speedup divides by its own part's plain runs."""
    drafts = {r: subject.widened_draft(r) for r in (0.0, 0.5)}
    prompts = [np.random.default_rng(i).integers(1, 256, size=16) for i in range(3)]
    parts = [DC.SweepPart("calibration", prompts[:1], reps=1, slot_costs=(0.0,)),
             DC.SweepPart("test", prompts[1:], reps=2, plain_runs=2)]
    mixed = DC.interleaved_sweep(subject.engine, drafts, parts, [1, 2], 6, seed=3, progress=False)
    cal, test = DC.split_parts(mixed, parts)
    assert len(cal) == 1 + 2 * 2 + 2 and (~cal.dedup).sum() == 2
    assert len(test) == 2 * 2 * (2 + 2 * 2) and set(test.prompt) == {0, 1} and set(test.rep) == {0, 1}
    switches = int((mixed.part != mixed.part.shift()).sum()) - 1
    assert switches >= 2                                    # not one part after the other
    assert list(mixed.seq) == list(range(len(mixed)))      # each run's place in the sweep
    for part, rows in ((parts[0], cal), (parts[1], test)):
        alone = DC.draft_cost_sweep(subject.engine, drafts, part.prompts, [1, 2], 6, reps=part.reps, progress=False,
                                    slot_costs=part.slot_costs, plain_runs=part.plain_runs)
        key = ["prompt", "draft_cost", "k", "dedup"]
        tokens = ["emitted", "steps", "accepted", "rejections"]
        a = rows.groupby(key, dropna=False)[tokens].sum().sort_index()
        b = alone.groupby(key, dropna=False)[tokens].sum().sort_index()
        assert a.equals(b)
        assert np.allclose(rows.speedup, speedup_over_plain(rows))
    with pytest.raises(ValueError, match="distinct names"):
        DC.interleaved_sweep(subject.engine, drafts, [parts[0], parts[0]], [1], 4, progress=False)
    with pytest.raises(ValueError, match="at least one prompt"):
        DC.interleaved_sweep(subject.engine, drafts, [DC.SweepPart("empty", [])], [1], 4, progress=False)


def test_a_held_prompt_resumes_as_its_prefill(subject):
    """Engine.hold / resume (the interleaved sweep's switch between prompts): a prompt set aside
    while another runs, then resumed, gives the same logits, value for value, as prefilling it
    again; positions a run left past the prompt are dropped on resume; misuse is refused."""
    eng = subject.engine
    a, b = ([int(t) for t in np.random.default_rng(i).integers(1, 256, size=12)] for i in (5, 6))
    first = eng.prefill(a)
    eng.forward([first, 7, 9])
    fresh = eng.last_logits.clone()
    eng.crop(len(a))
    held = eng.hold(first)
    assert eng.length == 0 and eng.cache is None
    other = eng.prefill(b)
    eng.forward([other, 3])
    assert eng.resume(held) == first and eng.length == len(a)
    eng.forward([first, 7, 9])
    assert torch.equal(eng.last_logits, fresh)
    assert eng.resume(held) == first and eng.length == len(a)   # a run left three positions past it
    assert eng.hold(first).length == len(a)
    with pytest.raises(ValueError, match="no sequence to hold"):
        eng.hold(first)
    with pytest.raises(TypeError, match="what hold\\(\\) returned"):
        eng.resume((a, first))


def test_a_draft_holding_its_prompts_drafts_as_one_that_feeds_them(subject):
    """ModelDraft(held_prompts=...): runs that return to a prompt in a shuffled order start from its
    kept cache and draft exactly what a draft feeding every prompt afresh drafts; at most
    ``held_prompts`` caches are kept (the oldest dropped)."""
    from moespec.engine.speculative import ModelDraft, speculative_generate

    eng = subject.engine
    prompts = [[int(t) for t in np.random.default_rng(i).integers(1, 256, size=10 + i)] for i in range(3)]
    fresh, holding = ModelDraft(subject.draft), ModelDraft(subject.draft, held_prompts=2)
    for pi in [0, 1, 0, 2, 1, 0, 0]:
        a = [s.accepted for s in speculative_generate(eng, fresh, prompts[pi], 3, 10)[1]]
        b = [s.accepted for s in speculative_generate(eng, holding, prompts[pi], 3, 10)[1]]
        assert a == b and holding.cache.get_seq_length() >= len(prompts[pi])
        assert len(holding._held) <= 2
    assert set(holding._held) == {tuple(prompts[2]), tuple(prompts[0])} and not fresh._held   # 0 dropped, fed again
