"""The round model (moespec.predict.round_model): its arithmetic on hand cases, the draft fit with its
intercept, the per-k bands against bound (21), the file round trip, the calibration builders on
synthetic loop rows, the predictions beside their measurements, and the declared machine states."""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd
import pytest

from moespec import predict
from moespec import theory as th
from moespec.measure.load import STATES, machine_state
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.predict.round_model import DraftTime, RoundModel, RoundModelError, RoundModels, Term, fit_draft_time

MS = 1e-3


def model(tau_dedup, host, draft=None, tau_slot=None, w=0.0, state="quiet", context="d=64"):
    tau_dedup = np.asarray(tau_dedup, float) * MS
    tau_slot = tau_dedup * 1.2 if tau_slot is None else np.asarray(tau_slot, float) * MS
    n = len(tau_dedup)
    verify = {p: Term(t, t * (1 - w), t * (1 + w), np.full(n, 4), "hand", "loop")
              for p, t in (("slot", tau_slot), ("dedup", tau_dedup))}
    S = tau_slot - tau_dedup
    return RoundModel("hand", context, state, verify, Term.exact(np.asarray(host, float) * MS, "hand", "loop"),
                      draft or DraftTime.free(n - 1), saving=Term(S, S, S, np.full(n, 4), "hand", "loop"))


# --- arithmetic ---------------------------------------------------------------------------------------
def test_step_time_is_draft_plus_verify_plus_host_by_hand():
    d = DraftTime.from_fit("d", 0.3 * MS, 0.7 * MS, kmax=3, source="hand")
    rm = model([10, 14, 16, 18], [0.2, 0.25, 0.3, 0.35], draft=d)
    # V(0) = 0 + 10 + 0.2; V(k) = (0.3 k + 0.7) + tau(k+1) + h(k): the intercept is paid from k = 1 on
    assert rm.step_times("dedup") / MS == pytest.approx([10.2, 1.0 + 14 + 0.25, 1.3 + 16 + 0.3, 1.6 + 18 + 0.35])
    assert rm.kmax == 3 and rm.n_max == 4
    assert rm.step_times("slot") / MS == pytest.approx([12.2, 1.0 + 16.8 + 0.25, 1.3 + 19.2 + 0.3, 1.6 + 21.6 + 0.35])
    # the switch engine: per-slot below n = 3, deduplicating from it
    assert rm.tau("switch", 3) / MS == pytest.approx([12, 16.8, 16, 18])
    assert rm.tau("switch", None) / MS == pytest.approx(rm.tau("slot") / MS)
    assert rm.crossover() == 2
    assert rm.step_times_for(np.array([1, 2, -3, 4]) * MS)[2] / MS == pytest.approx(1.3 - 3 + 0.3)


def test_draft_fit_keeps_the_intercept_and_its_interval_holds_it_and_is_never_negative():
    rng = np.random.default_rng(0)
    k = np.repeat(np.arange(1, 9), 6)
    share = rng.uniform(0, 1, k.size)                    # each run's catch-up share; its time does not depend on it
    t = (0.284 * k + 0.745) * MS + rng.normal(0, 0.01 * MS, k.size)
    d = fit_draft_time(k, t, "the run's own draft", kmax=8, source="synthetic", n_boot=400, share=share)
    assert d.a_s / MS == pytest.approx(0.284, abs=0.005) and d.b_s / MS == pytest.approx(0.745, abs=0.03)
    assert d.catch_up_s / MS < 0.02 and abs(d.one_token_s / MS) < 0.02
    assert d.term.values_s[0] == 0                       # no draft at k = 0
    assert d.term.values_s[1] == pytest.approx(d.a_s + d.b_s + d.one_token_s + d.catch_up_s * d.catch_up_share[1])
    assert np.all(d.term.lo_s <= d.term.values_s) and np.all(d.term.values_s <= d.term.hi_s)
    k4, s4 = np.arange(1, 5), 0.6 ** np.arange(1, 5)
    exact = fit_draft_time(k4, (k4 + 1) * MS, "x", kmax=4, source="hand", n_boot=10, share=s4)
    assert (exact.a_s / MS, exact.b_s / MS) == pytest.approx((1, 1))
    assert exact.term.values_s / MS == pytest.approx([0, 2, 3, 4, 5])
    # times 1, 3, 5, 7 ms at k = 1..4: least squares says 2 k - 1 ms, a negative intercept; with a, b, e >= 0
    # the optimum is on b = e = 0: the one-draft round's own level c takes k = 1, and a = sum(k t) / sum(k^2)
    # over k = 2..4 = 49/29 ms
    tilted = fit_draft_time(k4, np.array([1, 3, 5, 7]) * MS, "x", kmax=4, source="hand", n_boot=50, share=s4)
    assert (tilted.a_s / MS, tilted.b_s / MS, tilted.catch_up_s) == pytest.approx((49 / 29, 0, 0))
    assert tilted.one_token_s / MS == pytest.approx(1 - 49 / 29)
    assert np.all(tilted.term.lo_s >= 0) and np.all(tilted.term.lo_s <= tilted.term.values_s)
    with pytest.raises(RoundModelError, match="three draft lengths"):
        fit_draft_time([1, 2, 2], [1e-3, 2e-3, 2e-3], "x", kmax=3, source="hand", share=[0.1, 0.2, 0.2])
    with pytest.raises(RoundModelError, match="time >= 0 at every k = 1..3"):
        DraftTime.from_fit("x", 1e-3, -2e-3, kmax=3, source="hand")
    assert DraftTime.from_fit("x", -1e-3, 4e-3, kmax=3, source="hand").term.values_s[3] == pytest.approx(1e-3)


