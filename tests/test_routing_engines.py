"""Importing the routed experts that vLLM and SGLang return (moespec.routing.engines), on stand-in
outputs in exactly their documented formats (tests/engine_fixtures.py, tests/data/engines/)."""

from __future__ import annotations

import base64
import io
import json
import struct

import engine_fixtures as fx
import numpy as np
import pytest

from moespec import model_shapes as models
from moespec.cli import main as cli_main
from moespec.routing import RoutingTrace, from_sglang, from_vllm, import_jsonl
from moespec.routing.engines import decode_sglang, vllm_routed_array


def _docs(trace: RoutingTrace) -> dict[str, np.ndarray]:
    return {d: trace.docs[i].astype(np.int64) for i, d in enumerate(trace.doc_ids)}


def test_committed_fixtures_are_current(tmp_path):
    written = fx.write_fixtures(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in fx.FIXTURES.iterdir() if p.suffix != ".md")
    readme = (fx.FIXTURES / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in written), "every fixture is described in its README"
    for p in written:
        assert p.read_bytes() == (fx.FIXTURES / p.name).read_bytes(), p.name


# --- model configs ------------------------------------------------------------------------------
def test_spec_from_config_agrees_with_the_presets():
    olmoe = models.spec_from_config(fx.OLMOE_CONFIG)
    for attr in ("num_experts", "top_k", "num_layers", "num_moe_layers", "hidden_size", "expert_intermediate"):
        assert getattr(olmoe, attr) == getattr(models.OLMOE, attr), attr
    assert olmoe.expert_bytes("bf16") == models.OLMOE.expert_bytes("bf16") == 3 * 2048 * 1024 * 2
    assert olmoe.default_format == "bf16" and olmoe.name == "allenai/OLMoE-1B-7B-0125"
    # DeepSeek-V2-Lite's config.json numbers (as cited by moespec.model_shapes): a dense first layer
    ds = models.spec_from_config({"num_hidden_layers": 27, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                                  "n_routed_experts": 64, "num_experts_per_tok": 6, "n_shared_experts": 2,
                                  "hidden_size": 2048, "moe_intermediate_size": 1408, "intermediate_size": 10944})
    assert ds.num_moe_layers == models.DEEPSEEK_V2_LITE.num_moe_layers == 26
    assert ds.extra["moe_layers"] == list(range(1, 27))
    assert ds.expert_intermediate == 1408 and ds.num_shared_experts == 2


def test_config_moe_layer_rules():
    qwen = {"num_hidden_layers": 6, "mlp_only_layers": [0, 3], "decoder_sparse_step": 1}
    assert models.config_moe_layers(qwen) == [1, 2, 4, 5]
    assert models.config_moe_layers({"num_hidden_layers": 6, "decoder_sparse_step": 2}) == [1, 3, 5]
    assert models.config_moe_layers({"num_hidden_layers": 6, "first_k_dense_replace": 2, "moe_layer_freq": 2}) == [2, 4]
    assert models.config_format({"quantization_config": {"quant_method": "mxfp4"}}) == "mxfp4"
    with pytest.raises(ValueError, match="torch_dtype 'int4'"):
        models.config_format({"torch_dtype": "int4"})
    with pytest.raises(ValueError, match="num_hidden_layers"):
        models.spec_from_config({"num_experts": 4})


def test_read_config_from_a_checkpoint_folder(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(fx.SMALL_CONFIG))
    assert models.read_config(tmp_path)["n_routed_experts"] == 16
    with pytest.raises(FileNotFoundError, match="config.json"):
        models.read_config(tmp_path / "nowhere")


# --- vLLM ---------------------------------------------------------------------------------------
def test_vllm_whole_sequence_layout_drops_the_dense_layer():
    trace = from_vllm(fx.vllm_full_outputs(), config=fx.SMALL_CONFIG)
    truth = fx.vllm_full_truth()
    assert trace.doc_ids == ["r0", "r1", "r2/0", "r2/1"]
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, truth[doc][0])
    assert trace.meta["dense_layers"] == [0] and trace.meta["layer_indices"] == [1, 2, 3]
    assert trace.meta["prompt_tokens"] == [7, 4, 5, 5] and trace.meta["generated_tokens"] == [4, 5, 2, 3]
    assert trace.num_experts == 16 and trace.top_k == 4 and trace.model == "fixture/deepseek-like"
    assert trace.expert_bytes.tolist() == [3 * 64 * 32 * 2] * 3  # bf16 SwiGLU expert, from the config
    assert trace.meta["layout"] == ["full"] and trace.meta["engine"] == "vllm"


def test_vllm_jsonl_dump_gives_the_same_trace_as_the_objects(tmp_path):
    direct = from_vllm(fx.vllm_full_outputs(), config=fx.SMALL_CONFIG)
    dumped = import_jsonl(fx.FIXTURES / "vllm_full.jsonl", "vllm", config=fx.FIXTURES / "config_small.json")
    assert dumped.doc_ids == direct.doc_ids
    for a, b in zip(dumped.docs, direct.docs):
        np.testing.assert_array_equal(a, b)
    assert dumped.meta["imported_from"] == "vllm_full.jsonl"
    path = dumped.save(tmp_path / "t.npz")
    again = RoutingTrace.load(path)
    assert again.meta["dense_layers"] == [0] and again.meta["prompt_tokens"] == [7, 4, 5, 5]


