"""Build the embedded default models: tokenizer, then MoE, then draft, each cached on disk.

Recipe (``PROFILES["full"]``, what ``make reproduce`` uses): a 4096-symbol byte-level BPE
tokenizer trained on the WikiText-2 train split; the default MoE
(:func:`moespec.zoo.default_moe_config`) trained from scratch on that split (articles joined by
``<|endoftext|>``, cut into 256-token blocks) with AdamW, warm-up and cosine decay, a fixed
number of steps, seed 0, the router's per-layer load-balancing loss and the grouped expert
operation of :mod:`moespec.zoo.experts`; then the draft (:func:`moespec.zoo.default_draft_config`)
distilled from the trained MoE on the same split: its loss is the KL divergence to the MoE's
next-token distribution alone (``distill=1.0``; the smoke profile mixes in the next-token loss).

Where each artifact comes from: ``out`` (default ``data/models/``) already holds a build of the
same recipe (its ``moespec.json``), or it is trained. ``data/models/`` is committed with the full
recipe's build (the full recipe takes ~50 minutes of training on a 2-core CPU; the committed build
is what the figures were made with), so a fresh clone trains nothing. ``force=True``
(``moespec build-models --force``, ``make models``, notebook 00's ``retrain=True``) always trains,
with the same code and recipe, and replaces what ``out`` holds.

``PROFILES["smoke"]`` trains a few steps of smaller models for tests.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch
from transformers import LlamaForCausalLM, OlmoeForCausalLM

from moespec import corpus, paths, provenance
from moespec import zoo
from moespec.zoo import evaluate, store
from moespec.zoo import tokenizer as _tok
from moespec.zoo.experts import IMPLEMENTATION
from moespec.zoo.train import TrainConfig, train_lm

#: Intra-op threads for training. One thread makes a build bit-reproducible (no thread-count
#: dependent reduction order) and, on shared cores, avoids OpenMP threads spin-waiting on each
#: other: measured here under load, one fwd+bwd step took 3.0 s with 1 thread and 16.5 s with 2.
TRAIN_THREADS = 1

PROFILES = {
    "full": {"vocab_size": zoo.VOCAB_SIZE, "train_articles": None, "model_overrides": {},
             "moe": TrainConfig(steps=3000, batch_size=8, seq_len=zoo.CONTEXT, lr=3e-3, warmup=50,
                                log_every=20),
             "draft": TrainConfig(steps=3000, batch_size=8, seq_len=zoo.CONTEXT, lr=3e-3, warmup=50,
                                  log_every=20, precision="bf16-autocast", compile=True, distill=1.0)},
    "smoke": {"vocab_size": 300, "train_articles": 3,
              "model_overrides": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
                                  "num_experts": 16, "num_experts_per_tok": 4, "max_position_embeddings": 64},
              "moe": TrainConfig(steps=3, batch_size=2, seq_len=64, warmup=1, log_every=1),
              "draft": TrainConfig(steps=3, batch_size=2, seq_len=64, warmup=1, log_every=1, distill=0.5)},
}

ARTIFACTS = ("tokenizer", "moe", "draft")


def folder_name(what: str) -> str:
    """The folder of an artifact inside a models directory."""
    return {"tokenizer": zoo.TOKENIZER_DIR, "moe": zoo.MOE_DIR, "draft": zoo.DRAFT_DIR}[what]


def recipe(profile: str, seed: int, what: str) -> dict:
    """The recipe of one artifact (JSON-normalised): what decides whether a cached build is reused."""
    p = PROFILES[profile]
    r = {"profile": profile, "seed": seed, "threads": TRAIN_THREADS, "vocab_size": p["vocab_size"],
         "train_articles": p["train_articles"], "model_overrides": p["model_overrides"]}
    if what in ("moe", "draft"):
        r["train"] = {**p[what].to_dict(), "seed": seed}
        r["config"] = model_config(what, profile).to_diff_dict()
        if what == "draft":  # the draft is distilled from the MoE: its recipe includes the teacher's
            r["teacher"] = recipe(profile, seed, "moe")
    return json.loads(json.dumps(r, default=str))


#: Config fields that record the library that wrote a config, not the model: a cached build made
#: with another transformers release is the same model (its weights and config values are).
PROVENANCE_KEYS = ("transformers_version",)


def _without_provenance(value):
    if isinstance(value, dict):
        return {k: _without_provenance(v) for k, v in value.items() if k not in PROVENANCE_KEYS}
    return value


def same_recipe(a: dict | None, b: dict | None) -> bool:
    """Whether two recipes describe the same build, ignoring :data:`PROVENANCE_KEYS` (a new
    transformers release on PyPI must not retrain the committed models or fail their check)."""
    return a is not None and b is not None and _without_provenance(a) == _without_provenance(b)


def _recipe_of(folder: Path) -> dict | None:
    return store.read_meta(folder).get("recipe") if folder.is_dir() else None


def model_config(what: str, profile: str):
    """The transformers config of the MoE or the draft under ``profile``."""
    p = PROFILES[profile]
    cfg = zoo.default_moe_config(p["vocab_size"]) if what == "moe" else zoo.default_draft_config(p["vocab_size"])
    for k, v in p["model_overrides"].items():
        if what == "draft" and k in ("num_experts", "num_experts_per_tok"):
            continue
        if what == "draft" and k == "intermediate_size":
            v = 4 * v
        setattr(cfg, k, v)
    return cfg


def new_model(what: str, profile: str = "full"):
    """A freshly initialised (under the caller's seed) MoE or draft of ``profile``; the MoE with
    the grouped expert operation used in training."""
    cls = OlmoeForCausalLM if what == "moe" else LlamaForCausalLM
    model = cls(model_config(what, profile))
    if what == "moe":
        model.config._experts_implementation = IMPLEMENTATION
    return model


def train_tokenizer(profile: str = "full"):
    """The byte-level BPE tokenizer of ``profile`` trained on the WikiText-2 train articles."""
    p = PROFILES[profile]
    arts = corpus.articles("train")[:p["train_articles"]]
    return _tok.wrap(_tok.train_bpe((a.text for a in arts), p["vocab_size"]))


def training_stream(tok, n_articles: int | None) -> np.ndarray:
    """WikiText-2 train articles, tokenized, joined with one ``<|endoftext|>`` before each."""
    arts = corpus.articles("train")[:n_articles]
    eos = tok.convert_tokens_to_ids(_tok.EOS)
    ids = corpus.tokenize(arts, tok)
    return np.concatenate([np.concatenate([[eos], a]) for a in ids]).astype(np.int64)


def _train(what: str, profile: str, seed: int, stream: np.ndarray, teacher, progress: bool, tok):
    torch.manual_seed(seed)
    model = new_model(what, profile)
    tcfg = TrainConfig(**{**PROFILES[profile][what].to_dict(), "seed": seed})
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAIN_THREADS)
    try:
        t0 = time.perf_counter()
        history = train_lm(model, stream, tcfg, progress=progress, desc=f"train {what}",
                           teacher=teacher if tcfg.distill > 0 else None)
        seconds = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    tokens = history[-1]["tokens"]
    timing = {"seconds": seconds, "threads": TRAIN_THREADS, "tokens": tokens, "tokens_per_s": tokens / seconds}
    return model, history, timing, evaluate.checkpoint_check(model, tok)


def build(force: bool = False, profile: str = "full", seed: int = 0, progress: bool = True,
          out: Path | None = None) -> dict:
    """Build what is missing into ``out`` (default ``paths.models_dir()``); return a summary
    with each artifact's folder and how it was obtained (``"cached"`` or ``"trained"``, with the
    build time in seconds).

    ``force``: train everything from scratch.
    """
    if profile not in PROFILES:
        raise ValueError(f"unknown build profile {profile!r}; expected one of {sorted(PROFILES)}")
    out = paths.ensure(Path(out) if out else paths.models_dir())
    summary: dict = {}
    rebuilt = False  # an artifact trained here: everything after it is trained too
    tok = stream = moe = None
    for what in ARTIFACTS:
        folder, rec = out / folder_name(what), recipe(profile, seed, what)
        if not force and not rebuilt and same_recipe(_recipe_of(folder), rec):
            summary[what] = {"folder": str(folder), "how": "cached", "built": False}
        else:
            rebuilt = True
            t0 = time.perf_counter()
            if what == "tokenizer":
                tok = train_tokenizer(profile)
                store.save_tokenizer(tok, folder, {"recipe": rec, "seconds": time.perf_counter() - t0})
                summary[what] = {"folder": str(folder), "how": "trained", "built": True,
                                 "seconds": time.perf_counter() - t0}
                continue
            tok = tok or zoo.load_tokenizer(out / zoo.TOKENIZER_DIR)
            stream = training_stream(tok, PROFILES[profile]["train_articles"]) if stream is None else stream
            teacher = None
            if what == "draft":
                teacher = moe if moe is not None else store.load(out / zoo.MOE_DIR)
                teacher.config._experts_implementation = IMPLEMENTATION
            model, history, timing, check = _train(what, profile, seed, stream, teacher, progress, tok)
            if what == "moe":
                moe = model
            meta = {"recipe": rec, "history": history, "train_tokens_available": int(len(stream)),
                    "timing": timing, "check": check, "provenance": provenance.full_record()}
            store.save(model, folder, meta)
            summary[what] = {"folder": str(folder), "how": "trained", "built": True, **timing}
        if what != "tokenizer" and summary[what]["how"] != "trained":
            summary[what].update(store.read_meta(folder).get("timing", {}))
    return summary
