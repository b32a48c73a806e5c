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