def test_dense_placeholders_found_without_a_config_and_tokens_kept_apart():
    auto = from_vllm(fx.vllm_full_outputs(), num_experts=16)
    assert auto.meta["dense_layers"] == [0] and auto.expert_bytes.tolist() == [1.0] * 3
    truth = fx.vllm_full_truth()
    gen = from_vllm(fx.vllm_full_outputs(), num_experts=16, tokens="generated")
    prompt = from_vllm(fx.vllm_full_outputs(), num_experts=16, tokens="prompt")
    for doc, (ids, P) in truth.items():
        np.testing.assert_array_equal(_docs(gen)[doc], ids[P:])
        np.testing.assert_array_equal(_docs(prompt)[doc], ids[:P])
    assert gen.meta["prompt_tokens"] == [0, 0, 0, 0] and prompt.meta["generated_tokens"] == [0, 0, 0, 0]
    with pytest.raises(ValueError, match=r"request 'r0': routing not captured by this backend: token 0, layer 0 holds "
                                         r"expert 0 in all 4 slots .* or a dense layer's placeholder kept"):
        from_vllm(fx.vllm_full_outputs(), num_experts=16, dense_layers=None)  # placeholders kept: invalid


def test_vllm_split_layout_drops_the_prefix_cached_positions():
    trace = from_vllm(fx.vllm_split_outputs(), config=fx.SMALL_CONFIG)
    truth = fx.vllm_split_truth()
    for doc, ids in _docs(trace).items():
        full, P, cached = truth[doc]
        np.testing.assert_array_equal(ids, full[cached:])
    assert trace.meta["layout"] == ["split"] and trace.meta["dense_layers"] == []
    assert trace.meta["layer_indices"] == [1, 2, 3]  # the engine returned the MoE layers only
    assert trace.meta["first_position"] == [0, 4] and trace.meta["prompt_tokens"] == [6, 4]
    assert trace.meta["generated_tokens"] == [4, 3]


def test_vllm_openai_completions_response():
    trace = import_jsonl(fx.FIXTURES / "vllm_openai.jsonl", "vllm", num_experts=16)
    np.testing.assert_array_equal(trace.docs[0], fx.routing(13, [9], 3, 16, 4)[0])
    assert trace.doc_ids == ["cmpl-fixture"] and trace.meta["prompt_tokens"] == [5]


# --- SGLang -------------------------------------------------------------------------------------
def test_sglang_payload_decodes_a_hand_packed_array():
    ids = [[[0, 3], [1, 2]], [[2, 0], [3, 1]], [[1, 3], [0, 2]]]  # 3 tokens x 2 layers x top-2
    packed = struct.pack("<12i", *[v for tok in ids for layer in tok for v in layer])
    payload = base64.b64encode(packed).decode()
    np.testing.assert_array_equal(decode_sglang(payload, 2, 2), ids)
    resp = {"text": "", "meta_info": {"id": "h", "prompt_tokens": 2, "completion_tokens": 2,
                                      "routed_experts": payload}}
    trace = from_sglang([resp], num_layers=2, top_k=2, num_experts=4)
    assert trace.doc_ids == ["h"] and trace.docs[0].tolist() == ids
    assert trace.meta["prompt_tokens"] == [2] and trace.meta["generated_tokens"] == [1]


def test_sglang_generate_with_start_len_and_dense_layer():
    trace = import_jsonl(fx.FIXTURES / "sglang_generate.jsonl", "sglang", config=fx.FIXTURES / "config_small.json")
    truth = fx.sglang_truth()
    assert trace.doc_ids == ["g0", "g1"]
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, truth[doc][0])
    assert trace.meta["first_position"] == [0, 3] and trace.meta["prompt_tokens"] == [6, 6]
    assert trace.meta["generated_tokens"] == [4, 3] and trace.meta["dense_layers"] == [0]


def test_sglang_openai_chat_sgl_ext():
    trace = import_jsonl(fx.FIXTURES / "sglang_chat.jsonl", "sglang", num_layers=4, top_k=4, num_experts=16)
    np.testing.assert_array_equal(trace.docs[0], fx.sglang_chat_truth())
    assert trace.doc_ids == ["chat-fixture"] and trace.meta["dense_layers"] == [0]


# --- bad input: a clear error naming the request -------------------------------------------------
def _full(**change):
    outs = fx.vllm_full_outputs()
    for k, v in change.items():
        setattr(outs[1].outputs[0], k, v)
    return outs


def test_vllm_errors_name_the_request():
    with pytest.raises(ValueError, match=r"request 'r1': routed_experts must be \[tokens, layers, top_k\]"):
        from_vllm(_full(routed_experts=np.zeros((9, 16), np.int32)), num_experts=16)
    with pytest.raises(ValueError, match=r"request 'r1': no routed_experts .*enable_return_routed_experts"):
        from_vllm(_full(routed_experts=None), num_experts=16)
    with pytest.raises(ValueError, match=r"request 'r1': routed_experts has 8 token rows for P = 4 prompt and G = 6 generated tokens; "
                                         r"whole sequence from s would be P \+ G - 1 - s = 9 rows; it could be "
                                         r"positions 1 \.\. 8 \(pass prompt_start=1"):
        from_vllm(_full(routed_experts=np.ones((8, 4, 4), np.int32)), num_experts=16)
    bad = fx.vllm_full_outputs()
    bad[2].outputs[1].routed_experts = bad[2].outputs[1].routed_experts[:, :3]
    with pytest.raises(ValueError, match=r"request 'r2/1': routing has \(layers, top_k\) = \(3, 4\).*"
                                         r"inconsistent layer counts across requests"):
        from_vllm(bad, num_experts=16)
    with pytest.raises(ValueError, match=r"request 'r0': expert id 1[0-5] at token \d+ \((prompt|generated)\), "
                                         r"layer [123], slot \d is outside \[0, N\) with N = 10"):
        from_vllm(fx.vllm_full_outputs(), num_experts=10)
    with pytest.raises(ValueError, match="N is unknown"):
        from_vllm(fx.vllm_full_outputs())


