"""Importing the routed experts that vLLM and SGLang return (moespec.routing.engines), on stand-in
outputs in exactly their documented formats (tests/engine_fixtures.py, tests/data/engines/)."""

from __future__ import annotations

import base64
import json
import struct

import engine_fixtures as fx
import numpy as np
import pytest

from moespec import model_shapes as models
from moespec.cli import main as cli_main
from moespec.routing import RoutingTrace, from_sglang, from_vllm, import_jsonl
from moespec.routing.engines import decode_sglang


def _docs(trace: RoutingTrace) -> dict[str, np.ndarray]:
    return {d: trace.docs[i].astype(np.int64) for i, d in enumerate(trace.doc_ids)}


def test_committed_fixtures_are_current(tmp_path):
    written = fx.write_fixtures(tmp_path)
    assert sorted(p.name for p in written) == sorted(p.name for p in fx.FIXTURES.iterdir())
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
    with pytest.raises(ValueError, match=r"request 'r0': token 0, layer 0 selects the same expert twice: \[0, 0, 0, 0\]"):
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
