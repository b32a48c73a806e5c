"""Build the embedded default models: tokenizer, then MoE, then draft, each cached on disk.

Recipe (``PROFILES["full"]``, what ``make reproduce`` runs): a 4096-symbol byte-level BPE
tokenizer trained on the WikiText-2 train split; the default MoE
(:func:`moespec.zoo.default_moe_config`) and the draft (:func:`moespec.zoo.default_draft_config`)
each trained from scratch on that split (articles joined by ``<|endoftext|>``, cut into
256-token blocks) with AdamW, warm-up and cosine decay, a fixed number of steps, seed 0. The MoE
trains with the router's load-balancing loss (coefficient 0.01, OLMoE's) and the grouped expert
operation of :mod:`moespec.zoo.experts`.

Each artifact is skipped when its folder holds a build of the same recipe (``moespec.json``),
rebuilt otherwise. ``PROFILES["smoke"]`` trains a few steps of smaller models for tests.
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
from moespec.zoo import store
from moespec.zoo import tokenizer as _tok
from moespec.zoo.train import TrainConfig, train_lm

#: Intra-op threads for training. One thread makes a build bit-reproducible (no thread-count
#: dependent reduction order) and, on shared cores, avoids OpenMP threads spin-waiting on each
#: other: measured here under load, one fwd+bwd step took 3.0 s with 1 thread and 16.5 s with 2.
TRAIN_THREADS = 1

PROFILES = {
    "full": {"vocab_size": zoo.VOCAB_SIZE, "train_articles": None, "model_overrides": {},
             "moe": TrainConfig(steps=400, batch_size=8, seq_len=zoo.CONTEXT, lr=3e-3, warmup=20),
             "draft": TrainConfig(steps=400, batch_size=8, seq_len=zoo.CONTEXT, lr=3e-3, warmup=20)},
    "smoke": {"vocab_size": 300, "train_articles": 3,
              "model_overrides": {"hidden_size": 32, "intermediate_size": 32, "num_hidden_layers": 2,
                                  "num_experts": 16, "num_experts_per_tok": 4, "max_position_embeddings": 64},
              "moe": TrainConfig(steps=3, batch_size=2, seq_len=64, warmup=1, log_every=1),
              "draft": TrainConfig(steps=3, batch_size=2, seq_len=64, warmup=1, log_every=1)},
}


def _recipe(profile: str, seed: int, what: str) -> dict:
    p = PROFILES[profile]
    r = {"profile": profile, "seed": seed, "threads": TRAIN_THREADS, "vocab_size": p["vocab_size"],
         "train_articles": p["train_articles"], "model_overrides": p["model_overrides"]}
    if what in ("moe", "draft"):
        r["train"] = {**p[what].to_dict(), "seed": seed}
        cfg = zoo.default_moe_config(p["vocab_size"]) if what == "moe" else zoo.default_draft_config(p["vocab_size"])
        r["config"] = cfg.to_diff_dict()
    return json.loads(json.dumps(r, default=str))


def _cached(folder: Path, recipe: dict) -> bool:
    return folder.is_dir() and store.read_meta(folder).get("recipe") == recipe


def _training_stream(tok, n_articles: int | None) -> np.ndarray:
    """WikiText-2 train articles, tokenized, joined with one ``<|endoftext|>`` before each."""
    arts = corpus.articles("train")[:n_articles]
    eos = tok.convert_tokens_to_ids(_tok.EOS)
    ids = corpus.tokenize(arts, tok)
    return np.concatenate([np.concatenate([[eos], a]) for a in ids]).astype(np.int64)


def _config(what: str, profile: str):
    p = PROFILES[profile]
    cfg = zoo.default_moe_config(p["vocab_size"]) if what == "moe" else zoo.default_draft_config(p["vocab_size"])
    for k, v in p["model_overrides"].items():
        if what == "draft" and k in ("num_experts", "num_experts_per_tok"):
            continue
        if what == "draft" and k == "intermediate_size":
            v = 4 * v
        setattr(cfg, k, v)
    return cfg


def build(force: bool = False, profile: str = "full", seed: int = 0, progress: bool = True,
          out: Path | None = None) -> dict:
    """Build what is missing into ``out`` (default ``paths.models_dir()``); return a summary
    with each artifact's folder, whether it was rebuilt, and its build time in seconds."""
    if profile not in PROFILES:
        raise ValueError(f"unknown build profile {profile!r}; expected one of {sorted(PROFILES)}")
    out = paths.ensure(Path(out) if out else paths.models_dir())
    p = PROFILES[profile]
    summary: dict = {}

    tok_dir = out / zoo.TOKENIZER_DIR
    rec = _recipe(profile, seed, "tokenizer")
    meta_path = tok_dir / store.META
    if force or not (meta_path.is_file() and json.loads(meta_path.read_text()).get("recipe") == rec):
        t0 = time.perf_counter()
        arts = corpus.articles("train")[:p["train_articles"]]
        tok = _tok.wrap(_tok.train_bpe((a.text for a in arts), p["vocab_size"]))
        tok.save_pretrained(str(tok_dir))
        meta_path.write_text(json.dumps({"recipe": rec, "seconds": time.perf_counter() - t0}, indent=1))
        summary["tokenizer"] = {"folder": str(tok_dir), "built": True, "seconds": time.perf_counter() - t0}
    else:
        summary["tokenizer"] = {"folder": str(tok_dir), "built": False}
    tok = zoo.load_tokenizer(tok_dir)
    stream = None

    for what, cls, name in (("moe", OlmoeForCausalLM, zoo.MOE_DIR), ("draft", LlamaForCausalLM, zoo.DRAFT_DIR)):
        folder = out / name
        rec = _recipe(profile, seed, what)
        if not force and not summary["tokenizer"]["built"] and _cached(folder, rec):
            summary[what] = {"folder": str(folder), "built": False, **store.read_meta(folder).get("timing", {})}
            continue
        if stream is None:
            stream = _training_stream(tok, p["train_articles"])
        torch.manual_seed(seed)
        model = cls(_config(what, profile))
        if what == "moe":
            zoo.use_sorted_experts(model)
        tcfg = TrainConfig(**{**p[what].to_dict(), "seed": seed})
        threads = torch.get_num_threads()
        torch.set_num_threads(TRAIN_THREADS)
        try:
            t0 = time.perf_counter()
            history = train_lm(model, stream, tcfg, progress=progress, desc=f"train {what}")
            seconds = time.perf_counter() - t0
        finally:
            torch.set_num_threads(threads)
        meta = {"recipe": rec, "history": history, "train_tokens_available": int(len(stream)),
                "timing": {"seconds": seconds, "threads": TRAIN_THREADS},
                "provenance": provenance.full_record()}
        store.save(model, folder, meta)
        summary[what] = {"folder": str(folder), "built": True, "seconds": seconds}
    return summary