def test_vllm_sentinel_outside_the_cached_prefix_and_duplicates():
    outs = fx.vllm_split_outputs()
    outs[0].prompt_routed_experts[3, 1, 2] = -1
    with pytest.raises(ValueError, match=r"request 's0': expert id -1 .* at token 3, layer 1, slot 2"):
        from_vllm(outs, num_experts=16)
    outs = fx.vllm_split_outputs()
    outs[1].outputs[0].routed_experts[1, 2] = [5, 5, 6, 7]
    with pytest.raises(ValueError, match=r"request 's1': token \d+, layer 2 selects the same expert twice"):
        from_vllm(outs, num_experts=16)


def test_config_and_declared_dense_layers_must_match_the_data():
    outs = fx.vllm_full_outputs()
    with pytest.raises(ValueError, match=r"config makes layer\(s\) \[1\] dense, but the engine returned nonzero"):
        from_vllm(outs, config={**fx.SMALL_CONFIG, "first_k_dense_replace": 2})
    with pytest.raises(ValueError, match=r"dense_layers \[2\] hold nonzero expert ids"):
        from_vllm(outs, num_experts=16, dense_layers=[0, 2])
    with pytest.raises(ValueError, match="routing has 4 layers; the model config has num_hidden_layers 6"):
        from_vllm(outs, config={**fx.SMALL_CONFIG, "num_hidden_layers": 6})
    with pytest.raises(ValueError, match=r"layer\(s\) \[0\] are all zeros .*config does not match"):
        from_vllm(outs, config={**fx.SMALL_CONFIG, "num_hidden_layers": 5})
    with pytest.raises(ValueError, match="num_experts_per_tok 2"):
        from_vllm(outs, config={**fx.SMALL_CONFIG, "num_experts_per_tok": 2})


def test_sglang_truncated_payloads_are_caught():
    records = fx.sglang_generate_records()
    payload = records[0]["meta_info"]["routed_experts"]

    def with_payload(p):
        return [{**records[0], "meta_info": {**records[0]["meta_info"], "routed_experts": p}}]

    with pytest.raises(ValueError, match=r"request 'g0': routed_experts is not valid base64"):
        from_sglang(with_payload(payload[:-3]), num_layers=4, top_k=4, num_experts=16)
    raw = base64.b64decode(payload)
    assert len(raw) == 10 * 4 * 4 * 4  # P + G - 1 = 10 tokens x 4 layers x top-4 x 4 bytes
    with pytest.raises(ValueError, match=r"request 'g0': routed_experts decodes to 638 bytes, not a whole "
                                         r"number of int32 ids"):
        from_sglang(with_payload(base64.b64encode(raw[:-2]).decode()), num_layers=4, top_k=4, num_experts=16)
    with pytest.raises(ValueError, match=r"request 'g0': routed_experts holds 157 int32 ids, not a whole number "
                                         r"of tokens of num_layers x top_k = 4 x 4 = 16"):
        from_sglang(with_payload(base64.b64encode(raw[:-12]).decode()), num_layers=4, top_k=4, num_experts=16)
    short = base64.b64encode(raw[:-64]).decode()  # exactly one token fewer
    with pytest.raises(ValueError, match=r"request 'g0': routed_experts holds 9 tokens, expected .* = 10 "
                                         r"\(truncated payload\?\)"):
        from_sglang(with_payload(short), num_layers=4, top_k=4, num_experts=16)
    with pytest.raises(ValueError, match="pass num_layers and top_k"):
        from_sglang(records, num_experts=16)
    with pytest.raises(ValueError, match=r"request 'g0': no routed_experts .*--enable-return-routed-experts"):
        from_sglang(with_payload(None), num_layers=4, top_k=4, num_experts=16)


def test_jsonl_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "cut.jsonl"
    text = (fx.FIXTURES / "vllm_full.jsonl").read_text()
    bad.write_text(text[: len(text) - 200])  # the last line cut off
    with pytest.raises(ValueError, match=r"cut.jsonl:3: not valid JSON"):
        import_jsonl(bad, "vllm", num_experts=16)
    with pytest.raises(ValueError, match=r"cut2.jsonl: vLLM request 'r1'"):
        lines = text.splitlines()
        rec = json.loads(lines[1])
        rec["outputs"][0]["routed_experts"][0][1][0] = 99
        (tmp_path / "cut2.jsonl").write_text("\n".join([lines[0], json.dumps(rec), lines[2]]) + "\n")
        import_jsonl(tmp_path / "cut2.jsonl", "vllm", num_experts=16)


