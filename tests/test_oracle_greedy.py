"""The greedy-exact transition model beside paper 2's surrogate: hand values, an independent
deterministic DP, the bound over fixed k, the inputs' greedy indicator against the engine's measured
rounds, the measured fixed-K speedups, and the like-for-like comparison with paper 2."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from fakes import synthetic_rounds
from moespec import zoo
from moespec.oracle import analysis as A
from moespec.oracle.bellman import bellman, evaluate_policy, fixed_policy
from moespec.oracle.cost import CostModel, cost_matrix
from moespec.oracle.delta import boundary_slope
from moespec.oracle.junk import OracleInputs, junk_tails, load_inputs, save_inputs, synthetic_inputs
from moespec.oracle.rounds import fixed_k_speedups, rounds_frame

MODEL = CostModel(draft_a=0.46, draft_b=0.07, beta0=6.0, alpha=0.25, c=1.1e-3)


def hand_inputs() -> OracleInputs:
    """N = 4, Lmax = 2, greedy g = [1, 1, 0, 1], every union U = 1, top_k = 1."""
    n, lmax = 4, 2
    U = np.full((n, lmax, lmax + 1), np.nan)
    U[:, 0, :2] = 1.0
    U[:, 1, :3] = 1.0
    return OracleInputs("hand", "test", np.full(n, 0.5), np.array([1.0, 1.0, 0.0, 1.0]), np.full((n, lmax), 0.5), U,
                        np.zeros(n), top_k=1, num_experts=4)


def test_greedy_oracle_by_hand():
    """Cost(i, k, a) = t_draft(k) + t_target(U = 1) = k + 2 (draft k ms, pass 1 + U ms); a plain pass
    costs 1 + top_k = 2 ms, so Cost_AR = 8 ms. Runs of accepted tokens from each state: 2, 1, 0, 1
    (nothing to match past the end). Backwards: dp[3] = 3 (k = 1 accepts 1 and ends),
    dp[2] = 3 + dp[3] = 6 (nothing accepted), dp[1] = 3 + dp[3] = 6 (k = 1: a = 1, to state 3),
    dp[0] = min(3 + dp[2], 4 + dp[3]) = min(9, 7) = 7 with k = 2 (both accepted, to state 3)."""
    model = CostModel(draft_a=1.0, draft_b=0.0, beta0=1.0, alpha=1.0, c=0.0)
    greedy = A.solve(hand_inputs().with_transitions("greedy"), model)
    np.testing.assert_allclose(greedy.dp, [7.0, 6.0, 6.0, 3.0, 0.0])
    np.testing.assert_array_equal(greedy.policy, [2, 1, 1, 1])
    # the optimal path: k = 2 at state 0 (a = 2), k = 1 at state 3 (a = 1): 2 rounds, 3 drafted, 3 accepted
    assert (greedy.value.cost, greedy.value.rounds, greedy.value.drafted, greedy.value.accepted) == (7.0, 2.0, 3.0, 3.0)
    assert greedy.cost_ar == 8.0 and greedy.cost_ar / greedy.dp[0] == pytest.approx(8 / 7)
    # the surrogate (p = 1/2 everywhere) on the same unions and costs: state 3 drafts 1 (accepted with 1/2,
    # to the end either way): dp[3] = 3; state 2: k = 1 -> 3 + (dp[3] + dp[4]) / 2 = 4.5
    surrogate = A.solve(hand_inputs(), model)
    assert surrogate.dp[3] == 3.0 and surrogate.dp[2] == pytest.approx(4.5)
    assert surrogate.dp[0] > greedy.dp[0]          # the surrogate under-credits a draft that is right


def deterministic_dp(g: np.ndarray, cost: np.ndarray):
    """Shortest path over the reference when every draft token's acceptance is known (g in {0, 1}):
    at state i a draft of k is accepted for its leading run of ones in g[i:] (capped at k; nothing
    matches past the end), then the state moves past the accepted tokens and the bonus token."""
    n, lmax = cost.shape[0], cost.shape[1]
    value, choice = np.zeros(n + 1), np.zeros(n, dtype=int)
    for i in range(n - 1, -1, -1):
        best = None
        for k in range(1, lmax + 1):
            a = 0
            while a < k and i + a < n and g[i + a] == 1:
                a += 1
            total = cost[i, k - 1, a] + value[min(i + a + 1, n)]
            if best is None or total < best:
                best, choice[i] = total, k
        value[i] = best
    return value, choice


@pytest.mark.parametrize("seed", range(12))
def test_greedy_oracle_is_the_deterministic_shortest_path(seed):
    rng = np.random.default_rng(seed)
    n, lmax = int(rng.integers(1, 40)), int(rng.integers(1, 7))
    g = (rng.random(n) < rng.uniform(0.2, 0.95)).astype(float)
    cost = rng.uniform(0.5, 10.0, (n, lmax, lmax + 1))
    cost[:, np.arange(lmax)[:, None] < np.arange(lmax + 1)[None, :] - 1] = np.nan     # a > k unused
    dp, policy = bellman(g, cost)
    value, choice = deterministic_dp(g, cost)
    np.testing.assert_allclose(dp, value, rtol=1e-12)
    np.testing.assert_array_equal(policy, choice)
    assert evaluate_policy(g, cost, policy).cost == pytest.approx(dp[0])


@pytest.mark.parametrize("model", [MODEL, CostModel(0.284, 0.745, 3.1, 0.78, -0.004), CostModel(0.05, 0.0, 8.0, 0.05, 0.0)])
def test_greedy_oracle_costs_at_most_every_fixed_k(model):
    """Any Bellman optimum is at most every deterministic policy's expected cost on the same sequences,
    under the same transitions: here every fixed k, sequence by sequence and in total."""
    items = [synthetic_inputs(n=80, lmax=6, seed=s, seq_id=f"s{s}").with_transitions("greedy") for s in range(4)]
    for it in items:
        assert set(np.unique(it.p)) <= {0.0, 1.0}
        solved = A.solve(it, model)
        for k in range(1, it.lmax + 1):
            assert solved.dp[0] <= evaluate_policy(it.p, solved.cost, fixed_policy(it.n, k)).cost + 1e-9
    solved = [A.solve(it, model) for it in items]
    oracle = A.totals([s.value for s in solved], [s.cost_ar for s in solved])["speedup"]
    fixed = A.fixed_k_sweep(solved)
    assert list(fixed.k) == list(range(1, 7)) and (fixed.speedup <= oracle + 1e-12).all()
    assert fixed.speedup.max() < oracle or np.isclose(fixed.speedup.max(), oracle)


def test_with_transitions_and_saved_inputs(tmp_path):
    it = synthetic_inputs(n=30, lmax=4, seed=2)
    assert set(np.unique(it.greedy)) <= {0.0, 1.0} and np.all(it.greedy[it.p > 0.5] == 1.0)
    g = it.with_transitions("greedy")
    assert g.transitions == "greedy" and np.array_equal(g.p, it.greedy) and g.U is it.U and g.q is it.q
    assert it.with_transitions("surrogate") is it and g.with_transitions("greedy") is g
    assert g.truncated(2).transitions == "greedy" and np.array_equal(g.truncated(2).p, it.greedy)
    with pytest.raises(ValueError, match="already use the greedy transitions"):
        g.with_transitions("surrogate")
    with pytest.raises(ValueError, match="transitions must be one of"):
        it.with_transitions("sampled")
    with pytest.raises(ValueError, match="greedy must have shape"):
        OracleInputs("x", "c", it.p, it.greedy[:-1], it.q, it.U, it.L_prefix, 8, 64)
    with pytest.raises(ValueError, match="another transition model"):
        save_inputs([g], tmp_path / "g.npz")
    save_inputs([it], tmp_path / "x.npz")
    np.testing.assert_array_equal(load_inputs(tmp_path / "x.npz")[0].greedy, it.greedy)
    # a file without the greedy indicator is refused with what to do
    with np.load(tmp_path / "x.npz") as z:
        old = {k: z[k] for k in z.files if k != "greedy"}
    np.savez(tmp_path / "old.npz", **old)
    with pytest.raises(ValueError, match=r"old.npz: expected the oracle-inputs arrays .*missing \['greedy'\]\)"
                                         r".*reuse=False"):
        load_inputs(tmp_path / "old.npz")


def test_replayed_oracle_draft_has_the_surrogates_transitions():
    """The oracle draft replaces each drafted token independently with probability 1 - a: its exact
    transitions are the surrogate's (greedy = a), so both analyses agree."""
    from moespec.engine.replay import ReplayRouting
    from moespec.oracle.junk import replayed_inputs
    from moespec.routing import synthetic

    trace = synthetic.sticky(3, 60, 2, 16, 4, keep=0.4, seed=2)
    items = [replayed_inputs(ReplayRouting(trace, doc=d), 8, 30, 3, 0.7, seq_id=str(d)) for d in range(3)]
    assert all(np.all(it.greedy == 0.7) for it in items)
    by_t = A.analyse_transitions(items, MODEL, items[:2], items[2:], 3)
    assert by_t["greedy"].totals["speedup"] == pytest.approx(by_t["surrogate"].totals["speedup"], rel=1e-12)


