"""benchmarks/round_resolution.py on hand-made runs: rounds per run, what one round is worth, which
prompts' rounds changed from k - 1, and the refusals."""

from __future__ import annotations

import pandas as pd
import pytest

from bench_scripts import load_benchmark

rr = load_benchmark("round_resolution")


def _runs(steps: dict) -> pd.DataFrame:
    """One deduplicating test run per (prompt, k) with the given rounds and 32 tokens, plus a per-slot
    run and a plain run that are not counted."""
    rows = [{"draft_cost": 0.0, "k": k, "dedup": True, "prompt": p, "rep": 0, "steps": s, "emitted": 32}
            for (p, k), s in steps.items()]
    rows.append({**rows[0], "dedup": False, "steps": 1})
    rows.append({"draft_cost": float("nan"), "k": 0, "dedup": True, "prompt": 0, "rep": 0, "steps": 32, "emitted": 32})
    return pd.DataFrame(rows)


def test_rounds_and_one_round_share():
    steps = {(0, 6): 8, (1, 6): 7, (2, 6): 16, (0, 7): 8, (1, 7): 6, (2, 7): 16}
    table = rr.resolution(_runs(steps)).set_index("k")
    assert table.loc[6, ["rounds_min", "rounds_median", "rounds_max"]].tolist() == [7, 8, 16]
    assert table.loc[6, "one_round_share"] == pytest.approx(8 / 7 - 1)
    assert table.loc[7, "rounds_median"] == 8 and table.loc[7, "prompts_changed"] == 1   # prompt 1: 7 -> 6 rounds
    assert table.loc[7, "tokens_per_step_median"] == pytest.approx(32 / 8)
    assert pd.isna(table.loc[6, "prompts_changed"])                 # no k = 5 runs to compare with


def test_refusals():
    with pytest.raises(ValueError, match=r"lack column\(s\) \['steps'\]"):
        rr.resolution(_runs({(0, 1): 3}).drop(columns="steps"))
    with pytest.raises(ValueError, match="fewer than one round"):
        rr.resolution(_runs({(0, 1): 0}))