def test_cli_import_routing(tmp_path, capsys):
    out = tmp_path / "trace.npz"
    rc = cli_main(["import-routing", str(fx.FIXTURES / "sglang_generate.jsonl"), "--engine", "sglang",
                   "--config", str(fx.FIXTURES / "config_small.json"), "--out", str(out)])
    assert rc == 0
    trace = RoutingTrace.load(out)
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, fx.sglang_truth()[doc][0])
    printed = capsys.readouterr().out
    assert "dense layers dropped [0]" in printed and "prompt tokens 12, generated tokens 7" in printed
    rc = cli_main(["import-routing", str(fx.FIXTURES / "sglang_generate.jsonl"), "--engine", "sglang",
                   "--num-experts", "16", "--out", str(tmp_path / "x.npz")])
    assert rc == 1 and "pass num_layers and top_k" in capsys.readouterr().err
    assert not (tmp_path / "x.npz").exists()


def test_sglang_batched_generate():
    """/generate with a batch of prompts answers a list; per-item request fields are lists."""
    records = fx.sglang_generate_records()
    batch = {"request": {"rid": ["g0", "g1"], "routed_experts_start_len": [0, 3], "return_routed_experts": True},
             "response": [records[0], records[1]["response"]]}
    trace = from_sglang([batch], config=fx.SMALL_CONFIG)
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, fx.sglang_truth()[doc][0])
    assert trace.meta["first_position"] == [0, 3]


# --- current vLLM: base64 .npy payloads, routed_experts_prompt_start ------------------------------
def _records(name):
    return [json.loads(line) for line in (fx.FIXTURES / name).read_text().splitlines()]


def test_vllm_npy_fixture_decodes_as_vllms_own_test_does():
    """The fixture's payloads, decoded exactly as vLLM's test_return_routed_experts.py decodes them
    (np.load of the base64-decoded bytes), hold the known routing in the documented dtypes."""
    truth = fx.vllm_npy_truth()
    dtypes = {rid: d for rid, *_, d in fx.VLLM_NPY_REQUESTS}
    for rec in _records("vllm_openai_npy.jsonl"):
        resp = rec.get("response", rec)
        arr = np.load(io.BytesIO(base64.b64decode(resp["choices"][0]["routed_experts"])))
        assert arr.dtype == np.dtype(dtypes[resp["id"]]) and arr.shape[1:] == (2, 2)
        np.testing.assert_array_equal(arr, truth[resp["id"]][0])


def test_vllm_openai_npy_import_places_rows_at_their_positions():
    trace = import_jsonl(fx.FIXTURES / "vllm_openai_npy.jsonl", "vllm", num_experts=8)
    truth = fx.vllm_npy_truth()
    assert trace.doc_ids == ["cmpl-npy-int32", "cmpl-npy-uint8", "chatcmpl-npy", "cmpl-prompt-start"]
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, truth[doc][0])
    # P = 4, G = 10: 13 rows from 0; the chat P = 6, G = 5; the offset request P = 7, G = 4, s = 3
    assert trace.meta["first_position"] == [0, 0, 0, 3]
    assert trace.meta["positions"] == [[0, 13], [0, 13], [0, 10], [3, 10]]
    assert trace.meta["prompt_tokens"] == [4, 4, 6, 4] and trace.meta["generated_tokens"] == [9, 9, 4, 3]
    assert trace.meta["layout"] == ["full"] and trace.meta["vllm_payload"] == ["base64 .npy"]
    # position t, layer l, slot j holds (3 t + 5 l + j) mod 8: the offset request's first row is t = 3
    assert _docs(trace)["cmpl-prompt-start"][0].tolist() == [[1, 2], [6, 7]]


def test_vllm_prompt_start_from_the_record_the_argument_or_refused():
    bare = _records("vllm_openai_npy.jsonl")[3]["response"]  # the offset request without its request
    with pytest.raises(ValueError, match=r"routed_experts has 7 token rows for P = 7 prompt and G = 4 generated "
                                         r"tokens; whole sequence from s would be P \+ G - 1 - s = 10 rows; it "
                                         r"could be positions 3 \.\. 9 \(pass prompt_start=3, the request's "
                                         r"routed_experts_prompt_start\): say which"):
        from_vllm([bare], num_experts=8)
    # the trap: P + G - 1 - s <= G with s < P reads as "generated tokens only" unless told
    P, G, s = 5, 6, 4
    rows = fx.pattern_routing(P + G - 1 - s, 2, 8, 2, s)
    trap = {"id": "trap", "choices": [{"index": 0, "token_ids": list(range(G)), "routed_experts": fx.b64_npy(rows)}],
            "usage": {"prompt_tokens": P, "completion_tokens": G}}
    with pytest.raises(ValueError, match=r"it could be positions 4 \.\. 9 \(pass prompt_start=4, the request's "
                                         r"routed_experts_prompt_start\) or the generated tokens only \(vLLM 0\.21 "
                                         r"without prompt_routed_experts: pass layout='split'\): say which"):
        from_vllm([trap], num_experts=8)
    placed = from_vllm([trap], num_experts=8, prompt_start=4)
    assert placed.meta["positions"] == [[4, 10]] and placed.meta["prompt_tokens"] == [1]
    np.testing.assert_array_equal(placed.docs[0], rows)
    split = from_vllm([trap], num_experts=8, layout="split")  # the user's other reading: generated tokens only
    assert split.meta["first_position"] == [5] and split.meta["prompt_tokens"] == [0]
    trace = from_vllm([bare], num_experts=8, prompt_start=3)
    np.testing.assert_array_equal(trace.docs[0], fx.vllm_npy_truth()["cmpl-prompt-start"][0])
    assert trace.meta["first_position"] == [3]
    with pytest.raises(ValueError, match=r"the record says routed_experts_prompt_start = 3, prompt_start = 2"):
        from_vllm([_records("vllm_openai_npy.jsonl")[3]], num_experts=8, prompt_start=2)
    with pytest.raises(ValueError, match=r"routed_experts_prompt_start 9 is beyond the 7 prompt tokens"):
        from_vllm([bare], num_experts=8, prompt_start=9, layout="full")


