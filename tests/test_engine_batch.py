"""The engine at batch B (moespec.engine.batch, moespec.engine.batch_speculative) on the quick
profile's models: each sequence's tokens those of its own batch-one run, one expert operation per
MoE layer per pass over all B(k + 1) tokens, refusals, the round terms' rows."""

import numpy as np
import pytest
import torch

from moespec.engine import ModelDraft, speculative_generate
from moespec.engine.batch import BatchEngine, BatchLM
from moespec.engine.batch_speculative import (BatchModelDraft, BatchStep, batch_generate, batch_speculative_step,
                                              oracle_drafts, round_setup, summarize_batch_steps, text_positions,
                                              time_round_terms)
from moespec import zoo
from moespec.engine.runs import prompt_reference
from moespec.engine.subject import QUICK_MOE, load_subject
from moespec.measure.timing import read_bandwidth_callable

N_TOKENS = 14
LENGTHS = (5, 11, 8, 14)  # prompts of different lengths


@pytest.fixture(scope="module", params=["default", "byte-faithful-all"])
def subject(request):
    return load_subject(request.param, profile="quick")


@pytest.fixture(scope="module")
def near_draft():
    """The quick target's own tiny model (its own experts, f32) with noise on its LM head: a draft
    that agrees with the target often but not always (the quick draft, random, almost never does)."""
    draft = zoo.tiny_moe(**QUICK_MOE)
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(0.3 * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(3)))
    return draft


@pytest.fixture(scope="module")
def prompts():
    rng = np.random.default_rng(7)
    return [rng.integers(1, 256, size=n) for n in LENGTHS]


def _plain_reference(engine, prompt, n):
    first = engine.prefill(prompt)
    return [first] + engine.greedy(first, n - 1)


@pytest.mark.parametrize("dedup", [False, True])
def test_plain_decoding_matches_batch_one(subject, prompts, dedup):
    engine = subject.engine
    engine.dedup = dedup
    try:
        ref = [_plain_reference(engine, p, N_TOKENS) for p in prompts]
        for B in (1, 2, 4):
            out, steps = batch_generate(BatchEngine(engine), prompts[:B], k=0, n_tokens=N_TOKENS)
            assert [o[:N_TOKENS] for o in out] == ref[:B]
            assert len(steps) == N_TOKENS and all(s.accepted == [0] * B for s in steps)
    finally:
        engine.dedup = False


@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("which", ["near", "own"])
def test_speculative_decoding_matches_batch_one(subject, near_draft, prompts, k, which):
    engine = subject.engine
    draft = near_draft if which == "near" else subject.draft
    ref_tokens, ref_accepted = [], []
    for p in prompts:
        toks, steps = speculative_generate(engine, ModelDraft(draft), p, k, N_TOKENS)
        ref_tokens.append(toks[:N_TOKENS])
        ref_accepted.append([s.accepted for s in steps])
    for B in (1, 2, 4):
        out, steps = batch_generate(BatchEngine(engine), prompts[:B], k=k, n_tokens=N_TOKENS,
                                    drafter=BatchModelDraft(draft))
        assert [o[:N_TOKENS] for o in out] == ref_tokens[:B]
        for b in range(B):  # each sequence accepts its own drafts, round by round, until it is done
            mine = [s.accepted[b] for s in steps][:len(ref_accepted[b])]
            assert mine == ref_accepted[b]


def test_caches_become_ragged(subject, near_draft, prompts):
    """Sequences accept different numbers of drafts (some rounds all k), so their caches grow apart."""
    target = BatchEngine(subject.engine)
    _, steps = batch_generate(target, prompts, k=4, n_tokens=N_TOKENS, drafter=BatchModelDraft(near_draft))
    grown = np.array(target.lengths) - np.array(LENGTHS)
    assert len(set(grown.tolist())) > 1
    assert 4 in {j for s in steps for j in s.accepted}
    assert grown.tolist() == [sum(s.accepted[b] + 1 for s in steps) for b in range(len(LENGTHS))]


