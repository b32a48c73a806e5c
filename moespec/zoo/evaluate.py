"""Quality of a causal LM on documents: perplexity and greedy agreement between two models.

Every token of a document after the first is predicted exactly once: the document is cut into
windows of ``context`` tokens that overlap by one token, so each window's first token is the
previous window's last and serves only as context.
"""

from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import torch
from moespec.progress import tqdm


def _windows(ids: np.ndarray, context: int) -> Iterator[np.ndarray]:
    """Windows of at most ``context`` tokens, overlapping by one, covering ``ids``."""
    if context < 2:
        raise ValueError(f"context must be >= 2 tokens, found {context}")
    start = 0
    while start < len(ids) - 1:
        yield ids[start:start + context]
        start += context - 1


@torch.no_grad()
def nll(model, docs: Sequence[np.ndarray], context: int, device: str = "cpu",
        progress: bool = False, desc: str = "score") -> tuple[float, int]:
    """(summed negative log-likelihood in nats, number of predicted tokens) over ``docs``."""
    model.eval()
    total, count = 0.0, 0
    for ids in tqdm(docs, desc=desc, unit="doc", disable=not progress, mininterval=2):
        for win in _windows(np.asarray(ids), context):
            x = torch.as_tensor(win, device=device)[None]
            logits = model(input_ids=x).logits[0, :-1].float()
            total += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            count += len(win) - 1
    return total, count


def perplexity(model, docs: Sequence[np.ndarray], context: int, device: str = "cpu",
               words: int | None = None, progress: bool = False, desc: str = "perplexity") -> dict:
    """Token-level perplexity exp(NLL / tokens) and, given the documents' word count, the
    word-level perplexity exp(NLL / words), which compares models with different tokenizers."""
    total, count = nll(model, docs, context, device, progress, desc)
    out = {"nll": total, "tokens": count, "ppl_token": math.exp(total / count)}
    if words:
        out["words"] = words
        out["ppl_word"] = math.exp(total / words)
    return out


@torch.no_grad()
def greedy_agreement(target, draft, docs: Sequence[np.ndarray], context: int,
                     device: str = "cpu", progress: bool = False) -> dict:
    """Share of positions of ``docs`` (teacher-forced) where the draft's greedy next token equals
    the target's: the acceptance rate of greedy speculative decoding on that text."""
    agree, count = 0, 0
    for ids in tqdm(docs, desc="agreement", unit="doc", disable=not progress, mininterval=2):
        for win in _windows(np.asarray(ids), context):
            x = torch.as_tensor(win, device=device)[None]
            a = target(input_ids=x).logits[0, :-1].argmax(-1)
            b = draft(input_ids=x).logits[0, :-1].argmax(-1)
            agree += int((a == b).sum())
            count += len(win) - 1
    return {"agree": agree, "positions": count, "agreement": agree / count}


def expert_load(trace) -> np.ndarray:
    """[L, N] share of each layer's routed slots that go to each expert (rows sum to 1)."""
    ids = np.concatenate(trace.docs, axis=0)  # [T, L, m]
    load = np.stack([np.bincount(ids[:, l].ravel(), minlength=trace.num_experts)
                     for l in range(trace.num_layers)]).astype(np.float64)
    return load / load.sum(axis=1, keepdims=True)


def evaluation_documents(tokenizer, split: str = "valid", variant: str = "tokens",
                         words_per_article: int | None = None, articles: int | None = None):
    """(token arrays with the tokenizer's ``<|endoftext|>``/BOS id in front, number of words) of
    the ``split`` articles, each cut to its first lines holding ``words_per_article`` words
    (:func:`moespec.corpus.prefix`), so that every model scores the same text."""
    from moespec import corpus

    arts = corpus.articles(split, variant)[:articles]
    if words_per_article is not None:
        arts = [corpus.prefix(a, words_per_article) for a in arts]
    start = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if start is None or start == tokenizer.unk_token_id:
        start = tokenizer.bos_token_id
    docs = [np.concatenate([[start], ids]) for ids in corpus.tokenize(arts, tokenizer)]
    return docs, sum(a.num_words for a in arts)


#: The default models' quality goals (issue 15): (quantity, comparison, threshold).
QUALITY_GOALS = (
    ("MoE validation perplexity per token", "<=", 110.0),
    ("MoE / draft validation perplexity per token", "<=", 0.85),
    ("MoE router rho_hat(2), 32 fit articles", ">=", 0.25),
    ("draft greedy agreement with the MoE", ">=", 0.70),
)


def quality_goals(ppl_moe: float, ppl_draft: float, rho_2: float, agreement: float,
                  load: np.ndarray) -> "pd.DataFrame":
    """The goals of :data:`QUALITY_GOALS` with the measured values and whether each is met, plus
    the expert-load spread beside them (no goal: balance must not be given up for reuse).

    ``load`` is :func:`expert_load`'s ``[L, N]`` share of slots per expert."""
    import pandas as pd

    values = (ppl_moe, ppl_moe / ppl_draft, rho_2, agreement)
    rows = []
    for (quantity, op, goal), value in zip(QUALITY_GOALS, values):
        met = value <= goal if op == "<=" else value >= goal
        rows.append({"quantity": quantity, "value": float(value), "goal": f"{op} {goal:g}", "met": bool(met)})
    mean = load.mean(axis=1, keepdims=True)
    for quantity, value in (("busiest expert / mean load, worst layer", float((load.max(1) / mean[:, 0]).max())),
                            ("idlest expert / mean load, worst layer", float((load.min(1) / mean[:, 0]).min())),
                            ("coefficient of variation of expert load, worst layer",
                             float((load.std(1) / mean[:, 0]).max()))):
        rows.append({"quantity": quantity, "value": value, "goal": "", "met": None})
    return pd.DataFrame(rows)


def checkpoint_check(model, tokenizer, articles: int = 4, tokens: int = 256) -> dict:
    """A checkpoint's fingerprint: its mean next-token loss (nats) on the first ``tokens`` tokens
    of the first ``articles`` WikiText validation articles, one window each. Stored in
    ``moespec.json`` when a model is built, recomputed by the tests on the committed checkpoints."""
    docs, _ = evaluation_documents(tokenizer, "valid", "tokens", None, articles)
    docs = [d[:tokens] for d in docs]
    total, count = nll(model, docs, tokens)
    return {"articles": articles, "tokens": tokens, "predicted": count, "nll_per_token": total / count}
