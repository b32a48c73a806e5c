"""Routing traces: the expert sets S_{l,t} that each token of each document selects.

A trace is a list of documents, each an integer array ``[T, L, m]`` (token, MoE layer, slot) of
expert ids in ``[0, N)``; a token's m ids in one layer are distinct (paper 1, Section 2: "the
router selects a set S_{l,t} of m experts"). Per-layer expert bytes w_l weight the byte
statistics (eq. (3)); they default to 1 per layer, so byte shares become expert counts.

File format (``.npz``, compressed, no pickle): ``ids`` (all documents concatenated along the
token axis), ``offsets`` (int64, D+1 document boundaries), ``expert_bytes`` (float64 [L]) and
``meta`` (a one-element string array holding JSON: format tag and version, num_experts, doc_ids,
model, source, extra metadata).
"""

from __future__ import annotations

import json
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np

from moespec.io import atomic_path
from moespec.validate import jsonfile

FORMAT_TAG = "moespec-routing-trace"
FORMAT_VERSION = 1
REQUIRED_FIELDS = ("ids", "offsets", "expert_bytes", "meta")
#: JSON Schema of the ``meta`` field's JSON (after its format tag and version are checked).
META_SCHEMA = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object", "required": ["format", "version", "num_experts", "doc_ids"],
    "properties": {"num_experts": {"type": "integer", "minimum": 1},
                   "doc_ids": {"type": "array", "items": {"type": ["string", "integer"]}},
                   "model": {"type": ["string", "null"]}, "source": {"type": ["string", "null"]},
                   "meta": {"type": ["object", "null"]}},
}


