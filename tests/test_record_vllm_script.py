"""scripts/record_vllm.py without vLLM (none here): --help, the JSONL writer, the prompt builders,
and the whole main() against a stand-in ``vllm`` module that records how the engine was asked."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import types

import numpy as np
import pytest

import engine_fixtures as fx
from bench_scripts import load_script
from moespec import paths
from moespec.routing import from_vllm, import_jsonl


@pytest.fixture(scope="module")
def script():
    return load_script("record_vllm")


class WordTokenizer:
    """A stand-in tokenizer: one id per whitespace word (its length), with an optional chat template."""

    chat_template = "{{ messages }}"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [len(w) for w in text.split()]}

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True):
        return [1] + self(messages[0]["content"])["input_ids"] + [2]


def test_help_runs_without_vllm():
    proc = subprocess.run([sys.executable, str(paths.ROOT / "scripts" / "record_vllm.py"), "--help"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "--tp" in proc.stdout and "enable_return_routed_experts" not in proc.stderr


def test_arguments_are_checked(script):
    with pytest.raises(SystemExit):
        script.parse_args(["--model", "m", "--out", "x.jsonl", "--tp", "0"])
    args = script.parse_args(["--model", "m", "--out", "x.jsonl", "--tp", "4", "--corpus", "spec-bench"])
    assert args.tp == 4 and args.max_new_tokens == 256


def test_missing_vllm_is_a_clear_error(script, monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    assert script.main(["--model", "m", "--out", str(tmp_path / "o.jsonl")]) == 2
    assert "vLLM is not installed" in capsys.readouterr().err


def test_writer_round_trip_gzip_and_document_ids(script, tmp_path):
    outs = fx.vllm_full_outputs()
    path = script.write_jsonl(outs, tmp_path / "dump.jsonl.gz", ["doc-a", "doc-b", "doc-c"])
    with gzip.open(path, "rt") as fh:
        records = [json.loads(line) for line in fh]
    assert [r["request_id"] for r in records] == ["doc-a", "doc-b", "doc-c"]
    assert [r["vllm_request_id"] for r in records] == ["r0", "r1", "r2"]
    trace = import_jsonl(path, "vllm", config=fx.SMALL_CONFIG)
    direct = from_vllm(outs, config=fx.SMALL_CONFIG)
    assert trace.doc_ids == ["doc-a", "doc-b", "doc-c/0", "doc-c/1"]
    for a, b in zip(trace.docs, direct.docs):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="2 request ids for 3 outputs"):
        script.write_jsonl(outs, tmp_path / "x.jsonl", ["a", "b"])


def test_prompt_builders(script):
    wiki = script.wikitext_prompts(WordTokenizer(), max_docs=3, max_tokens=50)
    assert [d for d, _ in wiki] == ["wikitext/test/000", "wikitext/test/001", "wikitext/test/002"]
    assert all(0 < len(ids) <= 50 for _, ids in wiki)
    spec = script.spec_bench_prompts(WordTokenizer(), max_docs=None, max_tokens=20)
    assert len(spec) == 480 and spec[0][0] == "spec-bench/81"
    assert spec[0][1][0] == 1 and len(spec[0][1]) <= 20  # the chat template's tokens come first


def _stand_in_vllm(monkeypatch, seen, payload="array", version="0.99.0-stand-in"):
    """A ``vllm`` module whose LLM records its arguments and returns one token per prompt, the
    routing as a numpy array (PR 28284) or as the base64 .npy string of current vLLM."""

    class LLM:
        def __init__(self, **kwargs):
            seen["llm"] = kwargs
            seen["env"] = {k: v for k, v in __import__("os").environ.items() if k.startswith("VLLM_")}

        def get_tokenizer(self):
            return WordTokenizer()

        def generate(self, prompts, sampling):
            seen["sampling"] = sampling
            lengths = [len(p["prompt_token_ids"]) for p in prompts]
            docs = fx.routing(21, lengths, 3, 16, 4)  # new_tokens = 1: P + 1 - 1 rows
            seen["truth"] = docs
            def routed(d):
                ids = fx.with_dense(d, [0], 4)
                return fx.b64_npy(ids.astype(np.uint8)) if payload == "base64 .npy" else ids
            return [fx.RequestOutput(str(i), None, p["prompt_token_ids"], None,
                                     [fx.CompletionOutput(0, "", [7], -1.0, None, routed(d))])
                    for i, (p, d) in enumerate(zip(prompts, docs))]

    vllm = types.ModuleType("vllm")
    vllm.__version__ = version
    vllm.LLM = LLM
    vllm.SamplingParams = lambda **kw: kw
    inputs = types.ModuleType("vllm.inputs")
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)


def _checkpoint(tmp_path):
    model = tmp_path / "ckpt"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(fx.SMALL_CONFIG))
    return model


def test_main_against_a_stand_in_vllm(script, monkeypatch, tmp_path, capsys):
    """The whole recording path: the engine must be asked for routed experts on --tp GPUs with what
    capture needs (Model Runner V2, prefix caching), the script must say so, and the JSONL it
    writes must import."""
    seen = {}
    _stand_in_vllm(monkeypatch, seen)
    monkeypatch.delenv(script.V2_RUNNER, raising=False)
    model = _checkpoint(tmp_path)
    out = tmp_path / "wiki.jsonl"
    rc = script.main(["--model", str(model), "--tp", "4", "--corpus", "wikitext", "--max-docs", "2",
                      "--max-prompt-tokens", "40", "--out", str(out)])
    assert rc == 0
    assert seen["llm"]["enable_return_routed_experts"] is True and seen["llm"]["tensor_parallel_size"] == 4
    assert seen["llm"]["enable_prefix_caching"] is True and seen["env"][script.V2_RUNNER] == "1"
    assert seen["llm"]["max_model_len"] == 41 and seen["sampling"]["max_tokens"] == 1
    assert seen["sampling"]["temperature"] == 0.0
    printed = capsys.readouterr().out
    assert "set VLLM_USE_V2_MODEL_RUNNER=1" in printed and "enable_prefix_caching=True" in printed
    config = json.loads((tmp_path / "wiki.jsonl.config.json").read_text())
    rec = config["moespec_recording"]
    assert rec["vllm_version"] == "0.99.0-stand-in" and rec["layout"] == ["full"] and rec["payload"] == ["array"]
    assert rec["settings"] == {"VLLM_USE_V2_MODEL_RUNNER": "1", "enable_prefix_caching": True,
                               "enable_return_routed_experts": True, "routed_experts_prompt_start": 0}
    assert config["n_routed_experts"] == 16  # the model's own config.json is kept around it
    trace = import_jsonl(out, "vllm", config=f"{out}.config.json")
    assert trace.doc_ids == ["wikitext/test/000", "wikitext/test/001"]
    assert trace.meta["dense_layers"] == [0] and trace.doc_lengths.tolist() == [40, 40]
    assert trace.meta["generated_tokens"] == [0, 0]  # the pass routes the article; the one new token never enters


def test_base64_payloads_are_written_as_integers(script, monkeypatch, tmp_path, capsys):
    """Current vLLM hands back a base64 .npy string: the dump holds integer lists all the same."""
    seen = {}
    _stand_in_vllm(monkeypatch, seen, payload="base64 .npy")
    monkeypatch.setenv(script.V2_RUNNER, "0")
    out = tmp_path / "wiki.jsonl"
    assert script.main(["--model", str(_checkpoint(tmp_path)), "--max-docs", "2", "--max-prompt-tokens", "30",
                        "--no-prefix-caching", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "kept VLLM_USE_V2_MODEL_RUNNER=0" in printed and "enable_prefix_caching=False" in printed
    assert seen["llm"]["enable_prefix_caching"] is False and seen["env"][script.V2_RUNNER] == "0"
    records = [json.loads(line) for line in out.read_text().splitlines()]
    ids = records[0]["outputs"][0]["routed_experts"]
    assert isinstance(ids, list) and all(type(v) is int for row in ids for layer in row for v in layer)
    assert records[0]["routed_experts_prompt_start"] == 0
    rec = json.loads((tmp_path / "wiki.jsonl.config.json").read_text())["moespec_recording"]
    assert rec["payload"] == ["base64 .npy"] and rec["settings"]["VLLM_USE_V2_MODEL_RUNNER"] == "0"
    trace = import_jsonl(out, "vllm", config=fx.SMALL_CONFIG)
    for got, truth in zip(trace.docs, seen["truth"]):
        np.testing.assert_array_equal(got, truth)


def test_writer_output_is_the_fixture_layout(script, tmp_path):
    """The script's JSONL and the fixture (written from vLLM's field names by the fixture code, not
    by the script) agree byte for byte; int16/uint8 arrays and .npy strings come out as integers."""
    path = script.write_jsonl(fx.vllm_full_outputs(), tmp_path / "full.jsonl")
    assert path.read_text() == (fx.FIXTURES / "vllm_full.jsonl").read_text()
    offline = script.output_record(fx.offline_npy_outputs()[0])
    assert offline["outputs"][0]["routed_experts"] == fx.vllm_npy_truth()["cmpl-npy-uint8"][0].tolist()
    assert script.returned_format(fx.vllm_split_outputs()) == {"layout": ["split"], "payload": ["array"]}
    bad = fx.offline_npy_outputs()[0]
    bad.outputs[0].routed_experts = "not-a-payload"
    with pytest.raises(ValueError, match=r"vLLM request 'offline-0': routed_experts is a string of 13 characters "
                                         r"that is not base64"):
        script.output_record(bad)
