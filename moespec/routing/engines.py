"""Routing traces from inference engines: the routed experts that vLLM and SGLang return.

Paper 1 records S_{l,t} through the model's own routers (:mod:`moespec.routing.record`); a model
served tensor-parallel on several GPUs is routed inside the engine instead, and both engines can
hand the ids back with each request. This module turns what they return into a validated
:class:`~moespec.routing.RoutingTrace`, one document per request (per completion when n > 1),
prompt and generated tokens kept apart in ``meta``. The formats read here, with their sources,
are listed in docs/routing.md ("Traces from vLLM and SGLang"); in short:

* vLLM, whole-sequence layout (vLLM PR 28284, ``enable_return_routed_experts=True``):
  ``RequestOutput.outputs[i].routed_experts``, an int array ``[P + G - 1, num_hidden_layers,
  top_k]`` (P prompt tokens, G generated tokens; the last generated token never enters the
  model), with all-zero rows for the decoder layers that have no router (dense layers). Current
  vLLM returns the same rows as a base64-encoded ``.npy`` string (``choices[i].routed_experts`` of
  the OpenAI server; offline in the versions whose docs decode it so), uint8/uint16 or int32, and
  with the request's ``routed_experts_prompt_start`` s only positions s .. P + G - 2.
* vLLM, split layout (vLLM 0.21 docs, "Routed Experts Replay"): ``RequestOutput.
  prompt_routed_experts`` ``[P, num_moe_layers, top_k]`` and ``outputs[i].routed_experts``
  ``[<= G, num_moe_layers, top_k]`` (int16); prompt positions served from the prefix cache hold
  -1. The OpenAI ``/v1/completions`` JSON carries the same two fields (response level and choice
  level).
* SGLang (``--enable-return-routed-experts``, request field ``return_routed_experts``): base64 of
  little-endian ids (int32, or ``meta_info.routed_experts_dtype``) of logical shape
  ``[P + G - 1 - s, num_hidden_layers, top_k]``, s = ``routed_experts_start_len`` (default 0), in
  ``meta_info.routed_experts`` of ``/generate`` and in ``choices[i].sgl_ext.routed_experts`` of the
  OpenAI endpoints (``choices[i].routed_experts`` in earlier releases).

Every problem is a ValueError naming the request (and token, layer, slot where there is one), the
field, what was expected and what was found; a dump of the other engine is named as such.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from moespec.model_shapes import FORMATS, spec_from_config
from moespec.routing.trace import RoutingTrace

ENGINES = ("vllm", "sglang")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
TOKENS = ("all", "prompt", "generated")
VLLM_LAYOUTS = ("auto", "full", "split")


#: Every engine field the importers read: name -> (engine, repository, file, commit) where it was
#: checked; docs/routing.md lists the same ("Fields read, and where they were checked"), and
#: tests/test_routing_engines.py pins the two lists and this module's reads to each other.
VLLM_REPO, SGLANG_REPO = "vllm-project/vllm", "sgl-project/sglang"
_VLLM_SERVING = (VLLM_REPO, "vllm/entrypoints/openai/completion/serving.py", "cc139d8ea6ff")
_VLLM_REPLAY = (VLLM_REPO, "docs/training/routed_experts_replay.md", "0087e005dec9")
_VLLM_NPY = (VLLM_REPO, "tests/entrypoints/openai/test_return_routed_experts.py", "184bf8130478")
_SGLANG_IO = (SGLANG_REPO, "python/sglang/srt/managers/io_struct.py", "001067fffe33")
ENGINE_FIELDS = {
    "request_id": ("vllm", VLLM_REPO, "vllm/entrypoints/scale_out/token_in_token_out/protocol.py", "006ebac240f3"),
    "prompt_token_ids": ("vllm", *_VLLM_SERVING),
    "outputs": ("vllm", *_VLLM_SERVING),
    "index": ("vllm", *_VLLM_SERVING),
    "token_ids": ("vllm", *_VLLM_SERVING),
    "choices": ("vllm", *_VLLM_SERVING),
    "usage": ("vllm", *_VLLM_SERVING),
    "prompt_tokens": ("vllm", *_VLLM_SERVING),
    "completion_tokens": ("vllm", *_VLLM_SERVING),
    "id": ("vllm", *_VLLM_SERVING),
    "routed_experts": ("vllm", *_VLLM_NPY),
    "prompt_routed_experts": ("vllm", *_VLLM_REPLAY),
    "routed_experts_prompt_start": ("vllm", VLLM_REPO, "vllm/sampling_params.py", "00388f6573cc"),
    "sampling_params": ("vllm", VLLM_REPO, "vllm/sampling_params.py", "00388f6573cc"),
    "meta_info": ("sglang", SGLANG_REPO, "python/sglang/srt/state_capturer/routed_experts_wire.py", "a6463a100342"),
    "routed_experts_dtype": ("sglang", SGLANG_REPO, "python/sglang/srt/state_capturer/routed_experts_wire.py",
                             "a6463a100342"),
    "routed_experts_start_len": ("sglang", *_SGLANG_IO),
    "rid": ("sglang", *_SGLANG_IO),
    "sgl_ext": ("sglang", SGLANG_REPO, "class SglExt (file not read at a commit)", "PR 17434"),
}


@dataclass
class EngineSequence:
    """One request's (or completion's) routing as the engine returned it.

    ``ids``: ``[T, L_engine, k]``; row t is the token at absolute position ``first_position + t``
    of the sequence (prompt first). ``prompt_rows``: how many of the T rows are prompt tokens.
    """

    doc_id: str
    ids: np.ndarray
    prompt_rows: int
    first_position: int = 0


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """``obj.name`` for engine objects, ``obj[name]`` for their JSON form."""
    if isinstance(obj, dict):
        return obj.get(name, default)
    return getattr(obj, name, default)


def _describe(value: Any) -> str:
    """What a value is, for an error message ("a string of 428 characters", "an object with keys ...")."""
    if isinstance(value, (str, bytes)):
        kind = "string" if isinstance(value, str) else "bytes object"
        shown = f" {value!r}" if len(value) <= 24 else ""
        return f"a {kind} of {len(value)} characters{shown}"
    if isinstance(value, dict):
        return f"an object with keys {sorted(map(str, value))[:8]}"
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item(s)"
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype} and shape {value.shape}"
    return f"{type(value).__name__} {value!r}"[:80]


def _count(value: Any, where: str, field: str) -> int | None:
    """The length of a token-id list (``prompt_token_ids``, ``token_ids``, ``output_ids``), or None."""
    if value is None:
        return None
    if isinstance(value, (str, bytes, dict)) or not hasattr(value, "__len__"):
        raise ValueError(f"{where}: {field} must be a list of token ids; found {_describe(value)}")
    return len(value)


def _nonneg_int(value: Any, where: str, field: str) -> int | None:
    """A count or position (``prompt_tokens``, ``routed_experts_start_len``, ...) as an int, or None."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{where}: {field} must be an integer >= 0; found {_describe(value)}")
    return int(value)