def test_vllm_uint16_and_offline_base64():
    trace = import_jsonl(fx.FIXTURES / "vllm_openai_npy_uint16.jsonl", "vllm", num_experts=300)
    np.testing.assert_array_equal(trace.docs[0], fx.vllm_npy_uint16_record()[1])
    assert trace.meta["prompt_tokens"] == [5]  # from choices[0].prompt_token_ids (no usage in this response)
    off = from_vllm(fx.offline_npy_outputs(), num_experts=8)
    np.testing.assert_array_equal(off.docs[0], fx.vllm_npy_truth()["cmpl-npy-uint8"][0])
    assert off.meta["vllm_payload"] == ["base64 .npy"]


def _npy_by_hand(values: list[int], shape: tuple, descr: str = "|u1") -> str:
    """A .npy file written from the format's definition (numpy.lib.format, version 1.0): magic,
    version, little-endian header length, the header dict padded to 64 bytes, the raw data."""
    header = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    header += " " * ((64 - (10 + len(header) + 1) % 64) % 64) + "\n"
    data = np.array(values, dtype=descr).tobytes()
    raw = b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode("latin1") + data
    return base64.b64encode(raw).decode()


def test_vllm_npy_decoding_against_a_hand_written_file():
    payload = _npy_by_hand([0, 3, 1, 2, 2, 0, 3, 1], (2, 2, 2))
    np.testing.assert_array_equal(vllm_routed_array(payload, "here"), [[[0, 3], [1, 2]], [[2, 0], [3, 1]]])
    big = _npy_by_hand([300, 1, 299, 2], (1, 2, 2), "<u2")
    assert vllm_routed_array(big, "here").tolist() == [[[300, 1], [299, 2]]]


def test_vllm_payloads_it_cannot_read_are_named():
    sglang_like = base64.b64encode(struct.pack("<4i", 0, 1, 2, 3)).decode()
    with pytest.raises(ValueError, match=r"here: routed_experts is a base64 string of 24 characters that is not a "
                                         r"\.npy \(it decodes to 16 bytes without the \.npy magic .*SGLang's raw "
                                         r"int32 payload\? read it with --engine sglang\); vLLM layouts known here: "
                                         r"'full' = .* 'split' = "):
        vllm_routed_array(sglang_like, "here")
    with pytest.raises(ValueError, match=r"routed_experts is a string of 7 characters that is not base64"):
        vllm_routed_array("gASV...", "here")
    npy = fx.b64_npy(np.zeros((3, 2, 2), np.int32))
    cut = base64.b64encode(base64.b64decode(npy)[:-5]).decode()
    with pytest.raises(ValueError, match=r"is a base64 \.npy of \d+ bytes that numpy cannot read .*truncated"):
        vllm_routed_array(cut, "here")
    with pytest.raises(ValueError, match=r"must be an array of expert ids or a base64 \.npy string; found an "
                                         r"object with keys \['data', 'shape'\]"):
        vllm_routed_array({"data": "x", "shape": [1]}, "here")
    with pytest.raises(ValueError, match=r"must hold integer expert ids, found dtype float32"):
        vllm_routed_array(fx.b64_npy(np.zeros((3, 2, 2), np.float32)), "here")
    with pytest.raises(ValueError, match=r"must hold integer expert ids, found strings"):
        vllm_routed_array([[["a", "b"]]], "here")


