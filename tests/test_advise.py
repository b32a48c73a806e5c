"""moespec advise: hand-checkable decisions, agreement with moespec.theory on the committed run
and on paper 1's published Table 1, the JSON schema, refusals, the run file it reads (round trip,
agreement with the committed answer, refusals), its one-screen text and --explain, and
quick-profile runs of notebooks 03 and 08 made through the runner."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys

import jsonschema
import numpy as np
import pandas as pd
import pytest

from moespec import advice, paths, predict, runner
from moespec import theory as th
from moespec.advice.curves import VerifyCurves
from moespec.advice.errors import AdviceInputError
from moespec.predict import run_file
from moespec.validate import run_identity
from moespec.routing import RoutingTrace
from moespec.tables.bandwidth import PAPER_LABEL
from conftest import notebook_text

COMMITTED = paths.ROOT / "figures"


def curves(tau_slot, tau_dedup, eps, band=None, h=None, draft=None, spread=None):
    """Verify curves of a round model with these verify times (their interval +- ``spread``), the
    saving's interval +- ``band``, host time ``h`` (default 0) and ``draft`` (default free)."""
    tau_slot, tau_dedup = np.asarray(tau_slot, float), np.asarray(tau_dedup, float)
    S = tau_slot - tau_dedup
    n = len(S)
    band = np.zeros_like(S) if band is None else np.asarray(band, float)
    w = np.zeros(n) if spread is None else np.asarray(spread, float)
    verify = {p: predict.Term(t, t - w, t + w, np.ones(n, int), "test", "loop")
              for p, t in (("slot", tau_slot), ("dedup", tau_dedup))}
    host = predict.Term.exact(np.zeros(n) if h is None else np.asarray(h, float), "test", "loop")
    draft = draft or predict.DraftTime.free(len(host.values_s) - 1)
    rm = predict.RoundModel("test", "d=0", "quiet", verify, host, draft,
                            saving=predict.Term(S, S - band, S + band, np.ones(n, int), "test", "loop"))
    return VerifyCurves(round_model=rm, interval="given", eps=eps,
                        subject={"model": "m", "engine": "e", "format": "f", "source": "test", "from": "test"},
                        inputs=["test"], covers=["test"])


# --- hand-checkable cases -----------------------------------------------------------------------
def test_jump_example_by_hand():
    """V_dedup = (1, 2, 2) (paper 1, App. B.3) and V_slot = (1, 2.5, 3); every verify time known to
    within 10 % (interval [0.9 tau, 1.1 tau]): delta_k = 1/9 at every k."""
    tau_s, tau_d = np.array([1, 2.5, 3.0]), np.array([1, 2, 2.0])
    c = curves(tau_s, tau_d, eps=0.1, band=[0.1, 0.6, 0.2], spread=None)
    rm = c.round_model
    c.round_model = rm.with_verify({"slot": tau_s, "dedup": tau_d}, "test", "loop",
                                   half_width={"slot": 0.1 * tau_s, "dedup": 0.1 * tau_d},
                                   saving_half_width=[0.1, 0.6, 0.2])
    adv = advice.advise_curves(c, [0.5, 0.9])
    # S = (0, 1/2, 1): positive from n = 2; lower end (-0.1, -0.1, 0.8) from n = 3; upper end from 2
    assert adv["dedup"]["from_n"] == 2
    assert adv["dedup"]["guaranteed_from_n"] == 3 and adv["dedup"]["earliest_n"] == 2
    delta = 1 / 9                                      # V/V_lo - 1 = 1/0.9 - 1
    err = adv["error"]
    assert err["delta"] == pytest.approx(delta)
    assert err["loss_bound_20"] == pytest.approx(0.2)                    # 2 delta/(1 + delta)
    assert err["speedup_factor_21"] == pytest.approx([0.8, 1.25])         # (1-d)/(1+d), 1/(1 - 2 eps)
    assert err["margin_19"] == pytest.approx(math.log(1.1 / 0.9))
    half, nine = adv["acceptance"]
    # a = 1/2: T_dedup = (1, 1.5/2, 1.75/2): plain decoding; T_slot = (1, 0.6, 0.583): plain too
    assert half["engines"]["dedup"]["k_star"] == 0 and half["engines"]["slot"]["k_star"] == 0
    assert not half["recommended"]["speculate"] and half["recommended"]["k"] == 0
    # a = 0.9: T_dedup = (1, 0.95, 2.71/2) -> k* = 2, speedup 1.355; T_slot = (1, 0.76, 0.9033) -> 0
    d = nine["engines"]["dedup"]
    assert d["k_star"] == 2 and d["speedup"] == pytest.approx(1.355)
    assert d["speedup_lo"] == pytest.approx(1.355 * 0.8) and d["speedup_hi"] == pytest.approx(1.355 * 1.25)
    assert d["speedup_by_k"] == pytest.approx([1, 0.95, 1.355])
    # per k: [(1 - d_k)/(1 + d_0), (1 + d_k)/(1 - d_0)] x speedup(k), exactly 1 at k = 0
    assert d["speedup_lo_by_k"] == pytest.approx([1, 0.95 * 0.8, 1.355 * 0.8])
    assert d["speedup_hi_by_k"] == pytest.approx([1, 0.95 * 1.25, 1.355 * 1.25])
    assert d["delta_by_k"] == pytest.approx([delta] * 3)
    assert d["k_star_certain"]                                            # 1.25 x 1 < 1.355
    assert d["loss_k_off_by_one"] == pytest.approx(1 - 0.95 / 1.355)
    assert nine["engines"]["slot"]["k_star"] == 0
    assert nine["engines"]["switch"]["k_star"] == 2                       # switch at n = 2: V = V_dedup
    assert nine["recommended"]["engine"] == "dedup"                       # ties go to the simpler engine
    assert not nine["recommended"]["interval_contains_1"]                  # 1.355 x 0.8 > 1
    assert half["recommended"]["engine"] == "slot" and not half["recommended"]["interval_contains_1"]  # <= 0.6 x 1.25
    assert half["engines"]["dedup"]["speedup_hi_by_k"][2] == pytest.approx(0.875 * 1.25)  # a band above 1
    loss = nine["loss_if_wrong"]
    assert loss["per_slot_kernel_only"] == pytest.approx(1 - 1 / 1.355)
    assert loss["dedup_kernel_only"] == 0 and loss["plain_decoding"] == pytest.approx(1 - 1 / 1.355)
    s = adv["settings"][1]
    assert '"num_speculative_tokens": 2' in s["vllm"]["cli"] and '"method": "draft_model"' in s["vllm"]["cli"]
    assert "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in s["sglang"]["cli"]
    assert "--spec-draft-n-max 2" in s["llama_cpp"]["cli"]
    assert s["kernel_switch"]["per_slot_up_to"] == 1
    assert adv["settings"][0]["vllm"]["python"] is None                   # k = 0: speculation off


_N = np.arange(1, 10)
_SLOT = 1 + 0.5 * (_N - 1)                                       # tau_slot(n): 0.5 per token more
_KERNEL_CASES = {   # tau_dedup(n), the crossover, the engine recommended at a, its kernel switch (per-slot up to)
    "per-slot faster at every n": (_SLOT + 0.05 * (_N > 1), 0.9, None, "slot", None),
    "deduplicating faster from n = 2": (_SLOT - 0.05 * (_N > 1), 0.9, 2, "dedup", 1),
    "they cross at n = 4": (_SLOT + (0.35 - 0.1 * _N) * (_N > 1), 0.9, 4, "switch", 3),
    "deduplicating faster at n = 2-3 only": (np.where(_N == 2, 1.2, np.where(_N == 3, 1.6, _SLOT + 0.3 * (_N > 1))),
                                             0.6, None, "dedup", 1),
}


