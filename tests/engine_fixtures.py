"""Stand-in vLLM and SGLang outputs in exactly the formats of docs/routing.md ("Traces from vLLM
and SGLang"), built from known routing so that an import can be compared with the truth.

Each builder follows one documented example or test of the engine (cited in its docstring and in
``tests/data/engines/README.md``); the payloads are serialised here the way the engine's own code
and docs do it (``ndarray.tolist()`` for vLLM's JSON, ``np.save`` + base64 for the ``.npy``
payload, raw little-endian bytes + base64 for SGLang), never through moespec's importer, so that
the importer is checked against them. ``write_fixtures(folder)`` writes the committed files of
``tests/data/engines/``; a test rebuilds them and compares, so the files and this code cannot drift
apart. None of this was produced by vLLM or SGLang.
"""

from __future__ import annotations

import base64
import io
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

if __name__ == "__main__":  # run as a script: this checkout's moespec, not an installed copy's
    sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent)]

import numpy as np  # noqa: E402

from moespec import paths  # noqa: E402
from moespec.routing import synthetic  # noqa: E402

FIXTURES = paths.ROOT / "tests" / "data" / "engines"

#: A DeepSeek-like model: 4 decoder layers, layer 0 dense (first_k_dense_replace = 1), N = 16, m = 4.
SMALL_CONFIG = {"model_type": "deepseek_v2", "_name_or_path": "fixture/deepseek-like",
                "num_hidden_layers": 4, "first_k_dense_replace": 1, "moe_layer_freq": 1,
                "n_routed_experts": 16, "num_experts_per_tok": 4, "n_shared_experts": 1,
                "hidden_size": 64, "moe_intermediate_size": 32, "intermediate_size": 128,
                "torch_dtype": "bfloat16"}
SMALL_DENSE = [0]
#: OLMoE-1B-7B-0125's shape (the numbers moespec.model_shapes.OLMOE cites from its config.json).
OLMOE_CONFIG = {"model_type": "olmoe", "_name_or_path": "allenai/OLMoE-1B-7B-0125", "num_hidden_layers": 16,
                "num_experts": 64, "num_experts_per_tok": 8, "hidden_size": 2048, "intermediate_size": 1024,
                "torch_dtype": "bfloat16"}