@pytest.mark.parametrize("B,k", [(1, 0), (2, 1), (4, 0), (4, 2), (3, 4)])
def test_one_expert_call_per_layer_over_the_whole_pass(subject, prompts, B, k):
    engine = subject.engine
    switch = engine.switch
    sizes = []
    own = switch.kernel_for
    target, drafter = BatchEngine(engine), BatchModelDraft(subject.draft)
    currents = target.prefill(prompts[:B])
    drafter.begin(prompts[:B])
    draft_mlp = []
    hooks = [layer.mlp.register_forward_hook(lambda m, args, out: draft_mlp.append(args[0].shape[:2]))
             for layer in drafter.lm.layers]
    engine.dedup = True
    switch.record = []
    switch.kernel_for = lambda n: sizes.append((n, own(n))) or own(n)
    try:
        drafts = drafter.propose([[] for _ in range(B)], currents, k)
        draft_mlp_calls = list(draft_mlp)
        st = batch_speculative_step(target, drafter, [[] for _ in range(B)], currents, k)
        record = switch.record
    finally:
        switch.record, engine.dedup = None, False
        del switch.kernel_for
        for h in hooks:
            h.remove()
    n = B * (k + 1)
    assert st.drafts == drafts
    assert sorted(layer for layer, _ in record) == list(range(engine.num_layers))
    assert all(ids.shape[0] == n for _, ids in record)
    assert sizes == [(n, "slot" if n == 1 else "dedup")] * engine.num_layers  # the switch decides by n = B(k + 1)
    # the draft: each dense MLP once per draft pass over the B sequences' tokens
    assert draft_mlp_calls == [torch.Size([1, B])] * (k * len(drafter.lm.layers))


def test_refusals(subject, prompts):
    target = BatchEngine(subject.engine)
    with pytest.raises(ValueError, match=r"^prompts: the batch size must be >= 1, found 0$"):
        target.prefill([])
    with pytest.raises(ValueError, match=r"^B: the batch size must be >= 1, found 0$"):
        target.reset(0)
    with pytest.raises(ValueError, match=r"^prompts\[1\]: needs a non-empty 1-D token list, found shape \(0,\)$"):
        batch_generate(target, [prompts[0], []], k=0, n_tokens=4)
    with pytest.raises(ValueError, match=r"^k: the draft length must be >= 0, found -1$"):
        batch_generate(target, prompts, k=-1, n_tokens=4)
    with pytest.raises(ValueError, match=r"^drafter: k = 2 drafts need a drafter, found none$"):
        batch_generate(target, prompts, k=2, n_tokens=4)
    with pytest.raises(ValueError, match=r"^n_tokens: must be >= 1, found 0$"):
        batch_generate(target, prompts, k=0, n_tokens=0)
    target.prefill(prompts[:2])
    with pytest.raises(ValueError, match=r"^segments: one per sequence \(2\), found 1$"):
        target.forward([[1]])
    with pytest.raises(ValueError, match=r"^lengths\[0\]: cannot crop a cache of 5 positions to 6$"):
        target.crop([6, 3])


def test_replayed_routing_refused():
    sub = load_subject("replay", profile="quick")
    with pytest.raises(ValueError, match=r"^engine: it has pass listeners"):
        BatchEngine(sub.engine)


@pytest.mark.parametrize("dedup", [False, True])
def test_lean_batched_passes_are_transformers_bit_for_bit(subject, prompts, dedup):
    """BatchEngine on a lean engine runs LeanOlmoe.forward_segments; its logits equal the batched
    transformers path's (BatchEngine on Engine.variant(lean=False)) bit for bit: prefill, a ragged
    pass of three sequences, a pass of a subset of the rows after crops, and a pass of one sequence."""
    engine = subject.engine
    lean, plain = BatchEngine(engine), BatchEngine(engine.variant(lean=False))
    assert lean.lean and not plain.lean
    with engine.dedup_as(dedup):
        firsts = lean.prefill(prompts[:3])
        assert plain.prefill(prompts[:3]) == firsts
        passes = [([0, 1, 2], [[firsts[0]], [firsts[1], 5, 7, 9], [firsts[2], 11]]),
                  ([0, 2], [[3, 4, 6], [8]]),
                  ([1], [[12, 13]])]
        for i, (rows, segments) in enumerate(passes):
            ids = [torch.tensor(t) for t in segments]
            got, want = lean.run(rows, ids), plain.run(rows, ids)
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"pass {i}"
            assert lean.lengths == plain.lengths
            if i == 0:
                for m in (lean, plain):
                    m.crop([n - d for n, d in zip(m.lengths, (0, 2, 1))])
    assert lean.lengths == [LENGTHS[0] + 4, LENGTHS[1] + 4, LENGTHS[2] + 2]


