"""WikiText articles, the hash-based fit/hold-out split of paper 1, and tokenization.

Paper 1 (Section 2, App. D.2) records routing on the 60 articles of the WikiText-103 test set
(identical to the WikiText-2 test set) and fits on 32 of them, chosen "by a hash of the document
identifier". The paper does not name the hash; moespec takes the document identifier to be the
article title as it appears in the raw text and keeps the 32 articles with the smallest
SHA-256 of that title (UTF-8). The rule is fixed here and tested, so every routing source uses
the same 32 fit documents.

Text comes from ``data/wikitext/*.xz`` (copied with attribution, see ``data/wikitext/SOURCE.md``).
Variants: ``"tokens"`` (the tokenized WikiText files with ``<unk>``, the format the embedded
models were trained on; train/valid/test) and ``"raw"`` (original text; test exact, valid
approximate; no raw train split exists here).
"""

from __future__ import annotations

import hashlib
import lzma
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np

from moespec import paths

NUM_FIT_DOCUMENTS = 32  # paper 1, Section 2: "A hash of the document identifier selects 32"
SPLITS = ("train", "valid", "test")
VARIANTS = ("tokens", "raw")
_FILES = {
    ("train", "tokens"): "train.txt.xz",
    ("valid", "tokens"): "valid.txt.xz",
    ("test", "tokens"): "test.txt.xz",
    ("valid", "raw"): "wiki.valid.raw.approx.xz",
    ("test", "raw"): "wiki.test.raw.xz",
}
_EXPECTED_ARTICLES = {"train": 600, "valid": 60, "test": 60}
_TITLE = re.compile(r" = ([^=].*) = ")


@dataclass(frozen=True)
class Article:
    """One WikiText article: ``doc_id`` is ``"<split>/<index>"``; ``title`` is its raw title."""

    split: str
    index: int
    title: str
    text: str

    @property
    def doc_id(self) -> str:
        return f"{self.split}/{self.index:03d}"

    @property
    def num_words(self) -> int:
        """Whitespace words plus one end-of-line per line (WikiText's standard token count)."""
        return sum(len(line.split()) + 1 for line in self.text.split("\n"))


def wikitext_dir() -> Path:
    return paths.data_dir() / "wikitext"


def wikitext_file(split: str, variant: str = "tokens") -> Path:
    """Path of the xz file holding ``split`` in ``variant``; clear errors for unknown names."""
    if split not in SPLITS:
        raise ValueError(f"unknown WikiText split {split!r}; expected one of {SPLITS}")
    if variant not in VARIANTS:
        raise ValueError(f"unknown WikiText variant {variant!r}; expected one of {VARIANTS}")
    if (split, variant) not in _FILES:
        raise ValueError(f"no {variant} text of the {split} split exists here (WikiText-2 raw train "
                         f"was not obtainable); use variant='tokens'")
    path = wikitext_dir() / _FILES[split, variant]
    if not path.is_file():
        raise FileNotFoundError(f"{path}: WikiText file missing (see data/wikitext/SOURCE.md)")
    return path


def _split_articles(lines: list[str], split: str) -> list[tuple[str, str]]:
    """(title, text) per article: a title line ` = T = ` with blank lines before and after."""
    starts = [i for i, line in enumerate(lines)
              if _TITLE.fullmatch(line) and (i == 0 or not lines[i - 1].strip())
              and i + 1 < len(lines) and not lines[i + 1].strip()]
    out = []
    for j, s in enumerate(starts):
        end = starts[j + 1] if j + 1 < len(starts) else len(lines)
        body = lines[s:end]
        while body and not body[-1].strip():  # trailing blank lines belong to no article
            body = body[:-1]
        out.append((_TITLE.fullmatch(lines[s]).group(1), "\n".join(body)))
    return out


@lru_cache(maxsize=8)
def _read(split: str, variant: str) -> tuple[tuple[str, str], ...]:
    path = wikitext_file(split, variant)
    lines = lzma.decompress(path.read_bytes()).decode("utf-8").split("\n")
    arts = _split_articles(lines, split)
    if len(arts) != _EXPECTED_ARTICLES[split]:
        raise ValueError(f"{path}: expected {_EXPECTED_ARTICLES[split]} articles, found {len(arts)}")
    return tuple(arts)


def articles(split: str = "test", variant: str = "tokens") -> list[Article]:
    """The articles of a WikiText-2 split, in file order (test and valid: 60; train: 600).

    Titles always come from the raw file where one exists (the tokenized file replaces rare
    words by ``<unk>``), so an article has the same identifier and hash in both variants.
    """
    arts = _read(split, variant)
    titles = [t for t, _ in _read(split, "raw")] if (split, "raw") in _FILES else [t for t, _ in arts]
    return [Article(split, i, titles[i], text) for i, (_, text) in enumerate(arts)]


def document_hash(article: Article) -> str:
    """SHA-256 (hex) of the article's raw title: the hash that picks the fit documents."""
    return hashlib.sha256(article.title.encode("utf-8")).hexdigest()


def fit_documents(arts: Sequence[Article], count: int = NUM_FIT_DOCUMENTS) -> list[int]:
    """Indices (into ``arts``, ascending) of the ``count`` articles with the smallest hash.

    Paper 1, Section 2: "A hash of the document identifier selects 32 of them for fitting";
    the rest are held out.
    """
    if not 0 < count <= len(arts):
        raise ValueError(f"count must be in [1, {len(arts)}], found {count}")
    order = sorted(range(len(arts)), key=lambda i: document_hash(arts[i]))
    return sorted(order[:count])


def fit_holdout(arts: Sequence[Article], count: int = NUM_FIT_DOCUMENTS) -> tuple[list[int], list[int]]:
    """(fit indices, hold-out indices) of ``arts``; together they are every index once."""
    fit = fit_documents(arts, count)
    chosen = set(fit)
    return fit, [i for i in range(len(arts)) if i not in chosen]


def prefix(article: Article, max_words: int) -> Article:
    """The article cut after the line that reaches ``max_words`` words (whole lines, at least
    one). The tokenized and raw files have the same lines with the same word counts, so a prefix
    selects the same text in both variants, and word-level perplexities stay comparable."""
    if max_words < 1:
        raise ValueError(f"max_words must be >= 1, found {max_words}")
    lines, words = [], 0
    for line in article.text.split("\n"):
        lines.append(line)
        words += len(line.split()) + 1
        if words >= max_words:
            break
    return Article(article.split, article.index, article.title, "\n".join(lines))


def tokenize(arts: Sequence[Article], tokenizer, max_tokens: int | None = None) -> list[np.ndarray]:
    """Token ids (int64) of each article with ``tokenizer`` (a transformers tokenizer).

    ``max_tokens`` keeps only the first tokens of each article (an explicit choice of the caller,
    e.g. a quick profile); no special tokens are added.
    """
    out = []
    for art in arts:
        ids = np.asarray(tokenizer(art.text, add_special_tokens=False)["input_ids"], dtype=np.int64)
        out.append(ids[:max_tokens] if max_tokens is not None else ids)
    return out


def segments(ids: np.ndarray, length: int) -> list[np.ndarray]:
    """Consecutive pieces of at most ``length`` tokens covering ``ids`` (for contexts shorter
    than an article: each piece is then recorded as its own document)."""
    if length < 1:
        raise ValueError(f"segment length must be >= 1, found {length}")
    return [ids[i:i + length] for i in range(0, len(ids), length)]
