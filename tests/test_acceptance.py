"""Acceptance profiles as the engines measure them (moespec.acceptance), `moespec acceptance`,
advise deciding from a profile, the run file's profile (schema version 2) and the regret of
advise's k. The fixtures in tests/fixtures/acceptance are written from each engine's source or
docs (docs/advise.md, "Acceptance from your engine"); the vLLM ones are one constructed run of
1000 verify steps of K = 3 drafts, 812 / 654 / 500 of them accepting at least 1 / 2 / 3."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moespec import acceptance as A
from moespec import advice, paths
from moespec.advice import AdviceInputError
from moespec.advice.measured import regret
from moespec.predict import run_file

FIX = Path(__file__).parent / "fixtures" / "acceptance"
COMMITTED = paths.ROOT / "figures"
RUN_G = [1.812, 2.466, 2.966]          # the constructed run, counted by hand: 1 + 0.812, + 0.654, + 0.500


def _G(*names, **kw):
    return A.load([FIX / n for n in names], **kw)


# --- every format: G(k) equal to the hand count ---------------------------------------------------------
@pytest.mark.parametrize("files, fmt, G", [
    (["vllm_metrics_one_scrape.txt"], "vllm-prometheus", RUN_G),
    (["vllm_metrics_before.txt", "vllm_metrics_after.txt"], "vllm-prometheus", RUN_G),
    (["vllm_log.txt"], "vllm-log", RUN_G),
    (["vllm_requests.jsonl"], "vllm-requests", RUN_G),
    # cmpl-d: 39 / 1 / 0 / 3 steps accept 0..3; cmpl-e: 10 / 5 / 5 / 20: 83 steps, at least 1/2/3: 34, 28, 23
    (["vllm_requests_per_choice.json"], "vllm-requests", [1 + 34 / 83, 1 + 62 / 83, 1 + 85 / 83]),
    # r1: 30 / 20 / 10 / 40, r2: 50 / 30 / 10 / 10: 200 steps, at least 1/2/3: 120, 70, 50
    (["sglang_generate.jsonl"], "sglang-requests", [1.6, 1.95, 2.2]),
    (["sglang_sglext.json"], "sglang-requests", [1.4, 1.6, 1.7]),          # 60 / 20 / 10 / 10 of 100
    (["llamacpp_metrics.txt"], "llamacpp-prometheus", RUN_G),
    (["llamacpp_log.txt"], "llamacpp-log", RUN_G),
    # the two-line form: "mean len" and, at trace verbosity, "acc per pos" of the same slot and task
    (["llamacpp_log_split.txt"], "llamacpp-log", RUN_G),
])
def test_G_is_the_hand_count_in_every_format(files, fmt, G):
    assert A.detect(FIX / files[-1]) == fmt
    prof = _G(*files)
    np.testing.assert_allclose(prof.G()[1:], G, atol=1e-6)
    assert prof.mean_acceptance_length == pytest.approx(G[-1], abs=1e-6)


def test_one_run_gives_one_profile_from_its_exposition_log_and_requests():
    """The same constructed run read from a vLLM /metrics scrape, the difference of two scrapes
    (summed over two engines), its log lines and its per-request histograms: the same counts."""
    profiles = [_G("vllm_metrics_one_scrape.txt"), _G("vllm_metrics_before.txt", "vllm_metrics_after.txt"),
                _G("vllm_log.txt"), _G("vllm_requests.jsonl")]
    for prof in profiles:
        assert prof.counts.steps == pytest.approx(1000)
        np.testing.assert_allclose(prof.counts.at_least, [812, 654, 500], atol=1e-9)
    assert len(profiles[3].prompts) == 3 and profiles[3].median_prompt_G()[-1] == pytest.approx(2.95)


def test_scalar_fallbacks_say_so():
    log = _G("sglang_log.txt")                                   # accept len 3.21 and 2.79
    assert log.counts is None and log.mean_acceptance_length == pytest.approx(3.0)
    assert log.scalar == pytest.approx(1 - 1 / 3) and "scalar fallback" in log.notes[0]
    assert _G("sglang_metrics.txt").scalar == pytest.approx(1 - 1 / 2.5)
    old = _G("llamacpp_log_old.txt")                             # 1966 accepted of 3000 drafted
    assert old.scalar == pytest.approx(1966 / 3000) and "lower bound" in " ".join(old.notes)
    assert any("not verified" in n for n in _G("llamacpp_log.txt").notes)


def test_llamacpp_logs_pair_by_slot_and_fall_back_on_mean_len(tmp_path):
    split = _G("llamacpp_log_split.txt")        # slots 0 and 1 interleaved; task 3's "()" adds no step
    assert split.counts.steps == pytest.approx(1000) and len(split.prompts) == 2
    assert any("1 request(s) with no verify step" in n for n in split.notes)
    # "mean len" lines alone: steps A / (L - 1) = 1170 / 1.95 + 796 / 1.99 = 1000, L = 1 + 1966 / 1000
    text = "".join(line + "\n" for line in (FIX / "llamacpp_log_split.txt").read_text().splitlines()
                   if "acc per pos" not in line)
    alone = A.load([_write(tmp_path, "l.log", text)])
    assert alone.counts is None and alone.mean_acceptance_length == pytest.approx(2.966)
    assert "scalar fallback" in alone.notes[0]
    # one request lacking its rates beside others that have them: left out, said so
    text = (FIX / "llamacpp_log_split.txt").read_text().replace("task 2 |      acc per pos",
                                                                "task 9 |      acc per pos")
    mixed = A.load([_write(tmp_path, "m.log", text)])
    assert mixed.counts.steps == pytest.approx(600) and any("1 'mean len' line(s)" in n for n in mixed.notes)


def _llamacpp_scrape(drafts: str, per_pos, accepted: str) -> str:
    name = "llamacpp:spec_decode_num"
    return "\n".join([f"{name}_drafts_total {drafts}", f"{name}_accepted_tokens_total {accepted}",
                      *(f'{name}_accepted_tokens_per_pos_total{{position="{i}"}} {v}'
                        for i, v in enumerate(per_pos))]) + "\n"


def test_llamacpp_totals_printed_to_six_digits(tmp_path):
    """llama.cpp streams its totals as doubles (six significant digits): 1234567 steps print as
    1.23457e+06; the profile is read within that rounding, and a difference of two scrapes whose
    step count the rounding leaves unknown to more than 1 % is refused."""
    from moespec.acceptance.prometheus import resolution
    assert resolution("1.23457e+06") == pytest.approx(5) and resolution("812") == 0.5
    per_pos = [1000000, 800000, 600000]                          # true steps 1234567, accepted 2400000
    prof = A.load([_write(tmp_path, "a.txt", _llamacpp_scrape("1.23457e+06", per_pos, "2.4e+06"))])
    np.testing.assert_allclose(prof.G()[1:], 1 + np.cumsum(per_pos) / 1234567, rtol=1e-5)
    assert any("printed rounded" in n for n in prof.notes)
    after = _write(tmp_path, "b.txt", _llamacpp_scrape("1.23467e+06", [1000050, 800030, 600010], "2.40009e+06"))
    with pytest.raises(A.AcceptanceError, match=r"spec_decode_num_drafts_total: expected a step count known to 1%; "
                                                r"found 100 \+- 10"):
        A.load([tmp_path / "a.txt", after])


def test_the_moespec_table_keeps_every_draft_length():
    prof = _G("moespec_profile.csv")                             # quiet: the runs at k = 2 pooled, per prompt
    assert prof.K == 2 and prof.counts.steps == 140
    np.testing.assert_allclose(prof.G(), [1, 1 + 110 / 140, 1 + 200 / 140])
    E, how = prof.tokens_per_step(3)                              # per prompt: the median prompt's, runs at each k
    np.testing.assert_allclose(E[:3], [1, 1.8, np.median([1 + 0.9 + 50 / 60, 1 + 0.7 + 0.5])])
    assert "median prompt" in how and "extrapolated" in how
    assert _G("moespec_profile.csv", state="loaded").K == 2


def test_intervals_extrapolation_and_geometric_fit():
    prof = _G("vllm_log.txt")
    lo, hi = prof.p_interval()
    assert np.all(lo < prof.p) and np.all(prof.p < hi)
    c = prof.conditional
    np.testing.assert_allclose(c, [0.812, 0.654 / 0.812, 0.5 / 0.654])
    G5 = prof.G(5)
    assert G5[4] == pytest.approx(2.966 + 0.5 * c[-1]) and G5[5] == pytest.approx(G5[4] + 0.5 * c[-1] ** 2)
    a, dist = prof.geometric_fit()
    Ga = A.geometric_G(a, 3)
    assert dist == pytest.approx(np.max(np.abs(Ga / prof.G() - 1)))
    for b in (a - 0.01, a + 0.01):                              # the least-squares minimum
        assert ((A.geometric_G(b, 3) - prof.G()) ** 2).sum() > ((Ga - prof.G()) ** 2).sum()


# --- every refusal named ------------------------------------------------------------------------------
def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def _metrics(drafts, per_pos, accepted=None):
    lines = [f"vllm:spec_decode_num_drafts_total{{engine=\"0\",model_name=\"m\"}} {drafts}"]
    pos = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    lines += [f"{pos}{{engine=\"0\",model_name=\"m\",position=\"{i}\"}} {v}" for i, v in per_pos.items()]
    if accepted is not None:
        lines.append(f"vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\",model_name=\"m\"}} {accepted}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("text, match", [
    (_metrics(100, {0: 120, 1: 50}), r"position 1: expected at most the 100 verify steps; found 120"),
    (_metrics(100, {0: 50, 1: 60}), r"position 2: expected at most position 1's 50 .*the profile rises"),
    (_metrics(100, {0: -5, 1: 0}), r"position 1: expected a count >= 0; found -5"),
    (_metrics(100, {0: 50, 2: 20}), r"positions \[1\] missing"),
    (_metrics(100, {0: 50, 1: 20}, accepted=80), r"spec_decode_num_accepted_tokens_total: expected the sum .* 70; "
                                                 r"found 80"),
    (_metrics(100, {0: 50}).replace("} 50", "} fifty"), r"line 2: .*expected a finite number; found 'fifty'"),
])
def test_exposition_refusals_name_the_field(tmp_path, text, match):
    with pytest.raises(A.AcceptanceError, match=match):
        A.load([_write(tmp_path, "metrics.txt", text)])


def test_two_scrapes_in_the_wrong_order_are_refused():
    with pytest.raises(A.AcceptanceError, match=r"spec_decode_num_drafts_total: expected the second scrape's counter "
                                                r">= the first's"):
        _G("vllm_metrics_after.txt", "vllm_metrics_before.txt")


def test_response_and_log_refusals(tmp_path):
    line = json.loads((FIX / "vllm_requests.jsonl").read_text().splitlines()[0])
    line["metrics"]["speculative_decoding"]["num_spec_steps"] = 401
    with pytest.raises(A.AcceptanceError, match=r"acceptance_histogram: expected its counts to sum to the 401 verify "
                                                r"steps; found 400"):
        A.load([_write(tmp_path, "r.jsonl", json.dumps(line))])
    line["metrics"]["speculative_decoding"].update(num_spec_steps=400, acceptance_histogram=[80, 60, -1, 200])
    with pytest.raises(A.AcceptanceError, match=r"acceptance_histogram\[2\]: expected a count >= 0; found -1"):
        A.load([_write(tmp_path, "r.jsonl", json.dumps(line))])
    line["metrics"]["speculative_decoding"].update(acceptance_histogram=[80, 60, 60, 200, 1])
    with pytest.raises(A.AcceptanceError, match=r"expected the sum of the rows by draft length \[80, 60, 60, 200, 0\]"):
        A.load([_write(tmp_path, "r.jsonl", json.dumps(line))])
    del line["metrics"]["speculative_decoding"]["acceptance_histogram_by_draft_length"]
    with pytest.raises(A.AcceptanceError, match=r"expected at most K \+ 1 = 4 entries"):
        A.load([_write(tmp_path, "r.jsonl", json.dumps(line))])
    log = (FIX / "vllm_log.txt").read_text().replace("Drafted: 1800", "Drafted: 1801")
    with pytest.raises(A.AcceptanceError, match=r"line 2: Drafted: expected a multiple of the 3 positions"):
        A.load([_write(tmp_path, "v.log", log)])
    with pytest.raises(A.AcceptanceError, match=r"expected an acceptance source .* found none of their markers"):
        A.load([_write(tmp_path, "x.txt", "nothing here\n")])
    with pytest.raises(A.AcceptanceError, match=r"expected the format of .*vllm-log.*; found vllm-prometheus"):
        _G("vllm_log.txt", "vllm_metrics_after.txt")
    with pytest.raises(A.AcceptanceError, match=r"--engine sglang: expected a sglang file; found the vllm-log format"):
        _G("vllm_log.txt", engine="sglang")
    table = (FIX / "moespec_profile.csv").read_text().replace("quiet,1,2,2,80,40\n", "")
    with pytest.raises(A.AcceptanceError, match=r"prompt 1, k = 2: expected positions 1..2; found \[1\]"):
        A.load([_write(tmp_path, "p.csv", table)])


# --- the command line -----------------------------------------------------------------------------------
def test_cli_prints_the_profile_and_writes_json(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    out = tmp_path / "profile.json"
    done = subprocess.run([sys.executable, "-m", "moespec.cli", "acceptance", str(FIX / "vllm_metrics_before.txt"),
                           str(FIX / "vllm_metrics_after.txt"), "--json", str(out)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    for text in ("difference of two scrapes", "verify steps 1000; K = 3", "mean acceptance length G(3) = 2.966",
                 "best geometric fit: a = ", "extrapolated, the last conditional rate 0.765 held"):
        assert text in done.stdout
    doc = json.loads(out.read_text())
    assert doc["K"] == 3 and doc["mean_acceptance_length"] == pytest.approx(2.966)
    np.testing.assert_allclose(doc["p"], [0.812, 0.654, 0.5])
    np.testing.assert_allclose(doc["G"], RUN_G)
    per = json.loads(json.dumps(_G("vllm_requests.jsonl").to_json()))
    assert [p["prompt"] for p in per["prompts"]] == ["cmpl-a", "cmpl-b", "cmpl-c"] and "bootstrap_over_prompts" in per
    bad = subprocess.run([sys.executable, "-m", "moespec.cli", "acceptance", str(FIX / "vllm_log.txt"), "--engine",
                          "llamacpp"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and bad.stderr.count("\n") == 1 and "--engine llamacpp" in bad.stderr


# --- advise from a profile ----------------------------------------------------------------------------------
def test_acceptance_from_a_profile_changes_k_where_it_is_not_geometric(tmp_path):
    """A hand case: a profile whose late positions are accepted far more often than its geometric
    fit says (rising conditional rates) makes a longer draft pay; advise decides on G(k) from the
    profile, and the geometric rate of the same mean acceptance length picks a shorter k."""
    steps, at_least = 1000, [600, 540, 520, 510, 505, 502, 501, 500]     # conditional rates rise towards 1
    scrape = _metrics(steps, dict(enumerate(at_least)))
    path = _write(tmp_path, "metrics.txt", scrape)
    prof = A.load([path])
    adv = advice.advise(COMMITTED, acceptance_from=[path])
    item = adv["acceptance"][0]
    assert item["acceptance_model"] == "profile" and item["tokens_per_step"][1:] == pytest.approx(list(prof.G()[1:]))
    a_same_mean = float(adv["acceptance"][0]["a"])
    geo = advice.advise(COMMITTED, [a_same_mean])["acceptance"][0]
    assert item["recommended"]["k"] != geo["recommended"]["k"]
    assert "geometric acceptance assumed" in geo["label"]
    # the decision is the argmax of G(k) / V(k) on the round model's step times
    V = np.array(item["engines"][item["recommended"]["engine"]]["step_ms_by_k"])
    assert item["recommended"]["k"] == int(np.argmax(prof.G(len(V) - 1) / V))


def test_advise_on_the_committed_run_uses_its_own_measured_tokens_per_step():
    adv = advice.advise(COMMITTED)
    item = adv["acceptance"][0]
    meas = pd.read_csv(COMMITTED / "05_draft_cost_predictions.csv").query("state == 'quiet' and draft_cost == 0")
    assert item["tokens_per_step"][1:] == pytest.approx(list(meas.sort_values("k").tokens_per_step))
    assert "no per-position counts in this run" in item["label"] and item["recommended"]["k"] == 7
    with pytest.raises(AdviceInputError, match="no acceptance"):
        advice.advise(bandwidth=COMMITTED / "02_bandwidth_by_n.csv")


# --- the run file: version 2 -----------------------------------------------------------------------------------
def test_run_file_v2_round_trip_and_v1_refusal(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(COMMITTED, run)
    shutil.copy(FIX / "moespec_profile.csv", run / A.runs.PROFILE_FILE)
    doc = run_file.build_run_file(run)
    assert doc["schema_version"] == 2
    quiet = next(a for a in doc["acceptance"] if a["state"] == "quiet")
    assert {(r["prompt"], r["k"]) for r in quiet["profile"]["runs"]} == {("0", 1), ("1", 1), ("0", 2), ("1", 2)}
    run_file.write_run_file(run)
    back = run_file.read_run_file(run)
    prof = back.acceptance_profile("quiet")
    np.testing.assert_allclose(prof.G(), _G("moespec_profile.csv").G())
    assert sorted(prof.at_k) == [1, 2]
    old = json.loads((run / run_file.RUN_FILE).read_text())
    old["schema_version"] = 1
    (run / run_file.RUN_FILE).write_text(json.dumps(old))
    with pytest.raises(run_file.RunFileError, match=r"field schema_version: expected 2 \(the version this moespec "
                                                    r"reads\); found 1"):
        run_file.read_run_file(run)


# --- regret ------------------------------------------------------------------------------------------------
def test_regret_on_a_hand_table():
    speedup = pd.Series({1: 1.10, 2: 1.30, 3: 1.20})
    reps = np.array([[1.10, 1.10], [1.30, 1.00], [1.20, 1.20]])     # repetition 2 puts k = 3 first
    r = regret(speedup, reps, 3, resamples=2000)
    assert r["best_k"] == 2 and r["regret"] == pytest.approx(1 - 1.2 / 1.3)
    # resamples: (rep1, rep1) regret 1 - 1.2/1.3; (rep2, rep2) 0; mixed: medians 1.15 at k = 2, best k = 3: 0
    assert r["regret_lo"] == pytest.approx(0.0) and r["regret_hi"] == pytest.approx(1 - 1.2 / 1.3)
    assert regret(pd.Series({1: 0.9, 2: 0.8}), None, 0)["regret"] == 0.0      # plain decoding measured best
    assert np.isnan(regret(speedup, None, 2)["regret_hi"])
