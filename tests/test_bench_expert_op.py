"""The expert-operation benchmark on tiny shapes: rows, provenance, resume after an interruption."""

from __future__ import annotations

import json

import numpy as np
import pytest

from moespec import fit
from moespec.measure import expert_op, timing
from moespec.routing import synthetic
from moespec.routing.stats import pass_union

CFG = expert_op.BenchConfig(model="gpt-oss", fmt="f32", backend="torch", hidden=64, intermediate=32,
                            layers=(0, 1), ns=(1, 2, 3), u_count=3, windows_per_n=2, reps=3, warmup=0,
                            flush_bytes=0, membw_bytes=2**16, interleave="n")


def trace():   # gpt-oss's routing shape: 24 MoE layers, N = 32, m = 4
    return synthetic.uniform(2, 16, 24, 32, 4, seed=1, source="synthetic uniform (test)")


class Interrupt(Exception):
    pass


class CountingTimer:
    """Fake timer: runs the call, returns 1000 ns; raises after ``limit`` calls."""

    def __init__(self, limit=None):
        self.calls, self.limit = 0, limit

    def __call__(self, fn):
        self.calls += 1
        if self.limit is not None and self.calls > self.limit:
            raise Interrupt
        fn()
        return 1000.0


def test_rows_and_sidecar(tmp_path):
    run_dir = expert_op.run(CFG, out_dir=tmp_path, trace=trace(), progress=False, timer=CountingTimer())
    rows = expert_op.load_rows(run_dir)
    side = json.loads((run_dir / "provenance.json").read_text())
    assert side["status"] == "complete" and side["trace_source"] == "synthetic uniform (test)"
    assert "hardware" in side["provenance"] and side["config"]["model"] == "gpt-oss"
    timed = rows[~rows["kind"].isin(["membw", "ceiling"])]
    # per (layer, n): chosen U grid (n=1: {4}; n=2: 4,6,8; n=3: 4,8,12) + 2 windows, both kernels
    assert len(timed) == 2 * 2 * ((1 + 2) + (3 + 2) + (3 + 2))
    assert set(rows["kind"]) == {"chosen", "window", "membw", "ceiling"}
    assert (rows["kind"] == "membw").sum() == 6
    # the read ceiling: every pattern in every group, each over its 3 buffers of 1 MiB (the probe's least)
    ceiling = rows[rows["kind"] == "ceiling"]
    assert len(ceiling) == 6 * 4 and set(ceiling["kernel"]) == {"halves", "lanes", "whole", "side"}
    assert (ceiling["pass_id"] == "ceiling:" + ceiling["kernel"]).all()
    assert set(ceiling.loc[ceiling["kernel"] == "halves", "requested_bytes"]) == {3 * 2**20}
    # the flush and the cold size recorded beside the rows and in the sidecar
    cold = side["cold"]
    assert cold["flush_bytes"] == 0 and cold["read_bytes"] == 2**16 and cold["ceiling"]["buffers"] == 3
    assert cold["cold_bytes"] == timing.flush_bytes(cache=cold["cache"])
    assert set(rows["cold_bytes"]) == {cold["cold_bytes"]} and set(rows["flush_bytes"]) == {0}
    b = 3 * 64 * 32 * 4
    slot = timed[timed["kernel"] == "slot"]
    dedup = timed[timed["kernel"] == "dedup"]
    assert (slot["requested_bytes"] == slot["n"] * 4 * b).all()
    assert (dedup["requested_bytes"] == dedup["U"] * b).all()
    chosen2 = sorted(timed[(timed["kind"] == "chosen") & (timed["n"] == 2)]["U"].unique())
    assert chosen2 == [4, 6, 8]
    assert np.allclose(timed["t_median_s"], 1e-6) and (timed["reps"] == 3).all()
    assert set(rows["run_id"]) == {side["run_id"]}
    fit.check_rows(rows)  # the rows pass the fits' checks