def test_batch_lm_refuses_a_model_without_decoder_layers():
    with pytest.raises(ValueError, match=r"^Linear: batched passes need decoder layers"):
        BatchLM(torch.nn.Linear(2, 2))


def test_summarize_batch_steps_hand_case():
    drafts = [[1, 2], [3, 4]]
    steps = [BatchStep(drafts, [[0] * 3] * 2, [2, 0], [5, 9], 0.1, 0.3, 0.5),
             BatchStep(drafts, [[0] * 3] * 2, [1, 2], [8, 10], 0.1, 0.2, 0.5)]
    s = summarize_batch_steps(steps)
    # emitted: accepted 5 + one token per sequence per round (4) = 9; rejections: 0 then 1, 0 -> 2
    assert (s["B"], s["k"], s["n_pass"], s["rounds"], s["emitted"]) == (2, 2, 6, 2, 9)
    assert s["realized_a"] == pytest.approx(5 / 7)
    assert s["throughput_per_seq"] == pytest.approx(9 / 2 / 1.0)
    assert s["throughput_batch"] == pytest.approx(9.0)
    assert s["t_verify_mean_s"] == pytest.approx(0.25)
    assert s["t_host_mean_s"] == pytest.approx(0.5 - 0.25 - 0.1)
    with pytest.raises(ValueError, match="^steps: no rounds"):
        summarize_batch_steps([])


def test_round_terms_rows_and_restored_caches(subject, prompts):
    setups = [round_setup(subject.engine, subject.draft, prompts[:B]) for B in (1, 2)]
    bases = [(s.target.lengths, s.drafter.lm.lengths) for s in setups]
    calls = []

    def timer(fn):
        calls.append([s.target.lengths for s in setups])
        fn()
        return 1000.0  # ns

    df = time_round_terms(setups, ks=[0, 2], reps=3, warmup=1, timer=timer,
                          read=read_bandwidth_callable(4096))
    assert sorted(zip(df.B, df.k, df.term)) == [(1, 0, "verify"), (1, 2, "draft"), (1, 2, "verify"),
                                                (2, 0, "verify"), (2, 2, "draft"), (2, 2, "verify")]
    assert (df.n == df.B * (df.k + 1)).all()
    assert (df.reps == 3).all() and np.allclose(df.t_median_s, 1e-6, rtol=1e-12)
    assert df.read_GBps.iloc[0] == pytest.approx(4096 / 1e-6 / 1e9)
    assert len(calls) == 3 * 7
    assert all(c == [b[0] for b in bases] for c in calls)  # every timed call starts from the prompts
    assert [(s.target.lengths, s.drafter.lm.lengths) for s in setups] == bases


def _checkpoint(family: str):
    import transformers as tf

    common = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
                  max_position_embeddings=128, eos_token_id=0, pad_token_id=0, bos_token_id=0)
    torch.manual_seed(0)
    return {"qwen3_moe": lambda: tf.Qwen3MoeForCausalLM(tf.Qwen3MoeConfig(
                intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, head_dim=16,
                **common)),
            "mixtral": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(intermediate_size=32, num_local_experts=8,
                                                                      num_experts_per_tok=2, **common)),
            "mixtral_window": lambda: tf.MixtralForCausalLM(tf.MixtralConfig(
                intermediate_size=32, num_local_experts=8, num_experts_per_tok=2, sliding_window=5, **common)),
            "deepseek_v2": lambda: tf.DeepseekV2ForCausalLM(tf.DeepseekV2Config(
                intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
                n_shared_experts=1, first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                qk_nope_head_dim=8, v_head_dim=16, n_group=1, topk_group=1, **common))}[family]().eval()


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral", "mixtral_window", "deepseek_v2"])
def test_checkpoint_subjects_at_batch_b(family, tmp_path):
    """A checkpoint subject of each supported family: batched plain and speculative tokens those of
    batch one, one expert operation per MoE layer per pass of B(k + 1) tokens; with a sliding window
    of 5 positions (prompts and text longer than it) the plain tokens."""
    _checkpoint(family).save_pretrained(tmp_path / "target")
    zoo.tiny_draft(seed=1, vocab_size=128).save_pretrained(tmp_path / "draft")
    sub = load_subject(str(tmp_path / "target"), profile="quick", backend="torch", draft=str(tmp_path / "draft"))
    engine = sub.engine
    rng = np.random.default_rng(1)
    prompts = [rng.integers(1, 128, size=n) for n in (6, 10, 3)]
    ref = [_plain_reference(engine, p, 10) for p in prompts]
    out, _ = batch_generate(BatchEngine(engine), prompts, k=0, n_tokens=10)
    assert [o[:10] for o in out] == ref
    if family == "mixtral_window":  # transformers' sliding-window cache cannot be cropped: no speculation
        return
    ref = [speculative_generate(engine, ModelDraft(sub.draft), p, 3, 10)[0][:10] for p in prompts]
    engine.switch.record = []
    try:
        out, steps = batch_generate(BatchEngine(engine), prompts, k=3, n_tokens=10, drafter=BatchModelDraft(sub.draft))
        record = engine.switch.record
    finally:
        engine.switch.record = None
    assert [o[:10] for o in out] == ref
    assert len(record) == engine.num_layers * (len(prompts) + len(steps))  # a prefill per prompt, then the rounds
    verify = record[-engine.num_layers * len(steps):]  # one call per layer per round
    assert [ids.shape[0] for _, ids in verify] == [3 * 4] * (engine.num_layers * len(steps))