def test_analyse_transitions_tables():
    items = [synthetic_inputs(n=60, lmax=4, seed=s, seq_id=str(s)) for s in range(4)]
    train, test = A.split_sequences(items, seed=0)
    by_t = A.analyse_transitions(items, MODEL, train, test, 4)
    assert list(by_t) == ["surrogate", "greedy"]
    for t, r in by_t.items():   # each is analyse() on the inputs under that model
        direct = [A.solve(it.with_transitions(t), MODEL) for it in items]
        assert r.totals["speedup"] == pytest.approx(A.totals([s.value for s in direct], [s.cost_ar for s in direct])[
            "speedup"]) and r.transitions == t
    merged = A.merged_tables(by_t.values())
    sweep = merged["fig2_lmax_sweep"]
    assert list(sweep.transitions) == ["surrogate"] * 4 + ["greedy"] * 4
    assert set(merged["online_policy_info"]) == {"surrogate", "greedy"}
    assert merged["online_policy_info"]["greedy"]["oracle"] == by_t["greedy"].online_info["oracle"]
    json.dumps(merged["alpha0_summary"])          # written as JSON as it is
    overview = A.cost_models_overview({"m": by_t})
    assert list(overview.transitions) == ["surrogate", "greedy"]
    with pytest.raises(ValueError, match="different transition models"):
        A.analyse(items[:1] + [items[1].with_transitions("greedy")], MODEL, train, test, 4)