def test_resume_after_interruption_times_only_the_rest(tmp_path):
    full = CountingTimer()
    ref_dir = expert_op.run(CFG, out_dir=tmp_path / "ref", trace=trace(), progress=False, timer=full)
    first = CountingTimer(limit=40)
    with pytest.raises(Interrupt):
        expert_op.run(CFG, out_dir=tmp_path / "x", trace=trace(), progress=False, timer=first)
    partial = expert_op.load_rows(next((tmp_path / "x").iterdir()))
    assert 0 < len(partial) < len(expert_op.load_rows(ref_dir))
    second = CountingTimer()
    run_dir = expert_op.run(CFG, out_dir=tmp_path / "x", trace=trace(), progress=False, timer=second)
    assert len(list((tmp_path / "x").iterdir())) == 1, "resume must continue the same run folder"
    rows, ref = expert_op.load_rows(run_dir), expert_op.load_rows(ref_dir)
    key = ["layer", "n", "pass_id", "kernel"]
    assert sorted(map(tuple, rows[key].astype(str).values)) == sorted(map(tuple, ref[key].astype(str).values))
    assert second.calls < full.calls
    # a finished run is not resumed: a new call starts a new run
    expert_op.run(CFG, out_dir=tmp_path / "x", trace=trace(), progress=False, timer=CountingTimer())
    assert len(list((tmp_path / "x").iterdir())) == 2


def test_group_passes_deterministic_and_exact_u():
    spec = CFG.spec()
    a = expert_op.group_passes(CFG, spec, trace(), 1, 3)
    b = expert_op.group_passes(CFG, spec, trace(), 1, 3)
    assert [p["pass_id"] for p in a] == [p["pass_id"] for p in b]
    assert all((p["ids"] == q["ids"]).all() for p, q in zip(a, b))
    for p in a:
        if p["kind"] == "chosen":
            assert f"c{pass_union(p['ids'], spec.num_experts)}" == p["pass_id"]


def test_trace_must_match_the_model(tmp_path):
    """A trace of another shape (N, m, or only its L MoE layers) is refused by name, never timed at gpt-oss's."""
    bad = synthetic.uniform(1, 8, 24, 64, 8, seed=0)
    with pytest.raises(ValueError, match=r"expected the shape of gpt-oss-shrunk \(L = 24 MoE layers, N = 32 experts, "
                                         r"m = 4 per token\); found L = 24 MoE layers, N = 64 experts, m = 8"):
        expert_op.run(CFG, out_dir=tmp_path, trace=bad, progress=False, timer=CountingTimer())
    with pytest.raises(ValueError, match=r"ids \(layers, L\): expected .*found L = 2 MoE layers"):
        expert_op.run(CFG, out_dir=tmp_path, trace=synthetic.uniform(1, 8, 2, 32, 4, seed=0), progress=False,
                      timer=CountingTimer())


def test_synthetic_routing_is_labelled():
    tr = expert_op.synthetic_routing("olmoe", num_docs=1, doc_len=8)
    assert "calibrated to paper 1" in tr.label and tr.num_layers == 16
    tr = expert_op.synthetic_routing("deepseek-v2-lite", num_docs=1, doc_len=8)
    assert "uniform" in tr.label


def test_layer_interleave_times_the_same_passes_in_one_group(tmp_path):
    import dataclasses

    cfg = dataclasses.replace(CFG, interleave="layer")
    timer = CountingTimer()
    rows = expert_op.load_rows(expert_op.run(cfg, out_dir=tmp_path / "l", trace=trace(), progress=False,
                                             timer=timer))
    ref = expert_op.load_rows(expert_op.run(CFG, out_dir=tmp_path / "n", trace=trace(), progress=False,
                                            timer=CountingTimer()))
    key = ["layer", "n", "pass_id", "kernel", "U"]
    timed = lambda df: sorted(map(tuple, df[df["kind"].isin(["chosen", "window"])][key].astype(str).values))  # noqa
    assert timed(rows) == timed(ref)
    reads = rows[rows["kind"] == "membw"]
    assert len(reads) == 2 and set(reads["n"]) == {0}   # one read per layer group, n = 0: all n
    by_n = expert_op.read_bandwidth(rows, by_n=True)
    assert by_n["n"].tolist() == [1, 2, 3] and by_n["read_GBps"].nunique() == 1
    with pytest.raises(ValueError, match="interleave"):
        expert_op.run(dataclasses.replace(CFG, interleave="bogus"), out_dir=tmp_path / "b", trace=trace(),
                      progress=False, timer=CountingTimer())