@pytest.mark.parametrize("case", sorted(_KERNEL_CASES))
def test_kernel_switch_recommendation_and_header_are_one_decision(case):
    """Hand-made verify times (free draft, no host time): the recommended engine, the kernel switch
    printed with it and the explain header's pass sizes come from one decision. Where the per-slot
    kernel is faster at every n, nothing deduplicates; where deduplication is faster from n = 2, the
    deduplicating kernel from n = 2; where they cross at n = 4, the switch at 4 (not 'from n = 2'
    beside a switch at 4); where deduplication is faster at n = 2-3 only (no crossover through n = 9)
    and the draft length is 1, the deduplicating kernel from 2, its switch printed with why."""
    tau_d, a, from_n, engine, up_to = _KERNEL_CASES[case]
    adv = advice.advise_curves(curves(_SLOT, tau_d, eps=0.05), [a])
    item, ks = adv["acceptance"][0], adv["settings"][0]["kernel_switch"]
    assert adv["dedup"]["from_n"] == from_n
    assert item["recommended"]["speculate"] and item["recommended"]["engine"] == engine
    assert ks["per_slot_up_to"] == up_to
    text = advice.format_text(adv)
    switch_line = next(line for line in text.splitlines() if line.startswith("Kernel switch"))
    if up_to is None:
        assert "keep the per-slot kernel" in switch_line
        assert item["recommended"]["engine_name"] == "per-slot kernel at every n"
    else:
        assert f"deduplicating from {up_to + 1} tokens" in switch_line
        assert f"deduplicating from n = {up_to + 1}" in item["recommended"]["engine_name"] or up_to == 1
    faster = [int(n) for n in _N[1:] if tau_d[n - 1] < _SLOT[n - 1]]
    assert [r["n"] for r in adv["dedup"]["pass_sizes"] if r["dedup_faster"]] == faster
    header = next(line for line in advice.format_explain(adv).splitlines() if line.startswith("Expert kernel"))
    if case == "deduplicating faster at n = 2-3 only":
        assert item["recommended"]["k"] == 1 and "deduplication is faster at n = 2-3; from no n" in header
        assert "(that engine is faster at the recommended draft length, though deduplication is faster at n = 2-3)" \
            in " ".join(text.split())
    else:
        assert ("at no n up to 9" if from_n is None else f"from n = {from_n} tokens per pass on") in header


def test_llama_cpp_settings_name_the_gguf_file_of_a_checkpoint_folder(tmp_path):
    """llama.cpp takes a GGUF file: a checkpoint folder given as target or draft becomes
    <folder>.gguf in its settings, with llama.cpp's converter line; vLLM and SGLang keep the folder."""
    (tmp_path / "tiny-olmoe").mkdir()
    (tmp_path / "tiny-draft").mkdir()
    target, draft = str(tmp_path / "tiny-olmoe"), str(tmp_path / "tiny-draft")
    adv = advice.advise_curves(curves(_SLOT, _SLOT - 0.05 * (_N > 1), eps=0.05), [0.9], target=target, draft=draft)
    s = adv["settings"][0]
    cli = s["llama_cpp"]["cli"]
    assert f"-m {target}.gguf " in cli and f"--spec-draft-model {draft}.gguf " in cli
    assert f"-md {draft}.gguf " in s["llama_cpp"]["cli_legacy"] and f"vllm serve {target} " in s["vllm"]["cli"]
    assert s["llama_cpp"]["convert"] == [f"python convert_hf_to_gguf.py {target} --outfile {target}.gguf",
                                         f"python convert_hf_to_gguf.py {draft} --outfile {draft}.gguf"]
    assert "GGUF for llama.cpp (its converter): python convert_hf_to_gguf.py" in advice.format_text(adv)
    plain = advice.advise_curves(curves(_SLOT, _SLOT - 0.05 * (_N > 1), eps=0.05), [0.9])["settings"][0]
    assert "convert" not in plain["llama_cpp"] and "-m '<target-model>'" in plain["llama_cpp"]["cli"]


def test_draft_time_enters_the_step_time():
    """A draft of 1 ms per token and 0.5 ms per round makes drafting dearer: V(k) = t_draft(k) +
    tau(k+1) + h(k) with t_draft(0) = 0 and the intercept kept, so k* can only fall; host time is a
    separate term."""
    tau = np.array([1.0, 1.1, 1.2, 1.3]) * 1e-3
    free = advice.advise_curves(curves(tau, tau, eps=0.01), [0.8])
    draft = advice.draft_option("1,0.5", kmax=3)
    dear = advice.advise_curves(curves(tau, tau, eps=0.01, draft=draft, h=np.full(4, 0.1e-3)), [0.8])
    t_draft = np.array([0, 1.5, 2.5, 3.5]) * 1e-3
    V = tau + t_draft + 0.1e-3
    assert dear["acceptance"][0]["engines"]["slot"]["k_star"] == th.best_draft_length(V, 0.8)
    assert dear["acceptance"][0]["engines"]["slot"]["step_ms_by_k"] == pytest.approx(1e3 * V)
    assert dear["acceptance"][0]["engines"]["slot"]["k_star"] < free["acceptance"][0]["engines"]["slot"]["k_star"]
    assert dear["draft_time_ms"] == pytest.approx([0, 1.5, 2.5, 3.5])      # the intercept is kept
    assert dear["host_time_ms"] == pytest.approx([0.1] * 4)
    assert dear["draft"]["a_ms_per_token"] == 1 and dear["draft"]["b_ms_per_round"] == 0.5
    assert free["draft"]["protocol"] == "free"
    # host time known for k = 0..1 only (a run that drafted up to 1 token): decisions stop at k = 1
    short = advice.advise_curves(curves(tau, tau, eps=0.01, h=[0.0, 0.0]), [0.95])
    eng = short["acceptance"][0]["engines"]["slot"]
    assert len(eng["speedup_by_k"]) == 2 and eng["k_star"] == th.best_draft_length(tau[:2], 0.95) == 1
    with pytest.raises(AdviceInputError, match="two numbers"):
        advice.draft_option("1")
    with pytest.raises(AdviceInputError, match="not both"):
        advice.draft_option("1,0", free_draft=True)
    with pytest.raises(AdviceInputError, match="time >= 0"):
        advice.draft_option("1,-2")


def test_no_crossover_keeps_the_per_slot_kernel():
    adv = advice.advise_curves(curves([1, 1.5, 2], [1, 1.6, 2.2], eps=0.05), [0.7])
    assert adv["dedup"]["from_n"] is None
    assert adv["settings"][0]["kernel_switch"]["per_slot_up_to"] is None
    assert adv["acceptance"][0]["engines"]["switch"] == adv["acceptance"][0]["engines"]["slot"]


# --- agreement with theory on committed and published inputs ------------------------------------------
def test_committed_run_agrees_with_theory():
    """advise on the committed run decides on its round model (05_round_model.json: the quiet machine,
    the real draft's prompts, the draft as trained): every step time is that model's, every k* and
    speedup the theory's on it, and the bands are the model's per-k delta."""
    from moespec.predict.calibration import draft_name

    adv = advice.advise(COMMITTED, [0.4, 0.7])
    rm = predict.RoundModels.load(COMMITTED / "05_round_model.json").get("quiet", "chat", draft_name(0.0))
    assert adv["dedup"]["from_n"] == predict.crossover(rm.tau("slot") - rm.tau("dedup"))
    for item in adv["acceptance"]:
        for p in ("slot", "dedup"):
            V = rm.step_times(p)
            got = item["engines"][p]
            assert got["step_ms_by_k"] == pytest.approx(1e3 * V)
            assert got["k_star"] == th.best_draft_length(V, item["a"])
            assert got["speedup"] == pytest.approx(th.speedup(V, item["a"], got["k_star"]))
            assert got["delta_by_k"] == pytest.approx(rm.delta_by_k(p))
    assert adv["draft_time_ms"] == pytest.approx(1e3 * rm.draft.term.values_s[:rm.kmax + 1])
    assert adv["host_time_ms"] == pytest.approx(1e3 * rm.host.values_s[:rm.kmax + 1])
    assert adv["subject"]["source"] == "this run" and adv["inputs"] == [str(COMMITTED / run_file.RUN_FILE)]
    assert adv["subject"]["state"] == "quiet" and adv["draft"]["protocol"] == "fit"
    assert set(adv["acceptance"][0]["other_states"]) == set(predict.RoundModels.load(
        COMMITTED / "05_round_model.json").states) - {"quiet"}


