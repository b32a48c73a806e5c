"""The real draft's routing term (amendment of 2026-12-05 night): each verify pass's distinct
(expert, layer) pairs recorded by the engine, the round model's dependence of the deduplicating
verify pass on them, and the prediction with every prompt's pass at its own routing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec.engine import draftcost as DC
from moespec.engine.subject import load_subject
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.predict.round_model import RoundModel, RoundModelError, RoutingTerm
from moespec.theory import expected_tokens

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores


def test_routing_fit_by_hand():
    """Runs at k = 0, 1, 2 whose verify time is exactly alpha_k + 0.4 ms per distinct pair: the
    within-k slope is 0.4 ms, the distinct means per k are the hand averages, and the term's value
    at a run's own count is that run's time."""
    k = np.array([0, 0, 1, 1, 1, 2, 2])
    u = np.array([32, 32, 50, 56, 62, 70, 80], float)
    alpha = {0: 10e-3, 1: 5e-3, 2: 4e-3}
    t = np.array([alpha[j] + 0.4e-3 * x for j, x in zip(k, u)])
    term = RoutingTerm.fit(k, u, t, "hand")
    assert term.s_per_expert == pytest.approx(0.4e-3)
    assert term.distinct.tolist() == [32.0, 56.0, 75.0] and term.runs == 7
    for j, x, tj in zip(k, u, t):
        mean_k = t[k == j].mean()                       # the pooled term: the mean over runs at k
        assert mean_k + term.shift_s(int(j), x) == pytest.approx(tj)
    assert term.shift_s(2, 75.0) == 0.0
    assert RoutingTerm.from_dict(term.to_dict()).to_dict() == term.to_dict()
    # a slope a pass cannot have is clipped: below 0 (k = 1: 10 more pairs, 10 ms faster: -1 ms per
    # pair) to 0; above the smallest mean time per mean pair (min(10/32, 20/55) ms) to that ceiling,
    # where the routed pass stays positive even at no pair at all
    down = RoutingTerm.fit([0, 0, 1, 1], [32, 32, 50, 60], np.array([10, 10, 30, 20]) * 1e-3, "noisy")
    assert down.s_per_expert == 0.0 and "gave -1 ms per pair" in down.source
    up = RoutingTerm.fit([0, 0, 1, 1], [32, 32, 50, 60], np.array([10, 10, 10, 30]) * 1e-3, "noisy")
    assert up.s_per_expert == pytest.approx(10e-3 / 32) and "gave 2 ms per pair" in up.source
    assert 20e-3 + up.shift_s(1, 0.0) > 0
    flat = RoutingTerm.fit([0, 1, 1], [32, 50, 50], [10e-3, 20e-3, 22e-3], "one prompt")
    assert flat.s_per_expert == 0.0 and "no slope" in flat.source
    with pytest.raises(RoundModelError, match="no run at k"):
        RoutingTerm.fit([0, 2], [32, 50], [1e-3, 2e-3], "gap")
    with pytest.raises(RoundModelError, match="finite"):
        RoutingTerm.fit([0, 1], [32, np.nan], [1e-3, 2e-3], "nan")
    with pytest.raises(RoundModelError, match="one value per run"):
        RoutingTerm.fit([0, 1], [32], [1e-3, 2e-3], "shape")
    with pytest.raises(RoundModelError, match="covers k"):
        term.shift_s(3, 60)


def _runs(u_of: dict, prompts: int = 3, ks=(1, 2, 3), a: float = 0.6, slope: float = 0.4e-3,
          base: float = 4e-3, per_token: float = 3e-3, h: float = 0.5e-3, tps_of: dict | None = None) -> pd.DataFrame:
    """Synthetic sweep rows of one draft cost (0.0) whose deduplicating verify pass takes
    base + per_token k + slope u exactly, u = u_of[(prompt, k)] distinct pairs per pass (32 at
    k = 0); per-slot runs at 1.2 times the pass; draft time 0.1 ms per token; tokens per step
    G_a(k), or tps_of[(prompt, k)]; a share a^k of the rounds begins its draft with two tokens."""
    rows = []
    for p in range(prompts):
        t0 = base + slope * 32
        rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": np.nan, "k": 0, "dedup": True,
                     "accepted": 0, "rejections": 0, "steps": 100, "emitted": 100, "catch_up": 0, "t_verify_mean_s": t0,
                     "t_draft_mean_s": 0.0, "t_host_mean_s": h, "t_step_mean_s": t0 + h, "throughput": 1 / (t0 + h),
                     "speedup": 1.0, "ref_GBps": 10.0, "distinct_experts": 32.0})
        for k in ks:
            for dedup in (True, False):
                u = u_of[(p, k)]
                tv = (base + per_token * k + slope * u) * (1 if dedup else 1.2)
                E = tps_of[(p, k)] if tps_of else expected_tokens(a, k)
                V = 0.1e-3 * k + tv + h
                rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": 0.0, "k": k, "dedup": dedup,
                             "accepted": 600, "rejections": 400, "steps": 1000, "emitted": 1000 * E,
                             "catch_up": round(1000 * a ** k),
                             "t_verify_mean_s": tv, "t_draft_mean_s": 0.1e-3 * k, "t_host_mean_s": h,
                             "t_step_mean_s": V, "throughput": E / V, "speedup": E / V * (t0 + h), "ref_GBps": 10.0,
                             "distinct_experts": float(u)})
    return pd.DataFrame(rows)


def test_calibration_fits_the_routing_term_and_predicts_each_prompt_at_its_routing():
    """Calibration prompts touch 50/56/62 pairs per pass at every k; the test prompts 40, 60 and
    90, with tokens per step 2.0, 2.1, 2.2 at every k. Each test prompt's speedup is then
    E_p V(0) / (V(k) + slope (u_p - 56)) exactly, and the median of those three is the measured
    median; the unrouted prediction (every pass at the calibration's mean routing) misses it."""
    cal = _runs({(p, k): 50 + 6 * p for p in range(3) for k in (1, 2, 3)})
    models = CAL.from_draft_runs(cal, "synthetic", n_boot=50)
    rm: RoundModel = models[0.0]
    assert rm.routing.s_per_expert == pytest.approx(0.4e-3)
    assert rm.routing.distinct.tolist() == pytest.approx([32.0, 56.0, 56.0, 56.0])
    u_test = {0: 40, 1: 80, 2: 90}
    tps = {0: 2.0, 1: 2.1, 2: 2.2}
    test = _runs({(p, k): u_test[p] for p in range(3) for k in (1, 2, 3)},
                 tps_of={(p, k): tps[p] for p in range(3) for k in (1, 2, 3)})[lambda f: f.dedup]
    pred = SP.real_draft_predictions(models, test).merge(SP.real_draft_diagnostics(models, test), on=["draft_cost", "k"])
    assert np.allclose(pred.rel_error, 0, atol=1e-9)
    row = pred[pred.k == 2].iloc[0]
    V0 = 4e-3 + 0.4e-3 * 32 + 0.5e-3
    by_hand = sorted(tps[p] * V0 / (0.2e-3 + 4e-3 + 6e-3 + 0.4e-3 * u_test[p] + 0.5e-3) for p in range(3))[1]
    assert row.predicted == pytest.approx(by_hand) and row.measured == pytest.approx(by_hand)
    assert row.distinct_test == 80 and row.distinct_calibration == pytest.approx(56.0)
    assert row.ms_per_distinct_expert == pytest.approx(0.4)
    assert (pred.rel_error_unrouted.abs() > 0.01).all()
    assert row.predicted_lo <= row.predicted <= row.predicted_hi
    assert "within 5 % at 3 of 3" in SP.routing_line(pred, "quiet")
    # the file round trip keeps the term; a model without one cannot be asked at a routing
    again = RoundModel.from_dict(rm.to_dict())
    assert again.routing.to_dict() == rm.routing.to_dict()
    assert again.step_times_routed(2, 60.0) == pytest.approx(rm.step_times_routed(2, 60.0))
    V0_, V2 = rm.step_times_routed(2, 60.0)
    assert V0_ == pytest.approx(rm.step_times("dedup")[0]) and V2 - rm.step_times("dedup")[2] == pytest.approx(1.6e-3)
    bare = RoundModel.from_dict({**rm.to_dict(), "routing": None})
    with pytest.raises(RoundModelError, match="no routing term"):
        bare.step_times_routed(2, 60.0)


def test_routing_refusals():
    cal = _runs({(p, k): 50 + 6 * p for p in range(3) for k in (1, 2, 3)})
    models = CAL.from_draft_runs(cal, "synthetic", n_boot=20)
    test = cal[cal.dedup].copy()
    test.loc[test.index[2], "distinct_experts"] = np.nan
    with pytest.raises(ValueError, match="distinct_experts missing"):
        SP.real_draft_predictions(models, test)
    with pytest.raises(ValueError, match="distinct_experts"):
        SP.real_draft_predictions(models, test.drop(columns="distinct_experts"))
    partly = cal.copy()
    partly.loc[partly.index[3], "distinct_experts"] = np.nan
    with pytest.raises(ValueError, match="distinct_experts missing in 1"):
        CAL.from_draft_runs(partly, "synthetic", n_boot=20)
    assert CAL.from_draft_runs(cal.drop(columns="distinct_experts"), "synthetic", n_boot=20)[0.0].routing is None


@pytest.fixture(scope="module")
def subject():
    return load_subject("byte-faithful", profile="quick", backend="torch")


def test_engine_counts_each_passes_distinct_experts(subject):
    """A one-token pass touches m experts in each of the L layers; a pass of several tokens the
    union of their choices, the same count as the routing the engine records for those tokens
    teacher-forced (an independent path: :meth:`Engine.record_routing`)."""
    eng = subject.engine
    m = int(eng.model.config.num_experts_per_tok)
    prompt = np.random.default_rng(5).integers(1, 256, size=12).tolist()
    first = eng.prefill(prompt)
    with eng.routing_tap() as counts:
        eng.forward([first])
        eng.crop(len(prompt))
        eng.forward([first, 7, 9, 11])
    assert counts[0] == m * eng.num_layers
    eng.crop(len(prompt))
    ids = eng.record_routing([first, 7, 9, 11])             # [tokens, L, m]
    assert counts[1] == sum(len(np.unique(ids[:, layer])) for layer in range(ids.shape[1]))
    assert eng.switch.record is None and not eng.pass_listeners
    with pytest.raises(ValueError, match="already open"):
        with eng.routing_tap():
            with eng.routing_tap():
                pass
    assert eng.switch.record is None


def test_sweep_rows_carry_the_passes_routing(subject):
    """Every run of a sweep records its mean distinct pairs per verify pass: m L for plain decoding,
    between m L and min(E, (k + 1) m) L for draft length k; the same at every draft cost (widening
    a draft changes no token)."""
    drafts = {r: subject.widened_draft(r) for r in (0.0, 0.5)}
    prompts = [np.random.default_rng(i).integers(1, 256, size=16) for i in range(2)]
    runs = DC.draft_cost_sweep(subject.engine, drafts, prompts, [1, 3], 8, progress=False)
    eng = subject.engine
    m, L, E = int(eng.model.config.num_experts_per_tok), eng.num_layers, int(eng.model.config.num_experts)
    assert (runs.loc[runs.k == 0, "distinct_experts"] == m * L).all()
    spec = runs[runs.k > 0]
    assert (spec.distinct_experts >= m * L).all()
    assert (spec.distinct_experts <= np.minimum(E, (spec.k + 1) * m) * L).all()
    assert (spec.loc[spec.k == 3, "distinct_experts"].mean() > spec.loc[spec.k == 1, "distinct_experts"].mean())
    u = spec.pivot_table(index=["prompt", "k"], columns="draft_cost", values="distinct_experts")
    assert np.allclose(u[0.0], u[0.5])