def _int_array(value: Any, where: str, what: str) -> np.ndarray:
    """``value`` (numpy array or nested lists) as an int64 ``[T, L, k]`` array; errors name ``where``."""
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{where}: {what} is not a [tokens, layers, top_k] array ({exc})") from None
    if arr.size == 0:  # no tokens (e.g. "[]" in JSON): the shape is taken from the other requests
        return np.zeros((0, *arr.shape[1:]) if arr.ndim == 3 else (0, 0, 0), dtype=np.int64)
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        found = ("strings" if arr.dtype.kind in "US" else "booleans" if arr.dtype == np.bool_
                 else "ragged or mixed data" if arr.dtype == object else f"dtype {arr.dtype}")
        raise ValueError(f"{where}: {what} must hold integer expert ids, found {found} (dtype {arr.dtype}, "
                         f"shape {arr.shape})")
    if arr.ndim != 3:
        raise ValueError(f"{where}: {what} must be [tokens, layers, top_k], found {arr.ndim} "
                         f"dimension(s) with shape {arr.shape}")
    return arr.astype(np.int64, copy=False)


def _strip_cached_prefix(ids: np.ndarray, where: str) -> tuple[np.ndarray, int]:
    """vLLM marks prompt positions served from the prefix cache with -1: drop that leading run of
    prompt rows (their routing was not returned) and return (rows, rows dropped). A -1 anywhere
    else is an error naming the token, layer and slot."""
    whole = (ids == -1).reshape(ids.shape[0], -1).all(axis=1)
    lead = ids.shape[0] if whole.all() else int(np.argmin(whole))
    rest = ids[lead:]
    if (rest == -1).any():
        t, l, s = (int(i) for i in np.argwhere(rest == -1)[0])
        raise ValueError(f"{where}: expert id -1 (vLLM's mark of a prefix-cached position) at token "
                         f"{lead + t}, layer {l}, slot {s}, outside the leading cached prefix of "
                         f"{lead} prompt token(s)")
    return rest, lead


# --- vLLM ---------------------------------------------------------------------------------------
#: The first bytes of every .npy file (numpy's format spec, ``numpy.lib.format``).
NPY_MAGIC = b"\x93NUMPY"
#: What a vLLM payload can be, as named in ``meta["vllm_payload"]``.
VLLM_PAYLOADS = ("array", "base64 .npy")
VLLM_LAYOUT_HELP = ("vLLM layouts known here: 'full' = positions s .. P + G - 2 in one array (vLLM PR 28284: "
                    "numpy [P + G - 1, layers, top_k]; current vLLM: the same as a base64 .npy string, "
                    "s = routed_experts_prompt_start, default 0), 'split' = vLLM 0.21's prompt_routed_experts "
                    "[P, layers, top_k] plus routed_experts [<= G, layers, top_k] (docs/routing.md)")