@dataclass
class CompletionOutput:
    """The fields of ``vllm.outputs.CompletionOutput`` (vLLM PR 28284 added ``routed_experts``)."""

    index: int
    text: str
    token_ids: list
    cumulative_logprob: float | None
    logprobs: None
    routed_experts: np.ndarray | None = None
    finish_reason: str | None = "length"
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    """The fields of ``vllm.outputs.RequestOutput`` that matter here; ``prompt_routed_experts``
    exists from vLLM 0.21 on (leave it out for the PR 28284 layout)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list
    prompt_logprobs: None
    outputs: list
    finished: bool = True
    num_cached_tokens: int | None = 0
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        for k, v in self.extra.items():
            setattr(self, k, v)


def routing(seed: int, lengths: list[int], num_layers: int, num_experts: int, top_k: int) -> list[np.ndarray]:
    """Known routing: one ``[T, L, m]`` array per sequence (the sticky process, seeded)."""
    tr = synthetic.sticky(len(lengths), lengths, num_layers, num_experts, top_k, keep=0.4,
                          working_set=min(num_experts, 3 * top_k), seed=seed)
    return [d.astype(np.int64) for d in tr.docs]


def with_dense(ids: np.ndarray, dense: list[int], num_layers: int) -> np.ndarray:
    """Insert all-zero placeholder rows for the dense decoder layers (the engines' buffers are
    zero-filled and only MoE layers write to them)."""
    out = np.zeros((ids.shape[0], num_layers, ids.shape[2]), dtype=ids.dtype)
    out[:, [l for l in range(num_layers) if l not in dense], :] = ids
    return out


def tokens(seed: int, n: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, 50_000, n).tolist()


# --- vLLM ---------------------------------------------------------------------------------------
#: (request id, prompt tokens, generated tokens per completion) of the whole-sequence fixture.
VLLM_FULL_REQUESTS = [("r0", 7, [5]), ("r1", 4, [6]), ("r2", 5, [3, 4])]


def vllm_full_truth() -> dict[str, tuple[np.ndarray, int]]:
    """doc id -> (routing of the MoE layers [P + G - 1, 3, 4], P)."""
    lengths, keys = [], []
    for rid, P, gens in VLLM_FULL_REQUESTS:
        for i, G in enumerate(gens):
            keys.append((rid if len(gens) == 1 else f"{rid}/{i}", P))
            lengths.append(P + G - 1)
    docs = routing(11, lengths, 3, 16, 4)
    return {k: (d, P) for (k, P), d in zip(keys, docs)}


def vllm_full_outputs() -> list[RequestOutput]:
    """RequestOutputs of the PR 28284 layout: routed_experts int32 [P + G - 1, num_hidden_layers,
    top_k] per completion, dense layer 0 as zero rows."""
    truth = vllm_full_truth()
    outs = []
    for n, (rid, P, gens) in enumerate(VLLM_FULL_REQUESTS):
        comps = []
        for i, G in enumerate(gens):
            ids, _ = truth[rid if len(gens) == 1 else f"{rid}/{i}"]
            comps.append(CompletionOutput(i, f"text {i}", tokens(100 * n + i, G), -1.0, None,
                                          with_dense(ids, SMALL_DENSE, 4).astype(np.int32)))
        outs.append(RequestOutput(rid, None, tokens(n, P), None, comps))
    return outs


#: (request id, prompt tokens, prompt positions served from the prefix cache, generated tokens).
VLLM_SPLIT_REQUESTS = [("s0", 6, 0, 4), ("s1", 8, 4, 3)]


def vllm_split_truth() -> dict[str, tuple[np.ndarray, int, int]]:
    """doc id -> (routing [P + G, 3, 4] of every position, P, cached prefix length)."""
    docs = routing(12, [P + G for _, P, _, G in VLLM_SPLIT_REQUESTS], 3, 16, 4)
    return {rid: (d, P, c) for (rid, P, c, _), d in zip(VLLM_SPLIT_REQUESTS, docs)}


def vllm_split_outputs() -> list[RequestOutput]:
    """RequestOutputs of the vLLM 0.21 layout: prompt_routed_experts int16 [P, num_moe_layers,
    top_k] (-1 on prefix-cached positions) and routed_experts int16 [G, num_moe_layers, top_k]."""
    outs = []
    for n, (rid, (ids, P, cached)) in enumerate(vllm_split_truth().items()):
        prompt = ids[:P].astype(np.int16)
        prompt[:cached] = -1
        comp = CompletionOutput(0, "text", tokens(200 + n, ids.shape[0] - P), -1.0, None, ids[P:].astype(np.int16))
        outs.append(RequestOutput(rid, None, tokens(300 + n, P), None, [comp], num_cached_tokens=cached,
                                  extra={"prompt_routed_experts": prompt}))
    return outs


def vllm_openai_response() -> dict:
    """A /v1/completions response of vLLM 0.21 (n = 1): prompt_routed_experts at the response
    level, routed_experts on the choice, usage counts."""
    ids = routing(13, [9], 3, 16, 4)[0]
    return {"id": "cmpl-fixture", "object": "text_completion", "created": 0, "model": "fixture/deepseek-like",
            "choices": [{"index": 0, "text": " the", "logprobs": None, "finish_reason": "length",
                         "routed_experts": ids[5:].tolist()}],
            "prompt_routed_experts": ids[:5].tolist(),
            "usage": {"prompt_tokens": 5, "completion_tokens": 4, "total_tokens": 9}}


# --- SGLang -------------------------------------------------------------------------------------
def b64_int32(ids: np.ndarray) -> str:
    """SGLang's payload: base64 of the little-endian int32 ids, C order."""
    return base64.b64encode(np.ascontiguousarray(ids, dtype="<i4").tobytes()).decode("ascii")


#: (request id, prompt tokens, completion tokens, routed_experts_start_len).
SGLANG_REQUESTS = [("g0", 6, 5, 0), ("g1", 9, 4, 3)]


