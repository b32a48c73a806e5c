"""Prompts of the whole-model runs: WikiText validation articles truncated to d tokens (paper 1,
Section 4) and MT-Bench first turns (Appendix D.3)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from moespec import paths
from moespec import corpus

#: sha256 of the MT-Bench question file copied into data/mt_bench (see its SOURCE.md).
MT_BENCH_SHA256 = "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7"


def mt_bench_first_turns(path: str | Path | None = None) -> list[str]:
    """The 80 first-turn prompts (``turns[0]``) of MT-Bench, checked against the recorded sha256."""
    path = Path(path) if path else paths.data_dir() / "mt_bench" / "question.jsonl"
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != MT_BENCH_SHA256:
        raise ValueError(f"{path}: sha256 {digest} differs from the recorded {MT_BENCH_SHA256}")
    turns = []
    for i, line in enumerate(data.decode("utf-8").splitlines()):
        rec = json.loads(line)
        if not rec.get("turns"):
            raise ValueError(f"{path}, line {i + 1}: no 'turns' field")
        turns.append(rec["turns"][0])
    return turns


def validation_prompts(tokenizer, depth: int, count: int = 6) -> tuple[list[np.ndarray], list[str]]:
    """The first ``count`` WikiText validation articles (file order) with at least ``depth``
    tokens, truncated to ``depth``; returns (token arrays, titles). Raises if fewer exist."""

    arts = corpus.articles("valid")
    ids = corpus.tokenize(arts, tokenizer)
    picked = [(a.title, x[:depth]) for a, x in zip(arts, ids) if len(x) >= depth][:count]
    if len(picked) < count:
        raise ValueError(f"only {len(picked)} WikiText validation articles have >= {depth} tokens; need {count}")
    return [x for _, x in picked], [t for t, _ in picked]


def tokenize_prompts(texts: list[str], tokenizer, max_tokens: int | None = None) -> list[np.ndarray]:
    """Token ids of each prompt (no special tokens), cut to ``max_tokens`` when given."""
    out = []
    for text in texts:
        ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        if ids.size == 0:
            raise ValueError(f"prompt {text[:40]!r} tokenizes to nothing")
        out.append(ids[:max_tokens] if max_tokens else ids)
    return out