def _npy_from_base64(value: str | bytes, where: str, field: str) -> np.ndarray:
    """vLLM's base64-encoded ``.npy`` payload (``np.load(io.BytesIO(base64.b64decode(s)))``, the
    decoding of vLLM's tests/entrypoints/openai/test_return_routed_experts.py) as an int64 array."""
    n = len(value)
    try:
        raw = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where}: {field} is a string of {n} characters that is not base64 ({exc}); "
                         f"{VLLM_LAYOUT_HELP}") from None
    if not raw.startswith(NPY_MAGIC):
        hint = (" (a whole number of 4-byte ids: SGLang's raw int32 payload? read it with --engine sglang)"
                if raw and len(raw) % 4 == 0 else "")
        raise ValueError(f"{where}: {field} is a base64 string of {n} characters that is not a .npy (it decodes "
                         f"to {len(raw)} bytes without the .npy magic \\x93NUMPY){hint}; {VLLM_LAYOUT_HELP}")
    try:
        arr = np.load(io.BytesIO(raw), allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise ValueError(f"{where}: {field} is a base64 .npy of {len(raw)} bytes that numpy cannot read "
                         f"({exc}); a truncated payload?") from None
    return _int_array(arr, where, f"{field} (decoded .npy)")


def vllm_routed_array(value: Any, where: str, field: str = "routed_experts") -> np.ndarray:
    """A vLLM ``routed_experts``/``prompt_routed_experts`` value as an int64 ``[tokens, layers, top_k]``
    array: a numpy array (offline), nested lists (its JSON form) or a base64 ``.npy`` string
    (current OpenAI server, and offline where a version returns it); any integer dtype (int16 in
    vLLM 0.21, uint8/uint16 or int32 later). Anything else is an error naming ``field`` and the
    layouts known."""
    if isinstance(value, (str, bytes)):
        return _npy_from_base64(value, where, field)
    if value is None or isinstance(value, (dict, bool, int, float)):
        raise ValueError(f"{where}: {field} must be an array of expert ids or a base64 .npy string; found "
                         f"{_describe(value)}; {VLLM_LAYOUT_HELP}")
    return _int_array(value, where, field)


def _other_engine(record: Any, engine: str) -> str | None:
    """The field that marks ``record`` as the other engine's output, or None."""
    if not isinstance(record, dict):
        return None
    body = record.get("response", record)
    items = body if isinstance(body, list) else [body]
    for item in items:
        if not isinstance(item, dict):
            continue
        choices = item.get("choices") if isinstance(item.get("choices"), list) else []
        if engine == "vllm":
            if "meta_info" in item:
                return "meta_info"
            if any(isinstance(c, dict) and "sgl_ext" in c for c in choices):
                return "choices[].sgl_ext"
        else:
            for field in ("outputs", "prompt_token_ids", "prompt_routed_experts"):
                if field in item:
                    return field
    return None


def _wrong_engine(record: Any, engine: str, where: str) -> None:
    field = _other_engine(record, engine)
    if field is not None:
        mine, other = ("vLLM", "sglang") if engine == "vllm" else ("SGLang", "vllm")
        raise ValueError(f"{where}: not a {mine} output: it has the field {field!r} of "
                         f"{'SGLang' if other == 'sglang' else 'vLLM'}'s responses; read it with "
                         f"--engine {other} (from_{other})")


@dataclass
class _VllmRecord:
    rid: str
    prompt_len: int | None
    prompt_routed: Any
    completions: list
    prompt_start: int | None
    completion_tokens: int | None


def _vllm_record(record: Any, n: int) -> _VllmRecord:
    """One JSONL record or object: a RequestOutput (or its dump), an OpenAI /v1/completions or
    /v1/chat/completions response, either bare or as ``{"request": body, "response": body}`` (the
    request then may carry ``routed_experts_prompt_start``)."""
    where = f"vLLM record {n}"
    if isinstance(record, (list, str, bytes, int, float, bool)) or record is None:
        raise ValueError(f"{where}: expected a vLLM RequestOutput or an OpenAI completions response "
                         f"(a JSON object); found {_describe(record)}")
    _wrong_engine(record, "vllm", where)
    request = {}
    if isinstance(record, dict) and "response" in record and "choices" not in record:
        request, record = record.get("request") or {}, record["response"]
        if not isinstance(request, dict) or not isinstance(record, dict):
            raise ValueError(f"{where}: 'request' and 'response' must be JSON objects; found "
                             f"{_describe(request)} and {_describe(record)}")
    start = _field(record, "routed_experts_prompt_start")  # written by scripts/record_vllm.py
    if start is None:
        sampling = request.get("sampling_params") if isinstance(request.get("sampling_params"), dict) else {}
        start = request.get("routed_experts_prompt_start", sampling.get("routed_experts_prompt_start"))
    start = _nonneg_int(start, where, "routed_experts_prompt_start")
    if isinstance(record, dict) and "choices" in record:  # an OpenAI or tokens-in/tokens-out server response
        rid = str(record.get("id", record.get("request_id", n)))   # /inference/v1/generate: request_id, no id
        where = f"vLLM request {rid!r}"
        usage = record.get("usage") or {}
        if not isinstance(usage, dict):
            raise ValueError(f"{where}: usage must be a JSON object; found {_describe(usage)}")
        choices = record["choices"]
        if not isinstance(choices, list):
            raise ValueError(f"{where}: choices must be a list; found {_describe(choices)}")
        P = _nonneg_int(usage.get("prompt_tokens"), where, "usage.prompt_tokens")
        if P is None:   # return_token_ids=true: on the response (generate) or the choice (completions)
            P = _count(record.get("prompt_token_ids"), where, "prompt_token_ids")
        if P is None and choices and isinstance(choices[0], dict):
            P = _count(choices[0].get("prompt_token_ids"), where, "choices[0].prompt_token_ids")
        if P is None:   # /inference/v1/generate sends the prompt as the request's token ids
            P = _count(request.get("token_ids"), where, "request.token_ids")
        return _VllmRecord(rid, P, record.get("prompt_routed_experts"), choices, start,
                           _nonneg_int(usage.get("completion_tokens"), where, "usage.completion_tokens"))
    rid = _field(record, "request_id")
    rid = str(n) if rid is None else str(rid)
    where = f"vLLM request {rid!r}"
    outputs = _field(record, "outputs")
    if outputs is not None and (isinstance(outputs, (str, bytes, dict)) or not hasattr(outputs, "__iter__")):
        raise ValueError(f"{where}: outputs must be a list of completions; found {_describe(outputs)}")
    return _VllmRecord(rid, _count(_field(record, "prompt_token_ids"), where, "prompt_token_ids"),
                       _field(record, "prompt_routed_experts"), list(outputs or []), start, None)


def _vllm_sequences(outputs: Iterable[Any], layout: str, prompt_start: int | None = None,
                    prompt_length: int | None = None) -> tuple[list[EngineSequence], set[str], set[str]]:
    if layout not in VLLM_LAYOUTS:
        raise ValueError(f"layout must be one of {VLLM_LAYOUTS}, found {layout!r}")
    prompt_start = _nonneg_int(prompt_start, "from_vllm", "prompt_start")
    prompt_length = _nonneg_int(prompt_length, "from_vllm", "prompt_length (--prompt-length)")
    seqs, layouts, payloads = [], set(), set()
    for n, out in enumerate(outputs):
        rec = _vllm_record(out, n)
        P = rec.prompt_len
        if P is not None and prompt_length is not None and P != prompt_length:
            raise ValueError(f"vLLM request {rec.rid!r}: the record holds a prompt of {P} tokens, prompt_length "
                             f"(--prompt-length) {prompt_length} was given")
        P = prompt_length if P is None else P
        if P is None and rec.prompt_routed is None and layout != "split":
            raise ValueError(f"vLLM request {rec.rid!r}: the prompt length is unknown: the record has no "
                             "usage.prompt_tokens, prompt_token_ids or request token_ids (a response of "
                             "/inference/v1/generate carries only the generated tokens); expected the request with "
                             'the response ({"request": <its body>, "response": <the response>}: the prompt is the '
                             "request's token_ids) or the prompt length given (--prompt-length / prompt_length)")
        if not rec.completions:
            raise ValueError(f"vLLM request {rec.rid!r}: no completion outputs")
        for i, comp in enumerate(rec.completions):
            if not isinstance(comp, dict) and not hasattr(comp, "routed_experts"):
                raise ValueError(f"vLLM request {rec.rid!r}: completion {i} must be a JSON object; found "
                                 f"{_describe(comp)}")
            index = _field(comp, "index", i)
            doc_id = rec.rid if len(rec.completions) == 1 else f"{rec.rid}/{index}"
            where = f"vLLM request {doc_id!r}"
            routed = _field(comp, "routed_experts")
            if routed is None:
                raise ValueError(f"{where}: no routed_experts (start the engine with "
                                 f"enable_return_routed_experts=True / --enable-return-routed-experts)")
            payloads.add("base64 .npy" if isinstance(routed, (str, bytes)) else "array")
            gen = vllm_routed_array(routed, where)
            G = _count(_field(comp, "token_ids"), where, "token_ids")
            if G is None and len(rec.completions) == 1:
                G = rec.completion_tokens
            s = rec.prompt_start if rec.prompt_start is not None else prompt_start
            if rec.prompt_start is not None and prompt_start is not None and rec.prompt_start != prompt_start:
                raise ValueError(f"{where}: the record says routed_experts_prompt_start = {rec.prompt_start}, "
                                 f"prompt_start = {prompt_start} was given")
            chosen = layout
            whole = None if P is None or G is None else P + G - 1
            if chosen == "auto":
                if rec.prompt_routed is not None:
                    chosen = "split"
                elif whole is not None and gen.shape[0] == whole - (s or 0):
                    chosen = "full"
                else:
                    known = "" if s is None else f", routed_experts_prompt_start s = {s}"
                    rows = gen.shape[0]
                    readings = [] if whole is None else [
                        f"positions {whole - rows} .. {whole - 1} (pass prompt_start={whole - rows}, the request's "
                        f"routed_experts_prompt_start)" if 0 <= whole - rows <= P else None,
                        "the generated tokens only (vLLM 0.21 without prompt_routed_experts: pass layout='split')"
                        if G is not None and rows <= G else None]
                    readings = [r for r in readings if r]
                    raise ValueError(
                        f"{where}: routed_experts has {rows} token rows for P = {P} prompt and G = {G} generated "
                        f"tokens{known}; whole sequence from s would be P + G - 1 - s = "
                        f"{None if whole is None else whole - (s or 0)} rows"
                        + (f"; it could be {' or '.join(readings)}: say which" if readings else "")
                        + f"; {VLLM_LAYOUT_HELP}")
            layouts.add(chosen)
            if chosen == "full":
                s = s or 0
                if P is None or G is None:
                    raise ValueError(f"{where}: the whole-sequence layout needs the prompt and generated token "
                                     f"counts (prompt_token_ids / usage.prompt_tokens, token_ids / "
                                     f"usage.completion_tokens)")
                if s > P:
                    raise ValueError(f"{where}: routed_experts_prompt_start {s} is beyond the {P} prompt tokens")
                if gen.shape[0] != whole - s:
                    raise ValueError(f"{where}: routed_experts has {gen.shape[0]} token rows, expected "
                                     f"P + G - 1 - s = {P} + {G} - 1 - {s} = {whole - s} (whole-sequence layout, "
                                     f"s = routed_experts_prompt_start)")
                seqs.append(EngineSequence(doc_id, gen, prompt_rows=P - s, first_position=s))
                continue
            if s:
                raise ValueError(f"{where}: routed_experts_prompt_start {s} with the split layout (vLLM 0.21 "
                                 f"has no prompt offset)")
            if G is not None and gen.shape[0] > G:
                raise ValueError(f"{where}: routed_experts has {gen.shape[0]} token rows for {G} generated "
                                 f"tokens (split layout: at most one row per generated token)")
            if rec.prompt_routed is None:
                seqs.append(EngineSequence(doc_id, gen, prompt_rows=0, first_position=P or 0))
                continue
            prompt = vllm_routed_array(rec.prompt_routed, where, "prompt_routed_experts")
            if P is not None and prompt.shape[0] != P:
                raise ValueError(f"{where}: prompt_routed_experts has {prompt.shape[0]} token rows for "
                                 f"{P} prompt tokens")
            if not prompt.shape[0] or not gen.shape[0]:  # one part empty: the other's shape
                shape = (prompt if prompt.shape[0] else gen).shape[1:]
                prompt, gen = (x if x.shape[0] else np.zeros((0, *shape), np.int64) for x in (prompt, gen))
            if prompt.shape[1:] != gen.shape[1:]:
                raise ValueError(f"{where}: prompt_routed_experts has (layers, top_k) = {prompt.shape[1:]}, "
                                 f"routed_experts {gen.shape[1:]}")
            prompt, cached = _strip_cached_prefix(prompt, where)
            seqs.append(EngineSequence(doc_id, np.concatenate([prompt, gen]), prompt_rows=prompt.shape[0],
                                       first_position=cached))
    return seqs, layouts, payloads


# --- SGLang -------------------------------------------------------------------------------------
#: SGLang's wire dtypes (``meta_info.routed_experts_dtype``; absent: int32), little-endian, as in
#: sglang python/sglang/srt/state_capturer/routed_experts_wire.py (docs/routing.md).
SGLANG_DTYPES = {"int32": "<i4", "uint16": "<u2", "uint8": "u1"}


def decode_sglang(payload: str, num_layers: int, top_k: int, where: str = "SGLang response",
                  dtype: str = "int32") -> np.ndarray:
    """SGLang's ``routed_experts`` (base64 of little-endian ids of ``dtype``, int32 unless
    ``routed_experts_dtype`` says otherwise, flattened ``[tokens, num_layers, top_k]``) as an int64
    array; a truncated or malformed payload is an error naming ``where``."""
    if isinstance(payload, list):
        raise ValueError(f"{where}: routed_experts is {_describe(payload)}, not SGLang's base64 string "
                         f"(nested lists are vLLM's layout: read it with --engine vllm)")
    if not isinstance(payload, (str, bytes)):
        raise ValueError(f"{where}: routed_experts must be a base64 string, found {_describe(payload)}")
    if not isinstance(dtype, str) or dtype.strip().lower() not in SGLANG_DTYPES:   # as SGLang's own decoder
        raise ValueError(f"{where}: routed_experts_dtype {dtype!r} is not one of SGLang's wire dtypes "
                         f"{sorted(SGLANG_DTYPES)}")
    dtype = dtype.strip().lower()
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where}: routed_experts is not valid base64 ({exc}); a truncated payload?") from None
    if raw.startswith(NPY_MAGIC):
        raise ValueError(f"{where}: routed_experts is a base64 .npy file (vLLM's payload), not SGLang's raw "
                         f"ids: read it with --engine vllm")
    item = np.dtype(SGLANG_DTYPES[dtype]).itemsize
    if len(raw) % item:
        raise ValueError(f"{where}: routed_experts decodes to {len(raw)} bytes, not a whole number of "
                         f"{dtype} ids (truncated payload)")
    values = np.frombuffer(raw, dtype=SGLANG_DTYPES[dtype])
    per_token = num_layers * top_k
    if values.size % per_token:
        raise ValueError(f"{where}: routed_experts holds {values.size} {dtype} ids, not a whole number of "
                         f"tokens of num_layers x top_k = {num_layers} x {top_k} = {per_token} ids "
                         f"(truncated payload, or wrong num_layers/top_k)")
    return values.reshape(-1, num_layers, top_k).astype(np.int64)


