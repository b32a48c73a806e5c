"""moespec advise --verify-times: each reader on its fixture (tests/data/verify_times, written in the
tool's own output format; README there cites the source of each), the numbers equal to the
hand-read values, the refusals (one line naming the file, line or field), the curves by hand, the
consistency with the committed run's own fits, and advise end to end from llama.cpp and vLLM."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from moespec import advice, paths
from moespec import theory as th
from moespec.advice import verify_times as vt
from moespec.advice.errors import AdviceInputError
from moespec.model_shapes import PRESETS
from moespec.predict import run_file

DATA = paths.ROOT / "tests" / "data" / "verify_times"
MMID = DATA / "llama_test_backend_ops_mul_mat_id.txt"
MOE = DATA / "vllm_benchmark_moe.txt"
TUNED = DATA / "vllm_tuned_E=128,N=768,device_name=NVIDIA_H100_80GB_HBM3.json"
COMMITTED = paths.ROOT / "figures"
QWEN3 = PRESETS["qwen3"]
Q4K_MATRIX = 768 * 2048 // 256 * 144          # one expert matrix of the fixture (m = 768, k = 2048) in q4_K


def _published_ubar(u2, u8):
    rho = th.reuse_from_byte_share(u2, u8, 9)
    return np.cumsum(1 - rho) / np.arange(1, 10)


def _row(timed, n):
    return timed.rows.set_index("n").loc[n]


# --- each reader on its fixture ------------------------------------------------------------------------
def test_test_backend_ops_lines_read_by_hand():
    """Line 'MUL_MAT_ID(type_a=q4_K,...,n=3,...): 14232 runs - 70.30 us/run': a per-slot pass (n <= 8)
    requesting n m matrices; n = 9 a deduplicating one requesting the union of uniform ids."""
    t = vt.read(MMID)
    assert t.scope == "expert" and t.fmt == "q4_k" and t.routing == "uniform random expert ids (N = 128, m = 8)"
    assert list(t.rows["n"]) == list(range(1, 10))
    three, nine = _row(t, 3), _row(t, 9)
    assert (three["kernel"], three["t_s"], three["bytes"]) == ("slot", pytest.approx(70.30e-6), 3 * 8 * Q4K_MATRIX)
    assert nine["kernel"] == "dedup" and nine["t_s"] == pytest.approx(98.70e-6)
    assert nine["bytes"] == pytest.approx(128 * (1 - (120 / 128) ** 9) * Q4K_MATRIX)
    assert vt.read(MMID, "dedup").rows["kernel"].eq("dedup").all()


def test_benchmark_moe_lines_and_tuned_json_read_by_hand():
    t = vt.read(MOE)
    assert t.model == "Qwen/Qwen3-30B-A3B" and t.fmt == "bf16" and t.bytes_per_weight == 2
    four = _row(t, 4)
    assert four["kernel"] == "dedup" and four["t_s"] == pytest.approx(84.62e-6)
    b = 3 * 2048 * 768 * 2
    assert _row(t, 1)["t_s"] == pytest.approx(41.23e-6)
    with_bytes = vt._vllm_bytes(t, QWEN3).set_index("n")
    assert with_bytes.loc[4, "bytes"] == pytest.approx(128 * (1 - (120 / 128) ** 4) * b)
    assert vt.read(TUNED) == [1, 2, 4, 8, 16, 24, 32, 48, 64]


@pytest.mark.parametrize("name,form", [("llama_bench.csv", "CSV"), ("llama_bench.json", "JSON"),
                                       ("llama_bench.md", "markdown")])
def test_llama_bench_outputs_read_by_hand(name, form):
    """CSV: -p 1-9 -n 0 (one pass of n tokens, avg_ns); JSON and markdown: -p 2520 -ub 1-9 -n 0
    (2520/n passes of n tokens; markdown from t/s)."""
    t = vt.read(DATA / name)
    assert t.source == f"llama.cpp llama-bench ({form})" and t.scope == "model"
    assert t.model == "qwen3moe 30B.A3B Q4_K - Medium" and list(t.rows["n"]) == list(range(1, 10))
    if form == "CSV":
        assert _row(t, 5)["t_s"] == pytest.approx(10_310_000e-9, rel=1e-12)      # avg_ns 10310000, one pass
    elif form == "JSON":
        assert _row(t, 7)["t_s"] == pytest.approx(4_086_000_000e-9 / 360, rel=1e-9)  # avg_ns / (2520 / 7) passes
    else:
        assert _row(t, 1)["t_s"] == pytest.approx(1 / 140.85) and _row(t, 9)["t_s"] == pytest.approx(9 / 725.82)


def test_llama_bench_jsonl_and_moespec_rows(tmp_path):
    doc = json.loads((DATA / "llama_bench.json").read_text())
    jsonl = tmp_path / "bench.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in doc))
    assert list(vt.read(jsonl).rows["t_s"]) == list(vt.read(DATA / "llama_bench.json").rows["t_s"])
    # moespec's own rows: per-slot n m b, deduplicating U b over the time (Table 1's definition)
    rows = [{"model": "olmoe", "backend": "cpp", "fmt": "f32", "layer": 0, "kind": "window", "kernel": p, "n": n,
             "m": 8, "U": min(8 * n, 8 + 4 * (n - 1)), "expert_bytes": 1000.0,
             "t_median_s": 1e-6 * (n + 1) / (1 + (p == "dedup"))}
            for n in range(1, 10) for p in ("slot", "dedup")]
    path = tmp_path / "rows.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    t = vt.read(path)
    beta = t.rows.set_index(["kernel", "n"])["bytes"]          # GB/s * 1e9 over t_s = 1
    assert beta.loc[("slot", 3)] == pytest.approx(3 * 8 * 1000 / 4e-6)
    assert beta.loc[("dedup", 3)] == pytest.approx(16 * 1000 / 2e-6)
    assert t.own["ubar"].iloc[2] == pytest.approx(16 / 24)


# --- refusals -------------------------------------------------------------------------------------------
def _refused(path, kernel=None) -> str:
    with pytest.raises(AdviceInputError) as exc:
        vt.read(path, kernel)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_refusals_name_file_line_and_field(tmp_path):
    lines = MMID.read_text().splitlines()
    bad = tmp_path / "mmid.txt"
    bad.write_text("\n".join(lines + [lines[8]]) + "\n")                       # a case twice
    assert f"{bad}:{len(lines) + 1}: MUL_MAT_ID(...): expected each case once; found a repeat of line 9" \
        in _refused(bad)
    bad.write_text("\n".join(lines).replace("type_a=q4_K", "type_a=iq2_xxs", 1) + "\n")
    assert f"{bad}:7: type_a: expected a ggml type" in _refused(bad)
    bad.write_text("\n".join(lines[:8] + [lines[8].replace("n_used=8", "n_used=6")] + lines[9:]) + "\n")
    assert f"{bad}:9: n_used: expected 8 as on line 7 (one model's experts); found 6" in _refused(bad)
    bad.write_text("\n".join(lines[:7] + ["Backend 2/2: CPU"] + lines[8:]) + "\n")
    assert f"{bad}: Backend: expected the lines of one backend" in _refused(bad)
    bad.write_text(MMID.read_text().replace("type_a=q4_K", "type_a=f16"))
    assert "type_a: expected a quantized type, or a label slot=/dedup=" in _refused(bad)

    csv = pd.read_csv(DATA / "llama_bench.csv", dtype=str)
    csv.loc[6, ["n_prompt", "n_ubatch"]] = ["7", "2"]
    csv.to_csv(bad := tmp_path / "bench.csv", index=False)
    assert f"{bad}:8: n_prompt: expected a multiple of the pass size min(n_prompt, n_batch, n_ubatch) = 2" \
        in _refused(bad)
    csv.loc[6, "n_prompt"] = "x"
    csv.to_csv(bad, index=False)
    assert f"{bad}:8: n_prompt: expected a whole number >= 0; found 'x'" in _refused(bad)
    csv = pd.read_csv(DATA / "llama_bench.csv", dtype=str)
    csv.loc[3, "n_depth"] = "512"
    csv.to_csv(bad, index=False)
    assert f"{bad}:5: model_type, n_depth: expected" in _refused(bad)

    moe = MOE.read_text().splitlines()
    (bad := tmp_path / "moe.txt").write_text("\n".join(moe[:2] + moe[3:]) + "\n")     # a time lost
    assert f"{bad}:2: Kernel time: expected a 'Kernel time: T us' line after each 'Batch size'" in _refused(bad)
    (bad := tmp_path / "tuned.json").write_text(json.dumps({"triton_version": "3.4.0", "one": {}}))
    assert f"{bad}: keys: expected batch sizes mapping to fused_moe configs" in _refused(bad)
    (bad := tmp_path / "other.txt").write_text("hello\n")
    assert f"--verify-times {bad}: not a format advise reads" in _refused(bad)
    assert "no such file" in _refused(tmp_path / "missing.txt")
    assert "label: expected no slot=/dedup= label" in _refused(COMMITTED / "02_bandwidth_by_n.csv", "slot")


def test_curve_refusals(tmp_path):
    lines = MMID.read_text().splitlines()
    (short := tmp_path / "short.txt").write_text("\n".join(lines[:-6]) + "\n")   # n = 9 missing
    cases = [({"verify_times": [str(short)], "model": "qwen3"}, "n (timed path): expected passes of every n = 1..9"),
             ({"verify_times": [str(MMID)], "model": "qwen3", "eps": None}, "give --eps"),
             ({"verify_times": [str(TUNED)], "model": "qwen3"}, "only a tuned-config JSON"),
             ({"verify_times": [str(MMID), str(MOE)], "model": "qwen3"}, "give one, or two of one kind labelled"),
             ({"verify_times": [str(DATA / "llama_bench.csv")], "trace": str(tmp_path / "t.npz")}, "does not exist"),
             ({"verify_times": [str(MMID)], "model": "mixtral"}, "--model 'mixtral': not a preset"),
             ({"verify_times": [str(MMID)], "model": "qwen3", "source": "published"}, "--source 'published'")]
    for kwargs, expected in cases:
        kwargs = {"eps": 0.05, "free_draft": True, "acceptance": [0.8], **kwargs}
        with pytest.raises(AdviceInputError) as exc:
            advice.advise(**kwargs)
        assert expected in str(exc.value) and "\n" not in str(exc.value), (kwargs, str(exc.value))


# --- the curves by hand -------------------------------------------------------------------------------------
def test_test_backend_ops_curves_by_hand():
    """tau(n) = E(n)/beta(n) + D/beta(1): per-slot E = n m W at n <= 8, the published Qwen3 byte share
    ubar(9) at n = 9 (MMQ), beta the fixture's requested bytes over its time."""
    adv = advice.advise(verify_times=[str(MMID)], model="qwen3", eps=0.05, free_draft=True, acceptance=[0.8])
    W = float(QWEN3.total_expert_bytes("q4_k"))
    rows = {r["n"]: r for r in adv["dedup"]["pass_sizes"]}
    dense = 0.5 * 8 * W * 30.50e-6 / (8 * Q4K_MATRIX)
    assert rows[3]["tau_slot_ms"] == pytest.approx(1e3 * (3 * 8 * W * 70.30e-6 / (3 * 8 * Q4K_MATRIX) + dense))
    ubar9 = _published_ubar(0.77, 0.43)[8]
    union9 = 128 * (1 - (120 / 128) ** 9)
    assert rows[9]["tau_dedup_ms"] == pytest.approx(
        1e3 * (ubar9 * 9 * 8 * W * 98.70e-6 / (union9 * Q4K_MATRIX) + dense))
    assert all(r["tau_slot_ms"] == r["tau_dedup_ms"] and r["saving_ms"] == 0 for r in rows.values())
    assert adv["subject"]["kernel_paths"] == "one" and adv["dedup"]["from_n"] is None
    ks = adv["settings"][0]["kernel_switch"]
    assert ks["text"].startswith("one kernel path timed per pass size") and ks["per_slot_up_to"] is None
    assert adv["acceptance"][0]["recommended"]["engine_name"] == advice.ONE_PATH_ENGINE
    assert any("uniform random expert ids (N = 128, m = 8): the user's union bytes go through its bandwidths"
               in a for a in adv["assumptions"])