def _engine_run(root, backend, true, run_id):
    """A run folder as bench_engine_fits.py writes one, with exact times of known coefficients
    (test_fit.synthetic_rows) and one read per layer of 2**30 bytes in 40 ms."""
    import pandas as pd
    from test_fit import synthetic_rows

    rows = synthetic_rows(noise=0.0, true=true).assign(backend=backend, run_id=run_id)
    rows["requested_bytes"] = [expert_op.requested_bytes(k, n, m, U, b) for k, n, m, U, b in
                               rows[["kernel", "n", "m", "U", "expert_bytes"]].itertuples(index=False)]
    reads = pd.DataFrame([dict(run_id=run_id, model="toy", backend=backend, fmt="bf16", layer=layer, kind="membw",
                               kernel="read", n=0, m=8, U="", expert_bytes="", requested_bytes=2**30,
                               t_median_s=0.04, pass_id="read") for layer in (0, 1)])
    folder = root / run_id
    folder.mkdir()
    pd.concat([reads, rows], ignore_index=True).to_csv(folder / "rows.csv", index=False)
    return folder


def test_engine_fits_recover_each_engines_coefficients(tmp_path):
    from test_fit import TRUE

    from moespec.tables.bandwidth import engine_fits, load_engine_fit_runs

    slower = {k: {name: 2 * v for name, v in coefs.items()} for k, coefs in TRUE.items()}
    decisions = load_engine_fit_runs([_engine_run(tmp_path, "cpp", TRUE, "a"), _engine_run(tmp_path, "ggml", slower, "b")])
    assert list(decisions) == ["moespec CPU, run a", "llama.cpp CPU (ggml MUL_MAT_ID; per-slot: one call per token), run b"]
    coefs, eps = engine_fits(decisions)
    for (label, true) in zip(decisions, (TRUE, slower)):
        mine = coefs[coefs.engine == label]
        assert len(mine) == 4                            # 2 layers x 2 kernels
        for r in mine.itertuples():
            for name, value in true[r.kernel].items():
                assert getattr(r, name) == pytest.approx(value, rel=1e-6), (label, r.kernel, name)
        assert mine["reread_cost"].dropna().to_numpy() == pytest.approx(0.8 / 3)
        slot = mine[mine.kernel == "slot"]
        assert slot["c_u_GBps"].to_numpy() == pytest.approx(1e-9 / true["slot"]["c_u"])   # 33.3 GB/s (TRUE)
        assert slot["t_op_ms"].to_numpy() == pytest.approx(true["slot"]["t_op"] * 1e3)
    assert eps["eps_engine"].to_numpy() == pytest.approx([0, 0], abs=1e-9)
    assert eps["read_GBps"].to_numpy() == pytest.approx([2**30 / 0.04 / 1e9] * 2)


def test_engine_fit_run_of_two_backends_refused(tmp_path):
    import pandas as pd
    from test_fit import TRUE

    from moespec.tables.bandwidth import load_engine_fit_runs

    folder = _engine_run(tmp_path, "cpp", TRUE, "a")
    rows = pd.read_csv(folder / "rows.csv")
    rows.loc[rows.index[-1], "backend"] = "ggml"
    rows.to_csv(folder / "rows.csv", index=False)
    with pytest.raises(ValueError, match=r"one backend, found \['cpp', 'ggml'\]"):
        load_engine_fit_runs([folder])


def test_ggml_backend_errors():
    with pytest.raises(ValueError, match="kernel must be 'slot' or 'dedup'"):
        expert_op.ggml_forward(None, None, None, kernel="fused")
    with pytest.raises(ValueError, match="runs on the CPU"):
        expert_op.run(expert_op.BenchConfig(backend="ggml", device="cuda"), out_dir="/nonexistent")


BATCH_CFG = expert_op.BenchConfig(model="gpt-oss", fmt="f32", backend="torch", hidden=64, intermediate=32,
                                  layers=(0,), ns=(1, 2, 3), batch_sizes=(1, 2, 4), windows_per_n=2, reps=3,
                                  warmup=0, flush_bytes=0, membw_bytes=2**16)