def sglang_truth() -> dict[str, tuple[np.ndarray, int, int]]:
    """doc id -> (routing of the MoE layers at positions [start, P + G - 1), P, start)."""
    docs = routing(14, [P + G - 1 for _, P, G, _ in SGLANG_REQUESTS], 3, 16, 4)
    return {rid: (d[s:], P, s) for (rid, P, G, s), d in zip(SGLANG_REQUESTS, docs)}


def sglang_generate_records() -> list[dict]:
    """/generate responses: the first bare, the second with its request (which set
    routed_experts_start_len); meta_info.routed_experts over all num_hidden_layers (dense zero)."""
    out = []
    for n, (rid, (ids, P, start)) in enumerate(sglang_truth().items()):
        G = ids.shape[0] + start + 1 - P
        response = {"text": "generated text", "output_ids": tokens(400 + n, G),
                    "meta_info": {"id": rid, "finish_reason": {"type": "length", "length": G},
                                  "prompt_tokens": P, "completion_tokens": G, "cached_tokens": 0,
                                  "routed_experts": b64_int32(with_dense(ids, SMALL_DENSE, 4))}}
        if start:
            request = {"input_ids": tokens(500 + n, P), "sampling_params": {"max_new_tokens": G, "temperature": 0},
                       "return_routed_experts": True, "routed_experts_start_len": start, "rid": rid}
            out.append({"request": request, "response": response})
        else:
            out.append(response)
    return out


def sglang_chat_record() -> dict:
    """An OpenAI /v1/chat/completions response of SGLang: choices[0].sgl_ext.routed_experts."""
    ids = routing(15, [7], 3, 16, 4)[0]
    return {"id": "chat-fixture", "object": "chat.completion", "created": 0, "model": "fixture/deepseek-like",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length",
                         "sgl_ext": {"routed_experts": b64_int32(with_dense(ids, SMALL_DENSE, 4))}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}}


def sglang_chat_truth() -> np.ndarray:
    return routing(15, [7], 3, 16, 4)[0]


# --- the OLMoE-shaped dump of the README's worked example ---------------------------------------
OLMOE_REQUESTS = [(f"wikitext-stand-in/{i}", 24, 9) for i in range(4)]


def olmoe_outputs() -> list[RequestOutput]:
    """PR 28284 layout at OLMoE's shape (16 MoE layers, N = 64, m = 8): the sticky process stands
    in for the routing a vLLM run would return."""
    docs = routing(16, [P + G - 1 for _, P, G in OLMOE_REQUESTS], 16, 64, 8)
    return [RequestOutput(rid, None, tokens(600 + n, P),
                          None, [CompletionOutput(0, "", tokens(700 + n, G), -1.0, None, d.astype(np.int32))])
            for n, ((rid, P, G), d) in enumerate(zip(OLMOE_REQUESTS, docs))]


def _jsonl(path: Path, records: list) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))


def _lists(value):
    return None if value is None else np.asarray(value).tolist()


def request_output_json(out: RequestOutput) -> dict:
    """A RequestOutput as JSON with vLLM's field names (the layout of scripts/record_vllm.py's dump)."""
    return {"request_id": out.request_id, "vllm_request_id": out.request_id,
            "prompt_token_ids": list(out.prompt_token_ids),
            "prompt_routed_experts": _lists(getattr(out, "prompt_routed_experts", None)),
            "routed_experts_prompt_start": 0, "num_cached_tokens": out.num_cached_tokens,
            "outputs": [{"index": c.index, "token_ids": list(c.token_ids), "routed_experts": _lists(c.routed_experts),
                         "finish_reason": c.finish_reason} for c in out.outputs]}


