"""moespec advise --batch-sizes: k*(B) from V(k, B) (moespec.advice.batch), B = 1 the single-sequence
decision number for number, the verify times at n = B(k + 1) by hand from the rows and the fit, and the
schedules read back the way vLLM and SGLang read them (their sources, docs/advise.md)."""

from __future__ import annotations

import bisect
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from moespec import advice, paths
from moespec.advice import settings as st
from moespec.advice.errors import AdviceInputError
from moespec.predict.run_file import read_run_file
from moespec.routing import batch_union, synthetic

RUN = paths.ROOT / "figures"
BS = [1, 2, 4, 8, 16]


def _trace(layers=4, experts=64, m=8):
    """A routing trace of the committed run's model shape: 4 MoE layers x m = 8 = 32 pairs per token."""
    return synthetic.sticky(16, 80, layers, experts, m, keep=0.45, working_set=24, seed=1)


@pytest.fixture(scope="module")
def run_advice():
    return advice.advise(RUN, batch_sizes=BS[1:], trace=_trace(), method="eagle3")


def test_batch_one_is_the_single_sequence_decision(run_advice):
    rec = run_advice["acceptance"][0]["recommended"]
    one = run_advice["batch_schedule"]["rows"][0]
    assert (one["B"], one["engine"], one["k"], one["speedup"]) == (1, rec["engine"], rec["k"], rec["speedup"])
    assert one["verify_from"] == ["row"] * 9
    rm = read_run_file(RUN, ValueError).round_models.get("quiet", "chat", "the run's own draft (as trained)")
    V = rm.step_times(rec["engine"], run_advice["dedup"]["from_n"])
    assert one["engines"][rec["engine"]]["step_ms"] == [1e3 * float(v) for v in V]


def test_verify_times_at_batch_by_hand(run_advice):
    """(E.1): t = t_op + c_g U + c_t n, fitted to the rows; a row at n moves by c_g (U(B) - U_row(n)), beyond the rows
    the fit plus its residual at n = 9."""
    sched = run_advice["batch_schedule"]
    f = sched["fits"]["dedup"]
    rm = read_run_file(RUN, ValueError).round_models.get("quiet", "chat", "the run's own draft (as trained)")
    rows, U_rows = rm.verify["dedup"].values_s, rm.routing.distinct
    dh = rm.draft.term.values_s + rm.host.values_s
    by_B = {r["B"]: r for r in sched["rows"]}
    two = by_B[2]
    U2 = batch_union(_trace(), 2, 9).sum(axis=0)
    assert two["union_pairs"] == pytest.approx(U2.tolist())
    # B = 2, k = 0..3: n = 2, 4, 6, 8 are rows
    for k in range(4):
        n = 2 * (k + 1)
        tau = rows[n - 1] + f["c_g"] * (U2[k] - U_rows[n - 1])
        assert two["engines"]["dedup"]["step_ms"][k] == pytest.approx(1e3 * (dh[k] + tau), rel=1e-12)
        assert two["verify_from"][k].startswith("row")
    # B = 16, k = 0: n = 16, past the rows
    U16 = batch_union(_trace(), 16, 9).sum(axis=0)
    fit = lambda n, U: f["t_op"] + f["c_g"] * U + f["c_t"] * n       # noqa: E731
    tau = fit(16, U16[0]) + rows[8] - fit(9, U_rows[8])
    assert by_B[16]["engines"]["dedup"]["step_ms"][0] == pytest.approx(1e3 * (dh[0] + tau), rel=1e-12)
    assert by_B[16]["verify_from"][0].startswith("fit")
    # per-slot (4): t = t_op + c_u U + c_re (n m L - U), m L = 32
    g = sched["fits"]["slot"]
    tau = rm.verify["slot"].values_s[3] + (g["c_u"] - g["c_re"]) * (U2[1] - U_rows[3])
    assert by_B[2]["engines"]["slot"]["step_ms"][1] == pytest.approx(1e3 * (dh[1] + tau), rel=1e-12)
    for r in sched["rows"]:   # k*(B): the smallest maximizer of E(k)/V(k, B), speedup over plain at the same B
        E = np.asarray(run_advice["acceptance"][0]["tokens_per_step"])
        T = E / np.asarray(r["engines"][r["engine"]]["step_ms"])
        assert r["k"] == int(np.argmax(T)) and r["speedup"] == pytest.approx(T[r["k"]] / T[0], rel=1e-12)
        assert r["throughput_per_batch"] == pytest.approx(r["B"] * r["throughput_per_sequence"])