def test_labelled_paths_give_both_kernels_and_a_crossover(tmp_path):
    """The same times read as a per-slot and as a deduplicating build: r(n) = U(n)/(n m) (the same time,
    the union's bytes), so deduplication pays where ubar(n) < r(n). A label is cut at its first '='."""
    shutil.copy(MMID, named := tmp_path / "E=128,build=a.txt")
    adv = advice.advise(verify_times=[f"slot={named}", f"dedup={MMID}"], model="qwen3", eps=0.05, free_draft=True,
                        acceptance=[0.8])
    one = advice.advise(verify_times=[f"slot={named}"], model="qwen3", eps=0.05, free_draft=True, acceptance=[0.8])
    assert one["subject"]["kernel_paths"] == "one" and one["dedup"]["pass_sizes"][8]["tau_slot_ms"] == \
        pytest.approx(adv["dedup"]["pass_sizes"][8]["tau_slot_ms"])
    assert adv["subject"]["kernel_paths"] == "both"
    n = np.arange(1, 10)
    r = 128 * (1 - (120 / 128) ** n) / (8 * n)
    ubar = _published_ubar(0.77, 0.43)
    rows = adv["dedup"]["pass_sizes"]
    assert [x["r"] for x in rows[1:]] == pytest.approx(list(r[1:]))
    assert [x["dedup_faster"] for x in rows[1:]] == list(ubar[1:] < r[1:])
    assert adv["dedup"]["from_n"] == th.crossover(np.array([x["saving_ms"] for x in rows]))