def test_published_table_is_labelled_and_matches_notebook_04():
    from moespec import paper_reference
    from moespec.tables import theory as tables

    path = paper_reference.published_table1_path()
    adv = advice.advise(bandwidth=path, engine="llama.cpp Metal", model="Qwen3", acceptance=[0.8], free_draft=True)
    assert adv["subject"]["source"] == PAPER_LABEL and "their hardware" in adv["subject"]["from"]
    assert adv["error"]["eps"] == 0.031  # paper 1's published eps of llama.cpp Metal (reference data)
    row = paper_reference.read_table1(path).query("engine == 'llama.cpp Metal' and model == 'Qwen3'")
    rec = tables.table1_step_times(row, kmax=8, dense_ratio=0.5)[0]   # notebook 04's step times (ms)
    tau_slot = [r["tau_slot_ms"] for r in adv["dedup"]["pass_sizes"]]
    tau_dedup = [r["tau_dedup_ms"] for r in adv["dedup"]["pass_sizes"]]
    assert tau_slot == pytest.approx(rec["slot"].tau(), rel=1e-12)
    assert tau_dedup == pytest.approx(rec["dedup"].tau(), rel=1e-12)
    assert adv["acceptance"][0]["engines"]["dedup"]["k_star"] == th.best_draft_length(rec["V_dedup"], 0.8)
    assert "paper 1, published (their hardware)" in advice.format_text(adv)
    assert "paper 1, published (their hardware)" in advice.format_explain(adv)


def test_bandwidth_by_n_with_a_trace(tmp_path):
    """One row per n and a trace where every token repeats the first token's experts: ubar(n) = 1/n."""
    n = np.arange(1, 10)
    table = pd.DataFrame({"model": "olmoe", "n": n, "beta_slot_GBps": 20.0, "beta_dedup_GBps": 10.0,
                          "ubar": 1.0, "expert_bytes": 1000.0})
    table.to_csv(tmp_path / "bw.csv", index=False)
    ids = np.tile(np.arange(8), (50, 16, 1))   # OLMoE's shape: L = 16, m = 8, N = 64
    trace = RoutingTrace([ids], num_experts=64)
    trace.save(tmp_path / "t.npz")
    with pytest.raises(AdviceInputError, match="no draft of its own.*--draft-fit"):
        advice.advise(bandwidth=tmp_path / "bw.csv", trace=tmp_path / "t.npz", eps=0.05, acceptance=[0.5])
    adv = advice.advise(bandwidth=tmp_path / "bw.csv", trace=tmp_path / "t.npz", eps=0.05, acceptance=[0.5],
                        free_draft=True)
    rows = adv["dedup"]["pass_sizes"]
    assert [r["ubar"] for r in rows] == pytest.approx(1 / n)
    # ubar = 1/n < r = 1/2 from n = 3 on (n = 2: equal, no saving)
    assert adv["dedup"]["from_n"] == 3
    W = 16 * 1000.0  # 16 MoE layers of OLMoE x the table's expert bytes
    dense = 0.5 * 8 * W / 20e9
    assert rows[1]["tau_slot_ms"] == pytest.approx(1e3 * (2 * 8 * W / 20e9 + dense))
    assert rows[1]["tau_dedup_ms"] == pytest.approx(1e3 * (8 * W / 10e9 + dense))


def test_acceptance_table(tmp_path):
    pd.DataFrame({"accepted": [20, 10], "rejections": [5, 5]}).to_csv(tmp_path / "acc.csv", index=False)
    [(a, label)] = advice.acceptance_from_table(tmp_path / "acc.csv")
    assert a == pytest.approx(30 / 40) and "30 accepted" in label
    pd.DataFrame({"a": [0.5, 0.9], "label": ["chat", "code"]}).to_csv(tmp_path / "a.csv", index=False)
    assert advice.acceptance_from_table(tmp_path / "a.csv") == [(0.5, "chat"), (0.9, "code")]
    pd.DataFrame({"x": [1]}).to_csv(tmp_path / "bad.csv", index=False)
    with pytest.raises(AdviceInputError, match="accepted.*rejections.*column 'a'"):
        advice.acceptance_from_table(tmp_path / "bad.csv")


# --- schema ---------------------------------------------------------------------------------------------
def test_schema_is_valid_and_catches_breakage():
    jsonschema.Draft202012Validator.check_schema(advice.ADVICE_SCHEMA)
    adv = advice.advise_curves(curves([1, 2, 3], [1, 1.5, 2], eps=0.1), [0.6])
    advice.validate(json.loads(json.dumps(adv)))          # a JSON round trip validates
    for breakage in (lambda d: d.pop("settings"),
                     lambda d: d["acceptance"][0].__setitem__("a", 1.5),
                     lambda d: d["error"].__setitem__("eps", 0.6),
                     lambda d: d["dedup"]["pass_sizes"][0].__setitem__("tau_slot_ms", -1),
                     lambda d: d["acceptance"][0]["recommended"].__setitem__("engine", "other")):
        broken = json.loads(json.dumps(adv))
        breakage(broken)
        with pytest.raises(jsonschema.ValidationError):
            advice.validate(broken)


# --- refusals -------------------------------------------------------------------------------------------
def test_refusals(tmp_path):
    with pytest.raises(AdviceInputError, match=f"no run file {run_file.RUN_FILE}.*moespec run-file"):
        advice.advise(tmp_path, [0.5])
    with pytest.raises(AdviceInputError, match="no acceptance: give acceptance"):
        advice.advise(bandwidth=COMMITTED / "02_table1_bandwidth.csv", acceptance=[])
    with pytest.raises(AdviceInputError, match=r"field acceptance.quiet.profile: expected the real-draft runs' "
                                               r"acceptance profile"):
        advice.advise(_fake_expert_op_run(tmp_path / "fits"), free_draft=True)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        advice.advise(COMMITTED, [1.0])
    with pytest.raises(AdviceInputError, match="give one of a run folder, a bandwidth table or verify times"):
        advice.advise(COMMITTED, [0.5], bandwidth=COMMITTED / "02_table1_bandwidth.csv")
    with pytest.raises(AdviceInputError, match="select 0 rows"):
        advice.advise(bandwidth=COMMITTED / "02_table1_bandwidth.csv", engine="vLLM", acceptance=[0.5])
    with pytest.raises(AdviceInputError, match="eps = 0.6"):
        curves([1, 2], [1, 2], eps=0.6)
    with pytest.raises(AdviceInputError, match="--state 'busy': expected one of the run's machine states"):
        advice.advise(COMMITTED, [0.5], state="busy")
    with pytest.raises(AdviceInputError, match="--eps 0.05: describes a bandwidth table's rows"):
        advice.advise(COMMITTED, [0.5], eps=0.05)
    with pytest.raises(AdviceInputError, match="--state 'quiet' names a round model of a run"):
        advice.advise(bandwidth=COMMITTED / "02_table1_bandwidth.csv", acceptance=[0.5], state="quiet")


def _fake_expert_op_run(folder, override=None, build=True):
    """A run folder with notebook 03's tables written by hand and (``build``) its run file."""
    folder.mkdir(parents=True, exist_ok=True)
    fits = pd.DataFrame([dict(model="olmoe", backend="cpp", fmt="f32", layer=0, kernel="slot", t_op=1e-4, c_u=4e-11,
                              c_re=4e-11, c_g=np.nan, c_t=np.nan, n_passes=40),
                         dict(model="olmoe", backend="cpp", fmt="f32", layer=0, kernel="dedup", t_op=1e-4, c_u=np.nan,
                              c_re=np.nan, c_g=4e-11, c_t=1e-5, n_passes=40)])
    for (kernel, col), value in (override or {}).items():
        fits.loc[fits["kernel"] == kernel, col] = value
    fits.to_csv(folder / "03_fit_coefficients.csv", index=False)
    pd.DataFrame({"backend": ["cpp"], "eps_slot": [0.02], "eps_dedup": [0.03], "eps_engine": [0.03]}).to_csv(
        folder / "03_epsilon.csv", index=False)
    n = np.arange(1, 10)
    pd.DataFrame({"model": "olmoe", "n": n, "ubar": np.r_[1, np.linspace(0.85, 0.5, 8)], "expert_bytes": 25165824.0,
                  "read_GBps": 25.0}).to_csv(folder / "03_bandwidth_all_models.csv", index=False)
    if build:
        run_file.write_run_file(folder)
    return folder