def _vllm_k(schedule, num_speculative_tokens, bs):
    """vLLM's reading (vllm/v1/spec_decode/dynamic/utils.py @ 14b450ca590c): first range at 1, sorted, inclusive;
    a gap takes the previous K, past the last range its K; K clamped to num_speculative_tokens."""
    assert schedule[0][0] == 1 and all(a[1] < b[0] for a, b in zip(schedule, schedule[1:]))
    assert all(lo <= hi and k >= 0 for lo, hi, k in schedule)
    k = None
    for lo, hi, kk in schedule:
        if lo <= bs:
            k = kk
    return min(num_speculative_tokens, k)


def _sglang_k(config, bs, cuda_graph_bs=None):
    """SGLang's reading (adaptive_step_router.py @ a12239f6ac74): pad to the next CUDA-graph size, then the
    largest key not above it; one candidate step per slot."""
    keys = sorted(int(x) for x in config)
    if cuda_graph_bs:
        i = bisect.bisect_left(cuda_graph_bs, bs)
        bs = cuda_graph_bs[i] if i < len(cuda_graph_bs) else bs
    key = keys[max(0, bisect.bisect_right(keys, bs) - 1)]
    (k,) = config[str(key)]["candidate_steps"]
    return k


def test_schedules_read_back_as_the_engines_read_them(run_advice):
    sched = run_advice["batch_schedule"]
    k_of = {r["B"]: r["k"] for r in sched["rows"]}
    spec = json.loads(sched["vllm_cli"].split("--speculative-config ", 1)[1].strip("'"))
    assert spec["num_speculative_tokens_per_batch_size"] == sched["vllm"] == sched["ranges"]
    assert spec["num_speculative_tokens"] == max(k_of.values()) and spec["method"] == "eagle3"
    for B, k in k_of.items():
        assert _vllm_k(sched["vllm"], spec["num_speculative_tokens"], B) == k
        assert _sglang_k(sched["sglang"], B) == k
    assert "--speculative-adaptive --speculative-adaptive-config adaptive_config.json" in sched["sglang_cli"]


def test_ranges_by_hand():
    assert st.schedule_ranges({1: 5, 2: 4, 4: 4, 8: 1, 16: 0}) == [[1, 1, 5], [2, 7, 4], [8, 15, 1], [16, 16, 0]]
    assert st.schedule_ranges({1: 3}) == [[1, 1, 3]]
    s = st.batch_schedule_settings({1: 0, 4: 0}, "eagle3", "T", "D")
    assert s["vllm"] is None and s["vllm_cli"] is None and s["sglang"] == {"1": {"candidate_steps": [0]}}
    s = st.batch_schedule_settings({1: 2, 4: 1}, "draft_model", "T", "D")
    assert s["sglang_cli"] is None and "EAGLE/EAGLE3" in s["note"]
    mtp = st.batch_schedule_settings({1: 2, 4: 1}, "mtp", "T", "D")
    assert "--speculative-algorithm EAGLE " in mtp["sglang_cli"]
    for k_of in ({1: 4, 3: 2, 5: 2, 9: 0}, {1: 1, 2: 3}):
        s = st.batch_schedule_settings(k_of, "eagle3", "T", "D")
        for B in range(1, 20):
            decided = max(b for b in k_of if b <= B)
            assert _vllm_k(s["vllm"], max(k_of.values()), B) == _sglang_k(s["sglang"], B) == k_of[decided]


def test_a_bandwidth_table_at_batch_sizes():
    tr = synthetic.sticky(12, 60, 16, 64, 8, keep=0.4, working_set=20, seed=2, model="OLMoE")
    adv = advice.advise(bandwidth=paths.reference_dir() / "paper1_table1_bandwidth.csv", engine="llama.cpp CUDA",
                        model="OLMoE", trace=tr, acceptance=[0.8], free_draft=True, batch_sizes=[2, 4])
    rows = adv["batch_schedule"]["rows"]
    assert [r["B"] for r in rows] == [1, 2, 4] and rows[0]["k"] == adv["acceptance"][0]["recommended"]["k"]
    assert "byte share" in " ".join(adv["batch_schedule"]["assumptions"])
    advice.validate(adv)


def test_refusals():
    with pytest.raises(AdviceInputError, match="needs the union of B sequences"):
        advice.advise(RUN, batch_sizes=[4])
    with pytest.raises(AdviceInputError, match="--batch-sizes 0"):
        advice.advise(RUN, batch_sizes=[0], trace=_trace())
    with pytest.raises(AdviceInputError, match="not of the run's model"):
        advice.advise(RUN, batch_sizes=[2], trace=_trace(layers=2))
    only_one = advice.advise(RUN, batch_sizes=[1])          # B = 1 alone needs no trace
    assert only_one["batch_schedule"]["ranges"] == [[1, 1, only_one["acceptance"][0]["recommended"]["k"]]]