def test_wrong_json_types_in_dumps_are_named(tmp_path):
    """Issue 25's case for dumps: a field of the wrong type is a ValueError naming the file, the
    request and the field, what was expected and found (no raw TypeError/AttributeError/IndexError)."""
    rec = json.loads((fx.FIXTURES / "vllm_full.jsonl").read_text().splitlines()[0])
    cases = [({**rec, "prompt_token_ids": "abc"}, r"request 'r0': prompt_token_ids must be a list of token ids; "
                                                  r"found a string of 3 characters 'abc'"),
             ({**rec, "outputs": {"a": 1}}, r"outputs must be a list of completions; found an object"),
             ({**rec, "outputs": [{**rec["outputs"][0], "token_ids": 7}]}, r"token_ids must be a list of token ids; found int 7"),
             ({**rec, "routed_experts_prompt_start": -1}, r"routed_experts_prompt_start must be an integer >= 0; found int -1"),
             ({**rec, "outputs": [{**rec["outputs"][0], "routed_experts": 3.5}]}, r"found float 3\.5"),
             ([rec], r"vLLM record 0: expected a vLLM RequestOutput .* found a list of 1 item"),
             ({"id": "c", "choices": {"0": {}}}, r"request 'c': choices must be a list"),
             ({"id": "c", "choices": [], "usage": {"prompt_tokens": "5"}}, r"usage\.prompt_tokens must be an integer "
                                                                         r">= 0; found a string of 1 characters '5'")]
    for n, (bad, message) in enumerate(cases):
        path = tmp_path / f"bad{n}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"bad{n}\.jsonl: .*{message}"):
            import_jsonl(path, "vllm", num_experts=16)
    g = fx.sglang_generate_records()
    meta = g[0]["meta_info"]
    scases = [({"meta_info": [1]}, r"meta_info must be a JSON object; found a list"),
              ({**g[0], "meta_info": {**meta, "prompt_tokens": "6"}}, r"meta_info\.prompt_tokens must be an integer"),
              ({"request": {"routed_experts_start_len": "3"}, "response": g[0]}, r"routed_experts_start_len must be an "
                                                                                 r"integer >= 0; found a string"),
              ({"request": {"rid": ["a"]}, "response": [g[0], g[1]["response"]]}, r"request\.rid has 1 value\(s\) for "
                                                                                   r"2 response item"),
              ({"id": "c", "choices": [{"sgl_ext": "x"}], "usage": {"prompt_tokens": 1}}, r"choices\[0\]\.sgl_ext must "
                                                                                          r"be a JSON object"),
              (7, r"SGLang record 0: expected a JSON object")]
    for n, (bad, message) in enumerate(scases):
        path = tmp_path / f"sbad{n}.jsonl"
        path.write_text(json.dumps(bad) + "\n")
        with pytest.raises(ValueError, match=rf"sbad{n}\.jsonl: .*{message}"):
            import_jsonl(path, "sglang", num_layers=4, top_k=4, num_experts=16)