def test_boundary_when_quadrant_I_is_empty():
    """Paper 2's slope is the 1st percentile of dC/dA over quadrant I; with 0/1 transitions quadrant I
    can be empty: the steepest line the oracle's choices support (largest quadrant-III ratio), and
    slope 0 when no candidate changes E[a]."""
    q3 = pd.DataFrame({"dA": [-1.0, -2.0, 0.0], "dC": [-3.0, -4.0, 5.0]})
    b = boundary_slope(q3)
    assert b["slope_ms_per_token"] == 3.0 and b["n_q1"] == 0 and b["q3_crossing_line"] == 0
    assert "quadrant I empty" in b["slope_source"] and np.isnan(b["q1_min_ratio"])
    axis = boundary_slope(pd.DataFrame({"dA": [0.0, 0.0], "dC": [1.0, 2.0]}))
    assert axis["slope_ms_per_token"] == 0.0 and "no rejected candidate changes E[a]" in axis["slope_source"]
    q1 = boundary_slope(pd.DataFrame({"dA": [1.0, 1.0, -1.0], "dC": [2.0, 4.0, -1.0]}), percentile=0.0)
    assert q1["slope_ms_per_token"] == 2.0 and q1["slope_source"].startswith("quadrant I, 0th percentile")


def _round(gen, K, acc, tt, td, host=None):
    row = {"gen_id": gen, "question_id": 1, "category": "c", "K": K, "m": K + 1, "round_idx": 0, "L": 10, "T_T_ms": tt,
           "T_D_ms": td, "ubar": 8.0, "umax": 8.0, "accepted": acc, "kv_use": 0.1, "source": "test"}
    return row if host is None else {**row, "T_host_ms": host}


def test_fixed_k_speedups_by_hand():
    """K = 0: 1 token per 10 ms. K = 1: generation A accepts every draft (2 tokens per 14 ms round),
    B none (1 token per 14 ms); 6 tokens in 56 ms overall: speedup (6 / 56) / (1 / 10) = 1.0714.
    Resampling the two generations gives AA (8 / 56: 1.4286), AB or BA (1.0714) and BB (0.7143),
    so the 95 % interval is [0.7143, 1.4286]."""
    rows = ([_round("q1-K0", 0, 0, 9.0, 0.0, 1.0)] * 2 + [_round("q2-K0", 0, 0, 9.0, 0.0, 1.0)] * 2
            + [_round("q1-K1", 1, 1, 12.0, 1.0, 1.0)] * 2 + [_round("q2-K1", 1, 0, 12.0, 1.0, 1.0)] * 2)
    df = fixed_k_speedups(rounds_frame(rows))
    assert list(df.K) == [0, 1] and df.host_included.all()
    k0, k1 = df.iloc[0], df.iloc[1]
    assert (k0.speedup, k0.speedup_lo, k0.speedup_hi, k0.ms_per_token) == (1.0, 1.0, 1.0, 10.0)
    assert k1.speedup == pytest.approx(60 / 56) and k1.tokens_per_round == 1.5 and k1.ms_per_round == 14.0
    assert k1.speedup_lo == pytest.approx(40 / 56) and k1.speedup_hi == pytest.approx(80 / 56)
    assert (k1.rounds, k1.generations, k1.accepted_per_round) == (4, 2, 0.5)
    # without a host-time column the round time is T_T + T_D
    bare = fixed_k_speedups(rounds_frame([{k: v for k, v in r.items() if k != "T_host_ms"} for r in rows]))
    assert not bare.host_included.any() and bare.speedup.iloc[1] == pytest.approx((6 / 52) / (1 / 9))
    with pytest.raises(ValueError, match="no K = 0 rounds"):
        fixed_k_speedups(rounds_frame(rows[4:]))
    with pytest.raises(ValueError, match="T_host_ms has negative times"):
        rounds_frame([_round("g", 0, 0, 9.0, 0.0, -1.0)])