def test_flagged_fits_are_refused(tmp_path):
    free = dict(free_draft=True)
    with pytest.raises(AdviceInputError, match="layer 0 slot fit: time per byte c_u"):
        advice.advise(_fake_expert_op_run(tmp_path / "a", {("slot", "c_u"): -1e-12}), [0.5], **free)
    with pytest.raises(AdviceInputError, match="layer 0 dedup fit: coefficient c_t = nan"):
        advice.advise(_fake_expert_op_run(tmp_path / "b", {("dedup", "c_t"): np.nan}), [0.5], **free)
    run = _fake_expert_op_run(tmp_path / "c", build=False)
    (run / "manifest.json").write_text(json.dumps({"failed": "03_fits"}))
    with pytest.raises(run_file.RunFileError, match="manifest.json: field status: the run did not finish"):
        run_file.write_run_file(run)
    with pytest.raises(AdviceInputError, match="dedup fit predicts a non-positive operation time"):
        advice.advise(_fake_expert_op_run(tmp_path / "e", {("dedup", "t_op"): -1.0}), [0.5], **free)
    eps_run = _fake_expert_op_run(tmp_path / "f", build=False)
    pd.DataFrame({"eps_engine": [0.7]}).to_csv(eps_run / "03_epsilon.csv", index=False)
    run_file.write_run_file(eps_run)
    with pytest.raises(AdviceInputError, match="expert_op_fits.eps: bandwidth error eps = 0.7 is outside"):
        advice.advise(eps_run, [0.5], **free)
    with pytest.raises(AdviceInputError, match="no draft of its own"):
        advice.advise(_fake_expert_op_run(tmp_path / "g"), [0.5])
    ok = advice.advise(_fake_expert_op_run(tmp_path / "d"), [0.5], **free)
    # the fits' own prediction: sum over 16 layers of t_op + c_u·U·b + c_re·(n·m − U)·b, plus D/beta_read
    b, m = 25165824.0, 8
    one = 16 * (1e-4 + 4e-11 * m * b) + 0.5 * m * 16 * b / 25e9
    assert ok["dedup"]["pass_sizes"][0]["tau_slot_ms"] == pytest.approx(1e3 * one)


# --- a quick-profile run through the runner, and the CLI on it -------------------------------------------
@pytest.mark.notebook
def test_quick_run_of_notebook_03(tmp_path, monkeypatch):
    """Notebook 03's quick profile times tiny shapes for seconds: on a quiet machine its fits err by a
    few percent; on a loaded one they can err by more than the bounds allow (eps >= 1/2) or predict
    a non-positive time, and advise must then refuse, saying which. Both outcomes are checked."""
    run = tmp_path / "run"
    runner.reproduce(profile="quick", only=["03"], out=run, progress=False,
                     extra={"backend": "torch", "out_dir": str(tmp_path / "bench")})
    eps = float(pd.read_csv(run / "figures" / "03_epsilon.csv")["eps_engine"].iloc[0])
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    made = subprocess.run([sys.executable, "-m", "moespec.cli", "run-file", str(run)], capture_output=True, text=True,
                          env=env, timeout=300)
    assert made.returncode == 0 and made.stdout.strip().endswith(run_file.RUN_FILE), made.stderr
    cli = subprocess.run([sys.executable, "-m", "moespec.cli", "advise", str(run), "-a", "0.6", "--free-draft",
                          "--explain", "--json", str(tmp_path / "advice.json")], capture_output=True, text=True,
                         env=env, timeout=300)
    try:
        adv = advice.advise(run, [0.3, 0.9], free_draft=True)
    except AdviceInputError as refused:  # flagged fits (c_u, c_g <= 0 or a non-positive time) or eps >= 1/2
        msg = str(refused)
        assert "expert_op_fits" in msg and ("(flagged" in msg or "outside [0, 1/2)" in msg), msg
        assert ("outside [0, 1/2)" in msg) <= (eps >= 0.5)
        assert cli.returncode == 1 and msg in cli.stderr
        return
    assert adv["subject"]["from"].startswith("notebook 03") and adv["subject"]["source"] == "this run"
    rows = adv["dedup"]["pass_sizes"]
    S = np.array([r["saving_ms"] for r in rows])
    assert adv["dedup"]["from_n"] == predict.crossover(S)
    assert rows[0]["tau_slot_ms"] == pytest.approx(rows[0]["tau_dedup_ms"])  # n = 1: per-slot either way
    assert adv["error"]["eps"] == pytest.approx(eps)
    assert cli.returncode == 0, cli.stderr
    assert "Expert kernel: deduplication is faster at " in cli.stdout
    assert "Draft length at acceptance a = 0.600" in cli.stdout
    advice.validate(json.loads((tmp_path / "advice.json").read_text()))


