"""benchmarks/bench_lean_compile.py at a tiny size, with torch.compile's ``eager`` backend (dynamo's
tracing without code generation, which keeps every operation and so every bit): its file, columns,
the bit check and the share of the byte limit (the committed run is made by hand, with inductor)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench_scripts import load_benchmark


def test_tiny_run_writes_the_table_and_record(tmp_path):
    bench = load_benchmark("bench_lean_compile")
    bench.main(["--profile", "quick", "--reps", "2", "--warmup", "0", "--compile-backend", "eager",
                "--read-bytes", "1048576", "--prompt-tokens", "8", "--out", str(tmp_path)])
    table = pd.read_csv(next(tmp_path.glob("*_compile.csv")))
    rec = json.loads(next(tmp_path.glob("*_provenance.json")).read_text())
    assert sorted(zip(table.path, table["pass"])) == [("compiled", "n=1 slot"), ("compiled", "n=9 dedup"),
                                                     ("eager", "n=1 slot"), ("eager", "n=9 dedup")]
    compiled = table[table.path == "compiled"]
    assert compiled.logits_equal.all() and (compiled.max_abs_diff == 0).all()
    assert (compiled.graphs >= 1).all() and (compiled.compile_s > 0).all()
    assert table.share_of_limit.to_numpy() == pytest.approx((table.limit_ms / table.step_ms).to_numpy())
    assert table.limit_ms.to_numpy() == pytest.approx((table.bytes_MB * 1e6 / (table.ceiling_GBps * 1e9) * 1e3)
                                                      .to_numpy())
    assert (table.reps == 2).all() and rec["args"]["compile_backend"] == "eager"
    assert set(rec["compile"]) == {"n=1", "n=9"} and "cpu" in rec["provenance"]["hardware"]
