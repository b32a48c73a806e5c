"""The draft's time per round in the catch-up form: a round whose draft begins by feeding two tokens
(after a round that accepted every draft) counted by the engine, the fit
t_draft(k) = a k + b + c [k = 1] + e s(k), and each test prompt's draft at its own share."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec.engine import ModelDraft, speculative_generate, summarize_steps
from moespec.engine.speculative import Step
from moespec.oracle.cost import RoundCostModel
from moespec.predict import calibration as CAL
from moespec.predict import speculative as SP
from moespec.predict.round_model import DraftTime, RoundModel, RoundModelError, fit_draft_time
from moespec.runstats import catch_up_share

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: one torch thread on the shared cores
MS = 1e-3


def _step(k: int, accepted: int) -> Step:
    return Step(k, accepted, accepted < k, False, 1.0, 0.5, 0.1)


def test_catch_up_rounds_counted_by_hand():
    """k = 2, rounds accepting 2, 0, 2, 2, 1: the rounds after a fully accepted one are the 2nd, 4th
    and 5th, so 3 catch-up rounds of 5 (the last round's full acceptance is followed by none)."""
    steps = [_step(2, j) for j in (2, 0, 2, 2, 1)]
    assert summarize_steps(steps)["catch_up"] == 3
    assert summarize_steps([_step(2, j) for j in (2, 0, 2, 2, 2)])["catch_up"] == 3
    assert summarize_steps([_step(0, 0)] * 4)["catch_up"] == 0           # nothing drafted at k = 0
    rows = pd.DataFrame({"k": [2, 2, 0], "steps": [5, 10, 4], "catch_up": [3, 6, np.nan]})
    assert catch_up_share(rows).tolist() == pytest.approx([3 / 5, 6 / 10, 0.0])
    with pytest.raises(ValueError, match="no steps"):
        catch_up_share(rows.assign(steps=0))
    with pytest.raises(ValueError, match=r"lack column\(s\) \['catch_up'\]"):
        catch_up_share(rows.drop(columns="catch_up"))
    with pytest.raises(ValueError, match="catch_up missing in 1 of 2 drafted runs"):
        catch_up_share(rows.assign(catch_up=[3, np.nan, 0]))


def test_the_draft_feeds_two_tokens_exactly_in_the_counted_rounds():
    """Independent of the count: the draft's own feeds in a real run (a tiny MoE target; its twin
    with perturbed weights as the draft, accepted in part), tapped; the first feed of a round is
    two tokens long in exactly the ``catch_up`` rounds."""
    import torch

    from moespec.engine import Engine
    from moespec.zoo import tiny_moe

    shape = dict(vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)
    engine = Engine(tiny_moe(seed=1, **shape), backend="torch")
    twin = tiny_moe(seed=1, **shape)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for w in twin.parameters():
            w.add_(0.2 * torch.randn(w.shape, generator=g) * w.std())
    draft = ModelDraft(twin)
    feeds = []
    inner = draft._feed
    draft._feed = lambda ids: (feeds.append(len(ids)), inner(ids))[1]
    prompt = np.random.default_rng(0).integers(1, 256, size=24)
    for k in (1, 3):
        feeds.clear()
        _, steps = speculative_generate(engine, draft, prompt, k, 24)
        firsts = feeds[1::k]                        # feeds[0] is the prompt; then k feeds per round
        assert len(firsts) == len(steps) and set(firsts) <= {1, 2}
        counted = summarize_steps(steps)["catch_up"]
        assert sum(n == 2 for n in firsts) == counted and 0 < counted < len(steps) - 1


def _catch_up_runs(a=0.4e-3, b=0.1e-3, c=-0.2e-3, e=1.5e-3, kmax=4, prompts=4):
    """Runs whose draft time is a k + b + c [k = 1] + e s exactly, the share s differing by prompt."""
    k = np.repeat(np.arange(1, kmax + 1), prompts)
    s = np.tile(np.linspace(0.2, 0.5, prompts), kmax) * 0.9 ** k
    return k, s, a * k + b + c * (k == 1) + e * s


def test_catch_up_fit_recovers_its_coefficients_and_evaluates_at_the_mean_share():
    k, s, t = _catch_up_runs()
    d = fit_draft_time(k, t, "d", kmax=4, source="hand", n_boot=50, share=s)
    assert (d.a_s, d.b_s, d.one_token_s, d.catch_up_s) == pytest.approx((0.4e-3, 0.1e-3, -0.2e-3, 1.5e-3))
    mean = [0] + [s[k == j].mean() for j in (1, 2, 3, 4)]
    assert d.catch_up_share.tolist() == pytest.approx(mean)
    want = [0] + [0.4e-3 * j + 0.1e-3 - 0.2e-3 * (j == 1) + 1.5e-3 * mean[j] for j in (1, 2, 3, 4)]
    assert d.term.values_s == pytest.approx(want) and d.form == "catch-up"
    assert np.all(d.term.lo_s <= d.term.values_s) and np.all(d.term.hi_s >= d.term.values_s)
    assert d.shift_s(2, mean[2] + 0.1) == pytest.approx(1.5e-4) and d.shift_s(0, 0.9) == 0.0
    # a draft given as a line a k + b (no share) is the fit's degenerate case: no shift at any share
    line = DraftTime.from_fit("d", 0.4e-3, 0.1e-3, kmax=4, source="given")
    assert line.form == "line" and line.shift_s(2, 0.9) == 0.0
    assert line.term.values_s == pytest.approx([0, 0.5e-3, 0.9e-3, 1.3e-3, 1.7e-3])
    again = DraftTime.from_dict(d.to_dict())
    assert again.to_dict() == d.to_dict() and again.shift_s(3, 0.3) == pytest.approx(d.shift_s(3, 0.3))
    assert DraftTime.from_dict({k_: v for k_, v in line.to_dict().items()
                                if k_ not in ("form", "one_token_ms", "catch_up_ms", "catch_up_share")}).form == "line"
    assert "- 0.2 [k = 1] + 1.5 s(k) ms" in d.formula() and line.formula().endswith(" ms")
    # e >= 0: a share that seems to make the draft faster is held at 0
    neg = fit_draft_time(k, 0.4e-3 * k + 0.1e-3 - 1e-3 * s, "d", kmax=4, source="hand", n_boot=20, share=s)
    assert neg.catch_up_s == 0.0


def test_catch_up_refusals():
    k, s, t = _catch_up_runs()
    with pytest.raises(RoundModelError, match="catch-up shares for"):
        fit_draft_time(k, t, "d", kmax=4, source="hand", share=s[:-1])
    with pytest.raises(RoundModelError, match="three draft lengths"):
        fit_draft_time(k[k <= 2], t[k <= 2], "d", kmax=2, source="hand", share=s[k <= 2])
    with pytest.raises(RoundModelError, match="non-finite"):
        fit_draft_time(k, t, "d", kmax=4, source="hand", share=np.where(k == 2, np.nan, s))
    d = fit_draft_time(k, t, "d", kmax=4, source="hand", n_boot=10, share=s)
    with pytest.raises(RoundModelError, match=r"lies in \[0, 1\]"):
        d.shift_s(2, 1.5)
    with pytest.raises(RoundModelError, match="catch-up share per k"):
        DraftTime(d.name, d.term, d.a_s, d.b_s, d.one_token_s, d.catch_up_s, np.array([0, 0.5]))
    with pytest.raises(RoundModelError, match=r"one_token_ms and catch_up_ms: expected finite values, catch_up_ms >= 0; found .* and -1 ms"):
        DraftTime(d.name, d.term, d.a_s, d.b_s, d.one_token_s, -1e-3, d.catch_up_share)


def _sweep(share_of: dict, e: float = 2e-3, prompts: int = 3, tps: float = 2.0) -> pd.DataFrame:
    """Rows of one draft cost (0.2) whose draft takes 1 ms k + 0.2 ms + e s_p(k), s_p(k) =
    share_of[(prompt, k)] (encoded in the catch-up count of 100 rounds); verify 10 + 2 k ms over a
    routing that never varies, host 0.5 ms."""
    rows = []
    for p in range(prompts):
        rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": np.nan, "k": 0, "dedup": True,
                     "accepted": 0, "rejections": 0, "steps": 100, "emitted": 100, "catch_up": 0,
                     "t_verify_mean_s": 10e-3, "t_draft_mean_s": 0.0, "t_host_mean_s": 0.5e-3,
                     "t_step_mean_s": 10.5e-3, "throughput": 1 / 10.5e-3, "speedup": 1.0, "ref_GBps": 10.0,
                     "distinct_experts": 32.0})
        for k in (1, 2, 3):
            s = round(100 * share_of[(p, k)]) / 100        # a whole number of the 100 rounds
            td = 1e-3 * k + 0.2e-3 + e * s
            V = td + 10e-3 + 2e-3 * k + 0.5e-3
            for dedup in (True, False):
                rows.append({"prompt": p, "rep": 0, "prompt_tokens": 40, "draft_cost": 0.2, "k": k, "dedup": dedup,
                             "accepted": 100, "rejections": 100 - round(100 * s), "steps": 100,
                             "emitted": 100 * tps, "catch_up": round(100 * s), "t_verify_mean_s": 10e-3 + 2e-3 * k,
                             "t_draft_mean_s": td, "t_host_mean_s": 0.5e-3, "t_step_mean_s": V,
                             "throughput": tps / V, "speedup": tps / V * 10.5e-3, "ref_GBps": 10.0,
                             "distinct_experts": 40.0 + 8 * k})
    return pd.DataFrame(rows)