def test_cli_refuses_a_missing_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    bad = subprocess.run([sys.executable, "-m", "moespec.cli", "advise", str(tmp_path / "nothing"), "-a", "0.6"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "does not exist" in bad.stderr


def test_advise_against_runs_at_the_runs_own_profile(tmp_path):
    """advise is asked at the run's own measured profile; the band goal says whether the measured
    best speedup lies in the band advise prints for its answer; the regret table sets the geometric
    answer at the run file's measured ``a`` (the median prompt's) beside it."""
    import shutil
    run = tmp_path / "run"
    shutil.copytree(COMMITTED, run)
    pd.DataFrame({"state": ["quiet"], "a": [0.87], "a_pooled": [0.8], "label": ["by hand"]}).to_csv(
        run / "05_real_draft_acceptance.csv", index=False)
    run_file.write_run_file(run)
    table, regrets, goals = advice.measured.against_runs(run)
    assert set(table.state) == {"quiet"} and set(regrets.state) == {"quiet"}
    rec = advice.advise(run, state="quiet")["acceptance"][0]["recommended"]
    meas = pd.read_csv(run / "05_draft_cost_predictions.csv").query("state == 'quiet' and draft_cost == 0")
    best = float(meas.measured.max())
    band = goals[goals.goal.str.startswith("the measured best speedup inside")].iloc[0]
    assert band.met == (rec["speedup_lo"] <= best <= rec["speedup_hi"]) and f"{best:.3f}" in band.value
    assert table.set_index("k").advise_speedup[rec["k"]] == pytest.approx(rec["speedup"])
    geo = regrets[regrets.acceptance == "geometric at the measured a = 0.870"].iloc[0]
    assert geo.advise_k == advice.advise(run, [0.87], state="quiet")["acceptance"][0]["recommended"]["k"]
    own = regrets[regrets.acceptance == "the run's measured profile"].iloc[0]
    assert own.advise_k == rec["k"] and own.regret == pytest.approx(1 - meas.set_index("k").measured[rec["k"]] / best)
    pd.DataFrame({"state": ["quiet"], "accepted": [30], "rejections": [10]}).to_csv(
        run / "05_real_draft_acceptance.csv", index=False)   # pooled counts only: not the table notebook 05 writes
    with pytest.raises(run_file.RunFileError,
                       match=r"05_real_draft_acceptance.csv: missing column\(s\) \['a', 'label'\]"):
        run_file.write_run_file(run)


@pytest.mark.notebook
def test_notebook_08_on_this_runs_tables(tmp_path, monkeypatch):
    """Notebook 08 builds the run file from the tables of the run it is part of (here notebook 03's,
    written by hand), reads it, and writes advise's answer as JSON and a figure."""
    figures = _fake_expert_op_run(tmp_path / "run08" / "figures", build=False)  # the run's own tables
    runner.reproduce(profile="quick", only=["08"], out=tmp_path / "run08", progress=False,
                     extra={"free_draft": True})   # notebook 03's fits have no draft of their own
    assert run_file.read_run_file(figures).doc["expert_op_fits"]["model"] == "olmoe"
    written = json.loads((figures / "08_advice.json").read_text())
    assert written == json.loads(json.dumps(advice.advise(figures, [0.5, 0.7, 0.9], free_draft=True)))
    assert (figures / "08_advice.png").stat().st_size > 0
    text = notebook_text(tmp_path / "run08" / "08_advise.ipynb")
    assert "committed full run" not in text and "Kernel switch: per-slot kernel" in text


@pytest.mark.notebook
def test_notebook_08_without_tables_reads_the_committed_run(tmp_path, monkeypatch):
    runner.reproduce(profile="quick", only=["08"], out=tmp_path / "run08", progress=False)
    text = notebook_text(tmp_path / "run08" / "08_advise.ipynb")
    assert "give no decision" in text and "reading the committed full run's run file instead" in text
    figures = tmp_path / "run08" / "figures"
    written = json.loads((figures / "08_advice.json").read_text())
    assert written == json.loads(json.dumps(advice.advise(COMMITTED, [0.5, 0.7, 0.9], with_run_profile=True)))
    check = pd.read_csv(figures / "08_advise_vs_measured.csv")     # advise beside the committed run's runs
    assert set(check["stamp_run_id"]) == {"run08"}                # written by this run, stamped as such
    pd.testing.assert_frame_equal(check.drop(columns=list(run_identity.COLUMNS)),
                                  pd.read_csv(COMMITTED / "08_advise_vs_measured.csv"))


# --- the run file: one contract between a run and the answer --------------------------------------------
HISTORY = re.compile(r"amendment|\b20\d\d-\d\d-\d\d\b|\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b",
                     re.IGNORECASE)


def test_the_committed_run_file_is_built_from_the_committed_tables(tmp_path):
    """figures/moespec_run.json is what build_run_file makes of the committed tables (the same
    document), and it round-trips: written, read back, the same; its round models are notebook 05's
    file as written, number for number."""
    doc = run_file.build_run_file(COMMITTED)
    committed = json.loads((COMMITTED / run_file.RUN_FILE).read_text())
    assert json.loads(json.dumps(doc)) == committed, "run: moespec run-file figures"
    assert doc["round_models"]["models"] == json.loads((COMMITTED / "05_round_model.json").read_text())["models"]
    (tmp_path / "run").mkdir()
    copy = tmp_path / "run" / run_file.RUN_FILE
    copy.write_text(json.dumps(doc))
    back = run_file.read_run_file(tmp_path / "run")
    assert back.path == copy and back.doc == json.loads(json.dumps(doc))
    assert [m.to_dict() for m in back.round_models.models] == [
        m.to_dict() for m in predict.RoundModels.load(COMMITTED / "05_round_model.json").models]
    acc = pd.read_csv(COMMITTED / "05_real_draft_acceptance.csv")
    assert back.acceptance()[["state", "a"]].to_dict("records") == acc[["state", "a"]].to_dict("records")
    by_prompt = pd.read_csv(COMMITTED / "05_real_draft_acceptance_by_prompt.csv")
    assert sum(len(x["by_prompt"]) for x in doc["acceptance"]) == len(by_prompt)
    assert [x["state"] for x in doc["machine_states"]] == ["quiet", "loaded"]
    assert back.eps("quiet") == pd.read_csv(COMMITTED / "06_epsilon.csv")["eps_engine"].iloc[0]
    assert doc["run"]["complete"] and doc["run"]["id"] == "20261207-053012-full"
    assert not HISTORY.search(json.dumps(doc["sources"]))


def test_the_run_file_gives_the_committed_answer():
    """The answer from the run file is the one the committed run printed (figures/08_advice.json,
    written from the run's tables before the run file): recommendation, bands, k, kernel switch
    and every number, for each acceptance rate."""
    committed = json.loads((COMMITTED / "08_advice.json").read_text())
    now = json.loads(json.dumps(advice.advise(COMMITTED, [0.5, 0.7, 0.9], with_run_profile=True)))
    for key in ("dedup", "acceptance", "error", "draft_time_ms", "host_time_ms", "draft"):
        assert now[key] == committed[key], key
    for mine, theirs in zip(now["settings"], committed["settings"]):   # the commands and the switch (notes aside)
        assert {k: mine[k] for k in ("a", "k")} == {k: theirs[k] for k in ("a", "k")}
        for engine in ("vllm", "sglang", "llama_cpp"):
            assert mine[engine]["cli"] == theirs[engine]["cli"], engine
        assert mine["llama_cpp"]["cli_legacy"] == theirs["llama_cpp"]["cli_legacy"]
        for key in ("per_slot_up_to", "text", "mmvq_cap"):
            assert mine["kernel_switch"][key] == theirs["kernel_switch"][key], key
    assert [x["recommended"]["k"] for x in now["acceptance"]] == [x["recommended"]["k"]
                                                                 for x in committed["acceptance"]]


def test_a_hand_made_run_file_gives_the_same_advice(tmp_path):
    """A run file made by hand from the same inputs (one round model, its state's eps, no
    measurements) gives the advice the committed run file gives in that state."""
    committed = json.loads((COMMITTED / run_file.RUN_FILE).read_text())
    key = ("loaded", "chat", "the run's own draft (as trained)")
    model = next(m for m in committed["round_models"]["models"]
                 if (m["state"], m["context"], m["draft"]["name"]) == key)
    doc = {"schema": "moespec.run_file", "schema_version": run_file.SCHEMA_VERSION,
           "run": {"id": "by hand", "status": "unknown", "complete": True, "described": "written by hand",
                   "finished_notebooks": [], "manifest": None},
           "hardware": None, "subject": {"model": None, "engine": None, "format": None},
           "sources": {"round_models": {"by": "notebook 05", "files": ["05_round_model.json"],
                                        "what": "round models"}},
           "round_models": {"schema": "moespec.round_model/1", "order": {}, "models": [model]},
           "expert_op_fits": None,
           "machine_states": [{"state": "loaded", "read_GBps": model["read_GBps"], "regime": model["regime"],
                               "eps": run_file.read_run_file(COMMITTED).eps("loaded")}],
           "acceptance": [], "measured": []}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(doc))
    mine = advice.advise(path, [0.8, 0.866])
    ours = advice.advise(COMMITTED, [0.8, 0.866], state="loaded")
    for a, b in zip(mine["acceptance"], ours["acceptance"]):
        assert a["recommended"] == b["recommended"] and a["engines"] == b["engines"]
        assert a["other_states"] == {} and set(b["other_states"]) == {"quiet"}
    assert mine["dedup"] == ours["dedup"] and mine["error"] == ours["error"]
    assert mine["subject"]["model"] == model["subject"] and "hardware" not in mine["subject"]


def _one_line(exc) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_run_file_refusals_name_the_file_and_field(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(tmp_path / "empty", [0.7])
    msg = _one_line(exc)
    assert f"no run file {run_file.RUN_FILE}" in msg and f"moespec run-file {tmp_path / 'empty'}" in msg
    doc = json.loads((COMMITTED / run_file.RUN_FILE).read_text())
    old = tmp_path / "old.json"
    old.write_text(json.dumps({**doc, "schema_version": 0}))
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(old, [0.7])
    msg = _one_line(exc)
    assert str(old) in msg and "field schema_version: expected 2" in msg and "found 0" in msg
    assert "moespec run-file" in msg
    bad = tmp_path / "bad.json"
    doc["machine_states"][0]["read_GBps"] = -5
    bad.write_text(json.dumps(doc))
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(bad, [0.7])
    msg = _one_line(exc)
    assert str(bad) in msg and "field machine_states[0].read_GBps" in msg and "found -5" in msg
    doc = json.loads((COMMITTED / run_file.RUN_FILE).read_text())
    del doc["round_models"]["models"][0]["verify"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(bad, [0.7])
    assert str(bad) in _one_line(exc) and "models[0]" in str(exc.value)
    doc = json.loads((COMMITTED / run_file.RUN_FILE).read_text())
    doc["run"].update(complete=False, status="failed", described="status 'failed' in notebook 06_predictions")
    bad.write_text(json.dumps(doc))
    with pytest.raises(AdviceInputError) as exc:
        advice.advise(bad, [0.7])
    assert "field run.status" in _one_line(exc) and "--allow-incomplete" in str(exc.value)
    adv = advice.advise(bad, [0.7], allow_incomplete=True)
    assert adv["subject"]["source"] == "this run (an unfinished run: failed)"
    assert "notebook 05_whole_model (" in adv["assumptions"][0] and "05_round_model.json" in adv["assumptions"][0]


def _cli(*argv, cwd=None):
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    return subprocess.run([sys.executable, "-m", "moespec.cli", *argv], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd)


def test_advise_prints_one_screen(tmp_path):
    """`moespec advise figures -a 0.8`: at most 30 lines of at most 120 characters, with the
    recommendation and its band, the other machine state, the kernel switch, the settings and the
    sources, and no date, amendment or commit hash."""
    out = _cli("advise", "figures", "-a", "0.8", "--json", str(tmp_path / "a.json"), cwd=paths.ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 120, out.stdout
    assert not HISTORY.search(out.stdout), HISTORY.search(out.stdout)
    text = out.stdout
    adv = json.loads((tmp_path / "a.json").read_text())
    rec = adv["acceptance"][0]["recommended"]
    assert f"draft k = {rec['k']} tokens" in text and f"band [{rec['speedup_lo']:.3f}, {rec['speedup_hi']:.3f}]" in text
    assert "loaded machine (read 32.28 GB/s): k = 4" in text and "machine state: quiet, read 38.02 GB/s" in text
    assert "Kernel switch: per-slot kernel for passes of up to 1 token, deduplicating from 2 tokens" in text
    assert "vLLM:" in text and "SGLang:" in text and "llama.cpp:" in text and "num_speculative_tokens\": 3" in text
    assert "Sources: run file: figures/moespec_run.json; round models: notebook 05 (05_round_model.json)" in text
    assert text.count("05_round_model.json") == 1


def test_shell_commands_are_continued_at_option_boundaries():
    from moespec.advice.report import _command

    cmd = "llama-server -m 't a.gguf' " + " ".join(f"--opt-{i} {i}" for i in range(30))
    lines = _command("    llama.cpp: ", cmd)
    assert all(len(line) <= 120 for line in lines) and len(lines) > 1
    assert all(line.endswith(" \\") for line in lines[:-1])
    joined = " ".join(line.removesuffix(" \\").strip() for line in lines).removeprefix("llama.cpp: ")
    assert joined == cmd


def test_explain_prints_the_derivation(tmp_path):
    out = _cli("advise", str(COMMITTED), "-a", "0.8", "--explain", "--json", str(tmp_path / "a.json"))
    written = json.loads((tmp_path / "a.json").read_text())
    assert out.returncode == 0 and written["schema"] == advice.ADVICE_SCHEMA["$id"]
    assert "Round: V(k) = t_draft(k) + tau(k + 1) + h(k) (ms), deduplicating engine" in out.stdout
    refused = _cli("advise", str(COMMITTED), "-a", "0.8", "--explain", "--json", "-")   # the JSON instead of the text
    assert refused.returncode == 2 and "--explain prints the derivation" in refused.stderr and not refused.stdout
    adv = advice.advise(COMMITTED, [0.8])
    text = advice.format_explain(adv)
    assert "Expert kernel: deduplication is faster at n = 2-9; from n = 2 tokens per pass on" in text
    assert "Round: V(k) = t_draft(k) + tau(k + 1) + h(k) (ms), deduplicating engine" in text
    assert "speedup by k, deduplicating kernel from n = 2: k=1" in text and "Option names from:" in text
    assert len(text.splitlines()) > 30 and text.startswith(advice.format_text(adv).splitlines()[0][:40])


def test_no_option_selects_a_rejected_alternative():
    """advise's options are what a user asks; the verify-term versions and the protocol switch are gone."""
    out = _cli("advise", "--help")
    for gone in ("--version", "--depth", "--use", "grid", "earlier", "protocol"):
        assert gone not in out.stdout, gone
    for kept in ("--state", "--context", "--run-draft", "--draft-fit", "--free-draft", "--explain", "--bandwidth"):
        assert kept in out.stdout, kept
    bad = _cli("advise", str(COMMITTED), "-a", "0.7", "--version", "grid")
    assert bad.returncode == 2 and "unrecognized arguments: --version" in bad.stderr


def test_the_figure_names_its_axes_and_marks():
    from moespec.advice.figure import advice_figure

    fig = advice_figure(advice.advise(COMMITTED, [0.5, 0.8]))
    try:
        assert fig._suptitle.get_text().startswith("moespec advise:")
        for ax in fig.axes:
            assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title() and ax.get_legend() is not None
    finally:
        import matplotlib.pyplot as plt
        plt.close(fig)


# --- engine settings for old and new builds, the kernel switch per GPU architecture (issue 26) -----
from moespec.advice import settings as st  # noqa: E402
from moespec.advice.bandwidth_table import _gap_range, _half_unit, _table1_r, _table1_ubar  # noqa: E402

PUBLISHED_TABLE1 = paths.reference_dir() / "paper1_table1_bandwidth.csv"


def test_llama_cpp_settings_for_current_and_legacy_builds():
    s = st.llama_cpp(3, "t.gguf", "d.gguf")
    assert s["cli"] == ("llama-server -m t.gguf --spec-type draft-simple --spec-draft-model d.gguf "
                        "--spec-draft-n-max 3 "
                        "--spec-draft-n-min 0 --spec-draft-p-min 0")
    assert s["cli_legacy"] == "llama-server -m t.gguf -md d.gguf --draft-max 3 --draft-min 0 --draft-p-min 0"
    assert "PR 22397" in s["note"] and "0.8" in s["note"]  # the legacy p-min default the setting overrides
    plain = st.llama_cpp(0, "t.gguf", "d.gguf")
    assert plain["cli"] == plain["cli_legacy"] == "llama-server -m t.gguf"
    assert st.VERSIONS["llama.cpp-legacy"]["commit"].startswith("25d5b0c53f9a")
    assert "--draft-p-min (default 0.8)" in st.VERSIONS["llama.cpp-legacy"]["where"]


def test_settings_per_draft_method_to_the_letter():
    """--method eagle3 / mtp / ngram at k = 3: the option names and values each engine's source
    gives for that method (VERSIONS; docs/advise.md), one chain of k drafts, k + 1 verified."""
    s = {m: st.engine_settings(3, 2, "t", "d", "q4_k", m) for m in st.METHODS}
    assert s["eagle3"]["vllm"]["cli"] == ("vllm serve t --speculative-config "
                                          "'{\"method\": \"eagle3\", \"model\": \"d\", \"num_speculative_tokens\": 3}'")
    assert s["mtp"]["vllm"]["cli"] == ("vllm serve t --speculative-config "
                                       "'{\"method\": \"mtp\", \"num_speculative_tokens\": 3}'")
    assert s["ngram"]["vllm"]["cli"].endswith("'{\"method\": \"ngram\", \"num_speculative_tokens\": 3}'")
    chain = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    base = "python3 -m sglang.launch_server --model-path t --speculative-algorithm"
    assert s["eagle3"]["sglang"]["cli"] == f"{base} EAGLE3 --speculative-draft-model-path d {chain}"
    assert s["mtp"]["sglang"]["cli"] == f"{base} EAGLE {chain}"
    assert s["ngram"]["sglang"]["cli"] == (f"{base} NGRAM --speculative-num-draft-tokens 4 "
                                           "--speculative-ngram-max-bfs-breadth 1")
    fixed = "--spec-draft-n-max 3 --spec-draft-n-min 0 --spec-draft-p-min 0"
    assert s["eagle3"]["llama_cpp"]["cli"] == f"llama-server -m t --spec-type draft-eagle3 --spec-draft-model d {fixed}"
    assert s["mtp"]["llama_cpp"]["cli"] == f"llama-server -m t --spec-type draft-mtp {fixed}"
    assert s["ngram"]["llama_cpp"]["cli"] == "llama-server -m t --spec-type ngram-simple --spec-ngram-simple-size-m 3"
    assert s["ngram"]["llama_cpp"]["cli_legacy"] == "llama-server -m t --spec-type ngram-simple --spec-ngram-size-m 3"
    assert s["eagle3"]["llama_cpp"]["cli_legacy"] is None and s["mtp"]["llama_cpp"]["cli_legacy"] is None
    assert s["draft_model"]["sglang"] == st.sglang(3, "t", "d")
    assert s["draft_model"]["llama_cpp"] == st.llama_cpp(3, "t", "d")
    # the MoE kernel options and vLLM's fused_moe tuning for M = k + 1: 4 is tuned; 3, 5, 6, 7, 9 run a neighbour's
    assert s["mtp"]["kernel_switch"]["engines"]["vllm"].startswith("--moe-backend (default auto; triton")
    assert "--speculative-moe-runner-backend" in s["mtp"]["kernel_switch"]["engines"]["sglang"]
    assert [st.vllm_tune(k, "t")["runs_config_of"] for k in range(1, 9)] == [2, 2, 4, 4, 4, 8, 8, 8]
    tune = s["mtp"]["vllm"]["tune"]
    assert tune["cli"] == ("python benchmarks/kernels/benchmark_moe.py --model t --tp-size 1 --tune --batch-size "
                           "1 2 4 8 16 24 32 48 64 96 128 256 512 1024 1536 2048 3072 4096 --save-dir tuned_moe")
    assert st.vllm_tune(2, "t")["cli"].count(" 3 ") == 1 and st.vllm_tune(2, "t", [1, 2, 4])["runs_config_of"] == 2
    with pytest.raises(AdviceInputError, match="--method 'medusa': expected one of draft_model, eagle3, mtp, ngram"):
        advice.advise(COMMITTED, [0.8], method="medusa")
    text = advice.format_text(advice.advise(COMMITTED, [0.8], method="eagle3"))
    assert "settings for k = 3, eagle3:" in text and "--spec-type draft-eagle3" in text
    assert "before PR 22397" not in text


def test_mmvq_cap_per_architecture_and_type():
    """get_mmvq_mmid_max_batch's dispatch: 8 on Volta and from Ada on, the Turing-plus table on
    Turing and Ampere, the Pascal table below; types without an entry take MMVQ_MAX_BATCH_SIZE."""
    ampere, hopper, volta, pascal, xavier = 800, 900, 700, 610, 720
    assert [st.mmvq_mmid_max_batch(t, ampere) for t in ("MXFP4", "Q3_K", "IQ3_S", "Q4_K", "Q8_0")] == [7, 5, 6, 8, 8]
    assert [st.mmvq_mmid_max_batch(t, hopper) for t in ("MXFP4", "Q3_K", "Q4_K", "Q8_0")] == [8, 8, 8, 8]
    assert st.mmvq_mmid_max_batch("MXFP4", volta) == 8 and st.mmvq_mmid_max_batch("MXFP4", 1000) == 8
    assert [st.mmvq_mmid_max_batch(t, pascal) for t in ("MXFP4", "Q8_0", "Q4_K", "Q4_0")] == [4, 4, 5, 6]
    assert st.mmvq_mmid_max_batch("Q8_0", xavier) == 4  # neither Volta (700) nor Turing (750) and up
    assert st.mmvq_mmid_max_batch("Q8_0", 890) == 8 and st.mmvq_mmid_max_batch("Q8_0", 860) == 8
    assert st.mmq_above_cap("MXFP4", ampere) == st.mmq_above_cap("Q8_0", hopper) == "MMQ"
    assert st.mmq_above_cap("Q8_0", volta).startswith("MMQ only below MMQ_DP4A_MAX_BATCH_SIZE")
    assert st.mmq_above_cap("Q8_0", 600).startswith("no MMQ")  # below GGML_CUDA_CC_DP4A
    assert st.mmq_above_cap("NVFP4", hopper).startswith("no MMQ")  # not in that mmq.cu's list
    assert [c["ggml_type"] for c in st.mmvq_caps("q4_k_m")] == ["Q4_K"] * 4 + ["Q6_K"] * 4
    assert st.mmvq_caps("bf16") == [] and "not quantized" in st.kernel_switch(4, "bf16")["llama_cpp_cuda"]


def test_advise_prints_both_builds_and_the_caps_for_ampere_and_hopper():
    adv = advice.advise(bandwidth=PUBLISHED_TABLE1, engine="llama.cpp CUDA", model="gpt-oss", acceptance=[0.7],
                        free_draft=True)
    text = advice.format_explain(adv)
    k = adv["acceptance"][0]["recommended"]["k"]
    assert f"llama.cpp builds before PR 22397: llama-server -m '<target-model>' -md '<draft-model>' --draft-max {k} " \
           f"--draft-min 0 --draft-p-min 0" in text
    assert ("MXFP4 on Turing, Ampere (7.5 <= cc < 8.9: T4 7.5, A100 8.0, RTX 30 8.6): MMVQ up to 7 tokens, above that "
            "MMQ") in text
    assert ("MXFP4 on Ada, Hopper, Blackwell (cc >= 8.9: RTX 40 8.9, H100/H200 9.0, B200 10.0): MMVQ up to 8 tokens, "
            "above that MMQ") in text
    caps = {c["architecture"]: c["cap"] for c in adv["settings"][0]["kernel_switch"]["mmvq_cap"]}
    assert caps == {"Pascal and older": 4, "Volta": 8, "Turing, Ampere": 7, "Ada, Hopper, Blackwell": 8}
    assert set(adv["versions_cited"]) >= {"llama.cpp", "llama.cpp-legacy", "llama.cpp-cuda-kernel",
                                          "llama.cpp-cuda-mmq"}


# --- published tables read as published ------------------------------------------------------------
def test_published_r_columns_and_the_held_out_margin_of_paper_1():
    """Paper 1 (Sec. 4, Metal gpt-oss at d = 512): "Its measured saving at n = 8 is +0.2 ms ... and
    there the margin of (19) fails". With the published r = 0.34 (not 114/339 = 0.336 of the rounded
    bandwidths) advise agrees, and says the verdict is within the table's rounding."""
    adv = advice.advise(bandwidth=PUBLISHED_TABLE1, engine="llama.cpp Metal", model="gpt-oss", acceptance=[0.7],
                        free_draft=True)
    rows = {r["n"]: r for r in adv["dedup"]["pass_sizes"]}
    assert rows[8]["r"] == pytest.approx(0.34) and rows[2]["r"] == pytest.approx(0.37)
    assert rows[8]["ubar"] == pytest.approx(0.36)
    assert rows[8]["kernels_agree_19"] is False and rows[8]["margin_19_verdict"] == "within rounding"
    assert all(rows[n]["kernels_agree_19"] and rows[n]["margin_19_verdict"] == "holds" for n in range(2, 8))
    assert any("published n2_r, n8_r" in a for a in adv["assumptions"])
    assert "within the table's rounding (not certain either way) at n = 8" in advice.format_explain(adv)
    # by hand: |ln 0.34 - ln 0.36| = 0.0572 < ln(1.031/0.969) = 0.0620 (fails) ...
    assert abs(math.log(0.34 / 0.36)) < math.log(1.031 / 0.969) < abs(math.log(114 / 339 / 0.36))
    # ... and over the rounding, r in [0.335, 0.345], ubar in [0.355, 0.365]: the gap spans the margin
    assert -math.log(0.365 / 0.335) < -math.log(1.031 / 0.969) < -math.log(0.355 / 0.345)


def test_published_r_changes_one_of_the_sixteen_table1_points():
    """Of the 16 Table-1 points (8 rows, n = 2 and 8), only Metal gpt-oss at n = 8 changes its (19)
    verdict between the published r and the ratio of the rounded bandwidths."""
    table = pd.read_csv(PUBLISHED_TABLE1)
    eps = {"llama.cpp CUDA": 0.054, "llama.cpp Metal": 0.031, "MLX-LM": 0.148}  # paper1_scalars.csv
    flips = []
    for row in table.itertuples():
        for n in (2, 8):
            ubar = getattr(row, f"n{n}_ubar")
            published = th.kernels_agree(ubar, getattr(row, f"n{n}_r"), eps[row.engine])
            r = getattr(row, f"n{n}_beta_dedup_GBps") / getattr(row, f"n{n}_beta_slot_GBps")
            from_betas = th.kernels_agree(ubar, r, eps[row.engine])
            if published != from_betas:
                flips.append((row.engine, row.model, n))
    assert flips == [("llama.cpp Metal", "gpt-oss", 8)]


def test_rounding_box_corners_bound_its_interior():
    """_gap_range takes the extremes over the corners (each cell enters r(n) or ubar(n) monotonically):
    no point of the box falls outside them."""
    values = {"u2": 0.72, "u8": 0.36, "r2": 0.37, "r8": 0.34}
    halves = {k: 0.005 for k in values}

    def gap(v):
        return np.log(_table1_r(v)) - np.log(_table1_ubar(v["u2"], v["u8"]))

    rng = np.random.default_rng(0)
    box = _gap_range(gap, values, halves)
    for _ in range(300):
        g = gap({k: x + rng.uniform(-0.005, 0.005) for k, x in values.items()})
        assert np.all(box[:, 0] - 1e-12 <= g) and np.all(g <= box[:, 1] + 1e-12)
    betas = {"bs2": 213.0, "bs8": 339.0, "bd2": 79.0, "bd8": 114.0, "u2": 0.72, "u8": 0.36}
    bhalves = {k: 0.5 if k.startswith("b") else 0.005 for k in betas}
    bbox = _gap_range(gap, betas, bhalves)
    for _ in range(300):
        g = gap({k: x + rng.uniform(-bhalves[k], bhalves[k]) for k, x in betas.items()})
        assert np.all(bbox[:, 0] - 1e-12 <= g) and np.all(g <= bbox[:, 1] + 1e-12)


def test_margin_verdict_and_half_units_by_hand():
    m = math.log(1.031 / 0.969)
    assert th.margin_verdict(-0.0858, -0.0286, 0.031) == "within rounding"
    assert th.margin_verdict(m + 1e-9, 0.2, 0.031) == "holds" and th.margin_verdict(-0.3, -m - 1e-9, 0.031) == "holds"
    assert th.margin_verdict(-0.05, 0.05, 0.031) == "fails" and th.margin_verdict(-m, m, 0.031) == "fails"
    with pytest.raises(ValueError, match="gap_lo <= gap_hi"):
        th.margin_verdict(0.1, 0.0, 0.031)
    assert [_half_unit(c) for c in ("0.34", "114", "0.50", "1e-3", "2.5E2")] == pytest.approx([0.005, 0.5, 0.005,
                                                                                              0.0005, 5.0])


def test_table1_without_r_columns_uses_the_bandwidths_and_the_per_n_table_its_digits(tmp_path):
    t1 = pd.read_csv(PUBLISHED_TABLE1, dtype=str).drop(columns=["n2_r", "n8_r"])
    t1.to_csv(tmp_path / "no_r.csv", index=False)
    adv = advice.advise(bandwidth=tmp_path / "no_r.csv", engine="llama.cpp Metal", model="gpt-oss", acceptance=[0.7],
                        eps=0.031, free_draft=True)
    row8 = adv["dedup"]["pass_sizes"][7]
    assert row8["r"] == pytest.approx(114 / 339) and row8["kernels_agree_19"] is True  # the wrong answer ...
    assert row8["margin_19_verdict"] == "within rounding"                                  # ... now flagged as such
    n = np.arange(1, 10)
    exact = pd.DataFrame({"n": n, "beta_slot_GBps": 500.0 + n, "beta_dedup_GBps": 400.0 - 10 * n,
                          "ubar": np.round(1 / np.sqrt(n), 12), "model": "olmoe"})
    exact.to_csv(tmp_path / "per_n.csv", index=False, float_format="%.12f")
    rows = advice.advise(bandwidth=tmp_path / "per_n.csv", acceptance=[0.7], eps=0.05,
                         free_draft=True)["dedup"]["pass_sizes"]
    for r in rows[1:]:  # twelve printed digits: the rounding decides nothing
        assert r["margin_19_verdict"] == ("holds" if r["kernels_agree_19"] else "fails")


def test_printed_options_are_the_documented_list():
    """Every option and value in the commands advise prints is in PRINTED_OPTIONS, each is listed in
    docs/advise.md with its file and commit, and the docs' MMVQ table is the one advise uses
    (issue 26, item 6)."""
    import re
    import shlex

    docs = (paths.ROOT / "docs" / "advise.md").read_text()
    printed = set()
    for k, method in itertools.product(range(9), st.METHODS):
        setting = st.engine_settings(k, 4, "T", "D", "q8_0", method)
        commands = [setting["vllm"]["cli"], setting["sglang"]["cli"], setting["llama_cpp"]["cli"],
                    setting["llama_cpp"]["cli_legacy"], (setting["vllm"]["tune"] or {}).get("cli")]
        for cmd in filter(None, commands):
            words = shlex.split(cmd)
            printed |= {w for w in words if w.startswith("-")}
            printed |= {w for w in words if w in st.PRINTED_OPTIONS}
            for w in words:
                if w.startswith("{"):
                    spec = json.loads(w)
                    printed |= set(spec) | {spec["method"]}
        notes = [setting[e]["note"] for e in ("vllm", "sglang", "llama_cpp")] + [(setting["vllm"]["tune"] or {}).get(
            "note", ""), *setting["kernel_switch"]["engines"].values()]
        for n_switch in (None, 4):
            notes += [st.kernel_switch(n_switch, "mxfp4")["llama_cpp_cuda"], *st.cap_lines(st.mmvq_caps("q8_0"))]
        printed |= {w for w in re.findall(r"[A-Za-z_0-9-]+", " ".join(notes)) if w in st.PRINTED_OPTIONS}
    for method in st.METHODS:   # the per-batch-size schedules (--batch-sizes)
        sched = st.batch_schedule_settings({1: 3, 4: 1, 8: 0}, method, "T", "D", "a.json")
        for cmd in filter(None, (sched["vllm_cli"], sched["sglang_cli"])):
            words = shlex.split(cmd)
            printed |= {w for w in words if w.startswith("-")} | {w for w in words if w in st.PRINTED_OPTIONS}
            printed |= {key for w in words if w.startswith("{") for key in json.loads(w)}
        printed |= {key for slot in sched["sglang"].values() for key in slot}
    printed |= {"vllm serve", "python3 -m sglang.launch_server", "llama-server"}  # the command names
    assert printed == set(st.PRINTED_OPTIONS)
    assert set(st.PRINTED_OPTIONS.values()) <= set(st.VERSIONS)
    table = docs[docs.index("### Every option printed"):]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    for option, key in st.PRINTED_OPTIONS.items():
        commit = st.VERSIONS[key]["commit"][:12]
        where = re.search(r"[\w./-]+\.(?:py|md|cuh|cu|cpp)", st.VERSIONS[key]["where"]).group(0)
        assert any(f"`{option}`" in row.split("|")[1] and commit in row and where in row for row in rows), option
    caps = docs[docs.index("| type | Pascal and older"):].split("\n\n")[0].splitlines()[2:]
    listed = set()
    for row in caps:
        cells = [c.strip() for c in row.strip("|").split("|")]
        for t in cells[0].split(", "):
            listed.add(t)
            assert [st.mmvq_mmid_max_batch(t, cc) for cc in (610, 700, 800, 900)] == [int(c) for c in cells[1:]], t
    assert listed == set(st.MMVQ_MMID_MAX_BATCH["pascal_older"])


def test_advise_on_the_runs_own_profile_prints_one_screen(tmp_path):
    """`moespec advise figures` (the run's measured tokens per step): one screen too, the profile in
    two lines, its source and the geometric comparison left to --explain."""
    out = _cli("advise", "figures", "--json", str(tmp_path / "a.json"), cwd=paths.ROOT)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.rstrip("\n").splitlines()
    assert len(lines) <= 30 and max(len(line) for line in lines) <= 120, out.stdout
    assert not HISTORY.search(out.stdout), HISTORY.search(out.stdout)
    adv = json.loads((tmp_path / "a.json").read_text())
    G = ", ".join(f"{t:.2f}" for t in adv["acceptance"][0]["tokens_per_step"][1:])
    assert f"tokens per step G(k) = {G} for k = 1..8" in " ".join(line.strip() for line in lines)
    assert "draft k = 7 tokens" in out.stdout