def test_per_k_band_is_bound_21_with_delta_k():
    rm = model([10, 14, 16, 18], [0, 0, 0, 0], w=0.1)     # every verify time within +-10 %
    delta = rm.delta_by_k("dedup")
    assert delta == pytest.approx([1 / 0.9 - 1] * 4)       # max(V/V_lo - 1, 1 - V/V_hi)
    sp = rm.speedups(0.8)
    lo21, hi21 = th.speedup_interval(delta[0])
    G = th.expected_tokens(0.8, np.arange(4))
    assert sp["speedup"] == pytest.approx(G * 10 / np.array([10, 14, 16, 18]))
    # with one delta at every k the per-k interval is bound (21)'s; exactly 1 at k = 0
    assert sp["speedup_lo"][1:] == pytest.approx(sp["speedup"][1:] * lo21)
    assert sp["speedup_hi"][1:] == pytest.approx(sp["speedup"][1:] * hi21)
    assert sp["speedup_lo"][0] == sp["speedup_hi"][0] == 1
    # a hand case with different deltas: [(1 - d_k)/(1 + d_0), (1 + d_k)/(1 - d_0)]
    lo, hi = th.speedup_interval_by_k([0.1, 0.2])
    assert lo == pytest.approx([1, 0.8 / 1.1]) and hi == pytest.approx([1, 1.2 / 0.9])
    # delta >= 1 bounds from one side only: no lower bound at that k, no upper bound when delta_0 >= 1
    lo, hi = th.speedup_interval_by_k([0.1, 1.5])
    assert lo == pytest.approx([1, 0]) and hi == pytest.approx([1, 2.5 / 0.9])
    lo, hi = th.speedup_interval_by_k([1.2, 0.3])
    assert lo == pytest.approx([1, 0.7 / 2.2]) and hi[0] == 1 and hi[1] == np.inf
    for bad in ([0.1, -0.1], [0.1, np.nan], []):
        with pytest.raises(ValueError, match="delta: one finite value >= 0 per k"):
            th.speedup_interval_by_k(bad)


def test_with_verify_replaces_only_the_verify_term():
    d = DraftTime.from_fit("d", 1 * MS, 0, kmax=2, source="hand")
    rm = model([10, 14, 16], [0.5, 0.5, 0.5], draft=d)
    other = rm.with_verify({"slot": np.array([11, 15, 17]) * MS, "dedup": np.array([9, 12, 13]) * MS}, "chain",
                           half_width={"slot": np.full(3, 1 * MS), "dedup": np.full(3, 2 * MS)})
    assert other.step_times("dedup") / MS == pytest.approx([9.5, 1 + 12.5, 2 + 13.5])
    lo, hi = other.step_interval("dedup")
    assert lo / MS == pytest.approx([7.5, 11.5, 13.5]) and hi / MS == pytest.approx([11.5, 15.5, 17.5])
    assert other.host is rm.host and other.draft is rm.draft
    assert other.saving.values_s / MS == pytest.approx([2, 3, 4])