@pytest.mark.parametrize("k,a", [(1, 0.5), (3, 0.7), (4, 1.0)])
def test_oracle_draft_matches_batch_one(subject, prompts, k, a):
    """Sequence b of the batched oracle draws what OracleDraft(seed=[seed, b]) draws at batch one."""
    from moespec.engine import OracleDraft
    from moespec.engine.batch_speculative import BatchOracleDraft

    engine = subject.engine
    ref = []
    for b, p in enumerate(prompts):
        toks, steps = speculative_generate(engine, OracleDraft(engine, a, subject.vocab_size, seed=[5, b]), p, k,
                                           N_TOKENS)
        ref.append((toks[:N_TOKENS], [s.accepted for s in steps]))
    out, steps = batch_generate(BatchEngine(engine), prompts, k=k, n_tokens=N_TOKENS,
                                drafter=BatchOracleDraft(engine, a, subject.vocab_size, seed=5))
    assert [o[:N_TOKENS] for o in out] == [r[0] for r in ref]
    for b, (_, accepted) in enumerate(ref):
        assert [s.accepted[b] for s in steps][:len(accepted)] == accepted
    if a == 1.0:
        assert all(j == k for s in steps for j in s.accepted)
    with pytest.raises(ValueError, match=r"^a: the oracle's acceptance must lie in \[0, 1\], found 1.5$"):
        BatchOracleDraft(engine, 1.5, subject.vocab_size)


def test_round_setup_without_a_draft_verifies_the_continuations(subject, prompts):
    s = round_setup(subject.engine, None, prompts[:2], continuations=[[3, 4, 5], [6, 7, 8]])
    assert s.drafts(2) == [[3, 4], [6, 7]] and s.drafts(0) == [[], []]
    with pytest.raises(ValueError, match=r"^continuations\[0\]: 4 drafts asked at offset 0, found 3 tokens$"):
        s.drafts(4)
    df = time_round_terms([s], ks=[3], reps=2, warmup=0, timer=lambda fn: (fn(), 10.0)[1])
    assert df[["offset", "B", "k", "n", "term"]].values.tolist() == [[0, 2, 3, 8, "verify"]]
    assert np.isnan(df.read_GBps.iloc[0]) and s.target.lengths == list(LENGTHS[:2])


