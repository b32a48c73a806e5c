"""Tables 5 and 6 (paper 1, App. D.1 and E) from data/engines/kernel_dispatch.csv: the file's
columns, its agreement with moespec's own switch and with the CUDA readings of issue 26, the byte
counts on a hand case, and the refusals of a bad file."""

from __future__ import annotations

import pandas as pd
import pytest

from moespec.advice import settings
from moespec.engine.switch import SLOT_MAX, Switch
from moespec.model_shapes import PRESETS, MoESpec
from moespec.tables import dispatch as D
from moespec.validate.errors import InputError


def test_file_columns_are_pinned():
    raw = pd.read_csv(D.dispatch_path(), dtype=str, keep_default_na=False)
    assert tuple(raw.columns) == D.COLUMNS == ("engine", "setting", "n_from", "n_to", "kernel", "kind", "bytes",
                                               "f_l", "repository", "file", "commit", "where", "note")
    df = D.load_dispatch()
    # every row read from a repository names file, commit and function; paper rows name the paper
    repo = df[df["repository"] != "paper 1"]
    assert (repo["commit"].str.len() == 40).all() and (repo["where"].str.len() > 20).all()
    assert set(df.loc[df["repository"] == "paper 1", "where"]) == {"paper 1, Appendix E, Table 6"}
    assert {"moespec", "ggml CPU (llama.cpp)", "llama.cpp Metal", "llama.cpp CUDA", "vLLM fused_moe"} <= set(df["engine"])


def test_moespec_rows_are_the_switch():
    df = D.load_dispatch()
    for dedup, setting in ((False, "dedup off"), (True, "dedup on")):
        sw = Switch(dedup=dedup)
        for n in range(1, 2 * SLOT_MAX):
            kind = D.kernel_row(df, "moespec", setting, n)["kind"]
            assert {"slot": "per-slot", "dedup": "deduplicating"}[sw.kernel_for(n)] == kind, (setting, n)


def test_cuda_rows_are_issue_26_readings():
    df = D.load_dispatch()
    mmvq, mmq = D.kernel_row(df, "llama.cpp CUDA", "upstream", 1), D.kernel_row(df, "llama.cpp CUDA", "upstream", 9)
    assert mmvq["n_to"] == settings.MMVQ_MAX_BATCH_SIZE and mmq["n_from"] == settings.MMVQ_MAX_BATCH_SIZE + 1
    assert mmvq["commit"] == settings.VERSIONS["llama.cpp-cuda-kernel"]["commit"]
    assert mmq["commit"] == settings.VERSIONS["llama.cpp-cuda-mmq"]["commit"]


def test_bytes_on_a_hand_case():
    """N = 8, m = 2, two MoE layers, H = 32, I = 16 in f32: w = 3*32*16*4 = 6144 B, W = 12288 B."""
    spec = MoESpec("hand", num_experts=8, top_k=2, num_layers=2, num_moe_layers=2, hidden_size=32,
                   expert_intermediate=16, default_format="f32")
    df = D.load_dispatch()
    slot = D.kernel_row(df, "moespec", "dedup off", 3)
    assert D.pass_bytes(slot, 3, spec) == (3 * 2 * 12288,) * 3
    dedup = D.kernel_row(df, "moespec", "dedup on", 3)
    E, lo, hi = D.pass_bytes(dedup, 3, spec, union=4.5)
    assert (E, lo, hi) == (4.5 * 12288, 2 * 12288, 6 * 12288)
    assert D.pass_bytes(dedup, 5, spec)[2] == 8 * 12288          # min(nm, N) = N: at most every expert
    assert D.pass_bytes(dedup, 5, spec, fmt="bf16")[1] == 2 * 6144   # bf16 halves the bytes
    t5, t6 = D.dispatch_tables(spec, union=[2, 3.5, 4.5, 5, 6, 6.5, 7, 7.5, 8])
    ours = t6[t6["engine"] == "moespec"].set_index("n")
    assert ours.loc[1, "kind_on"] == "per-slot" and ours.loc[1, "E_bytes_on"] == 2 * 12288
    assert ours.loc[2, "E_bytes_off"] == 4 * 12288 and ours.loc[2, "E_bytes_on"] == 3.5 * 12288
    assert ours.loc[2, "f_l_dedup"] == 1 and pd.isna(ours.loc[1, "f_l_dedup"])
    # Table 5: one default setting per engine read from source, every n; the paper's rows are not in it
    assert set(t5["engine"]) == {"moespec", "ggml CPU (llama.cpp)", "llama.cpp Metal", "llama.cpp CUDA", "vLLM fused_moe"}
    assert t5.groupby("engine")["n"].apply(list).map(lambda ns: ns == list(range(1, 10))).all()
    cuda = t5[t5["engine"] == "llama.cpp CUDA"].set_index("n")
    assert cuda.loc[8, "kind"] == "per-slot" and cuda.loc[9, "kind"] == "deduplicating"
    assert pd.isna(cuda.loc[9, "E_bytes"]) and cuda.loc[9, "bytes"] == "Ub"   # f_l not read from source
    assert (t6.loc[t6["engine"].str.contains("paper 1"), "source"].str.startswith("paper 1")).all()


def test_published_shape_bytes():
    """OLMoE in Q8_0: w = 3*2048*1024/32*34 = 6684672 B over 16 layers; n = 2 per-slot = 2*8*W."""
    t5, _ = D.dispatch_tables(PRESETS["olmoe"])
    row = t5[(t5["engine"] == "llama.cpp Metal") & (t5["n"] == 2)].iloc[0]
    assert row["kind"] == "per-slot" and row["E_bytes"] == 2 * 8 * 16 * 6684672


@pytest.mark.parametrize("edit,match", [
    (lambda df: df.drop(columns="commit"), r"missing column\(s\) \['commit'\]"),
    (lambda df: df.assign(setting=df["setting"].where(df.index != 0, "sometimes")), r"row 1 \(line 2\), column 'setting'"),
    (lambda df: df.assign(commit=df["commit"].where(df.index != 4, "")), r"row 5 \(line 6\), column 'commit'"),
    (lambda df: df.assign(n_to=df["n_to"].where(df.index != 0, "0")), r"row 1 \(line 2\), column 'n_to'"),
    (lambda df: df.assign(n_from=df["n_from"].where(df.index != 1, "5")), r"row 2 \(line 3\).*covered by another row"),
    (lambda df: df.assign(bytes=df["bytes"].where(df.index != 0, "Ub")), r"'nmb' for a per-slot kernel"),
])
def test_bad_file_is_refused(tmp_path, edit, match):
    raw = pd.read_csv(D.dispatch_path(), dtype=str, keep_default_na=False)
    path = tmp_path / "kernel_dispatch.csv"
    edit(raw).to_csv(path, index=False)
    with pytest.raises(InputError, match=match):
        D.load_dispatch(path)


def test_uncovered_pass_size_is_named():
    df = D.load_dispatch()
    with pytest.raises(ValueError, match=r"'llama.cpp Metal, modified \(paper 1\)', 'dedup on' has no row covering n = 10"):
        D.kernel_row(df, "llama.cpp Metal, modified (paper 1)", "dedup on", 10)