def _id_dtype(num_experts: int) -> np.dtype:
    """Smallest unsigned dtype that holds ids in [0, N): traces of 10^5 tokens stay small."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if num_experts - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.int64)


def _check_doc(doc: Any, index: int, num_experts: int, shape_lm: tuple[int, int] | None) -> np.ndarray:
    """Validate one document and return it as a compact unsigned array; errors name doc ``index``."""
    arr = np.asarray(doc)
    where = f"document {index}"
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{where}: expert ids must be integers, found dtype {arr.dtype}")
    if arr.ndim != 3:
        raise ValueError(f"{where}: expected an array [T, L, m] (token, layer, slot), "
                         f"found {arr.ndim} dimension(s) with shape {arr.shape}")
    T, L, m = arr.shape
    if T == 0:
        raise ValueError(f"{where}: empty document (0 tokens)")
    if L == 0 or m == 0:
        raise ValueError(f"{where}: need L >= 1 layers and m >= 1 slots, found shape {arr.shape}")
    if shape_lm is not None and (L, m) != shape_lm:
        raise ValueError(f"{where}: ragged trace: expected (L, m) = {shape_lm} as in document 0, "
                         f"found (L, m) = {(L, m)}")
    if m > num_experts:
        raise ValueError(f"{where}: m = {m} slots exceed N = {num_experts} experts")
    bad = (arr < 0) | (arr >= num_experts)
    if bad.any():
        t, l, s = (int(i) for i in np.argwhere(bad)[0])
        raise ValueError(f"{where}: expert id {int(arr[t, l, s])} at token {t}, layer {l}, slot {s} "
                         f"is outside [0, N) with N = {num_experts} ({int(bad.sum())} such ids)")
    if m > 1:
        srt = np.sort(arr, axis=-1)
        dup = (srt[..., 1:] == srt[..., :-1]).any(axis=-1)
        if dup.any():
            t, l = (int(i) for i in np.argwhere(dup)[0])
            raise ValueError(f"{where}: token {t}, layer {l} selects the same expert twice: "
                             f"{arr[t, l].tolist()} (a token's m experts must be distinct; "
                             f"{int(dup.sum())} such token-layers)")
    return arr.astype(_id_dtype(num_experts), copy=False)


def _check_doc_ids(doc_ids) -> list[str]:
    """``doc_ids`` as a list of strings: a sequence of ids, each a string or an integer (a bare
    string would otherwise count as one id per character)."""
    if isinstance(doc_ids, (str, bytes)) or not isinstance(doc_ids, (Sequence, np.ndarray)):
        raise ValueError(f"doc_ids: expected a sequence (list, tuple or array) of ids, each a string or an "
                         f"integer, one per document; found {type(doc_ids).__name__} {doc_ids!r}")
    ids = []
    for i, x in enumerate(doc_ids):
        if isinstance(x, (bool, np.bool_)) or not isinstance(x, (str, int, np.integer, np.str_)):
            raise ValueError(f"doc_ids[{i}]: an id must be a string or an integer; found {type(x).__name__} {x!r}")
        ids.append(str(x))
    return ids


class RoutingTrace:
    """Recorded (or synthetic) routing of D documents through L MoE layers of N experts.

    Args:
        docs: list of integer arrays ``[T_d, L, m]``; ``docs[d][t, l]`` is the set S_{l,t} of
            document d (paper 1, Section 2).
        num_experts: N.
        expert_bytes: w_l, bytes of one expert of each layer, shape ``[L]``, positive; default
            1 per layer (byte statistics then count experts).
        doc_ids: one id per document, a sequence (list, tuple or array, not one string) of
            strings or integers, stored as strings (default ``"0", "1", ...``); must be unique.
        model: the model that routed (e.g. ``"olmoe"`` or a checkpoint path), or None.
        source: what produced the trace, shown as its label in plots (e.g. ``"synthetic
            sticky, calibrated to paper 1 rho(2)"`` or ``"recorded: OLMoE on WikiText-103"``).
        meta: extra JSON-serialisable metadata (corpus, split, seed, ...).

    Raises ValueError naming the document, token, layer and slot of the first bad entry.
    """

    def __init__(self, docs: Sequence[Any], num_experts: int, expert_bytes: Any = None,
                 doc_ids: Sequence[str] | None = None, model: str | None = None,
                 source: str | None = None, meta: dict | None = None):
        if isinstance(num_experts, (bool, np.bool_)) or not isinstance(num_experts, (int, np.integer)):
            raise ValueError(f"num_experts must be an integer, found {num_experts!r}")
        if num_experts < 1:
            raise ValueError(f"num_experts must be >= 1, found {num_experts}")
        self.num_experts = int(num_experts)
        if isinstance(docs, np.ndarray) and docs.ndim == 3:
            raise ValueError("docs must be a list of [T, L, m] arrays; wrap a single document in a list")
        docs = list(docs)
        if not docs:
            raise ValueError("a trace needs at least one document, found none")
        checked: list[np.ndarray] = []
        for i, doc in enumerate(docs):
            shape_lm = checked[0].shape[1:] if checked else None
            checked.append(_check_doc(doc, i, self.num_experts, shape_lm))
        self.docs: list[np.ndarray] = checked
        L = self.num_layers

        if expert_bytes is None:
            w = np.ones(L)
        else:
            w = np.asarray(expert_bytes, dtype=np.float64)
            if w.shape != (L,):
                raise ValueError(f"expert_bytes: expected shape ({L},) (one w_l per layer), found {w.shape}")
            if not np.all(np.isfinite(w)) or np.any(w <= 0):
                raise ValueError(f"expert_bytes: every w_l must be finite and > 0, found {w.tolist()}")
        self.expert_bytes = w

        if doc_ids is None:
            ids = [str(i) for i in range(len(docs))]
        else:
            ids = _check_doc_ids(doc_ids)
            if len(ids) != len(docs):
                raise ValueError(f"doc_ids: expected {len(docs)} ids (one per document), found {len(ids)}")
            if len(set(ids)) != len(ids):
                dup = sorted({x for x in ids if ids.count(x) > 1})
                raise ValueError(f"doc_ids must be unique; repeated: {dup[:5]}")
        self.doc_ids = ids
        self.model = model
        self.source = source
        self.meta = dict(meta or {})
        try:
            json.dumps(self.meta)
        except TypeError as exc:
            raise ValueError(f"meta must be JSON-serialisable: {exc}") from None
        self._cache: dict[str, Any] = {}  # statistics computed once per trace (routing.stats)
        self.path: Path | None = None     # the file it was loaded from (errors name it)

    # --- shape ------------------------------------------------------------------------------
    @property
    def num_docs(self) -> int:
        return len(self.docs)

    @property
    def num_layers(self) -> int:
        """L, MoE layers."""
        return int(self.docs[0].shape[1])

    @property
    def top_k(self) -> int:
        """m, experts per token."""
        return int(self.docs[0].shape[2])

    @property
    def doc_lengths(self) -> np.ndarray:
        return np.array([d.shape[0] for d in self.docs], dtype=np.int64)

    @property
    def num_tokens(self) -> int:
        return int(self.doc_lengths.sum())

    @property
    def label(self) -> str:
        """What plots and tables call this trace: its source, else its model, else 'trace'."""
        return self.source or self.model or "trace"

    def __len__(self) -> int:
        return self.num_docs

    def __repr__(self) -> str:
        return (f"RoutingTrace({self.num_docs} docs, {self.num_tokens} tokens, L={self.num_layers}, "
                f"m={self.top_k}, N={self.num_experts}, model={self.model!r}, source={self.source!r})")

    # --- derived traces ---------------------------------------------------------------------
    def subset(self, doc_indices: Iterable[int]) -> "RoutingTrace":
        """A trace of the documents ``doc_indices``, in that order (no repeats: doc ids stay unique)."""
        idx = [int(i) for i in doc_indices]
        for i in idx:
            if not -self.num_docs <= i < self.num_docs:
                raise ValueError(f"subset: document index {i} is outside [0, {self.num_docs})")
        return RoutingTrace([self.docs[i] for i in idx], self.num_experts, self.expert_bytes,
                            [self.doc_ids[i] for i in idx], self.model, self.source, self.meta)

    @staticmethod
    def concat(traces: Sequence["RoutingTrace"], source: str | None = None) -> "RoutingTrace":
        """Documents of several traces in one; N, L, m and w_l must agree, doc ids stay unique."""
        traces = list(traces)
        if not traces:
            raise ValueError("concat: no traces given")
        first = traces[0]
        for i, tr in enumerate(traces[1:], start=1):
            if tr.num_experts != first.num_experts:
                raise ValueError(f"concat: trace {i} has N = {tr.num_experts}, trace 0 has {first.num_experts}")
            if not np.array_equal(tr.expert_bytes, first.expert_bytes):
                raise ValueError(f"concat: trace {i} has different expert_bytes from trace 0")
        docs = [d for tr in traces for d in tr.docs]
        ids = [x for tr in traces for x in tr.doc_ids]
        return RoutingTrace(docs, first.num_experts, first.expert_bytes, ids, first.model,
                            source if source is not None else first.source, first.meta)

    # --- file format ------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the trace as a compressed ``.npz`` (no pickle), atomically."""
        path = Path(path)
        offsets = np.concatenate([[0], np.cumsum(self.doc_lengths)]).astype(np.int64)
        meta = {"format": FORMAT_TAG, "version": FORMAT_VERSION, "num_experts": self.num_experts,
                "doc_ids": self.doc_ids, "model": self.model, "source": self.source, "meta": self.meta}
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            # a file object, so numpy does not append ".npz" to the temporary name
            np.savez_compressed(fh, ids=np.concatenate(self.docs, axis=0), offsets=offsets,
                                expert_bytes=self.expert_bytes, meta=np.array([json.dumps(meta)]))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "RoutingTrace":
        """Read and validate a trace written by :meth:`save`; errors name the file and field."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"{path}: no such routing trace")
        if not zipfile.is_zipfile(path):  # else np.load would take it for a pickle
            raise ValueError(f"{path}: truncated or corrupt routing trace file (not an .npz zip archive)")
        try:
            with np.load(path, allow_pickle=False) as npz:
                missing = [f for f in REQUIRED_FIELDS if f not in npz.files]
                if missing:
                    raise ValueError(f"{path}: missing field(s) {missing}; found {sorted(npz.files)}")
                fields = {f: npz[f] for f in REQUIRED_FIELDS}
                for f, value in fields.items():   # a member that is not .npy data comes back as raw bytes
                    if not isinstance(value, np.ndarray):
                        raise ValueError(f"{path}: field {f!r}: expected a numpy array (.npy member); found "
                                         f"{len(value)} bytes that are not one (a corrupt or foreign member)")
        except ValueError as exc:
            if str(path) in str(exc):
                raise
            raise ValueError(f"{path}: unreadable routing trace (pickled or corrupt field): {exc}") from None
        except (zipfile.BadZipFile, zlib.error, OSError, EOFError, KeyError) as exc:
            raise ValueError(f"{path}: truncated or corrupt routing trace file "
                             f"({type(exc).__name__}: {exc})") from None

        meta_arr = fields["meta"]
        if meta_arr.shape != (1,) or meta_arr.dtype.kind != "U":
            raise ValueError(f"{path}: field 'meta': expected one JSON string, found dtype "
                             f"{meta_arr.dtype} shape {meta_arr.shape}")
        try:
            meta = json.loads(str(meta_arr[0]))
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: field 'meta' is not valid JSON: {exc}") from None
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_TAG:
            raise ValueError(f"{path}: field 'meta': format tag {FORMAT_TAG!r} expected, "
                             f"found {meta.get('format') if isinstance(meta, dict) else meta!r}")
        if meta.get("version") != FORMAT_VERSION:
            raise ValueError(f"{path}: trace format version {meta.get('version')!r}, "
                             f"this moespec reads version {FORMAT_VERSION}")
        for key in ("num_experts", "doc_ids"):
            if key not in meta:
                raise ValueError(f"{path}: field 'meta' lacks {key!r}")
        jsonfile.check(meta, META_SCHEMA, f"{path}: the JSON of field 'meta'")
        if fields["expert_bytes"].dtype.kind not in "iuf":   # ids and offsets: checked below
            raise ValueError(f"{path}: field 'expert_bytes': expected an array of numbers; found dtype "
                             f"{fields['expert_bytes'].dtype}")

        ids, offsets = fields["ids"], fields["offsets"]
        if offsets.ndim != 1 or offsets.size < 2 or not np.issubdtype(offsets.dtype, np.integer):
            raise ValueError(f"{path}: field 'offsets': expected >= 2 integer boundaries, found "
                             f"dtype {offsets.dtype} shape {offsets.shape}")
        if ids.ndim != 3:
            raise ValueError(f"{path}: field 'ids': expected [tokens, L, m], found shape {ids.shape}")
        if offsets[0] != 0 or offsets[-1] != ids.shape[0] or np.any(np.diff(offsets) < 0):
            raise ValueError(f"{path}: field 'offsets' must rise from 0 to {ids.shape[0]} (tokens in "
                             f"'ids'), found {offsets[:3].tolist()}...{offsets[-3:].tolist()}")
        docs = [ids[offsets[i]:offsets[i + 1]] for i in range(offsets.size - 1)]
        try:
            trace = cls(docs, meta["num_experts"], fields["expert_bytes"], meta["doc_ids"],
                        meta.get("model"), meta.get("source"), meta.get("meta"))
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        trace.path = path
        return trace