def test_vllm_curves_and_the_tuning_of_its_config():
    adv = advice.advise(verify_times=[str(MOE), str(TUNED)], eps=0.05, draft_fit="0.5,0.3", acceptance=[0.8],
                        method="eagle3")
    W = 48 * 3 * 2048 * 768 * 2.0
    b = 3 * 2048 * 768 * 2
    union = 128 * (1 - (120 / 128) ** np.arange(1, 10))
    ubar = _published_ubar(0.77, 0.43)
    t = [41.23, 58.71, 73.05, 84.62, 94.18, 101.77, 108.40, 113.96, 119.85]
    dense = 0.5 * 8 * W * t[0] * 1e-6 / (union[0] * b)
    expected = [1e3 * (ubar[i] * (i + 1) * 8 * W * t[i] * 1e-6 / (union[i] * b) + dense) for i in range(9)]
    assert [r["tau_dedup_ms"] for r in adv["dedup"]["pass_sizes"]][1:] == pytest.approx(expected[1:])
    assert adv["subject"]["model"] == "qwen3"
    assert adv["subject"]["tuned_batch_sizes"] == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    s = adv["settings"][0]
    k = s["k"]
    assert s["method"] == "eagle3" and s["vllm"]["tune"]["M"] == k + 1
    assert s["vllm"]["tune"]["runs_config_of"] == min([1, 2, 4, 8, 16, 24, 32, 48, 64], key=lambda x: abs(x - k - 1))
    assert "your tuned config's sizes 1, 2, 4, 8, 16, 24, 32, 48, 64" in s["vllm"]["tune"]["note"]


