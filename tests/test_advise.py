"""moespec advise: hand-checkable decisions, agreement with moespec.theory on the committed run
and on paper 1's published Table 1, the JSON schema, refusals, and a quick-profile run of notebook
03 made through the runner."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jsonschema
import numpy as np
import pandas as pd
import pytest

from moespec import advice, paths, predict, runner
from moespec import theory as th
from moespec.advice.inputs import AdviceInputError, VerifyCurves
from moespec.routing import RoutingTrace
from moespec.tables.bandwidth import PAPER_LABEL
from conftest import notebook_text

COMMITTED = paths.ROOT / "figures"


def curves(tau_slot, tau_dedup, eps, band=None, h=None):
    tau_slot, tau_dedup = np.asarray(tau_slot, float), np.asarray(tau_dedup, float)
    S = tau_slot - tau_dedup
    band = np.zeros_like(S) if band is None else np.asarray(band, float)
    return VerifyCurves(tau={"slot": tau_slot, "dedup": tau_dedup}, S_lo=S - band, S_hi=S + band,
                        interval="given", h=np.zeros(len(S)) if h is None else h, eps=eps,
                        subject={"model": "m", "engine": "e", "format": "f", "source": "test", "from": "test"},
                        inputs=["test"])


# --- hand-checkable cases -----------------------------------------------------------------------
def test_jump_example_by_hand():
    """V_dedup = (1, 2, 2) (paper 1, App. B.3) and V_slot = (1, 2.5, 3), eps = 1/10."""
    c = curves([1, 2.5, 3], [1, 2, 2], eps=0.1, band=[0.1, 0.6, 0.2])
    adv = advice.advise_curves(c, [0.5, 0.9])
    # S = (0, 1/2, 1): positive from n = 2; lower end (-0.1, -0.1, 0.8) from n = 3; upper end from 2
    assert adv["dedup"]["from_n"] == 2
    assert adv["dedup"]["guaranteed_from_n"] == 3 and adv["dedup"]["earliest_n"] == 2
    delta = 1 / 9
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
    assert d["k_star_certain"]                                            # 1.25 x 1 < 1.355
    assert d["loss_k_off_by_one"] == pytest.approx(1 - 0.95 / 1.355)
    assert nine["engines"]["slot"]["k_star"] == 0
    assert nine["engines"]["switch"]["k_star"] == 2                       # switch at n = 2: V = V_dedup
    assert nine["recommended"]["engine"] == "dedup"                       # ties go to the simpler engine
    loss = nine["loss_if_wrong"]
    assert loss["per_slot_kernel_only"] == pytest.approx(1 - 1 / 1.355)
    assert loss["dedup_kernel_only"] == 0 and loss["plain_decoding"] == pytest.approx(1 - 1 / 1.355)
    s = adv["settings"][1]
    assert '"num_speculative_tokens": 2' in s["vllm"]["cli"] and '"method": "draft_model"' in s["vllm"]["cli"]
    assert "--speculative-num-steps 2 --speculative-eagle-topk 1 --speculative-num-draft-tokens 3" in s["sglang"]["cli"]
    assert "--spec-draft-n-max 2" in s["llama_cpp"]["cli"]
    assert s["kernel_switch"]["per_slot_up_to"] == 1
    assert adv["settings"][0]["vllm"]["python"] is None                   # k = 0: speculation off


def test_draft_time_enters_the_step_time():
    """h(k) = k x 1 ms makes drafting dearer: V(k) = tau(k+1) + h(k), so k* can only fall."""
    tau = np.array([1.0, 1.1, 1.2, 1.3]) * 1e-3
    free = advice.advise_curves(curves(tau, tau, eps=0.01), [0.8])
    dear = advice.advise_curves(curves(tau, tau, eps=0.01, h=np.arange(4) * 1e-3), [0.8])
    V = tau + np.arange(4) * 1e-3
    assert dear["acceptance"][0]["engines"]["slot"]["k_star"] == th.best_draft_length(V, 0.8)
    assert dear["acceptance"][0]["engines"]["slot"]["k_star"] < free["acceptance"][0]["engines"]["slot"]["k_star"]
    assert dear["draft_time_ms"] == pytest.approx([0, 1, 2, 3])
    # h known for k = 0..1 only (a run that drafted up to 1 token): decisions stop at k = 1
    short = advice.advise_curves(curves(tau, tau, eps=0.01, h=[0.0, 0.0]), [0.95])
    eng = short["acceptance"][0]["engines"]["slot"]
    assert len(eng["speedup_by_k"]) == 2 and eng["k_star"] == th.best_draft_length(tau[:2], 0.95) == 1


def test_no_crossover_keeps_the_per_slot_kernel():
    adv = advice.advise_curves(curves([1, 1.5, 2], [1, 1.6, 2.2], eps=0.05), [0.7])
    assert adv["dedup"]["from_n"] is None
    assert adv["settings"][0]["kernel_switch"]["per_slot_up_to"] is None
    assert adv["acceptance"][0]["engines"]["switch"] == adv["acceptance"][0]["engines"]["slot"]


# --- agreement with theory on committed and published inputs ------------------------------------------
def test_committed_run_agrees_with_theory():
    adv = advice.advise(COMMITTED, [0.4, 0.7])
    c = pd.read_csv(COMMITTED / "06_curves.csv")
    g = c[(c["d"] == 64) & (c["version"] == "prediction")].sort_values("n")
    tau = {p: g[f"tau_{p}_ms"].to_numpy() / 1e3 for p in ("slot", "dedup")}
    assert adv["dedup"]["from_n"] == predict.crossover(tau["slot"] - tau["dedup"])
    assert adv["dedup"]["guaranteed_from_n"] == predict.crossover((g["S_ms"] - g["band_ms"]).to_numpy())
    eps = float(pd.read_csv(COMMITTED / "06_epsilon.csv")["eps_engine"].iloc[0])      # full precision
    assert adv["error"]["eps"] == eps
    t7 = float(pd.read_csv(COMMITTED / "06_table7_error.csv").query("source == 'this run' and d == 64")["engine_eps"].iloc[0])
    assert t7 == round(eps, 3)                                                   # the table's three decimals
    h = pd.read_csv(COMMITTED / "06_step_overhead.csv").query("d == 64").sort_values("k")["h_s"].to_numpy()
    for item in adv["acceptance"]:
        for p in ("slot", "dedup"):
            V = tau[p][: len(h)] + h          # V(k) = tau(k + 1) + h(k), h measured in notebook 05's runs
            got = item["engines"][p]
            assert got["k_star"] == th.best_draft_length(V, item["a"])
            assert got["speedup"] == pytest.approx(th.speedup(V, item["a"], got["k_star"]))
    assert adv["subject"]["source"] == "this run" and "06_curves.csv" in adv["inputs"][0]
    assert any("draft time h(k): measured" in a for a in adv["assumptions"])


def test_published_table_is_labelled_and_matches_notebook_04():
    from moespec.tables import theory as tables

    path = tables.published_table1_path()
    adv = advice.advise(bandwidth=path, engine="llama.cpp Metal", model="Qwen3", acceptance=[0.8])
    assert adv["subject"]["source"] == PAPER_LABEL and "their hardware" in adv["subject"]["from"]
    assert adv["error"]["eps"] == 0.031  # paper 1's published eps of llama.cpp Metal (reference data)
    row = tables.read_table1(path).query("engine == 'llama.cpp Metal' and model == 'Qwen3'")
    rec = tables.table1_step_times(row, kmax=8, dense_ratio=0.5)[0]   # notebook 04's step times (ms)
    tau_slot = [r["tau_slot_ms"] for r in adv["dedup"]["pass_sizes"]]
    tau_dedup = [r["tau_dedup_ms"] for r in adv["dedup"]["pass_sizes"]]
    assert tau_slot == pytest.approx(rec["slot"].tau(), rel=1e-12)
    assert tau_dedup == pytest.approx(rec["dedup"].tau(), rel=1e-12)
    assert adv["acceptance"][0]["engines"]["dedup"]["k_star"] == th.best_draft_length(rec["V_dedup"], 0.8)
    text = advice.format_text(adv)
    assert "paper 1, published (their hardware)" in text


def test_bandwidth_by_n_with_a_trace(tmp_path):
    """One row per n and a trace where every token repeats the first token's experts: ubar(n) = 1/n."""
    n = np.arange(1, 10)
    table = pd.DataFrame({"model": "olmoe", "n": n, "beta_slot_GBps": 20.0, "beta_dedup_GBps": 10.0,
                          "ubar": 1.0, "expert_bytes": 1000.0})
    table.to_csv(tmp_path / "bw.csv", index=False)
    ids = np.tile(np.arange(8), (50, 16, 1))   # OLMoE's shape: L = 16, m = 8, N = 64
    trace = RoutingTrace([ids], num_experts=64)
    trace.save(tmp_path / "t.npz")
    adv = advice.advise(bandwidth=tmp_path / "bw.csv", trace=tmp_path / "t.npz", eps=0.05, acceptance=[0.5])
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
    with pytest.raises(AdviceInputError, match="03_fit_coefficients.csv"):
        advice.advise(tmp_path, [0.5])
    with pytest.raises(AdviceInputError, match="no acceptance rate"):
        advice.advise(COMMITTED, [])
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        advice.advise(COMMITTED, [1.0])
    with pytest.raises(AdviceInputError, match="either a run folder or a bandwidth table"):
        advice.advise(COMMITTED, [0.5], bandwidth=COMMITTED / "02_table1_bandwidth.csv")
    with pytest.raises(AdviceInputError, match="select 0 rows"):
        advice.advise(bandwidth=COMMITTED / "02_table1_bandwidth.csv", engine="vLLM", acceptance=[0.5])
    with pytest.raises(AdviceInputError, match="eps = 0.6"):
        curves([1, 2], [1, 2], eps=0.6)
    with pytest.raises(AdviceInputError, match="no context depth d = 7"):
        advice.advise(COMMITTED, [0.5], depth=7)