def _sglang_items(record: Any, n: int) -> list[tuple[dict, dict]]:
    """(request body, response item) pairs of one JSONL record: ``{"request": ..., "response": ...}``
    or a bare response; a batched /generate response (a list) gives one pair per item."""
    where = f"SGLang record {n}"
    if not isinstance(record, (dict, list)):
        raise ValueError(f"{where}: expected a JSON object (or a list of them); found {_describe(record)}")
    _wrong_engine(record, "sglang", where)
    if isinstance(record, dict) and "response" in record:
        request, response = record.get("request") or {}, record["response"]
        if not isinstance(request, dict):
            raise ValueError(f"{where}: request must be a JSON object; found {_describe(request)}")
    else:
        request, response = {}, record
    items = response if isinstance(response, list) else [response]
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"SGLang response item {i}: expected a JSON object, found {_describe(item)}")
        req = dict(request)
        for k in ("rid", "routed_experts_start_len"):  # a batched request gives per-item values as lists
            if isinstance(request.get(k), list):
                if len(request[k]) != len(items):
                    raise ValueError(f"{where}: request.{k} has {len(request[k])} value(s) for {len(items)} "
                                     f"response item(s)")
                req[k] = request[k][i]
        out.append((req, item))
    return out


def _sglang_sequences(responses: Iterable[Any], num_layers: int, top_k: int) -> list[EngineSequence]:
    seqs = []
    for n, record in enumerate(responses):
        for request, item in _sglang_items(record, n):
            if "choices" in item:  # OpenAI-compatible endpoints
                usage = item.get("usage") or {}
                choices = item["choices"]
                rid = str(item.get("id", n))
                if not isinstance(usage, dict) or not isinstance(choices, list):
                    raise ValueError(f"SGLang request {rid!r}: usage must be an object and choices a list; found "
                                     f"{_describe(usage)} and {_describe(choices)}")
                where = f"SGLang request {rid!r}"
                P = _nonneg_int(usage.get("prompt_tokens"), where, "usage.prompt_tokens")
                G_all = (_nonneg_int(usage.get("completion_tokens"), where, "usage.completion_tokens")
                         if len(choices) == 1 else None)
                payloads = []
                for i, c in enumerate(choices):
                    if not isinstance(c, dict):
                        raise ValueError(f"{where}: choices[{i}] must be a JSON object; found {_describe(c)}")
                    ext = c.get("sgl_ext") or {}
                    if not isinstance(ext, dict):
                        raise ValueError(f"{where}: choices[{i}].sgl_ext must be a JSON object; found {_describe(ext)}")
                    holder = ext if "routed_experts" in ext else c
                    payloads.append((holder.get("routed_experts"), holder.get("routed_experts_dtype"),
                                     rid if len(choices) == 1 else f"{rid}/{c.get('index', i)}", G_all))
                meta = {}
            else:
                meta = item.get("meta_info") or {}
                if not isinstance(meta, dict):
                    raise ValueError(f"SGLang record {n}: meta_info must be a JSON object; found {_describe(meta)}")
                rid = str(meta.get("id", request.get("rid", n)))
                where = f"SGLang request {rid!r}"
                P = _nonneg_int(meta.get("prompt_tokens"), where, "meta_info.prompt_tokens")
                payloads = [(meta.get("routed_experts"), meta.get("routed_experts_dtype"), rid,
                             _nonneg_int(meta.get("completion_tokens"), where, "meta_info.completion_tokens"))]
            start = request.get("routed_experts_start_len", meta.get("routed_experts_start_len"))
            start = _nonneg_int(start, f"SGLang request {rid!r}", "routed_experts_start_len") or 0
            for payload, dtype, doc_id, G in payloads:
                where = f"SGLang request {doc_id!r}"
                if payload is None:
                    raise ValueError(f"{where}: no routed_experts (start the server with "
                                     f"--enable-return-routed-experts and send return_routed_experts=true)")
                ids = decode_sglang(payload, num_layers, top_k, where, "int32" if dtype is None else dtype)
                if P is None:
                    raise ValueError(f"{where}: prompt_tokens missing (meta_info.prompt_tokens or usage)")
                if not 0 <= start <= P:
                    raise ValueError(f"{where}: routed_experts_start_len {start} outside [0, prompt_tokens = {P}]")
                if G is not None and ids.shape[0] != P + G - 1 - start:
                    raise ValueError(f"{where}: routed_experts holds {ids.shape[0]} tokens, expected "
                                     f"prompt_tokens + completion_tokens - 1 - routed_experts_start_len = "
                                     f"{P} + {G} - 1 - {start} = {P + G - 1 - start} (truncated payload?)")
                seqs.append(EngineSequence(doc_id, ids, prompt_rows=min(P - start, ids.shape[0]),
                                           first_position=start))
    return seqs