# --- current vLLM: base64 .npy payloads -----------------------------------------------------------
def b64_npy(ids: np.ndarray) -> str:
    """vLLM's payload: the array written with ``np.save`` and base64-encoded (decoded in vLLM's
    tests/entrypoints/openai/test_return_routed_experts.py with ``np.load(io.BytesIO(b64decode(s)))``)."""
    buf = io.BytesIO()
    np.save(buf, ids, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


#: TitanML/tiny-mixtral, the model of vLLM's test_return_routed_experts.py: 8 local experts, top-2,
#: 2 hidden layers (all MoE).
TINY_MIXTRAL = {"num_layers": 2, "num_experts": 8, "top_k": 2}


def pattern_routing(rows: int, num_layers: int, num_experts: int, top_k: int, first_position: int = 0) -> np.ndarray:
    """Known routing by formula: slot j of layer l at sequence position t selects expert
    (3 t + 5 l + j) mod N (distinct slots while top_k <= N). The rows hold positions
    first_position .. first_position + rows - 1, so the formula gives each row's true position."""
    t = np.arange(first_position, first_position + rows)[:, None, None]
    l = np.arange(num_layers)[None, :, None]
    j = np.arange(top_k)[None, None, :]
    return (3 * t + 5 * l + j) % num_experts


#: (request id, prompt tokens, generated tokens, routed_experts_prompt_start, dtype) of the OpenAI
#: responses of current vLLM (docs/features/routed_experts.md: dtype uint8 with <= 256 experts;
#: vLLM PR 51906: int32 expert ids).
VLLM_NPY_REQUESTS = [("cmpl-npy-int32", 4, 10, 0, "int32"), ("cmpl-npy-uint8", 4, 10, 0, "uint8"),
                     ("chatcmpl-npy", 6, 5, 0, "uint8"), ("cmpl-prompt-start", 7, 4, 3, "int32")]


def vllm_npy_truth() -> dict[str, tuple[np.ndarray, int, int]]:
    """doc id -> (routing of positions s .. P + G - 2, P, s)."""
    k = TINY_MIXTRAL
    return {rid: (pattern_routing(P + G - 1 - s, k["num_layers"], k["num_experts"], k["top_k"], s), P, s)
            for rid, P, G, s, _ in VLLM_NPY_REQUESTS}


def vllm_npy_records() -> list[dict]:
    """OpenAI responses of current vLLM as docs/features/routed_experts.md shows them ("Example
    response": ``choices[i].routed_experts`` a base64 ``.npy`` string next to ``token_ids``, the
    request sent with ``return_token_ids``): a completion (int32 and uint8 ids), a chat completion,
    and a completion whose request set ``routed_experts_prompt_start`` (vLLM PR 51906; written as
    ``{"request": ..., "response": ...}`` so the offset travels with the response)."""
    truth = vllm_npy_truth()
    out = []
    for n, (rid, P, G, s, dtype) in enumerate(VLLM_NPY_REQUESTS):
        ids = truth[rid][0].astype(dtype)
        chat = rid.startswith("chat")
        choice = {"index": 0, "token_ids": tokens(800 + n, G), "routed_experts": b64_npy(ids), "finish_reason": "length"}
        choice.update({"message": {"role": "assistant", "content": "..."}} if chat else {"text": "..."})
        response = {"id": rid, "object": "chat.completion" if chat else "text_completion", "created": 0,
                    "model": "TitanML/tiny-mixtral", "choices": [choice],
                    "usage": {"prompt_tokens": P, "completion_tokens": G, "total_tokens": P + G}}
        request = {"model": "TitanML/tiny-mixtral", "max_tokens": G, "temperature": 0, "return_token_ids": True,
                   **({"messages": [{"role": "user", "content": "Hello, world"}]} if chat else {"prompt": "Hello, world"})}
        if s:
            out.append({"request": {**request, "routed_experts_prompt_start": s}, "response": response})
        else:
            out.append(response)
    return out


#: A model with more than 256 experts: vLLM then sends uint16 ids (docs/features/routed_experts.md).
WIDE = {"num_layers": 3, "num_experts": 300, "top_k": 4}


def vllm_npy_uint16_record() -> tuple[dict, np.ndarray]:
    """(response, truth): a completion of a 300-expert model, its ids uint16 in the .npy."""
    P, G = 5, 3
    ids = pattern_routing(P + G - 1, WIDE["num_layers"], WIDE["num_experts"], WIDE["top_k"]) + 250
    ids %= WIDE["num_experts"]
    response = {"id": "cmpl-uint16", "object": "text_completion", "created": 0, "model": "fixture/300-experts",
                "choices": [{"index": 0, "text": "...", "prompt_token_ids": tokens(900, P), "token_ids": tokens(901, G),
                             "routed_experts": b64_npy(ids.astype(np.uint16)), "finish_reason": "length"}]}
    return response, ids


def offline_npy_outputs() -> list[RequestOutput]:
    """RequestOutputs whose routed_experts is the base64 .npy string, as the offline example of
    docs/features/routed_experts.md decodes ``outputs[0].outputs[0].routed_experts``."""
    truth = vllm_npy_truth()
    ids, P, _ = truth["cmpl-npy-uint8"]
    G = ids.shape[0] + 1 - P
    return [RequestOutput("offline-0", None, tokens(950, P), None,
                          [CompletionOutput(0, "...", tokens(951, G), None, None, b64_npy(ids.astype(np.uint8)))])]


# --- SGLang with routed_experts_dtype ------------------------------------------------------------
def sglang_uint8_record() -> tuple[dict, np.ndarray]:
    """(/generate response, truth) with ``meta_info.routed_experts_dtype = "uint8"`` (sglang
    python/sglang/srt/state_capturer/routed_experts_wire.py: the sender names the dtype it sent)."""
    P, G = 5, 4
    ids = with_dense(pattern_routing(P + G - 1, 3, 16, 4), SMALL_DENSE, 4)
    payload = base64.b64encode(np.ascontiguousarray(ids, dtype=np.uint8).tobytes()).decode("ascii")
    return ({"text": "...", "output_ids": tokens(960, G),
             "meta_info": {"id": "g-uint8", "prompt_tokens": P, "completion_tokens": G, "cached_tokens": 0,
                           "routed_experts": payload, "routed_experts_dtype": "uint8"}},
            pattern_routing(P + G - 1, 3, 16, 4))


# --- current vLLM: the tokens-in/tokens-out endpoint /inference/v1/generate -----------------------
#: (request id, generated tokens, routed_experts_prompt_start, .npy dtype) of the generate fixture:
#: the prompt is the request's token_ids [1, 2, 3] and G = 10 (vLLM's
#: tests/entrypoints/scale_out/token_in_token_out/test_return_routed_experts.py), one request per
#: dtype the engines write (uint8/uint16/int32 in the endpoint's protocol, int64 as numpy's default).
GENERATE_PROMPT = [1, 2, 3]
VLLM_GENERATE_REQUESTS = [("gen-uint8", 10, 0, "uint8"), ("gen-int32", 10, 0, "int32"),
                          ("gen-int64", 10, 0, "int64"), ("gen-prompt-start", 10, 2, "uint8")]


def vllm_generate_truth() -> dict[str, tuple[np.ndarray, int, int]]:
    """doc id -> (routing of positions s .. P + G - 2 at tiny-mixtral's shape, P, s)."""
    k, P = TINY_MIXTRAL, len(GENERATE_PROMPT)
    return {rid: (pattern_routing(P + G - 1 - s, k["num_layers"], k["num_experts"], k["top_k"], s), P, s)
            for rid, G, s, _ in VLLM_GENERATE_REQUESTS}


def _generate_response(rid: str, G: int, payload: str, seed: int) -> dict:
    """A non-streaming /inference/v1/generate response (``GenerateResponse`` of vLLM's
    vllm/entrypoints/scale_out/token_in_token_out/protocol.py: top-level ``request_id``, per choice
    ``token_ids`` (the generated tokens only) and ``routed_experts``; ``usage`` unset)."""
    return {"request_id": rid, "choices": [{"index": 0, "finish_reason": "length", "token_ids": tokens(seed, G),
                                            "routed_experts": payload}]}


def vllm_generate_records() -> list[dict]:
    """Each request with its response, as a client of the endpoint stores them: the request's
    ``token_ids`` are the prompt, its ``sampling_params.routed_experts_prompt_start`` the offset."""
    truth = vllm_generate_truth()
    out = []
    for n, (rid, G, s, dtype) in enumerate(VLLM_GENERATE_REQUESTS):
        params = {"max_tokens": G, "temperature": 0.0, **({"routed_experts_prompt_start": s} if s else {})}
        request = {"model": "TitanML/tiny-mixtral", "request_id": rid, "token_ids": GENERATE_PROMPT,
                   "sampling_params": params, "stream": False}
        out.append({"request": request,
                    "response": _generate_response(rid, G, b64_npy(truth[rid][0].astype(dtype)), 1000 + n)})
    return out


def vllm_generate_uint16_record() -> tuple[dict, np.ndarray]:
    """(bare response, truth): a 300-expert model's generate response, uint16 ids; stored without
    its request, so the prompt length (5) must be given."""
    P, G = 5, 3
    ids = pattern_routing(P + G - 1, WIDE["num_layers"], WIDE["num_experts"], WIDE["top_k"])
    ids = (ids + 250) % WIDE["num_experts"]
    return _generate_response("gen-uint16", G, b64_npy(ids.astype(np.uint16)), 1100), ids


def vllm_uncaptured_record() -> dict:
    """A generate response whose routed_experts is all zeros, correctly shaped (tiny-mixtral,
    uint8): what vLLM returns when the MoE kernel routes inside itself and bypasses the capture
    (vllm-project/vllm issue 44116, PR 49184: ``min=0 max=0``, every token "routes to expert 0")."""
    P, G = len(GENERATE_PROMPT), 10
    zeros = np.zeros((P + G - 1, TINY_MIXTRAL["num_layers"], TINY_MIXTRAL["top_k"]), dtype=np.uint8)
    request = {"model": "TitanML/tiny-mixtral", "token_ids": GENERATE_PROMPT,
               "sampling_params": {"max_tokens": G, "temperature": 0.0}, "stream": False}
    return {"request": request, "response": _generate_response("gen-uncaptured", G, b64_npy(zeros), 1200)}


def sglang_uncaptured_record() -> dict:
    """An SGLang /generate response whose int32 payload is all zeros (sgl-project/sglang PR 37949:
    the NGRAM speculative worker returns an all-zeros capture tape)."""
    P, G = 6, 5
    zeros = np.zeros((P + G - 1, 4, 4), dtype=np.int32)
    return {"text": "...", "output_ids": tokens(1300, G),
            "meta_info": {"id": "g-uncaptured", "prompt_tokens": P, "completion_tokens": G, "cached_tokens": 0,
                          "routed_experts": b64_int32(zeros)}}


def write_fixtures(folder: Path) -> list[Path]:
    """Write every fixture file into ``folder`` (the README beside them is written by hand)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config_small.json").write_text(json.dumps(SMALL_CONFIG, indent=1) + "\n")
    (folder / "config_olmoe.json").write_text(json.dumps(OLMOE_CONFIG, indent=1) + "\n")
    _jsonl(folder / "vllm_full.jsonl", [request_output_json(o) for o in vllm_full_outputs()])
    _jsonl(folder / "vllm_split.jsonl", [request_output_json(o) for o in vllm_split_outputs()])
    _jsonl(folder / "vllm_olmoe.jsonl", [request_output_json(o) for o in olmoe_outputs()])
    _jsonl(folder / "vllm_openai.jsonl", [vllm_openai_response()])
    _jsonl(folder / "vllm_openai_npy.jsonl", vllm_npy_records())
    _jsonl(folder / "vllm_openai_npy_uint16.jsonl", [vllm_npy_uint16_record()[0]])
    _jsonl(folder / "sglang_generate.jsonl", sglang_generate_records())
    _jsonl(folder / "sglang_generate_uint8.jsonl", [sglang_uint8_record()[0]])
    _jsonl(folder / "sglang_chat.jsonl", [sglang_chat_record()])
    _jsonl(folder / "vllm_generate.jsonl", vllm_generate_records())
    _jsonl(folder / "vllm_generate_uint16.jsonl", [vllm_generate_uint16_record()[0]])
    _jsonl(folder / "vllm_generate_uncaptured.jsonl", [vllm_uncaptured_record()])
    _jsonl(folder / "sglang_generate_uncaptured.jsonl", [sglang_uncaptured_record()])
    return sorted(p for p in folder.iterdir() if p.suffix != ".md")


if __name__ == "__main__":  # python tests/engine_fixtures.py: rewrite the committed fixtures
    if FIXTURES.resolve().parent.parent.parent != Path(__file__).resolve().parent.parent:
        sys.exit(f"refusing to write {FIXTURES}: not this checkout's tests/data/engines")
    for p in write_fixtures(FIXTURES):
        print(f"{p.stat().st_size:>8d}  {p}")
