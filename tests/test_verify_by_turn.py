"""moespec.engine.summaries.verify_by_turn and benchmarks/verify_by_turn.py: the calibration's
verify times per turn against the test's, by hand."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bench_scripts import load_benchmark
from moespec.engine.summaries import verify_by_turn

bench = load_benchmark("verify_by_turn")


def _rows(times: dict, tokens: dict) -> pd.DataFrame:
    """{(prompt, k): [verify ms of each run]}: deduplication on at k >= 1, plain at k = 0; one
    per-slot run per turn at k = 1 that must be left out."""
    rows = [{"prompt": p, "prompt_tokens": tokens[p], "k": k, "dedup": k >= 1, "t_verify_mean_s": ms / 1e3}
            for (p, k), runs in times.items() for ms in runs]
    rows += [{"prompt": p, "prompt_tokens": tokens[p], "k": 1, "dedup": False, "t_verify_mean_s": 1.0} for p in tokens]
    return pd.DataFrame(rows)


CAL = _rows({(0, 0): [20.0], (0, 1): [30.0, 34.0], (1, 0): [22.0], (1, 1): [26.0]}, {0: 40, 1: 200})
TEST = _rows({(0, 0): [21.0, 21.0], (0, 1): [32.0, 32.0]}, {0: 60})


def test_turns_and_the_pooled_term_by_hand():
    turns, by_k = verify_by_turn(CAL, TEST)
    t = turns.set_index(["part", "prompt", "k"])
    assert t.loc[("calibration", 0, 1), "verify_ms"] == pytest.approx(32.0) and t.loc[("calibration", 0, 1), "runs"] == 2
    assert t.loc[("calibration", 1, 0), "prompt_tokens"] == 200 and t.loc[("test", 0, 1), "verify_ms"] == pytest.approx(32)
    k1 = by_k.set_index("k").loc[1]
    assert k1.calibration_ms == pytest.approx(30.0)            # (30 + 34 + 26) / 3 runs; the per-slot run left out
    assert k1.test_ms == pytest.approx(32.0) and k1.ratio == pytest.approx(30 / 32)
    assert (k1.calibration_turn_min_ms, k1.calibration_turn_max_ms) == pytest.approx((26.0, 32.0))
    assert (k1.leave_one_turn_out_min_ms, k1.leave_one_turn_out_max_ms) == pytest.approx((26.0, 32.0))
    k0 = by_k.set_index("k").loc[0]
    assert k0.calibration_ms == pytest.approx(21.0) and k0.test_ms == pytest.approx(21.0)


def test_refusals():
    with pytest.raises(ValueError, match=r"test rows lack column\(s\) \['t_verify_mean_s'\]"):
        verify_by_turn(CAL, TEST.drop(columns="t_verify_mean_s"))
    with pytest.raises(ValueError, match="calibration rows hold no run with deduplication on or plain"):
        verify_by_turn(CAL[~CAL.dedup & (CAL.k > 0)], TEST)


def test_script_reads_a_results_folder(tmp_path):
    data = tmp_path / "run"
    data.mkdir()
    CAL.assign(state="quiet").to_csv(data / "draft_calibration.csv", index=False)
    TEST.to_csv(data / "real_draft.csv", index=False)
    (data / "run.json").write_text(json.dumps({"started": {"verify_grid": "2026-12-05T20:17:23+00:00"},
                                               "finished": "2026-12-05T20:55:29+00:00", "subject": "s",
                                               "sizes": {"draft_calibration": "interleaved"},
                                               "provenance": {"git_commit": "abc", "hardware": {}}}))
    out = tmp_path / "out"
    result = bench.run(data, out)
    assert result["source"]["commit"] == "abc" and result["source"]["draft_calibration"] == "interleaved"
    by_k = pd.read_csv(out / "20261205T201723Z_verify_by_turn_by_k.csv")
    assert by_k.set_index("k").loc[1, "calibration_ms"] == pytest.approx(30.0) and set(by_k.state) == {"quiet"}
    with pytest.raises(FileNotFoundError, match="holds no draft_calibration.csv"):
        bench.run(tmp_path / "out", out)