def test_a_round_started_into_the_text_is_a_later_round_of_the_decode_loop(subject, prompts):
    """seek(j): the caches hold prompt + the greedy text's first j tokens, the round's current token
    is the text's token j and its drafts the next ones; a verify pass there accepts every draft
    (the text is the target's greedy text) and emits what batch-one greedy decoding emits."""
    B, k, j = 2, 3, 4
    texts = [prompt_reference(subject.engine, p, N_TOKENS) for p in prompts[:B]]
    texts = [[first] + text[1:] for first, text in texts]
    s = round_setup(subject.engine, None, prompts[:B], continuations=[t[1:] for t in texts])
    s.seek(j)
    assert s.target.lengths == [n + j for n in LENGTHS[:B]] and s.offset == j
    assert s.currents == [t[j] for t in texts] and s.generated == [t[:j] for t in texts]
    assert s.drafts(k) == [t[j + 1:j + 1 + k] for t in texts]
    argmax = s.target.forward([[c] + d for c, d in zip(s.currents, s.drafts(k))])
    assert argmax == [t[j + 1:j + 2 + k] for t in texts]
    s.restore()
    assert s.target.lengths == [n + j for n in LENGTHS[:B]]
    s.seek(0)
    assert s.target.lengths == list(LENGTHS[:B]) and s.currents == [t[0] for t in texts]
    with pytest.raises(ValueError, match=r"^continuations\[0\]: offset 20 needs more than 20 tokens of text, "
                                         r"found 15$"):
        s.seek(20)
    with pytest.raises(ValueError, match=r"^offset: 2 needs the sequences' continuations, found none$"):
        round_setup(subject.engine, None, prompts[:1]).seek(2)


def test_round_terms_at_positions_into_the_text(subject, near_draft, prompts):
    """offsets: every timed call at offset j starts from caches of prompt + j tokens of the text (the
    target's and the draft's), one row per (offset, B, k, term), and the setups end at the prompts."""
    texts = [prompt_reference(subject.engine, p, N_TOKENS) for p in prompts[:2]]
    cont = [text[1:] for _, text in texts]
    setups = [round_setup(subject.engine, near_draft, prompts[:B], continuations=cont[:B]) for B in (1, 2)]
    seen = []

    def timer(fn):
        seen.append(([s.offset for s in setups], [s.target.lengths for s in setups],
                     [s.drafter.lm.lengths for s in setups]))
        fn()
        return 1000.0

    df = time_round_terms(setups, ks=[0, 2], reps=1, warmup=0, timer=timer, offsets=[0, 5])
    assert sorted(set(zip(df.offset, df.B, df.k, df.term))) == sorted(
        (j, B, k, t) for j in (0, 5) for B in (1, 2) for k, t in ((0, "verify"), (2, "verify"), (2, "draft")))
    assert len(df) == 12 and len(seen) == 12
    for offsets, targets, drafts in seen:
        j = offsets[0]
        assert targets == [[n + j for n in LENGTHS[:B]] for B in (1, 2)]
        assert drafts == targets
    assert [s.target.lengths for s in setups] == [list(LENGTHS[:B]) for B in (1, 2)]
    assert all(s.offset == 0 for s in setups)


def test_round_terms_into_the_text_follow_the_previous_round(subject, prompts):
    """At offset j every timed call follows, untimed, the previous round at its k: the target's pass
    over the text's min(k + 1, j) tokens before j, from caches holding the prompt and the text up to
    there; at the prompts' end (no read) nothing runs before the call."""
    texts = [prompt_reference(subject.engine, p, N_TOKENS) for p in prompts[:2]]
    texts = [[first] + text[1:] for first, text in texts]
    s = round_setup(subject.engine, None, prompts[:2], continuations=[t[1:] for t in texts])
    passes, before = [], []
    forward = s.target.forward

    def spy(segments):
        passes.append((s.target.lengths, [list(x) for x in segments]))
        return forward(segments)

    def timer(fn):
        before.append((s.offset, list(passes)))
        fn()
        passes.clear()
        return 1000.0

    s.target.forward = spy
    time_round_terms([s], ks=[0, 3], reps=2, warmup=0, timer=timer, offsets=[0, 2, 6])
    expected = []
    for j in (0, 2, 6):
        for _ in range(2):
            for k in (0, 3):
                m = min(k + 1, j)
                expected.append((j, [([n + j - m for n in LENGTHS[:2]], [t[j - m:j] for t in texts])] if m else []))
    assert before == expected
    assert s.target.lengths == list(LENGTHS[:2])


def test_oracle_drafts_in_the_round_terms(subject, prompts):
    """oracle = (a, vocab, seed): a = 1 keeps the text, a = 0 replaces every token by another; the same
    (B, offset, k) draws the same drafts, as BatchOracleDraft's rule (oracle_drafts)."""
    cont = [list(range(10, 40)), list(range(50, 80))]
    keep = round_setup(subject.engine, None, prompts[:2], continuations=cont, oracle=(1.0, 256, 0))
    assert keep.drafts(4) == [c[:4] for c in cont]
    swap = round_setup(subject.engine, None, prompts[:2], continuations=cont, oracle=(0.0, 256, 0))
    d = swap.drafts(4)
    assert all(x != y and 0 <= x < 256 for row, c in zip(d, cont) for x, y in zip(row, c[:4]))
    assert swap.drafts(4) == d
    rng = np.random.default_rng([0, 2, 0, 4])
    assert d == [oracle_drafts(c[:4], rng, 0.0, 256) for c in cont]


