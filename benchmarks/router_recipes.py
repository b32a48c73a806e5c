"""Router recipes for the default MoE: train a variant of the full recipe and report, at a few
points of its schedule, the validation perplexity per token, the router's reuse rho_hat(2) and
rho_hat(9) on paper 1's 32 fit articles (layer mean and per layer) and the expert-load spread
(issue 15: reuse near a real MoE's without giving up load balance; docs/models.md).

Each variant is the full recipe's MoE (``moespec.zoo.build.PROFILES["full"]["moe"]``, seed 0,
one thread) with some of: ``--coef`` (load-balancing coefficient), ``--window`` (selection
shares averaged over that many steps: the global-batch balance of
:class:`moespec.zoo.train.ShareAverage`), ``--router-z`` (router z-loss), ``--layers`` (MoE
depth), ``--steps`` (schedule length; evaluated ``--points`` times along it). One JSON line per
evaluation point goes to stdout and to ``--out`` (appended).

Run: ``.venv/bin/python benchmarks/router_recipes.py --name coef0.001 --coef 0.001 --steps 1500 --points 3``
(about 1.2 h of one core per 1,000 steps of the full-size MoE on a 2-core VM under load).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

from moespec import corpus, paths, zoo
from moespec.routing import record, reuse
from moespec.zoo import build, evaluate
from moespec.zoo.train import Trainer, TrainConfig


def fit_documents(tok) -> list[np.ndarray]:
    """Paper 1's 32 fit articles of the WikiText test split, in context-length pieces."""
    arts = corpus.articles("test", "tokens")
    ids = corpus.tokenize([arts[i] for i in corpus.fit_documents(arts)], tok)
    return [seg for x in ids for seg in corpus.segments(x, zoo.CONTEXT)]


def snapshot(model, valid_docs, words, fit_docs) -> dict:
    """Validation perplexity, reuse (layer mean and per layer) and expert-load spread of ``model``."""
    model.eval()
    with torch.no_grad():
        ppl = evaluate.perplexity(model, valid_docs, zoo.CONTEXT, words=words)["ppl_token"]
        trace = record(model, fit_docs, progress=False)
    rho = reuse(trace, 9)
    load = evaluate.expert_load(trace)
    mean = load.mean(axis=1)
    model.train()
    return {"ppl_token": ppl, "rho2": float(rho[:, 1].mean()), "rho9": float(rho[:, 8].mean()),
            "rho2_layers": [round(float(v), 4) for v in rho[:, 1]],
            "cv_max": float((load.std(1) / mean).max()), "max_over_mean": float((load.max(1) / mean).max()),
            "min_over_mean": float((load.min(1) / mean).min())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--name", required=True)
    ap.add_argument("--steps", type=int, default=build.PROFILES["full"]["moe"].steps)
    ap.add_argument("--points", type=int, default=3, help="evaluations along the schedule (default 3)")
    ap.add_argument("--coef", type=float, default=None, help="load-balancing coefficient (default the config's)")
    ap.add_argument("--window", type=int, default=1, help="steps the selection shares are averaged over")
    ap.add_argument("--router-z", type=float, default=0.0)
    ap.add_argument("--layers", type=int, default=None, help="MoE layers (default the config's)")
    ap.add_argument("--out", type=Path, default=paths.bench_dir() / "router_recipes.jsonl")
    args = ap.parse_args(argv)
    torch.set_num_threads(build.TRAIN_THREADS)
    tok = build.train_tokenizer("full")
    stream = build.training_stream(tok, None)
    torch.manual_seed(0)
    model = build.new_model("moe", "full")
    if args.coef is not None:
        model.config.router_aux_loss_coef = args.coef
    if args.layers is not None:
        torch.manual_seed(0)
        cfg = model.config
        cfg.num_hidden_layers = args.layers
        model = type(model)(cfg)
    cfg = TrainConfig(**{**build.PROFILES["full"]["moe"].to_dict(), "steps": args.steps,
                         "balance_window": args.window, "router_z": args.router_z})
    trainer = Trainer(model, stream, cfg)
    valid_docs, words = evaluate.evaluation_documents(tok, "valid", "tokens", 200, None)
    fit_docs = fit_documents(tok)
    at = {int(args.steps * (i + 1) / args.points) for i in range(args.points)}
    paths.ensure(args.out.parent)
    t0 = time.perf_counter()
    for step in range(1, args.steps + 1):
        trainer.step()
        if step in at:
            row = {"name": args.name, "step": step, "tokens": step * trainer.tokens_per_step,
                   "coef": model.config.router_aux_loss_coef, "window": args.window, "router_z": args.router_z,
                   "layers": model.config.num_hidden_layers, "steps": args.steps,
                   **snapshot(model, valid_docs, words, fit_docs), "seconds": time.perf_counter() - t0}
            line = json.dumps(row)
            print(line, flush=True)
            with open(args.out, "a") as fh:
                fh.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
