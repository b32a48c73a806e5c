"""The oracle on real transformers models (tiny, random): router tap, junk tails, measured rounds."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from moespec import zoo
from moespec.oracle.boundaries import new_experts
from moespec.oracle.hf import RouterTap
from moespec.oracle.junk import junk_tails
from moespec.routing.stats import union_sizes

V = 256


@pytest.fixture(scope="module")
def models():
    return zoo.tiny_moe(seed=0, vocab_size=V), zoo.tiny_draft(seed=1, vocab_size=V)


def greedy(model, prompt, n):
    ids = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


def full_routing(model, ids):
    """Expert ids of every position from the router logits transformers returns, [T, layers, topk]."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_router_logits=True)
    k = model.config.num_experts_per_tok
    return np.stack([lg.reshape(len(ids), -1).topk(k, -1).indices.numpy() for lg in out.router_logits], axis=1)


def test_router_tap_matches_router_logits(models):
    target, _ = models
    ids = list(range(3, 20))
    with RouterTap(target) as tap, torch.inference_mode():
        target(input_ids=torch.tensor([ids]))
        got = tap.take()[0]
    np.testing.assert_array_equal(np.sort(got, -1), np.sort(full_routing(target, ids), -1))


def test_junk_tails_against_full_passes(models):
    target, draft = models
    prompt = [5, 17, 33, 2, 90, 41]
    ref = greedy(target, prompt, 10)
    lmax = 4
    x = junk_tails(target, draft, prompt, ref, lmax=lmax, seed=0)
    S = prompt + ref
    Lp, N = len(prompt), len(ref)
    assert x.U.shape == (N, lmax, lmax + 1) and x.q.shape == (N, lmax)
    # p: the draft's probability of each reference token, from one teacher-forced pass
    with torch.inference_mode():
        probs = torch.softmax(draft(input_ids=torch.tensor([S])).logits[0].float(), -1).numpy()
    np.testing.assert_allclose(x.p, probs[Lp - 1 + np.arange(N), ref], rtol=1e-4, atol=1e-6)
    # the all-reference chain's union equals the union over the same positions of a full pass
    routing = full_routing(target, S)
    for i in range(N):
        for k in range(1, lmax + 1):
            if i + k <= N:
                u = union_sizes(routing[Lp + i - 1:Lp + i + k], target.config.num_experts)[-1].mean()
                assert x.U[i, k - 1, k] == pytest.approx(u)
    top_k = target.config.num_experts_per_tok
    for k in range(1, lmax + 1):
        used = x.U[:, k - 1, :k + 1]
        assert np.all(used >= top_k) and np.all(used <= min(target.config.num_experts, (k + 1) * top_k))
        assert np.all(np.isnan(x.U[:, k - 1, k + 1:]))
    for a in range(lmax):    # a longer draft of the same chain never has a smaller union
        assert np.all(np.diff(x.U[:, a:, a], axis=1) >= 0)
    np.testing.assert_array_equal(x.L_prefix, Lp + np.arange(N))
    # the kept tokens: the reference, and the draft's own greedy chain from every state
    np.testing.assert_array_equal(x.tokens, ref)
    for i in range(N):
        assert x.draft_chain[i].tolist() == greedy(draft, S[:Lp + i], lmax)
    np.testing.assert_array_equal(x.greedy, (x.draft_chain[:, 0] == x.tokens).astype(float))
    # Appendix B's new experts along the reference: the growth of the full pass's union, step by step
    new = new_experts(x.U, top_k)[:, :, lmax]
    for i in range(N):
        u = union_sizes(routing[Lp + i - 1:Lp + i + lmax], target.config.num_experts).mean(axis=-1)
        for j in range(1, lmax + 1):
            if i + j <= N:
                assert new[i, j - 1] == pytest.approx(u[j] - u[j - 1])
            else:
                assert np.isnan(new[i, j - 1])