# --- from engine sequences to a RoutingTrace ----------------------------------------------------
def _dense_layers(seqs: Sequence[EngineSequence], L: int, dense_layers, spec, engine: str) -> tuple[list[int], list[int]]:
    """(dense layers to drop, decoder index of each kept layer)."""
    who = ENGINE_NAMES.get(engine, engine)
    zero = [l for l in range(L) if all(not s.ids[:, l, :].any() for s in seqs)]
    if dense_layers is None or dense_layers == "none":
        return [], list(range(L))
    if spec is not None and dense_layers == "auto":
        moe = list(spec.extra.get("moe_layers", range(spec.num_layers)))
        if L == len(moe) and L != spec.num_layers:  # the engine returned the MoE layers only
            if zero:
                raise ValueError(f"{who}: routing has {L} layers, as many as the config's MoE layers {moe}, "
                                 f"but layer(s) {zero} are all zeros (dense placeholders?): the model config "
                                 f"does not match this routing")
            return [], moe
        if L != spec.num_layers:
            raise ValueError(f"{who}: routing has {L} layers; the model config has num_hidden_layers "
                             f"{spec.num_layers}, {len(moe)} of them MoE")
        dense = [l for l in range(L) if l not in moe]
        routed = [l for l in dense if l not in zero]
        if routed:
            raise ValueError(f"{who}: the model config makes layer(s) {routed} dense, but the engine "
                             f"returned nonzero expert ids there")
        return dense, moe
    if dense_layers == "auto":
        dense = zero
    else:
        dense = sorted({int(l) for l in dense_layers})
        bad = [l for l in dense if not 0 <= l < L]
        if bad:
            raise ValueError(f"dense_layers {bad} outside [0, {L}) (the engine returned {L} layers)")
        routed = [l for l in dense if l not in zero]
        if routed:
            raise ValueError(f"{who}: dense_layers {routed} hold nonzero expert ids; a dense layer's "
                             f"placeholder rows are all zero")
    if len(dense) == L:
        raise ValueError(f"{who}: {NOT_CAPTURED}: every expert id of every one of the {L} layers is 0 in every "
                         f"request (no routed layer left); {NOT_CAPTURED_HINT}")
    return dense, [l for l in range(L) if l not in dense]