def test_cli_writes_the_sglang_file(tmp_path):
    _trace().save(tmp_path / "t.npz")
    out = subprocess.run([sys.executable, "-m", "moespec.cli", "advise", str(RUN), "--batch-sizes", "2", "8",
                          "--trace", str(tmp_path / "t.npz"), "--method", "eagle3", "--json", str(tmp_path / "a.json"),
                          "--sglang-adaptive-config", str(tmp_path / "sg.json")], capture_output=True, text=True,
                         cwd=paths.ROOT, env={**os.environ, "PYTHONPATH": str(paths.ROOT)}, timeout=300)
    assert out.returncode == 0, out.stderr
    adv = json.loads((tmp_path / "a.json").read_text())
    assert json.loads((tmp_path / "sg.json").read_text()) == adv["batch_schedule"]["sglang"]
    assert f"--speculative-adaptive-config {tmp_path / 'sg.json'}" in " ".join(out.stdout.split())
    assert "k*" in out.stdout and "ranges: B = 1" in out.stdout


def test_where_speculation_stops_paying(run_advice):
    """k*(B) = 0 from B on through the largest B given, else None; the theory's stops_paying on the same V(k, B)
    agrees where acceptance is geometric."""
    from moespec import theory as th
    adv = advice.advise(RUN, acceptance=[0.6], batch_sizes=[2, 4, 8, 16, 32, 64], trace=_trace())
    sched = adv["batch_schedule"]
    ks = [r["k"] for r in sched["rows"]]
    V = {r["B"]: np.asarray(r["engines"][r["engine"]]["step_ms"]) for r in sched["rows"]}
    stops = th.stops_paying(V, 0.6)
    assert sched["speculation_stops_from"] == stops and stops > 2 and max(ks) > 0
    assert all((k == 0) == (r["B"] >= stops) for r, k in zip(sched["rows"][1:], ks[1:]))
    assert run_advice["batch_schedule"]["speculation_stops_from"] is None


def test_one_kernel_path_keeps_the_decisions_engine():
    """Verify times of one kernel path per pass size (an engine's benchmark without slot=/dedup= labels): no engine
    to choose between at any B, and the answer says so."""
    tr = synthetic.sticky(8, 40, 48, 128, 8, keep=0.5, working_set=30, seed=3, model="qwen3")
    adv = advice.advise(verify_times=[str(paths.ROOT / "tests" / "data" / "verify_times" /
                                          "llama_test_backend_ops_mul_mat_id.txt")],
                        model="qwen3", eps=0.05, free_draft=True, acceptance=[0.8], trace=tr, batch_sizes=[2, 8])
    sched = adv["batch_schedule"]
    assert {r["engine"] for r in sched["rows"]} == {adv["acceptance"][0]["recommended"]["engine"]}
    assert any("one kernel path" in a for a in sched["assumptions"])


def test_the_docs_numbers_are_this_runs():
    """docs/advise.md quotes the committed run with this file's trace; the numbers must be the ones advise gives."""
    import re
    text = " ".join((paths.ROOT / "docs" / "advise.md").read_text().split())
    rows = {r["B"]: r for r in advice.advise(RUN, batch_sizes=[2, 4, 8, 16, 32, 64], trace=_trace())
            ["batch_schedule"]["rows"]}
    quoted = (f"{rows[1]['speedup']:.3f} (k* = {rows[1]['k']}) at B = 1, {rows[2]['speedup']:.3f} at B = 2, "
              f"{rows[4]['speedup']:.3f} at B = 4, {rows[8]['speedup']:.3f} (k* = {rows[8]['k']}) at B = 8, "
              f"{rows[64]['speedup']:.3f} (k* = {rows[64]['k']}) at B = 64")
    assert quoted in text, re.findall(r"1\.\d{3} \(k\* = \d\) at B = 1.{0,160}", text)
    geo = {r["B"]: r["k"] for r in advice.advise(RUN, acceptance=[0.6], batch_sizes=[2, 4, 8, 16, 32, 64],
                                                 trace=_trace())["batch_schedule"]["rows"]}
    assert geo == {1: 0, 2: 1, 4: 1, 8: 1, 16: 1, 32: 0, 64: 0}
    assert "k* = 0 at B = 1, 1 at B = 2..16, 0 from B = 32" in text