def _fake_expert_op_run(folder, override=None):
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
    return folder


def test_flagged_fits_are_refused(tmp_path):
    with pytest.raises(AdviceInputError, match="layer 0 slot fit: time per byte c_u"):
        advice.advise(_fake_expert_op_run(tmp_path / "a", {("slot", "c_u"): -1e-12}), [0.5])
    with pytest.raises(AdviceInputError, match="layer 0 dedup fit: coefficient c_t = nan"):
        advice.advise(_fake_expert_op_run(tmp_path / "b", {("dedup", "c_t"): np.nan}), [0.5])
    run = _fake_expert_op_run(tmp_path / "c")
    (run / "manifest.json").write_text(json.dumps({"failed": "03_fits"}))
    with pytest.raises(AdviceInputError, match="manifest.json: field status: the run did not finish"):
        advice.advise(run, [0.5])
    with pytest.raises(AdviceInputError, match="dedup fit predicts a non-positive operation time"):
        advice.advise(_fake_expert_op_run(tmp_path / "e", {("dedup", "t_op"): -1.0}), [0.5])
    eps_run = _fake_expert_op_run(tmp_path / "f")
    pd.DataFrame({"eps_engine": [0.7]}).to_csv(eps_run / "03_epsilon.csv", index=False)
    with pytest.raises(AdviceInputError, match="eps = 0.7 is outside"):
        advice.advise(eps_run, [0.5])
    ok = advice.advise(_fake_expert_op_run(tmp_path / "d"), [0.5])
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
    cli = subprocess.run([sys.executable, "-m", "moespec.cli", "advise", str(run), "-a", "0.6",
                          "--json", str(tmp_path / "advice.json")], capture_output=True, text=True, env=env,
                         timeout=300)
    try:
        adv = advice.advise(run, [0.3, 0.9])
    except AdviceInputError as refused:  # flagged fits (c_u, c_g <= 0 or a non-positive time) or eps >= 1/2
        msg = str(refused)
        assert "03_" in msg and ("(flagged" in msg or "outside [0, 1/2)" in msg), msg
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
    assert "Expert kernel: deduplication is faster from n =" in cli.stdout
    assert "Draft length at acceptance a = 0.600" in cli.stdout
    advice.validate(json.loads((tmp_path / "advice.json").read_text()))


