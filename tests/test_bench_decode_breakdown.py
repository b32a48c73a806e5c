"""benchmarks/bench_decode_breakdown.py's thread-count table at a tiny size: its rows, the bytes of
each pass (the kernel each pass runs) and the share arithmetic; the engine's dedup switch is back
where it was."""

from __future__ import annotations

import numpy as np
import pytest

from bench_scripts import load_benchmark
from moespec.engine.breakdown import pass_bytes, pass_total
from moespec.engine.subject import load_subject


def test_thread_counts_rows_and_shares():
    bench = load_benchmark("bench_decode_breakdown")
    sub = load_subject("byte-faithful-all", profile="quick")
    prompt = np.arange(1, 9)
    was = sub.engine.dedup
    df = bench.thread_counts(sub, prompt, counts=(1,), reps=2, warmup=0, read_bytes=1 << 20)
    assert sub.engine.dedup == was and sub.engine.length == len(prompt)
    assert df[["threads", "pass"]].values.tolist() == [[1, "n=1"], [1, "n=9 dedup"]]
    assert df.share_of_limit.to_numpy() == pytest.approx((df.limit_ms / df.step_ms).to_numpy())
    tokens = bench.continuation(sub.engine, prompt, 9)
    sub.engine.crop(len(prompt))
    nbytes = [pass_total(pass_bytes(sub.engine, tokens, n), kernel) for n, kernel in ((1, "slot"), (9, "dedup"))]
    assert (df.limit_ms * 1e-3 * df.ceiling_GBps * 1e9).to_numpy() == pytest.approx(nbytes)


def test_batch_passes_rows_bytes_and_shares():
    """--batch-sizes: one row per (B, k, path); the pass's bytes at B = 1 are the batch-one pass's
    (pass_bytes of the same tokens), a pass of several sequences reads at most the per-slot bytes
    and its KV cache is every sequence's; shares and speedups follow from the medians."""
    from moespec.engine.batch import BatchEngine
    from moespec.engine.breakdown import batch_pass_bytes

    bench = load_benchmark("bench_decode_breakdown")
    sub = load_subject("byte-faithful-all", profile="quick")
    df = bench.batch_passes(sub, Bs=(1, 2), ks=(0, 2), depth=10, reps=2, warmup=0, read_bytes=1 << 20)
    assert sorted(zip(df.B, df.k, df.path)) == sorted((B, k, p) for B in (1, 2) for k in (0, 2)
                                                      for p in ("lean", "transformers"))
    assert (df.n == df.B * (df.k + 1)).all() and set(df.kernel) == {"slot", "dedup"}
    assert df.share_of_limit.to_numpy() == pytest.approx((df.limit_ms / df.step_ms).to_numpy())
    for (B, k), g in df.groupby(["B", "k"]):
        lean, tf = (g[g.path == p].step_ms.iloc[0] for p in ("lean", "transformers"))
        assert g.lean_speedup.to_numpy() == pytest.approx([tf / lean] * 2) and g.bytes_MB.nunique() == 1
    prompts = [np.asarray(p) for p in sub.chat_prompts(1, 10, seed=0)]
    text = bench.continuation(sub.engine, prompts[0], 3)
    sub.engine.crop(len(prompts[0]))
    one = pass_bytes(sub.engine, text, 3)
    target = BatchEngine(sub.engine)
    target.prefill(prompts[:1])
    assert batch_pass_bytes(target, [text]) == pytest.approx(one)
    target.prefill([prompts[0], prompts[0]])
    two = batch_pass_bytes(target, [text, text])
    assert target.lengths == [len(prompts[0])] * 2
    # one sequence twice: the same experts, twice the per-slot reads and the cache, the dense bytes once
    assert two["experts_dedup"] == pytest.approx(one["experts_dedup"])
    assert two["experts_slot"] == pytest.approx(2 * one["experts_slot"])
    assert two["kv_cache"] == pytest.approx(2 * one["kv_cache"]) and two["dense"] == one["dense"]