def test_file_round_trip_and_refusals(tmp_path):
    rm = model([10, 14, 16], [0.5, 0.5, 0.6], w=0.05)
    models = RoundModels([rm, model([11, 15, 17], [0.5] * 3, state="loaded")], {"calibration quiet": "2026-12-03T10:00"})
    path = models.save(tmp_path / "05_round_model.json")
    back = RoundModels.load(path)
    assert back.order == models.order and back.states == ["quiet", "loaded"]
    got = back.get("quiet", "d=64", "free draft")
    assert got.step_times("dedup") == pytest.approx(rm.step_times("dedup"))
    assert got.step_interval("slot")[1] == pytest.approx(rm.step_interval("slot")[1])
    with pytest.raises(RoundModelError, match="match 0"):
        back.get("busy")
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(RoundModelError, match="not a round-model file"):
        RoundModels.load(tmp_path / "bad.json")
    with pytest.raises(RoundModelError, match="does not exist"):
        RoundModels.load(tmp_path / "none.json")
    d = json.loads(path.read_text())
    d["models"][0]["verify"]["dedup"]["lo_ms"][1] = 99.0
    (tmp_path / "broken.json").write_text(json.dumps(d))
    with pytest.raises(RoundModelError, match="does not hold its value"):
        RoundModels.load(tmp_path / "broken.json")
    with pytest.raises(RoundModelError, match=r"verify.slot.values_ms\[0\]: expected a time > 0 ms; found 0 ms"):
        model([0, 14, 16], [0.5] * 3)


# --- calibration and predictions ----------------------------------------------------------------------
def loop_rows(tau_slot, tau_dedup, host, prompts=3, reps=2, d=64, jitter=0.0, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(prompts):
        for rep in range(reps):
            for n in range(1, len(tau_dedup) + 1):
                for dd in (False, True):
                    t = (tau_dedup if dd else tau_slot)[n - 1] * MS * (1 + jitter * rng.standard_normal())
                    rows.append({"prompt": p, "rep": rep, "d": d, "n": n, "k": n - 1, "dedup": dd,
                                 "t_verify_mean_s": t, "t_draft_mean_s": 0.01 * MS * (n - 1),
                                 "t_host_mean_s": host[n - 1] * MS, "ref_GBps": 15.0, "emitted": 48})
    return pd.DataFrame(rows)


def test_verify_loops_build_the_depth_model_by_hand():
    rows = loop_rows([10, 16, 20], [10, 14, 16], [0.2, 0.3, 0.3])
    rm = CAL.from_verify_loops(rows, "hand", n_boot=50)[64]
    assert rm.context == "d=64" and rm.draft.name == CAL.ORACLE_DRAFT and rm.regime == "one"
    assert rm.tau("dedup") / MS == pytest.approx([10, 14, 16]) and rm.tau("slot") / MS == pytest.approx([10, 16, 20])
    assert rm.saving.values_s / MS == pytest.approx([0, 2, 4])     # paired within (prompt, rep)
    assert rm.step_times("dedup") / MS == pytest.approx([10.2, 0.01 + 14.3, 0.02 + 16.3])
    assert rm.depth == pytest.approx(64 + 24) and rm.read_GBps == 15.0
    assert list(rm.verify["dedup"].runs) == [6, 6, 6]


def test_depth_model_on_every_loop_of_both_regimes():
    """Two read regimes: prompts 0 and 1 at 30 GB/s, prompt 2 at 15 GB/s with every pass 1.5 times
    as long. The loops run interleaved with the runs they predict, which meet both regimes alike:
    the depth's model is the mean over every loop, and says that it spans both."""
    rows = loop_rows([10, 16, 20], [10, 14, 16], [0.2, 0.3, 0.3], jitter=0.0)
    low = rows.prompt == 2
    rows.loc[:, "ref_GBps"] = np.where(low, 15.0, 30.0)
    rows.loc[low, "t_verify_mean_s"] *= 1.5
    every = CAL.from_verify_loops(rows, "hand", n_boot=50)[64]
    assert every.regime == "all rows" and every.notes["runs"] == len(rows)
    assert every.tau("dedup") / MS == pytest.approx(np.array([10, 14, 16]) * (2 + 1.5) / 3)
    assert every.read_GBps == pytest.approx(30.0)                 # the median same-round read


def test_saving_falls_back_to_the_kernels_means_where_no_run_is_paired():
    rows = loop_rows([10, 16, 20], [10, 14, 16], [0.2, 0.3, 0.3])
    # at n = 2 keep the per-slot runs of repetition 0 and the deduplicating runs of repetition 1 only
    drop = (rows.n == 2) & (((~rows.dedup) & (rows.rep == 1)) | (rows.dedup & (rows.rep == 0)))
    rm = CAL.from_verify_loops(rows[~drop], "hand", n_boot=50)[64]
    assert rm.saving.values_s / MS == pytest.approx([0, 2, 4]) and "unpaired at n = [2]" in rm.saving.source
    assert rm.saving.lo_s[1] <= rm.saving.values_s[1] <= rm.saving.hi_s[1]


def test_oracle_predictions_on_runs_that_follow_the_model():
    rm = model([10, 14, 16], [0.5, 0.5, 0.5])
    V = rm.step_times("dedup")
    rows = []
    for k in range(3):
        for a in (0.5, 0.9):
            G = th.expected_tokens(a, k)
            rows.append({"d": 64, "k": k, "a": a, "throughput": G / V[k], "t_step_mean_s": V[k]})
    pred = SP.oracle_predictions({64: rm}, pd.DataFrame(rows))
    assert np.allclose(pred.speedup_rel_error, 0) and np.allclose(pred.V_rel_error, 0)
    assert np.allclose(pred.throughput_rel_error, 0) and pred.speedup_inside.all()
    plain = SP.plain_step(rm, pd.DataFrame(rows), "oracle runs d=64")
    assert plain["rel_error"] == pytest.approx(0) and plain["V0_hat_ms"] == pytest.approx(10.5)
    with pytest.raises(ValueError, match="no round model for depth d = 198"):
        SP.oracle_predictions({64: rm}, pd.DataFrame(rows).assign(d=198))


def test_goals_decide_each_tolerance():
    from moespec.studies.goals import round_model_goals

    plain = pd.DataFrame([{"context": "d=64", "state": "quiet", "rel_error": 0.029},
                          {"context": "chat", "state": "quiet", "rel_error": -0.031}])
    oracle = pd.DataFrame({"k": [1, 2], "state": "quiet", "speedup_rel_error": [0.01, -0.049], "speedup_inside": True})
    real = pd.DataFrame({"k": [1, 2], "state": "quiet", "rel_error": [0.051, 0.0], "inside": [True, False]})
    g = round_model_goals(plain, oracle, real).set_index("goal")
    assert list(g.met) == [False, True, True, False, False] and g.preregistered.all()


# --- machine states -------------------------------------------------------------------------------------
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="the loaded state needs two CPUs")
def test_machine_states_start_and_stop_the_load():
    import psutil

    before = set(os.sched_getaffinity(0))
    with machine_state("loaded") as st:
        assert os.sched_getaffinity(0) == {st.cpu} and st.load_cpu != st.cpu
        proc = psutil.Process(st.load_pid)
        assert proc.is_running() and proc.cpu_affinity() == [st.load_cpu]
    assert not psutil.pid_exists(st.load_pid) or psutil.Process(st.load_pid).status() == psutil.STATUS_ZOMBIE
    assert set(os.sched_getaffinity(0)) == before
    assert st.describe()["state"] == "loaded" and "memory-bandwidth" in STATES["loaded"]
    with machine_state("quiet") as q:
        assert q.load_pid is None
    with pytest.raises(ValueError, match="machine state must be one of"):
        machine_state("busy")
    # an error inside the block still stops the load and restores the CPUs
    with pytest.raises(RuntimeError, match="inside"):
        with machine_state("loaded") as st2:
            raise RuntimeError("inside")
    assert not psutil.pid_exists(st2.load_pid) or psutil.Process(st2.load_pid).status() == psutil.STATUS_ZOMBIE
    assert set(os.sched_getaffinity(0)) == before