def test_record_rounds_reproduces_greedy_text(models):
    from moespec.oracle.record import record_rounds

    target, draft = zoo.tiny_moe(seed=0, vocab_size=V), zoo.tiny_draft(seed=1, vocab_size=V)
    prompts = [{"question_id": 1, "category": "a", "ids": [5, 17, 33, 2]},
               {"question_id": 2, "category": "b", "ids": [9, 8, 7, 6, 5]}]
    expect = {p["question_id"]: greedy(models[0], p["ids"], 8) for p in prompts}
    df, outs = record_rounds(target, draft, prompts, ks=[1, 3], n_tokens=8, repeats=1, backend="torch",
                             progress=False)
    assert set(df.K) == {1, 3} and (df.m == df.K + 1).all() and (df.T_T_ms > 0).all()
    assert df.gen_id.nunique() == 4
    top_k = target.config.num_experts_per_tok
    assert (df.ubar >= top_k).all() and (df.ubar <= df.m * top_k).all()
    for g, sub in df.groupby("gen_id"):
        # context grows by the emitted tokens of the previous round
        assert list(sub.L.diff().dropna()) == list((sub.accepted + 1).iloc[:-1])
    for qid, toks in outs.items():
        assert toks == expect[qid]
    with pytest.raises(ValueError, match="max_position_embeddings"):
        record_rounds(target, draft, prompts[:1], ks=[1], n_tokens=500, repeats=1, backend="torch", progress=False)


def test_record_rounds_resumes_each_prompt_as_a_fresh_prefill(models):
    """The runs of one prompt after its first resume its prefill (Engine.hold / resume, the draft's
    held cache): every round's tokens, acceptance and routing are those of runs that each prefill."""
    from moespec.oracle.record import record_rounds

    target, draft = zoo.tiny_moe(seed=0, vocab_size=V), zoo.tiny_draft(seed=1, vocab_size=V)
    prompts = [{"question_id": 1, "category": "a", "ids": [5, 17, 33, 2]},
               {"question_id": 2, "category": "b", "ids": [9, 8, 7, 6, 5]}]
    ks = [1, 2, 4]
    together, _ = record_rounds(target, draft, prompts, ks=ks, n_tokens=10, repeats=1, backend="torch",
                                progress=False)
    apart = pd.concat([record_rounds(zoo.tiny_moe(seed=0, vocab_size=V), zoo.tiny_draft(seed=1, vocab_size=V), [p],
                                     ks=[k], n_tokens=10, repeats=1, backend="torch", progress=False)[0]
                       for p in prompts for k in ks], ignore_index=True)
    cols = ["gen_id", "round_idx", "K", "L", "accepted", "ubar", "umax"]
    assert len(together) == len(apart) > len(prompts) * len(ks)
    pd.testing.assert_frame_equal(together[cols].reset_index(drop=True), apart[cols])


def test_load_questions(tmp_path):
    from moespec.oracle.record import load_questions

    qs = load_questions(["math_reasoning"], per_category=3)
    assert len(qs) == 3 and all(q["category"] == "math_reasoning" for q in qs)
    assert len(load_questions(per_category=1)) == 13
    with pytest.raises(ValueError, match="no category"):
        load_questions(["poetry"])
    bad = tmp_path / "q.jsonl"
    bad.write_text('{"question_id": 1, "turns": ["x"]}\n')
    with pytest.raises(ValueError, match="category"):
        load_questions(path=bad)


def test_check_reused_refuses_another_workload(tmp_path):
    """A reused rounds/inputs file must hold exactly the workload asked for (issue 28's per-category
    oracle workload would otherwise silently reuse a one-category file)."""
    from moespec.oracle.record import check_reused

    wanted = [(1, 0), (1, 1), (2, 0), (2, 1)]
    check_reused(tmp_path / "rounds.csv", reversed(wanted), wanted, "rounds")          # order does not matter
    with pytest.raises(ValueError, match=r"hold 3 keys, the run asks for 4 \(missing \[\(2, 1\)\], extra \[\]\)"):
        check_reused(tmp_path / "rounds.csv", wanted[:3], wanted, "rounds")
    with pytest.raises(ValueError, match=r"extra \[\('9', 48, 12\)\].*reuse=False"):
        check_reused("x.npz", [("1", 48, 12), ("9", 48, 12)], [("1", 48, 12)], "oracle inputs")