def test_a_dump_of_the_other_engine_is_named(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"vllm_full\.jsonl: SGLang record 0: not a SGLang output: it has the "
                                         r"field 'outputs' of vLLM's responses; read it with --engine vllm"):
        import_jsonl(fx.FIXTURES / "vllm_full.jsonl", "sglang", num_layers=4, top_k=4, num_experts=16)
    with pytest.raises(ValueError, match=r"not a vLLM output: it has the field 'meta_info' of SGLang's responses; "
                                         r"read it with --engine sglang"):
        import_jsonl(fx.FIXTURES / "sglang_generate.jsonl", "vllm", num_experts=16)
    with pytest.raises(ValueError, match=r"field 'choices\[\]\.sgl_ext'"):
        import_jsonl(fx.FIXTURES / "sglang_chat.jsonl", "vllm", num_experts=16)
    with pytest.raises(ValueError, match=r"routed_experts is a base64 \.npy file \(vLLM's payload\), not SGLang's "
                                         r"raw ids: read it with --engine vllm"):
        import_jsonl(fx.FIXTURES / "vllm_openai_npy.jsonl", "sglang", num_layers=2, top_k=2, num_experts=8)
    with pytest.raises(ValueError, match=r"field 'prompt_routed_experts' of vLLM's responses"):
        import_jsonl(fx.FIXTURES / "vllm_openai.jsonl", "sglang", num_layers=3, top_k=4, num_experts=16)
    listed = {"id": "c", "choices": [{"routed_experts": [[[0, 1]]]}], "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
    with pytest.raises(ValueError, match=r"routed_experts is a list of 1 item\(s\), not SGLang's base64 string "
                                         r"\(nested lists are vLLM's layout: read it with --engine vllm\)"):
        from_sglang([listed], num_layers=1, top_k=2, num_experts=4)
    rc = cli_main(["import-routing", str(fx.FIXTURES / "vllm_full.jsonl"), "--engine", "sglang", "--num-layers", "4",
                   "--top-k", "4", "--num-experts", "16", "--out", str(tmp_path / "t.npz")])
    err = capsys.readouterr().err
    assert rc == 1 and "vllm_full.jsonl" in err and "--engine vllm" in err and "restart" not in err


def test_sglang_wire_dtype():
    record, truth = fx.sglang_uint8_record()
    trace = import_jsonl(fx.FIXTURES / "sglang_generate_uint8.jsonl", "sglang", config=fx.FIXTURES / "config_small.json")
    np.testing.assert_array_equal(trace.docs[0], truth)
    assert trace.meta["dense_layers"] == [0]
    bad = {**record, "meta_info": {**record["meta_info"], "routed_experts_dtype": "int8"}}
    with pytest.raises(ValueError, match=r"routed_experts_dtype 'int8' is not one of SGLang's wire dtypes "
                                         r"\['int32', 'uint16', 'uint8'\]"):
        from_sglang([bad], num_layers=4, top_k=4, num_experts=16)
    as_int32 = {**record, "meta_info": {k: v for k, v in record["meta_info"].items() if k != "routed_experts_dtype"}}
    with pytest.raises(ValueError, match=r"decodes to 128 bytes.*|holds 32 int32 ids.*|expected .* = 8"):
        from_sglang([as_int32], num_layers=4, top_k=4, num_experts=16)  # the bytes read as int32 do not fit


def test_cli_prompt_start(tmp_path, capsys):
    bare = tmp_path / "bare.jsonl"
    bare.write_text(json.dumps(_records("vllm_openai_npy.jsonl")[3]["response"]) + "\n")
    out = tmp_path / "t.npz"
    assert cli_main(["import-routing", str(bare), "--engine", "vllm", "--num-experts", "8", "--out", str(out)]) == 1
    assert "pass prompt_start=3" in capsys.readouterr().err
    assert cli_main(["import-routing", str(bare), "--engine", "vllm", "--num-experts", "8", "--prompt-start", "3",
                     "--out", str(out)]) == 0
    assert RoutingTrace.load(out).meta["positions"] == [[3, 10]]
    assert cli_main(["import-routing", str(bare), "--engine", "sglang", "--prompt-start", "3", "--num-layers", "2",
                     "--top-k", "2", "--num-experts", "8", "--out", str(out)]) == 2


def test_fields_read_are_the_documented_list():
    """Every field the importers read is in ENGINE_FIELDS, and docs/routing.md lists each of them
    with the file and commit it was checked against (issue 26, item 6)."""
    import re

    from moespec import paths
    from moespec.routing import engines

    source = (paths.ROOT / "moespec" / "routing" / "engines.py").read_text()
    read = set(re.findall(r'_field\([a-z_.]+, "([a-z_]+)"', source)) | set(re.findall(r'\.get\("([a-z_]+)"', source))
    internal = {"request", "response", "meta", "moe_layers"}  # dump wrappers, the caller's meta, the config spec
    assert read - internal == set(engines.ENGINE_FIELDS)
    docs = (paths.ROOT / "docs" / "routing.md").read_text().splitlines()
    for name, (_, repo, path, commit) in engines.ENGINE_FIELDS.items():
        rows = [line for line in docs if line.startswith("|") and f"`{name}`" in line.split("|")[1]]
        assert rows and any(commit in row and path.split(" ")[0] in row for row in rows), name


def test_gzip_by_content_and_binary_files(tmp_path):
    import gzip

    named_plain = tmp_path / "dump.jsonl"  # gzip data without .gz
    named_plain.write_bytes(gzip.compress((fx.FIXTURES / "vllm_full.jsonl").read_bytes()))
    assert import_jsonl(named_plain, "vllm", num_experts=16).doc_ids == ["r0", "r1", "r2/0", "r2/1"]
    binary = tmp_path / "weights.jsonl"
    binary.write_bytes(b'{"a": 1}\n' + bytes(range(128, 256)))
    with pytest.raises(ValueError, match=r"weights\.jsonl:2: not UTF-8 text"):
        import_jsonl(binary, "vllm", num_experts=16)


# --- vLLM's tokens-in/tokens-out endpoint, every dtype, routing not captured --------------------------------
def test_vllm_generate_request_and_response_in_every_dtype():
    """/inference/v1/generate (request_id, choices[i].token_ids, routed_experts as base64 .npy, no usage):
    the prompt is the request's token_ids, the offset its sampling_params.routed_experts_prompt_start."""
    records = _records("vllm_generate.jsonl")
    dtypes = {rid: d for rid, *_, d in fx.VLLM_GENERATE_REQUESTS}
    truth = fx.vllm_generate_truth()
    for rec in records:   # decoded as vLLM's test_return_routed_experts.py decodes them, in the dtype sent
        assert "usage" not in rec["response"] and "id" not in rec["response"]
        arr = np.load(io.BytesIO(base64.b64decode(rec["response"]["choices"][0]["routed_experts"])))
        assert arr.dtype == np.dtype(dtypes[rec["response"]["request_id"]])
    assert sorted(set(dtypes.values())) == ["int32", "int64", "uint8"]
    trace = import_jsonl(fx.FIXTURES / "vllm_generate.jsonl", "vllm", num_experts=8)
    assert trace.doc_ids == ["gen-uint8", "gen-int32", "gen-int64", "gen-prompt-start"]
    for doc, ids in _docs(trace).items():
        np.testing.assert_array_equal(ids, truth[doc][0])
    # P = 3 (the request's token_ids), G = 10: positions 0 .. 11; the offset request from s = 2
    assert trace.meta["positions"] == [[0, 12]] * 3 + [[2, 12]]
    assert trace.meta["prompt_tokens"] == [3, 3, 3, 1] and trace.meta["generated_tokens"] == [9, 9, 9, 9]


def test_vllm_generate_response_alone_needs_the_prompt_length(tmp_path, capsys):
    bare = _records("vllm_generate.jsonl")[0]["response"]
    with pytest.raises(ValueError, match=r"vLLM request 'gen-uint8': the prompt length is unknown: .*/inference/v1/"
                                         r"generate carries only the generated tokens.*--prompt-length"):
        from_vllm([bare], num_experts=8)
    trace = from_vllm([bare], num_experts=8, prompt_length=3)
    np.testing.assert_array_equal(trace.docs[0], fx.vllm_generate_truth()["gen-uint8"][0])
    with pytest.raises(ValueError, match=r"routed_experts has 12 token rows for P = 4 prompt and G = 10"):
        from_vllm([bare], num_experts=8, prompt_length=4)
    with pytest.raises(ValueError, match=r"'gen-uint8': the record holds a prompt of 3 tokens, prompt_length "
                                         r"\(--prompt-length\) 4 was given"):
        from_vllm([_records("vllm_generate.jsonl")[0]], num_experts=8, prompt_length=4)
    response, ids = fx.vllm_generate_uint16_record()   # uint16 ids of a 300-expert model, stored without the request
    trace = import_jsonl(fx.FIXTURES / "vllm_generate_uint16.jsonl", "vllm", num_experts=300, prompt_length=5)
    assert np.load(io.BytesIO(base64.b64decode(response["choices"][0]["routed_experts"]))).dtype == np.uint16
    np.testing.assert_array_equal(trace.docs[0], ids)
    out = tmp_path / "t.npz"
    argv = ["import-routing", str(fx.FIXTURES / "vllm_generate_uint16.jsonl"), "--engine", "vllm", "--num-experts",
            "300", "--out", str(out)]
    assert cli_main(argv) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "the prompt length is unknown" in err and "--prompt-length" in err
    assert cli_main(argv + ["--prompt-length", "5"]) == 0
    assert RoutingTrace.load(out).meta["prompt_tokens"] == [5]
    assert cli_main(argv[:3] + ["sglang", "--prompt-length", "5", "--num-layers", "3", "--top-k", "4",
                                "--num-experts", "300", "--out", str(out)]) == 2
    assert "--prompt-length" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", ["uint8", "uint16", "int32", "int64"])
def test_vllm_npy_payload_in_every_dtype(dtype):
    rows = fx.pattern_routing(6, 2, 8, 2)
    resp = {"request_id": "d", "choices": [{"index": 0, "token_ids": [7] * 4, "routed_experts":
                                            fx.b64_npy(rows.astype(dtype))}]}
    trace = from_vllm([resp], num_experts=8, prompt_length=3)
    np.testing.assert_array_equal(trace.docs[0], rows)


@pytest.mark.parametrize("dtype", ["int32", "uint16", "uint8", " UINT16 "])
def test_sglang_every_wire_dtype(dtype):
    """SGLang's wire dtypes (routed_experts_wire.py: int32, uint16, uint8, named case-insensitively)."""
    ids = fx.pattern_routing(9, 4, 16, 4)
    wire = {"int32": "<i4", "uint16": "<u2", "uint8": "u1"}[dtype.strip().lower()]
    payload = base64.b64encode(np.ascontiguousarray(ids, dtype=wire).tobytes()).decode()
    resp = {"meta_info": {"id": "w", "prompt_tokens": 5, "completion_tokens": 5, "routed_experts": payload,
                          "routed_experts_dtype": dtype}}
    np.testing.assert_array_equal(from_sglang([resp], num_layers=4, top_k=4, num_experts=16,
                                              dense_layers=None).docs[0], ids)


def test_routing_not_captured_is_refused(capsys, tmp_path):
    with pytest.raises(ValueError, match=r"vllm_generate_uncaptured.jsonl: vLLM: routing not captured by this "
                                         r"backend: every expert id of every one of the 2 layers is 0 .*issue 44116"):
        import_jsonl(fx.FIXTURES / "vllm_generate_uncaptured.jsonl", "vllm", num_experts=8)
    with pytest.raises(ValueError, match=r"request 'gen-uncaptured': routing not captured by this backend: token 0, "
                                         r"layer 0 holds expert 0 in all 2 slots \(24 such"):   # nothing taken as dense
        import_jsonl(fx.FIXTURES / "vllm_generate_uncaptured.jsonl", "vllm", num_experts=8, dense_layers=None)
    with pytest.raises(ValueError, match=r"routing not captured by this backend: every expert id of every one of the "
                                         r"4 layers is 0"):   # no config: every layer looks like a dense placeholder
        import_jsonl(fx.FIXTURES / "sglang_generate_uncaptured.jsonl", "sglang", num_layers=4, top_k=4, num_experts=16)
    with pytest.raises(ValueError, match=r"request 'g-uncaptured': routing not captured by this backend: token 0, "
                                         r"layer 1 holds expert 0 in all 4 slots"):   # the config's MoE layers
        import_jsonl(fx.FIXTURES / "sglang_generate_uncaptured.jsonl", "sglang",
                     config=fx.FIXTURES / "config_small.json")
    out = tmp_path / "t.npz"
    assert cli_main(["import-routing", str(fx.FIXTURES / "vllm_generate_uncaptured.jsonl"), "--engine", "vllm",
                     "--num-experts", "8", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "routing not captured by this backend" in err and not out.exists()


def test_constant_routing_is_refused_and_a_short_top1_dump_is_not():
    def response(rows):
        return {"request_id": "c", "choices": [{"index": 0, "token_ids": [1] * (rows.shape[0] - 2),
                                                "routed_experts": fx.b64_npy(rows.astype(np.uint8))}]}
    zeros = np.zeros((9, 2, 1), np.int64)   # top_k 1, every token to expert 0 in both layers
    with pytest.raises(ValueError, match=r"routing not captured by this backend: layer 0 routes every one of the 9 "
                                         r"tokens to the same expert\(s\) \[0\] \(constant routing\)"):
        from_vllm([response(zeros)], num_experts=8, prompt_length=3, dense_layers=None)
    same = np.tile(np.array([[3, 5], [1, 6]]), (9, 1, 1))   # top_k 2, one expert set for every token
    with pytest.raises(ValueError, match=r"layer 0 routes every one of the 9 tokens to the same expert\(s\) \[3, 5\]"):
        from_vllm([response(same)], num_experts=8, prompt_length=3)
    short = np.zeros((4, 2, 1), np.int64)   # fewer tokens than CONSTANT_MIN_TOKENS: cannot be told apart
    assert from_vllm([response(short)], num_experts=8, prompt_length=3, dense_layers=None).num_docs == 1
