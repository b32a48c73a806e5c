"""WikiText articles, the hash-based fit split (paper 1, Sec. 2) and tokenization helpers."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from moespec import corpus


def test_article_counts_and_word_totals_match_source_md():
    for split, n, lines, words in (("test", 60, 4358, 245_569), ("valid", 60, 3760, 217_646)):
        arts = corpus.articles(split)
        assert len(arts) == n
        # SOURCE.md: whitespace tokens + one <eos> per line. Only blank lines (one <eos> each:
        # the file's first line, the blank lines after each article) lie outside the articles.
        outside = lines - sum(len(a.text.split("\n")) for a in arts)
        assert sum(a.num_words for a in arts) + outside == words
    assert len(corpus.articles("train")) == 600


def test_raw_and_tokenized_articles_align():
    tok, raw = corpus.articles("test", "tokens"), corpus.articles("test", "raw")
    assert [a.title for a in tok] == [a.title for a in raw]
    assert [a.num_words for a in tok] == [a.num_words for a in raw]
    assert tok[0].title == "Robert Boulter" and "<unk>" in tok[0].text and "<unk>" not in raw[0].text
    p_tok, p_raw = corpus.prefix(tok[5], 300), corpus.prefix(raw[5], 300)
    assert p_tok.num_words == p_raw.num_words >= 300


def test_fit_documents_are_the_32_smallest_title_hashes():
    arts = corpus.articles("test", "raw")
    fit, hold = corpus.fit_holdout(arts)
    assert len(fit) == 32 and len(hold) == 28 and sorted(fit + hold) == list(range(60))
    hashes = [hashlib.sha256(a.title.encode()).hexdigest() for a in arts]
    assert max(hashes[i] for i in fit) < min(hashes[i] for i in hold)
    # the same split whichever variant the articles come from
    assert corpus.fit_documents(corpus.articles("test", "tokens")) == fit


def test_segments_cover_in_order():
    ids = np.arange(10)
    segs = corpus.segments(ids, 4)
    assert [len(s) for s in segs] == [4, 4, 2]
    np.testing.assert_array_equal(np.concatenate(segs), ids)


def test_bad_names_are_clear():
    with pytest.raises(ValueError, match="unknown WikiText split 'dev'"):
        corpus.articles("dev")
    with pytest.raises(ValueError, match="no raw text of the train split"):
        corpus.articles("train", "raw")
    with pytest.raises(ValueError, match="segment length"):
        corpus.segments(np.arange(3), 0)
