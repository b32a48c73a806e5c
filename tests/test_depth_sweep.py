"""The oracle draft's round calibration interleaved with the runs it predicts (notebook 05's depth
sweep): one shuffled order over both parts changes no token, step or routing of either, only the
order the runs meet the machine in."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moespec.engine import Engine
from moespec.engine.calibration import depth_sweep, verify_loops
from moespec.engine.runs import oracle_sweep
from moespec.zoo import tiny_moe

TOKENS = ["steps", "emitted", "accepted", "rejections", "realized_a", "cut_short"]


@pytest.fixture(scope="module")
def engine():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield Engine(tiny_moe(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32),
                 backend="torch")
    torch.set_num_threads(before)


def _prompts(seeds):
    return [np.random.default_rng(s).integers(1, 256, size=20) for s in seeds]


def test_depth_sweep_runs_both_parts_as_their_own_sweeps_would(engine):
    cal, orc = _prompts([1, 2]), _prompts([3, 4])
    ks, a_values = [0, 1, 3], [0.5, 0.9]
    routing = []
    loops, runs = depth_sweep(engine, cal, orc, ks, a_values, n_tokens=6, n_max=3, cal_reps=2, cal_seed=7,
                              oracle_seed=0, seed=5, depth=24, first_cal_prompt=2, routing_out=routing,
                              progress=False)
    # every cell once per prompt and repetition: 2 prompts x 2 reps x (3 n x 2 kernels); 2 x 3 k x 2 a
    assert len(loops) == 2 * 2 * 6 and len(runs) == 2 * 3 * 2
    assert set(loops.prompt) == {2, 3} and set(runs.prompt) == {0, 1} and set(loops.d) == set(runs.d) == {24}
    seq = np.sort(np.r_[loops.seq, runs.seq])
    assert list(seq) == list(range(len(loops) + len(runs)))          # one order over both parts
    part = np.r_[np.zeros(len(loops)), np.ones(len(runs))][np.argsort(np.r_[loops.seq, runs.seq])]
    assert int((np.diff(part) != 0).sum()) >= 2                        # not one part after the other
    alone_loops = verify_loops(engine, cal, n_max=3, n_tokens=6, reps=2, seed=7, depth=24, first_prompt=2,
                               progress=False)
    alone_routing = []
    alone_runs = oracle_sweep(engine, orc, ks, a_values, 6, seed=0, depth=24, routing_out=alone_routing,
                              progress=False)
    for mixed, alone, key in ((loops, alone_loops, ["prompt", "n", "dedup", "rep"]),
                              (runs, alone_runs, ["prompt", "k", "a", "rep"])):
        assert list(mixed.columns) == [*alone.columns, "seq"]
        a = mixed.set_index(key).sort_index()[TOKENS]
        b = alone.set_index(key).sort_index()[TOKENS]
        assert a.equals(b)
    assert len(routing) == len(alone_routing) == 2
    assert all(np.array_equal(x, y) for x, y in zip(routing, alone_routing))
    assert (loops.loc[loops.n == 1, "tokens_per_step"] == 1).all() and (loops.k == loops.n - 1).all()


def test_depth_sweep_refuses_what_it_cannot_run(engine):
    cal, orc = _prompts([1]), _prompts([3])
    with pytest.raises(ValueError, match="calibration and oracle prompts"):
        depth_sweep(engine, [], orc, [0, 1], [0.5], n_tokens=4, progress=False)
    with pytest.raises(ValueError, match="n_max"):
        depth_sweep(engine, cal, orc, [0, 1], [0.5], n_tokens=4, n_max=0, progress=False)
    with pytest.raises(ValueError, match="one draft length"):
        depth_sweep(engine, cal, orc, [], [0.5], n_tokens=4, progress=False)
