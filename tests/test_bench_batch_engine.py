"""benchmarks/bench_batch_engine.py at a tiny size: its files and columns, and the throughput
relative to plain decoding on a hand case (the committed run is made by hand)."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench_scripts import load_benchmark


@pytest.mark.parametrize("draft", ["oracle", "real"])
def test_tiny_run_writes_runs_summary_terms_and_record(tmp_path, draft):
    bench = load_benchmark("bench_batch_engine")
    bench.main(["--batch-sizes", "1,2", "--ks", "0,2", "--reps", "2", "--term-reps", "2", "--n-tokens", "5",
                "--draft", draft, "--read-bytes", "1048576", "--out", str(tmp_path)])
    runs = pd.read_csv(next(tmp_path.glob("*_runs.csv")))
    summary = pd.read_csv(next(tmp_path.glob("*_summary.csv")))
    terms = pd.read_csv(next(tmp_path.glob("*_terms.csv")))
    rec = json.loads(next(tmp_path.glob("*Z.json")).read_text())
    assert len(runs) == 2 * 2 * 2 and sorted(set(zip(runs.B, runs.k))) == [(1, 0), (1, 2), (2, 0), (2, 2)]
    assert (runs.n_pass == runs.B * (runs.k + 1)).all() and (runs.emitted >= runs.B * 5).all()
    for col in ("throughput_per_seq", "t_verify_mean_s", "read_GBps", "other_load"):
        assert runs[col].notna().all(), col
    assert summary[summary.k == 0].rel_plain.tolist() == [1.0, 1.0]
    expected = {"oracle": ["verify"], "real": ["draft", "verify"]}[draft]
    assert sorted(set(terms.term)) == expected and (terms.n == terms.B * (terms.k + 1)).all()
    assert rec["read_bytes"] == 1048576 and rec["subject"]["kind"] == "byte-faithful-all"
    assert "cpu" in rec["provenance"]["hardware"]


def test_relative_to_plain_hand_case():
    bench = load_benchmark("bench_batch_engine")
    runs = pd.DataFrame({"B": [1, 1, 1, 1], "k": [0, 0, 2, 2], "rep": [0, 1, 0, 1], "n_pass": [1, 1, 3, 3],
                         "throughput_per_seq": [10.0, 20.0, 15.0, 50.0]})
    for col in ("throughput_batch", "realized_a", "tokens_per_round_per_seq", "t_verify_mean_s", "t_draft_mean_s",
                "t_host_mean_s", "t_step_mean_s", "read_GBps", "other_load"):
        runs[col] = 1.0
    s = bench.summarize(runs).set_index("k")
    assert s.loc[2, "rel_plain"] == pytest.approx(32.5 / 15.0)          # ratio of the medians
    assert (s.loc[2, "rel_plain_q25"], s.loc[2, "rel_plain_q75"]) == pytest.approx((1.5 + 0.25 * 1.0, 1.5 + 0.75))