#: The refusal of a dump whose ids are the engine's zero-filled buffer, not the router's choice.
NOT_CAPTURED = "routing not captured by this backend"
NOT_CAPTURED_HINT = ("the engine returned its capture buffer's fill, not the router's choices (vLLM issue 44116, PR "
                     "49184: MoE kernels that route inside the kernel, FlashInfer TRT-LLM/CUTLASS, bypass the capture; "
                     "vLLM's Triton MoE backend captures); record again with a backend that captures routing")
#: Tokens a layer must hold one id for before it counts as constant routing (with top_k 1 a short
#: dump can route every token to one expert).
CONSTANT_MIN_TOKENS = 8


def _refuse_uncaptured(seqs: Sequence[EngineSequence], keep: list[int], layer_index: list[int], who: str) -> None:
    """Refuse routing the engine did not capture: with top_k >= 2 a (token, layer) whose k ids are
    all 0 (a token's experts are distinct, so only an unwritten buffer row holds k zeros), and at
    any top_k a routed layer that sends every token of every request to the same experts (at least
    :data:`CONSTANT_MIN_TOKENS` tokens)."""
    k = seqs[0].ids.shape[2]
    tokens = sum(s.ids.shape[0] for s in seqs)
    if k >= 2:
        for s in seqs:
            zero = (s.ids[:, keep, :] == 0).all(axis=2)
            if zero.any():
                t, j = (int(i) for i in np.argwhere(zero)[0])
                raise ValueError(f"{who} request {s.doc_id!r}: {NOT_CAPTURED}: token {s.first_position + t}, "
                                 f"layer {layer_index[j]} holds expert 0 in all {k} slots ({int(zero.sum())} such "
                                 "(token, layer) rows in the request), which no router chooses (a token's experts "
                                 f"are distinct); {NOT_CAPTURED_HINT}, or a dense layer's placeholder kept "
                                 "(dense_layers)")
    for j, l in enumerate(keep):
        rows = np.unique(np.sort(np.concatenate([s.ids[:, l, :] for s in seqs]), axis=1), axis=0)
        if len(rows) == 1 and tokens >= CONSTANT_MIN_TOKENS:
            raise ValueError(f"{who}: {NOT_CAPTURED}: layer {layer_index[j]} routes every one of the {tokens} "
                             f"tokens to the same expert(s) {rows[0].tolist()} (constant routing); "
                             f"{NOT_CAPTURED_HINT}")