def test_text_positions_spread_over_the_run():
    assert text_positions(32, 8) == [2, 6, 10, 14, 18, 22, 26, 30]
    assert text_positions(32, 1) == [16] and text_positions(3, 3) == [0, 1, 2]
    with pytest.raises(ValueError, match="^n_tokens and count: must be >= 1"):
        text_positions(0, 2)


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("B,k", [(1, 0), (1, 3), (4, 2)])
def test_attention_projections_once_per_pass(subject, prompts, B, k, lean):
    """Each attention's q/k/v and output projections run once per pass over its B(k + 1) tokens
    (their weights read once per pass), on the lean path and on transformers' modules; the cores
    per sequence."""
    target = BatchEngine(subject.engine.variant(lean=lean))
    assert target.lean == lean
    currents = target.prefill(prompts[:B])
    names = ("q_proj", "k_proj", "v_proj", "o_proj")
    modules = [getattr(layer.self_attn, p) for layer in target.layers for p in names]
    calls = []
    hooks = [getattr(layer.self_attn, p).register_forward_hook(
        lambda m, args, out, p=p: calls.append((p, args[0].shape[1])))
        for layer in target.layers for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
    try:
        target.forward([[c] + [1] * k for c in currents])
    finally:
        for h in hooks:
            h.remove()
    assert sorted(calls) == sorted([(p, B * (k + 1)) for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
                                   * len(target.layers))
    assert [getattr(layer.self_attn, p) for layer in target.layers for p in names] == modules  # put back


def test_a_forward_set_on_the_attention_is_kept(subject, prompts):
    """A pass of transformers' batched modules swaps each attention's forward for its own and puts
    back what was there."""
    target = BatchEngine(subject.engine.variant(lean=False))
    attn = target.layers[0].self_attn
    seen = []
    own = attn.forward

    def mine(*args, **kwargs):
        seen.append(kwargs["hidden_states"].shape[1])
        return own(*args, **kwargs)

    attn.forward = mine
    try:
        currents = target.prefill(prompts[:2])
        target.forward([[c, 1] for c in currents])
        assert attn.forward is mine
    finally:
        del attn.forward
    assert seen == [LENGTHS[0], LENGTHS[1], 2, 2]  # the two prefills, then one call per sequence


def test_mixed_layer_types_refused():
    model = zoo.tiny_draft(seed=1)
    model.config.layer_types = ["full_attention", "sliding_attention"]
    with pytest.raises(ValueError, match=r"^LlamaForCausalLM: layer_types mixes \['full_attention', "
                                         r"'sliding_attention'\]"):
        BatchLM(model)


def test_a_run_from_restored_prefilled_caches_equals_a_fresh_one(subject, near_draft, prompts):
    """batch_generate from a RoundSetup's prompts (prefilled once, cropped back, after other runs
    and an untimed pass) emits the tokens of a run that prefills afresh; caches that do not hold
    exactly the prompts are refused."""
    s = round_setup(subject.engine, None, prompts[:2])
    fresh, fresh_steps = batch_generate(BatchEngine(subject.engine), prompts[:2], k=3, n_tokens=N_TOKENS,
                                        drafter=BatchModelDraft(near_draft))
    for _ in range(2):
        s.restore()
        s.target.forward([[int(f)] for f in s.firsts])
        s.restore()
        out, steps = batch_generate(s.target, prompts[:2], k=3, n_tokens=N_TOKENS, drafter=BatchModelDraft(near_draft),
                                    prefilled=s.firsts)
        assert out == fresh and [st.accepted for st in steps] == [st.accepted for st in fresh_steps]
    with pytest.raises(ValueError, match=r"prefilled: expected the first tokens of 2 prompts whose caches hold"):
        batch_generate(s.target, prompts[:2], k=0, n_tokens=4, prefilled=s.firsts)   # not restored: longer caches