def test_oracle_bound_goal():
    from moespec.studies import goals as G

    measured = pd.DataFrame({"K": [0, 1, 2], "speedup": [1.0, 0.97, 0.93], "speedup_lo": [1.0, 0.94, 0.9],
                             "speedup_hi": [1.0, 1.0, 0.96]})
    met = G.oracle_bound_goal(0.95, measured)
    assert met.met.iloc[0] and met.value.iloc[0] == "oracle 0.950; measured K = 1: 0.970 [0.940, 1.000]"
    assert not G.oracle_bound_goal(0.66, measured).met.iloc[0]


@pytest.mark.filterwarnings("ignore:The design matrix is rank-deficient")   # the fake's kv_use is (L + m) / 4096
def test_paper2_comparison_is_like_for_like():
    from moespec.oracle.regression import fit_rounds
    from moespec.tables import oracle as T

    coef = {"beta0": {m: 5.0 + 0.3 * m for m in range(1, 7)}, "alpha": {m: 0.08 if m <= 4 else 0.26 for m in range(1, 7)},
            "c": 1e-3, "draft_a": 0.46, "draft_b": 0.07}
    fits = fit_rounds(synthetic_rounds(coef, ks=range(0, 6), generations_per_k=6, rounds_per_gen=12, seed=1))
    sweeps = {"surrogate": pd.DataFrame({"speedup": [1.2, 1.3], "mean_accepted_length": [0.5, 0.6],
                                         "mean_draft_length": [1.0, 1.5]}),
              "greedy": pd.DataFrame({"speedup": [1.4, 1.6], "mean_accepted_length": [0.9, 1.2],
                                      "mean_draft_length": [1.0, 1.8]})}
    cmp = T.ours_vs_paper(T.paper2_comparison_values(fits, sweeps, 2)).set_index("quantity")
    ours, theirs = cmp["ours (this machine)"], cmp["paper 2, published (their hardware)"]
    assert ours["in_sample_R2_per_K"] == f"{fits.per_k.r2_in.min():.4f}-{fits.per_k.r2_in.max():.4f}"
    assert (theirs["in_sample_R2_per_K"], theirs["oos_MAPE_per_K_pct"]) == ("0.9669-0.9991", "0.26-0.59")
    assert ours["pooled_eq4_R2"] == f"{fits.categorical.r2:.4f}" and theirs["pooled_eq4_R2"] == "0.999"
    assert theirs["pooled_eq4_cv_MAPE_pct"] == "0.37" and theirs["pooled_A3_R2"] == "0.861"
    assert ours["oracle_speedup_plateau"] == "1.300x at Lmax=2" and ours["oracle_speedup_plateau_greedy"] == "1.600x at Lmax=2"
    assert theirs["oracle_speedup_plateau"] == "2.34x beyond Lmax=6" and theirs["oracle_speedup_plateau_greedy"] == ""


def noisy_copy(model, noise: float = 0.5, seed: int = 0):
    """A draft that agrees with ``model``'s argmax at some positions only: a copy whose output
    embedding carries Gaussian noise of ``noise`` times its spread."""
    import copy

    draft = copy.deepcopy(model)
    with torch.no_grad():
        w = draft.lm_head.weight
        w += noise * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(seed))
    return draft