def build_trace(seqs: Sequence[EngineSequence], engine: str, *, num_experts: int | None = None,
                config=None, expert_bytes=None, fmt: str | None = None, model: str | None = None,
                dense_layers="auto", tokens: str = "all", source: str | None = None,
                meta: dict | None = None) -> RoutingTrace:
    """A :class:`RoutingTrace` of engine sequences (see :func:`from_vllm` for the arguments)."""

    who = ENGINE_NAMES.get(engine, engine)
    if tokens not in TOKENS:
        raise ValueError(f"tokens must be one of {TOKENS}, found {tokens!r}")
    if not seqs:
        raise ValueError(f"{who}: no requests given")
    empty = [s.doc_id for s in seqs if not s.ids.shape[0]]  # no routed token: no shape, no document
    seqs = [s for s in seqs if s.ids.shape[0]]
    if not seqs:
        raise ValueError(f"{who}: no routed token in any of the {len(empty)} requests")
    first = seqs[0]
    L, k = first.ids.shape[1:]
    for s in seqs[1:]:
        if s.ids.shape[1:] != (L, k):
            raise ValueError(f"{who} request {s.doc_id!r}: routing has (layers, top_k) = {s.ids.shape[1:]}, "
                             f"request {first.doc_id!r} has {(L, k)}: inconsistent layer counts across requests")
    spec = spec_from_config(config, name=model) if config is not None else None
    if spec is not None and spec.top_k != k:
        raise ValueError(f"{who}: routing has top_k = {k}; the model config has num_experts_per_tok {spec.top_k}")
    N = num_experts if num_experts is not None else (spec.num_experts if spec is not None else None)
    if N is None:
        raise ValueError(f"{who}: the number of experts N is unknown: pass num_experts or the model config")
    dense, layer_index = _dense_layers(seqs, L, dense_layers, spec, engine)
    keep = [l for l in range(L) if l not in dense]
    _refuse_uncaptured(seqs, keep, layer_index, who)

    docs, ids, prompt, generated, firsts, skipped = [], [], [], [], [], empty
    for s in seqs:
        rows = s.ids[:, keep, :]
        lo, hi = {"all": (0, rows.shape[0]), "prompt": (0, s.prompt_rows),
                  "generated": (s.prompt_rows, rows.shape[0])}[tokens]
        rows = rows[lo:hi]
        if rows.shape[0] == 0:
            skipped.append(s.doc_id)
            continue
        bad = (rows < 0) | (rows >= N)
        if bad.any():
            t, l, slot = (int(i) for i in np.argwhere(bad)[0])
            pos = s.first_position + lo + t
            part = "prompt" if lo + t < s.prompt_rows else "generated"
            raise ValueError(f"{who} request {s.doc_id!r}: expert id {int(rows[t, l, slot])} at token {pos} "
                             f"({part}), layer {layer_index[l]}, slot {slot} is outside [0, N) with N = {N} "
                             f"({int(bad.sum())} such ids)")
        docs.append(rows)
        ids.append(s.doc_id)
        prompt.append(max(0, min(s.prompt_rows, hi) - lo))
        generated.append(rows.shape[0] - prompt[-1])
        firsts.append(s.first_position + lo)
    if not docs:
        raise ValueError(f"{who}: no {tokens} tokens in any of the {len(seqs)} requests")

    if fmt is not None and fmt not in FORMATS:
        raise ValueError(f"format (--format) {fmt!r}: expected one of the storage formats {sorted(FORMATS)}")
    if fmt is not None and (expert_bytes is not None or spec is None):   # a format that would select nothing
        raise ValueError(f"format (--format) {fmt!r}: gives the expert bytes w_l from the model config; it has no "
                         + ("effect beside expert_bytes (--expert-bytes), which gives them" if expert_bytes is not None
                            else "effect without a config (--config): w_l is then 1 per layer"))
    w = expert_bytes
    fmt_used = fmt
    if w is None and spec is not None:
        fmt_used = fmt or spec.default_format
        w = spec.layer_expert_bytes(fmt_used)
    elif w is not None and np.ndim(w) == 0:
        w = [float(w)] * len(keep)
    name = model or (spec.name if spec is not None else None)
    info = {"engine": engine, "tokens": tokens, "layer_indices": layer_index, "dense_layers": dense,
            "engine_layers": int(L), "prompt_tokens": prompt, "generated_tokens": generated,
            "first_position": firsts, "positions": [[f, f + len(d)] for f, d in zip(firsts, docs)],
            "skipped_requests": skipped,
            "expert_bytes_format": fmt_used if w is not None else None, **(meta or {})}
    label = source or f"imported from {who}" + (f": {name}" if name else "")
    try:
        return RoutingTrace(docs, N, w, ids, model=name, source=label, meta=info)
    except ValueError as exc:
        msg = str(exc)
        m = re.match(r"document (\d+): (.*)", msg, flags=re.S)
        if not m:
            raise
        d = int(m.group(1))
        # the trace counts tokens and layers within the document; say the sequence position and
        # the decoder layer instead
        text = re.sub(r"token (\d+), layer (\d+)",
                      lambda t: f"token {firsts[d] + int(t.group(1))}, layer {layer_index[int(t.group(2))]}",
                      m.group(2))
        raise ValueError(f"{who} request {ids[d]!r}: {text}") from None


