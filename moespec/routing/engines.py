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
  model), with all-zero rows for the decoder layers that have no router (dense layers).
* vLLM, split layout (vLLM 0.21 docs, "Routed Experts Replay"): ``RequestOutput.
  prompt_routed_experts`` ``[P, num_moe_layers, top_k]`` and ``outputs[i].routed_experts``
  ``[<= G, num_moe_layers, top_k]`` (int16); prompt positions served from the prefix cache hold
  -1. The OpenAI ``/v1/completions`` JSON carries the same two fields (response level and choice
  level).
* SGLang (``--enable-return-routed-experts``, request field ``return_routed_experts``): base64 of
  little-endian int32 ids of logical shape ``[P + G - 1 - s, num_hidden_layers, top_k]``,
  s = ``routed_experts_start_len`` (default 0), in ``meta_info.routed_experts`` of ``/generate``
  and in ``choices[i].sgl_ext.routed_experts`` of the OpenAI endpoints (``choices[i].
  routed_experts`` in earlier releases).

Every problem is a ValueError naming the request (and token, layer, slot where there is one).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from moespec.model_shapes import spec_from_config
from moespec.routing.trace import RoutingTrace

ENGINES = ("vllm", "sglang")
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}
TOKENS = ("all", "prompt", "generated")
VLLM_LAYOUTS = ("auto", "full", "split")


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


def _int_array(value: Any, where: str, what: str) -> np.ndarray:
    """``value`` (numpy array or nested lists) as an int64 ``[T, L, k]`` array; errors name ``where``."""
    try:
        arr = np.asarray(value)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"{where}: {what} is not a [tokens, layers, top_k] array ({exc})") from None
    if arr.size == 0:  # no tokens (e.g. "[]" in JSON): shape taken from the other requests
        return np.zeros((0, 0, 0), dtype=np.int64)
    if arr.dtype == object or arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{where}: {what} must hold integer expert ids, found dtype {arr.dtype} "
                         f"(ragged or non-integer data)")
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
def _vllm_completions(out: Any) -> tuple[str, int | None, Any, list]:
    """(request id, prompt length, prompt routing, completions) of a RequestOutput, its JSON dump,
    or an OpenAI /v1/completions response of vLLM."""
    if isinstance(out, dict) and "choices" in out:  # OpenAI-compatible server response
        usage = out.get("usage") or {}
        return (str(out.get("id")), usage.get("prompt_tokens"), out.get("prompt_routed_experts"),
                list(out["choices"]))
    prompt_ids = _field(out, "prompt_token_ids")
    return (str(_field(out, "request_id")), None if prompt_ids is None else len(prompt_ids),
            _field(out, "prompt_routed_experts"), list(_field(out, "outputs") or []))


def _vllm_sequences(outputs: Iterable[Any], layout: str) -> tuple[list[EngineSequence], set[str]]:
    if layout not in VLLM_LAYOUTS:
        raise ValueError(f"layout must be one of {VLLM_LAYOUTS}, found {layout!r}")
    seqs, layouts = [], set()
    for n, out in enumerate(outputs):
        rid, P, prompt_re, completions = _vllm_completions(out)
        rid = rid if rid != "None" else str(n)
        if not completions:
            raise ValueError(f"vLLM request {rid!r}: no completion outputs")
        for comp in completions:
            index = _field(comp, "index", 0)
            doc_id = rid if len(completions) == 1 else f"{rid}/{index}"
            where = f"vLLM request {doc_id!r}"
            routed = _field(comp, "routed_experts")
            if routed is None:
                raise ValueError(f"{where}: no routed_experts (start the engine with "
                                 f"enable_return_routed_experts=True / --enable-return-routed-experts)")
            gen = _int_array(routed, where, "routed_experts")
            token_ids = _field(comp, "token_ids")
            G = len(token_ids) if token_ids is not None else None
            chosen = layout
            if chosen == "auto":
                if prompt_re is not None:
                    chosen = "split"
                elif P is not None and G is not None and gen.shape[0] == P + G - 1:
                    chosen = "full"
                elif G is not None and gen.shape[0] <= G:
                    chosen = "split"
                else:
                    raise ValueError(
                        f"{where}: routed_experts has {gen.shape[0]} token rows; expected P + G - 1 = "
                        f"{None if P is None or G is None else P + G - 1} (whole sequence, vLLM PR 28284) "
                        f"or at most G = {G} (generated tokens only, vLLM >= 0.21)")
            layouts.add(chosen)
            if chosen == "full":
                if P is None or G is None:
                    raise ValueError(f"{where}: the whole-sequence layout needs prompt_token_ids and token_ids")
                if gen.shape[0] != P + G - 1:
                    raise ValueError(f"{where}: routed_experts has {gen.shape[0]} token rows, expected "
                                     f"P + G - 1 = {P} + {G} - 1 = {P + G - 1} (whole-sequence layout)")
                seqs.append(EngineSequence(doc_id, gen, prompt_rows=P))
                continue
            if G is not None and gen.shape[0] > G:
                raise ValueError(f"{where}: routed_experts has {gen.shape[0]} token rows for {G} generated "
                                 f"tokens (split layout: at most one row per generated token)")
            if prompt_re is None:
                seqs.append(EngineSequence(doc_id, gen, prompt_rows=0, first_position=P or 0))
                continue
            prompt = _int_array(prompt_re, where, "prompt_routed_experts")
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
    return seqs, layouts