# --- paper 2's oracle on the round model --------------------------------------------------------------
def test_round_cost_model_levels_by_hand():
    from moespec.oracle.cost import RoundCostModel, cost_ar, cost_matrix

    m = RoundCostModel((10, 14, 16), (0.2, 0.3, 0.3), (8, 13, 17), 80.0, alpha=0.5, c=0.01, draft_a=0.3, draft_b=0.7)
    assert m.t_target(8, 80, 1) == pytest.approx(10.2)                 # tau(1) + h(0) at its own union and depth
    assert m.t_target(13, 90, 2) == pytest.approx(14.3 + 0.01 * 10)     # context moves it by c per token
    assert m.t_target(20, 80, 5) == pytest.approx(16.3 + 0.5 * 3)       # past M = 3: level at M, the union carries it
    assert m.without_experts().t_target(8, 80, 1) == pytest.approx(10.2 - 0.5 * 8)
    assert m.t_draft(np.array([0, 1, 3])) == pytest.approx([0, 1.0, 1.6])   # the intercept from k = 1 on
    assert m.with_draft_scale(0.5).t_draft(2) == pytest.approx(0.65)
    # the oracle's plain baseline is the round model's plain step, whatever the union's coefficient
    assert cost_ar(np.array([80, 80, 80]), 8, m) == pytest.approx(3 * 10.2)
    U = np.full((1, 2, 3), np.nan)
    U[0, 0, :2], U[0, 1, :3] = 11, 15
    cost = cost_matrix(U, np.array([80]), m)
    assert cost[0, 0, 0] == pytest.approx(1.0 + 14.3 + 0.5 * (11 - 13))
    assert cost[0, 1, 2] == pytest.approx(1.3 + 16.3 + 0.5 * (15 - 17))