def from_vllm(outputs: Iterable[Any], *, num_experts: int | None = None, config=None, expert_bytes=None,
              fmt: str | None = None, model: str | None = None, dense_layers="auto", tokens: str = "all",
              layout: str = "auto", prompt_start: int | None = None, prompt_length: int | None = None,
              source: str | None = None, meta: dict | None = None) -> RoutingTrace:
    """A RoutingTrace of vLLM outputs: ``vllm.RequestOutput`` objects (engine started with
    ``enable_return_routed_experts=True``), their JSON dump (``scripts/record_vllm.py``: the same
    field names), or OpenAI ``/v1/completions``/``/v1/chat/completions`` responses (vLLM 0.21's nested
    lists, current vLLM's base64 ``.npy``), bare or as ``{"request": ..., "response": ...}``.

    Args:
        num_experts: N; default from ``config``.
        config: the model's ``config.json`` (dict, file or checkpoint folder): N, top_k, which
            decoder layers are dense, expert bytes w_l (:func:`moespec.model_shapes.spec_from_config`).
        expert_bytes: w_l (one number, or one per routed layer); default from ``config`` in
            format ``fmt`` (default: the checkpoint's dtype), else 1 per layer.
        model: the trace's model name (default: the config's ``_name_or_path``).
        dense_layers: ``"auto"`` (the config's dense layers; without a config, every layer whose
            ids are all zero in every request: the placeholders of the whole-sequence layout),
            a list of engine layer indices, or None (drop nothing). Dropped indices go to
            ``meta["dense_layers"]``, the decoder index of each kept layer to ``meta["layer_indices"]``.
        tokens: ``"all"`` (prompt then generated tokens, one document per request), ``"prompt"``
            or ``"generated"``; ``meta["prompt_tokens"]``/``["generated_tokens"]`` count each
            document's parts either way.
        layout: ``"auto"``, ``"full"`` (positions s .. P + G - 2 in one array: PR 28284's numpy
            array, or current vLLM's base64 ``.npy`` string) or ``"split"`` (vLLM 0.21: prompt and
            generated routing apart). ``"auto"`` takes ``"split"`` where ``prompt_routed_experts`` is
            there, ``"full"`` where the rows are P + G - 1 - s, and otherwise refuses to guess.
        prompt_start: s, the request's ``routed_experts_prompt_start`` (the engine then returns
            positions s .. P + G - 2), for dumps that do not record it (a record's own
            ``routed_experts_prompt_start``, or its request's, wins; the two must agree). Rows are
            placed at their true positions: ``meta["first_position"]``/``meta["positions"]``.
        prompt_length: P, the prompt's token count, for records that do not hold it (a response of
            ``/inference/v1/generate`` without its request: the prompt is the request's
            ``token_ids``); a record that holds it must agree.
    """
    seqs, layouts, payloads = _vllm_sequences(outputs, layout, prompt_start, prompt_length)
    return build_trace(seqs, "vllm", num_experts=num_experts, config=config, expert_bytes=expert_bytes,
                       fmt=fmt, model=model, dense_layers=dense_layers, tokens=tokens, source=source,
                       meta={"layout": sorted(layouts), "vllm_payload": sorted(payloads), **(meta or {})})


def from_sglang(responses: Iterable[Any], *, num_layers: int | None = None, top_k: int | None = None,
                num_experts: int | None = None, config=None, expert_bytes=None, fmt: str | None = None,
                model: str | None = None, dense_layers="auto", tokens: str = "all",
                source: str | None = None, meta: dict | None = None) -> RoutingTrace:
    """A RoutingTrace of SGLang responses (server started with ``--enable-return-routed-experts``,
    requests with ``return_routed_experts``): ``/generate`` JSON (``meta_info.routed_experts``),
    OpenAI ``/v1/completions`` or ``/v1/chat/completions`` JSON (``choices[i].sgl_ext.routed_experts``),
    each either bare or as ``{"request": body, "response": body}`` (the request's
    ``routed_experts_start_len`` then says where the returned rows start).

    ``num_layers`` and ``top_k`` give the payload's logical shape (default from ``config``:
    ``num_hidden_layers``, ``num_experts_per_tok``); the ids are int32 unless the response names
    another wire dtype (``routed_experts_dtype``: uint16, uint8); the other arguments as
    :func:`from_vllm`.
    """
    if num_layers is None or top_k is None:
        if config is None:
            raise ValueError("SGLang's payload is flat: pass num_layers and top_k, or the model config")

        spec = spec_from_config(config)
        num_layers = num_layers if num_layers is not None else spec.num_layers
        top_k = top_k if top_k is not None else spec.top_k
    if num_layers < 1 or top_k < 1:
        raise ValueError(f"num_layers and top_k must be >= 1, found {num_layers} and {top_k}")
    seqs = _sglang_sequences(responses, num_layers, top_k)
    return build_trace(seqs, "sglang", num_experts=num_experts, config=config, expert_bytes=expert_bytes,
                       fmt=fmt, model=model, dense_layers=dense_layers, tokens=tokens, source=source,
                       meta={"layout": ["full"], **(meta or {})})


# --- JSONL dumps --------------------------------------------------------------------------------
def read_jsonl(path: str | os.PathLike) -> list[Any]:
    """The records of a JSONL file (gzip read transparently, whatever the name; blank lines
    skipped); a line that is not JSON or not UTF-8 is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    with open(path, "rb") as fh:
        gzipped = fh.read(2) == b"\x1f\x8b"  # gzip's magic (RFC 1952)
    opener = gzip.open if gzipped else open
    records = []
    try:
        with opener(path, "rb") as fh:
            for n, raw in enumerate(fh, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not UTF-8 text ({exc.reason} at byte {exc.start} of the line); "
                                     f"a binary file?") from None
                if not line.strip():
                    continue
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n}: not valid JSON ({exc}); a truncated file?") from None
    except (OSError, EOFError) as exc:
        raise ValueError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if not records:
        raise ValueError(f"{path}: no records")
    return records


def import_jsonl(path: str | os.PathLike, engine: str, **kwargs) -> RoutingTrace:
    """:func:`from_vllm` or :func:`from_sglang` on the records of a JSONL dump; errors name the file."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, found {engine!r}")
    records = read_jsonl(path)
    reader = from_vllm if engine == "vllm" else from_sglang
    kwargs["meta"] = {"imported_from": Path(path).name, **(kwargs.get("meta") or {})}
    try:
        return reader(records, **kwargs)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None