def test_greedy_indicator_predicts_the_engines_accepted_drafts():
    """On tiny models: the junk tails' greedy indicator is the draft's teacher-forced argmax against the
    reference, and the accepted drafts of every measured round (the engine's greedy verification of
    the greedy ModelDraft) are the leading run of ones it predicts from the round's state."""
    from moespec.oracle.record import record_rounds

    target = zoo.tiny_moe(seed=3, vocab_size=32)     # its greedy text varies (13 distinct tokens)
    draft = noisy_copy(target)
    prompt, n_tokens, K = [1, 3, 2, 0, 1, 2, 5, 7], 20, 3
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n_tokens + K + 1):
            ids.append(int(target(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    ref = ids[len(prompt):]
    x = junk_tails(target, draft, prompt, ref, lmax=K, seed=0)
    with torch.inference_mode():
        argmax = draft(input_ids=torch.tensor([prompt + ref])).logits[0].argmax(-1).numpy()
    np.testing.assert_array_equal(x.greedy, (argmax[len(prompt) - 1 + np.arange(len(ref))] == ref).astype(float))
    rounds, outs = record_rounds(target, draft, [{"question_id": 1, "category": "a", "ids": prompt}], ks=[K],
                                 n_tokens=n_tokens, repeats=1, backend="torch", progress=False)
    assert outs[1] == ref[:n_tokens] and (rounds.T_host_ms >= 0).all()
    for r in rounds.itertuples():
        i = r.L - len(prompt) + 1                      # the round verifies [x_i] + drafts: x_1..x_i are produced
        run = 0
        while run < K and x.greedy[i + run] == 1:
            run += 1
        assert r.accepted == run, f"round at state {i}: accepted {r.accepted}, greedy indicator predicts {run}"
    assert set(rounds.accepted) >= {0, 1, K}, "the case needs rounds that accept none, some and all drafts"


def test_report_block_sets_both_oracles_beside_the_measured_rounds(tmp_path):
    from moespec import report
    from moespec.report.run import ReportError, RunFiles

    (tmp_path / "MANIFEST.json").write_text(json.dumps({"started": "2026-12-03T10:00:00", "git_commit": "abc1234"}))
    (tmp_path / "07_measured_fixed_k.csv").write_text(
        "K,rounds,generations,accepted_per_round,tokens_per_round,ms_per_round,ms_per_token,speedup,speedup_lo,"
        "speedup_hi,host_included\n0,10,2,0,1,8,8,1,1,1,True\n1,10,2,0.75,1.75,14.3,8.2,0.975,0.95,1.0,True\n"
        "2,10,2,1.3,2.3,20.5,8.9,0.9,0.88,0.93,True\n")
    sweep = "lmax,speedup,mean_draft_length,mean_accepted_length,transitions\n"
    (tmp_path / "07_fig2_lmax_sweep.csv").write_text(
        sweep + "1,0.66,1,0.26,surrogate\n2,0.664,1.004,0.263,surrogate\n1,0.98,1,0.75,greedy\n2,1.05,1.6,1.2,greedy\n")
    (tmp_path / "07_fixed_k.csv").write_text(
        "k,speedup,mean_accepted_length,transitions\n1,0.662,0.252,surrogate\n2,0.5,0.3,surrogate\n"
        "1,0.98,0.75,greedy\n2,0.93,1.25,greedy\n")
    (tmp_path / "07_cost_models_overview.csv").write_text("cost_model,transitions\nall rows,surrogate\n"
                                                          "round model (notebook 05),surrogate\n")
    doc = "<!-- moespec-report:oracle-transitions -->\n<!-- /moespec-report:oracle-transitions -->\n"
    out = report.render_text(doc, RunFiles(tmp_path))
    assert ("reach at best 0.975 [0.950, 1.000] at K = 1 (0.75 drafts accepted per round; 95 % bootstrap interval "
            "over generations)") in out and "T_T + T_D + host time against" in out
    assert ("reaches 0.664 at Lmax = 2 (from 0.660 at Lmax = 1; mean draft length 1.00, accepted 0.26 per round) with "
            "paper 2's surrogate transitions") in out
    assert "and 1.050 at Lmax = 2 (from 0.980 at Lmax = 1; mean draft length 1.60, accepted 1.20 per round) with" in out
    assert "predict 0.662 with 0.25 accepted (surrogate) and 0.980 with 0.75 accepted (greedy-exact)" in out
    assert "the oracle's costs are notebook 05's round model" in out
    (tmp_path / "07_fixed_k.csv").write_text("k,speedup,mean_accepted_length\n1,0.662,0.252\n")
    with pytest.raises(ReportError, match="07_fixed_k.csv has no column 'transitions'"):
        report.render_text(doc, RunFiles(tmp_path))
