"""Trace files of the embedded routing sources: fit-article subset and commit-size naming."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from moespec import paths
from moespec.routing import RoutingTrace
from moespec.zoo import sources


def _trace(meta):
    docs = [np.zeros((3, 1, 1), dtype=int)] * 3
    return RoutingTrace(docs, 4, doc_ids=["test/000#0", "test/000#1", "test/001#0"], meta=meta)


def test_fit_subset_keeps_pieces_of_fit_articles():
    sub = sources.fit_subset(_trace({"fit_doc_ids": ["test/000"]}))
    assert sub.doc_ids == ["test/000#0", "test/000#1"]
    with pytest.raises(ValueError, match="no fit_doc_ids"):
        sources.fit_subset(_trace({}))


def test_save_trace_names_large_files(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_DATA", str(tmp_path))
    tr = _trace({})
    small = sources.save_trace(tr, "src", "test")
    assert small.name == "src-wikitext-test.npz" and sources.find_trace("src", "test") == small
    monkeypatch.setattr(sources, "COMMIT_LIMIT", 10)
    large = sources.save_trace(tr, "src", "test")
    assert large.name == "src-wikitext-test.large.npz" and not small.exists()  # one file per trace
    assert RoutingTrace.load(large).doc_ids == tr.doc_ids


def test_saved_traces_filters_split_and_cuts_test_to_fit_articles(tmp_path, monkeypatch):
    monkeypatch.setenv("MOESPEC_DATA", str(tmp_path))
    sources.save_trace(_trace({"split": "test", "fit_doc_ids": ["test/000"]}), "src", "test")
    sources.save_trace(_trace({"split": "valid"}), "src", "valid")
    sources.save_trace(_trace({}), "user", "any")  # no split: a user's trace, always kept
    test = sources.saved_traces("test")
    assert sorted(t.num_docs for t in test) == [2, 3]  # the test trace cut to test/000's two pieces
    assert sorted(t.num_docs for t in sources.saved_traces("valid")) == [3, 3]
    assert sorted(t.num_docs for t in sources.saved_traces(None, fit_only=False)) == [3, 3, 3]
    (paths.run_traces_dir() / "broken.npz").write_bytes(b"not a trace")
    with pytest.raises(ValueError, match="broken.npz"):
        sources.saved_traces("test")


def test_traces_are_saved_in_the_run_folder_and_shadow_shared_ones(tmp_path, monkeypatch):
    """A run saves the traces it records into its own folder, never into the shared data/traces;
    it reads its own first, and a shared trace of the same name is not read twice."""
    monkeypatch.setenv("MOESPEC_DATA", str(tmp_path / "data"))
    shared = _trace({"split": "test"})
    shared.save(tmp_path / "data" / "traces" / "src-wikitext-test.npz")
    other = _trace({"split": "test"})
    other.save(tmp_path / "data" / "traces" / "other-wikitext-test.npz")
    own = sources.save_trace(_trace({"split": "test", "mine": True}), "src", "test")
    assert own.parent == paths.run_traces_dir() and own.parent != paths.traces_dir()
    assert sources.find_trace("src", "test") == own
    assert paths.trace_files() == [tmp_path / "data" / "traces" / "other-wikitext-test.npz", own]
    assert sorted(bool(t.meta.get("mine")) for t in sources.saved_traces("test")) == [False, True]


def test_record_checkpoint_from_a_local_folder(tmp_path):
    """A saved MoE checkpoint with its tokenizer records on raw WikiText articles, cut to its context."""
    from moespec import corpus, zoo
    from moespec.zoo import tokenizer as T

    tok = T.wrap(T.train_bpe((a.text for a in corpus.articles("train")[:2]), 300))
    model = zoo.tiny_moe(seed=0, vocab_size=len(tok), context=32)
    model.save_pretrained(tmp_path / "ckpt")
    tok.save_pretrained(str(tmp_path / "ckpt"))
    trace = sources.record_checkpoint(str(tmp_path / "ckpt"), articles=2, max_tokens=40, progress=False)
    assert trace.doc_ids == ["test/000#0", "test/000#1", "test/001#0", "test/001#1"]
    assert list(trace.doc_lengths) == [32, 8, 32, 8] and trace.source == "recorded: ckpt on WikiText test"
    with pytest.raises(FileNotFoundError, match="no local checkpoint"):
        sources.record_checkpoint(str(tmp_path / "absent"))


@pytest.mark.notebook
def test_notebook_01_records_a_checkpoint_path(run_notebook, tmp_path):
    """Notebook 01 with ``model`` = a local checkpoint folder records it and shows its fit articles."""
    from moespec import corpus, zoo
    from moespec.zoo import tokenizer as T

    tok = T.wrap(T.train_bpe((a.text for a in corpus.articles("train")[:2]), 300))
    ckpt = tmp_path / "tinyckpt"
    zoo.tiny_moe(seed=0, vocab_size=len(tok), context=64).save_pretrained(ckpt)
    tok.save_pretrained(str(ckpt))
    (tmp_path / "run").mkdir()
    _, figures, text = run_notebook("01_routing_reuse", model=str(ckpt), load_recorded=False)
    assert "recorded: tinyckpt on WikiText test: rho_hat(2) = " in text
    table = pd.read_csv(figures / "01_table_reuse.csv")
    row = table[table["source"] == "recorded: tinyckpt on WikiText test"].iloc[0]
    assert row["docs"] == 32 and row["N"] == 16  # the 32 fit articles (quick: first 64 tokens, one piece each)