def batch_trace():   # gpt-oss's routing shape, 5 documents of 16 tokens
    return synthetic.uniform(5, 16, 24, 32, 4, seed=2, source="synthetic uniform (batch test)")


def test_batch_mode_rows_carry_b_and_k_plus_1(tmp_path):
    """Batch mode: every (B, k + 1) pass is B windows of k + 1 tokens from B different documents,
    n = B·(k + 1), U counted on the whole pass, both kernels, in one interleaved group with the reads."""
    tr = batch_trace()
    run_dir = expert_op.run(BATCH_CFG, out_dir=tmp_path, trace=tr, progress=False, timer=CountingTimer())
    rows = expert_op.load_rows(run_dir)
    assert list(rows.columns) == expert_op.BATCH_FIELDS
    timed = rows[rows["kind"] == "batch"]
    assert set(rows["kind"]) == {"batch", "membw", "ceiling"}
    assert len(timed) == 3 * 3 * 2 * 2   # (B, k + 1) x windows_per_n x kernels
    assert (timed["n"] == timed["B"] * timed["k_plus_1"]).all()
    assert sorted(set(zip(timed["B"], timed["k_plus_1"]))) == [(b, w) for b in (1, 2, 4) for w in (1, 2, 3)]
    assert set(rows.loc[rows["kind"] == "membw", "n"]) == {0}   # one group: every n of the layer
    for _, r in timed.iterrows():
        where = [tuple(map(int, part.split(":"))) for part in r["window"].split("+")]
        assert len(where) == r["B"] and len({d for d, _ in where}) == r["B"]   # B different documents
        ids = np.concatenate([tr.docs[d][s:s + int(r["k_plus_1"]), 0, :] for d, s in where])
        assert r["U"] == pass_union(ids, 32)
        assert r["requested_bytes"] == (r["U"] if r["kernel"] == "dedup" else r["n"] * 4) * 3 * 64 * 32 * 4
    assert timed.groupby("pass_id")["kernel"].apply(lambda k: sorted(k) == ["dedup", "slot"]).all()
    fit.check_rows(rows)
    side = json.loads((run_dir / "provenance.json").read_text())
    assert side["config"]["batch_sizes"] == [1, 2, 4]


def test_batch_mode_leaves_the_other_runs_config_hash():
    """A run without batch sizes hashes its configuration as before the field existed."""
    assert "batch_sizes" not in CFG.as_dict() and CFG.pass_sizes() == (1, 2, 3)
    assert BATCH_CFG.pass_sizes() == (1, 2, 3, 4, 6, 8, 12)


def test_batch_mode_refuses_a_trace_with_too_few_documents(tmp_path):
    with pytest.raises(ValueError, match=r"batch mode needs 4 documents of >= 3 tokens .*found 3"):
        expert_op.run(BATCH_CFG, out_dir=tmp_path, trace=synthetic.uniform(3, 16, 24, 32, 4, seed=0),
                      progress=False, timer=CountingTimer())
    with pytest.raises(ValueError, match="expected a routing trace"):
        expert_op.run(BATCH_CFG, out_dir=tmp_path, trace=None, progress=False, timer=CountingTimer())


def test_batch_windows_from_distinct_documents():
    from moespec.measure.ids import batch_windows

    docs = [np.arange(d * 100, d * 100 + 10 * 2).reshape(10, 1, 2) for d in range(4)]
    docs.append(np.zeros((2, 1, 2)))    # too short for k + 1 = 3: never drawn
    for where, ids in batch_windows(docs, 0, 4, 3, 5, np.random.default_rng(0)):
        assert sorted(d for d, _ in where) == [0, 1, 2, 3] and ids.shape == (12, 2)
        assert np.array_equal(ids, np.concatenate([docs[d][s:s + 3, 0] for d, s in where]))
    with pytest.raises(ValueError, match=r"expected at least 5 documents of >= 3 tokens .*found 4"):
        batch_windows(docs, 0, 5, 3, 1, np.random.default_rng(0))