# --- SGLang -------------------------------------------------------------------------------------
def decode_sglang(payload: str, num_layers: int, top_k: int, where: str = "SGLang response") -> np.ndarray:
    """SGLang's ``routed_experts`` (base64 of little-endian int32, flattened ``[tokens, num_layers,
    top_k]``) as an int64 array; a truncated or malformed payload is an error naming ``where``."""
    if not isinstance(payload, (str, bytes)):
        raise ValueError(f"{where}: routed_experts must be a base64 string, found {type(payload).__name__}")
    try:
        raw = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{where}: routed_experts is not valid base64 ({exc}); a truncated payload?") from None
    if len(raw) % 4:
        raise ValueError(f"{where}: routed_experts decodes to {len(raw)} bytes, not a whole number of "
                         f"int32 ids (truncated payload)")
    values = np.frombuffer(raw, dtype="<i4")
    per_token = num_layers * top_k
    if values.size % per_token:
        raise ValueError(f"{where}: routed_experts holds {values.size} int32 ids, not a whole number of "
                         f"tokens of num_layers x top_k = {num_layers} x {top_k} = {per_token} ids "
                         f"(truncated payload, or wrong num_layers/top_k)")
    return values.reshape(-1, num_layers, top_k).astype(np.int64)


def _sglang_items(record: Any) -> list[tuple[dict, dict]]:
    """(request body, response item) pairs of one JSONL record: ``{"request": ..., "response": ...}``
    or a bare response; a batched /generate response (a list) gives one pair per item."""
    if isinstance(record, dict) and "response" in record:
        request, response = record.get("request") or {}, record["response"]
    else:
        request, response = {}, record
    items = response if isinstance(response, list) else [response]
    out = []
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise ValueError(f"SGLang response item {i}: expected a JSON object, found {type(item).__name__}")
        # a batched request gives per-item values as lists
        req = {k: (v[i] if k in ("rid", "routed_experts_start_len") and isinstance(v, list) else v)
               for k, v in request.items()}
        out.append((req, item))
    return out


def _sglang_sequences(responses: Iterable[Any], num_layers: int, top_k: int) -> list[EngineSequence]:
    seqs = []
    for n, record in enumerate(responses):
        for request, item in _sglang_items(record):
            if "choices" in item:  # OpenAI-compatible endpoints
                usage = item.get("usage") or {}
                P = usage.get("prompt_tokens")
                choices = item["choices"]
                G_all = usage.get("completion_tokens") if len(choices) == 1 else None
                rid = str(item.get("id", n))
                payloads = [((c.get("sgl_ext") or {}).get("routed_experts", c.get("routed_experts")),
                             rid if len(choices) == 1 else f"{rid}/{c.get('index', i)}", G_all)
                            for i, c in enumerate(choices)]
                meta = {}
            else:
                meta = item.get("meta_info") or {}
                rid = str(meta.get("id", request.get("rid", n)))
                P = meta.get("prompt_tokens")
                payloads = [(meta.get("routed_experts"), rid, meta.get("completion_tokens"))]
            start = int(request.get("routed_experts_start_len", meta.get("routed_experts_start_len", 0)) or 0)
            for payload, doc_id, G in payloads:
                where = f"SGLang request {doc_id!r}"
                if payload is None:
                    raise ValueError(f"{where}: no routed_experts (start the server with "
                                     f"--enable-return-routed-experts and send return_routed_experts=true)")
                ids = decode_sglang(payload, num_layers, top_k, where)
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
        raise ValueError(f"{who}: every one of the {L} layers is all zeros: no routed layer left")
    return dense, [l for l in range(L) if l not in dense]


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
            "first_position": firsts, "skipped_requests": skipped,
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
              layout: str = "auto", source: str | None = None, meta: dict | None = None) -> RoutingTrace:
    """A RoutingTrace of vLLM outputs: ``vllm.RequestOutput`` objects (engine started with
    ``enable_return_routed_experts=True``), their JSON dump (``scripts/record_vllm.py``: the same
    field names), or OpenAI ``/v1/completions`` responses of vLLM >= 0.21.

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
        layout: ``"auto"``, ``"full"`` (whole sequence, PR 28284) or ``"split"`` (prompt and
            generated routing apart, vLLM >= 0.21).
    """
    seqs, layouts = _vllm_sequences(outputs, layout)
    return build_trace(seqs, "vllm", num_experts=num_experts, config=config, expert_bytes=expert_bytes,
                       fmt=fmt, model=model, dense_layers=dense_layers, tokens=tokens, source=source,
                       meta={"layout": sorted(layouts), **(meta or {})})


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
    ``num_hidden_layers``, ``num_experts_per_tok``); the other arguments as :func:`from_vllm`.
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
    """The records of a JSONL file (``.gz`` read transparently; blank lines skipped); a line that
    is not JSON is an error naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file")
    opener = gzip.open if path.suffix == ".gz" else open
    records = []
    try:
        with opener(path, "rt", encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
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