def test_each_test_prompt_is_predicted_at_its_own_catch_up_share():
    """Calibration shares 0.3/0.4/0.5 times 0.8^k; test prompts at 0.6, 0.7, 0.8 times 0.8^k (more
    accepted rounds). The catch-up form predicts each prompt's round exactly; the line, fitted
    at the calibration's mean shares (the diagnostics' ``predicted_unrouted``), under-predicts the
    test's draft and misses."""
    cal = _sweep({(p, k): (0.3 + 0.1 * p) * 0.8 ** k for p in range(3) for k in (1, 2, 3)})
    test = _sweep({(p, k): (0.6 + 0.1 * p) * 0.8 ** k for p in range(3) for k in (1, 2, 3)})[lambda f: f.dedup]
    models = CAL.from_draft_runs(cal, "synthetic", n_boot=30)
    rm: RoundModel = models[0.2]
    assert rm.draft.catch_up_s == pytest.approx(2e-3) and rm.draft.a_s == pytest.approx(1e-3)
    pred = SP.real_draft_predictions(models, test).merge(SP.real_draft_diagnostics(models, test), on=["draft_cost", "k"])
    assert np.allclose(pred.rel_error, 0, atol=1e-9)
    assert (pred.rel_error_unrouted > 0.005).all()              # the test's drafts take longer than the calibration's
    row = pred[pred.k == 2].iloc[0]
    s_test = 0.7 * 0.64
    V2 = 2e-3 + 0.2e-3 + 2e-3 * round(100 * s_test) / 100 + 14e-3 + 0.5e-3
    assert row.predicted == pytest.approx(2.0 * 10.5e-3 / V2)
    assert row.catch_up_test == pytest.approx(round(100 * s_test) / 100) and row.ms_per_catch_up == pytest.approx(2.0)
    assert row.catch_up_calibration == pytest.approx(np.mean([round(100 * (0.3 + 0.1 * p) * 0.64) / 100
                                                              for p in range(3)]))
    again = RoundModel.from_dict(rm.to_dict())
    assert again.step_times_routed(2, 56.0, 0.5) == pytest.approx(rm.step_times_routed(2, 56.0, 0.5))


def test_the_oracle_reads_the_draft_term_and_extends_it_per_token():
    k, s, t = _catch_up_runs()
    d = fit_draft_time(k, t, "d", kmax=4, source="hand", n_boot=10, share=s)
    levels = tuple(1e3 * d.term.values_s)
    m = RoundCostModel((10, 14), (0.2, 0.3), (8, 13), 80.0, alpha=0.5, c=0.01, draft_a=1e3 * d.a_s,
                       draft_b=1e3 * d.b_s, draft_levels_ms=levels)
    assert m.t_draft(np.arange(5)) == pytest.approx(levels)
    assert m.t_draft(6) == pytest.approx(levels[4] + 2 * 0.4)                 # past kmax: a per drafted token
    assert m.with_draft_scale(0.5).t_draft(1) == pytest.approx(0.5 * levels[1])
    with pytest.raises(ValueError, match="non-finite"):
        RoundCostModel((10,), (0.2,), (8,), 80.0, 0.5, 0.01, 0.4, 0.1, draft_levels_ms=(0.0, np.nan))