def test_cli_refuses_a_missing_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(paths.ROOT)}
    bad = subprocess.run([sys.executable, "-m", "moespec.cli", "advise", str(tmp_path / "nothing"), "-a", "0.6"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and "does not exist" in bad.stderr


@pytest.mark.notebook
def test_notebook_08_on_this_runs_tables(tmp_path, monkeypatch):
    """Notebook 08 reads the tables of the run it is part of (here notebook 03's, written by hand),
    writes advise's answer as JSON and a figure, and ends with its summary."""
    figures = _fake_expert_op_run(tmp_path / "run08" / "figures")  # the run's own tables
    runner.reproduce(profile="quick", only=["08"], out=tmp_path / "run08", progress=False)
    written = json.loads((figures / "08_advice.json").read_text())
    assert written == json.loads(json.dumps(advice.advise(figures, [0.5, 0.7, 0.9])))
    assert (figures / "08_advice.png").stat().st_size > 0
    text = notebook_text(tmp_path / "run08" / "08_advise.ipynb")
    assert "committed full run" not in text and "Expert kernel: deduplication" in text


@pytest.mark.notebook
def test_notebook_08_without_tables_reads_the_committed_run(tmp_path, monkeypatch):
    runner.reproduce(profile="quick", only=["08"], out=tmp_path / "run08", progress=False)
    text = notebook_text(tmp_path / "run08" / "08_advise.ipynb")
    assert "give no decision" in text and "reading the committed full run's instead" in text
    written = json.loads((tmp_path / "run08" / "figures" / "08_advice.json").read_text())
    assert written == json.loads(json.dumps(advice.advise(COMMITTED, [0.5, 0.7, 0.9])))