# --- consistency with the run's own fits --------------------------------------------------------------------
def test_own_benchmark_gives_the_runs_kernel_switch_and_k(tmp_path):
    """Notebook 02's per-n table of the committed run (02_bandwidth_by_n.csv, its windows' routing)
    against advise from the same run's fits (notebook 03's tables, a fits-only run file), same draft,
    eps and dense bytes: the same kernel switch at every acceptance rate, the same k wherever the fits
    call k certain, and elsewhere a k inside the fits' band (the two differ by the fits' error, within eps)."""
    shutil.copytree(COMMITTED, tmp_path / "figures", ignore=lambda d, names: [
        n for n in names if n not in run_file.SOURCE_FILES["expert_op_fits"][0]])
    run_file.write_run_file(tmp_path)
    same_k = 0
    for a in np.arange(0.05, 0.96, 0.05):
        fits = advice.advise(tmp_path, [a], draft_fit="0.2,0.1")
        ours = advice.advise(verify_times=[str(COMMITTED / "02_bandwidth_by_n.csv")], acceptance=[a],
                             eps=fits["error"]["eps"], draft_fit="0.2,0.1")
        assert {k: ours["dedup"][k] for k in ("from_n", "guaranteed_from_n")} == \
            {k: fits["dedup"][k] for k in ("from_n", "guaranteed_from_n")}
        f, o = fits["acceptance"][0]["recommended"], ours["acceptance"][0]["recommended"]
        band = fits["acceptance"][0]["engines"][f["engine"]]
        inside = [k for k in range(9) if band["speedup_hi_by_k"][k] >= f["speedup_lo"]]
        assert o["k"] == f["k"] if f["k_certain"] else o["k"] in inside, (a, f, o)
        same_k += o["k"] == f["k"]
    assert same_k >= 16           # of 19 acceptance rates


# --- end to end ------------------------------------------------------------------------------------------------
def _cli(*argv):
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    return subprocess.run([sys.executable, "-m", "moespec.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300)


def test_advise_end_to_end_from_llama_cpp_and_vllm(tmp_path):
    out = _cli("advise", "--verify-times", str(MMID), "--model", "qwen3", "--eps", "0.05", "--draft-fit", "0.5,0.3",
               "-a", "0.8", "--method", "mtp", "--json", str(tmp_path / "l.json"))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 30 and max(map(len, lines)) <= 120, out.stdout
    assert "Kernel switch: one kernel path timed per pass size" in out.stdout and "--spec-type draft-mtp" in out.stdout
    adv = json.loads((tmp_path / "l.json").read_text())
    advice.validate(adv)
    assert adv["inputs"] == [str(MMID)] and adv["settings"][0]["method"] == "mtp"
    out = _cli("advise", "--verify-times", str(MOE), str(TUNED), "--eps", "0.05", "--draft-fit", "0.5,0.3", "-a", "0.8",
               "--explain", "--json", str(tmp_path / "v.json"))
    assert out.returncode == 0, out.stderr
    adv = json.loads((tmp_path / "v.json").read_text())
    k = adv["acceptance"][0]["recommended"]["k"]
    assert f"vLLM Triton fused_moe for M = {k + 1}: python benchmarks/kernels/benchmark_moe.py" in out.stdout
    assert "try_get_optimal_moe_config runs the config of the nearest tuned batch size" in out.stdout
    bad = _cli("advise", "--verify-times", str(MMID), "--model", "qwen3", "--free-draft", "-a", "0.8")
    assert bad.returncode == 1 and bad.stderr.strip().endswith("give --eps (the fit's error on your routing, or the "
                                                                "benchmark's spread)")
