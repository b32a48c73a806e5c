"""How deep the trained default MoE's context can run (issue 27, item 1: "if the trained model's
context can run deeper, add depths toward the paper's 512 and 4096 ... if not, say why").

The model was trained on sequences of 256 positions (``max_position_embeddings`` 256; rotary
positions, which compute for any position). This scores it past that: WikiText validation articles
long enough for ``--length`` tokens, teacher-forced in one pass each (the limit lifted for this
measurement only), and the mean next-token loss and perplexity reported per bucket of positions
(0-255: inside the training length; beyond: outside it). Writes
``benchmarks/results/context/<stamp>_depth.csv`` and ``<stamp>_provenance.json``.

    .venv/bin/python benchmarks/bench_context_depth.py --length 1024 --docs 8
"""

from __future__ import annotations

import argparse
import datetime as dt
import math

import numpy as np
import pandas as pd
import torch

from moespec import corpus, io, paths, provenance, zoo

BUCKETS = ((0, 256), (256, 512), (512, 1024), (1024, 2048), (2048, 4096))


def long_documents(tokenizer, length: int, count: int) -> list[np.ndarray]:
    """The first ``count`` WikiText validation articles with at least ``length`` tokens, cut to it."""
    docs = [d for d in corpus.tokenize(corpus.articles("valid"), tokenizer) if len(d) >= length]
    if len(docs) < count:
        raise SystemExit(f"only {len(docs)} validation articles hold {length} tokens; ask for fewer or shorter")
    return [np.asarray(d[:length]) for d in docs[:count]]


@torch.inference_mode()
def position_losses(model, docs) -> np.ndarray:
    """Next-token loss at every position 1..T-1 of each document, ``[docs, T - 1]`` (nats)."""
    out = []
    for d in docs:
        ids = torch.as_tensor(d, dtype=torch.long)[None]
        logits = model(input_ids=ids).logits[0, :-1].float()
        out.append(torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="none").numpy())
    return np.stack(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--length", type=int, default=1024, help="tokens per document (past the training length)")
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default; not timed)")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    started = dt.datetime.now(dt.timezone.utc)
    model, tok = zoo.load_default_moe(), zoo.load_tokenizer()
    trained = int(model.config.max_position_embeddings)
    model.config.max_position_embeddings = args.length      # this measurement only
    losses = position_losses(model, long_documents(tok, args.length, args.docs))
    rows = []
    for lo, hi in BUCKETS:
        if lo >= args.length - 1:
            break
        per_doc = losses[:, lo:min(hi, args.length) - 1].mean(axis=1)   # loss of predicting positions lo+1..
        boot = np.random.default_rng(0).choice(per_doc, size=(2000, len(per_doc))).mean(axis=1)
        rows.append({"positions": f"{lo}-{min(hi, args.length) - 1}", "inside_training_length": hi <= trained,
                     "mean_loss_nats": float(per_doc.mean()), "perplexity": math.exp(per_doc.mean()),
                     "perplexity_lo": math.exp(np.quantile(boot, 0.025)), "perplexity_hi": math.exp(np.quantile(boot, 0.975)),
                     "docs": len(per_doc), "trained_positions": trained})
    table = pd.DataFrame(rows)
    out = paths.ROOT / "benchmarks" / "results" / "context"
    stamp = started.strftime("%Y%m%dT%H%M%S")
    io.write_dataframe(out / f"{stamp}_depth.csv", table)
    io.write_json(out / f"{stamp}_provenance.json", {**provenance.full_record(), "started": started.isoformat(),
                                                    "args": vars(args), "model": "default MoE (trained here)"})
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))
    print(f"written to {out}/{stamp}_*")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
