"""Training loop for the embedded models (next-token loss, plus the router's load-balancing loss).

Deterministic: the model is initialised under ``torch.manual_seed(seed)`` by the caller, batches
are drawn by a ``numpy`` generator seeded with ``seed``, and the step count is fixed (never a
time budget), so two runs on the same machine and thread count give the same weights.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tqdm.auto import tqdm


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and schedule. ``steps`` batches of ``batch_size`` sequences of ``seq_len`` tokens."""

    steps: int = 1000
    batch_size: int = 16
    seq_len: int = 512
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    log_every: int = 10
    balance: str = "per_layer"  # load-balancing loss: each MoE layer's own (see balance_loss)

    def to_dict(self) -> dict:
        return asdict(self)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def balance_loss(router_logits, top_k: int) -> torch.Tensor:
    """Switch-Transformer load-balancing loss of each MoE layer, averaged over layers:
    ``N * sum_i f_i P_i`` with f_i the share of the layer's top-k slots that go to expert i times
    k (so sum_i f_i = k) and P_i its mean router probability; ``k`` when perfectly balanced.

    transformers' ``load_balancing_loss_func`` pools f and P over all layers before the product,
    so layers that prefer different experts cancel out; measured here, that left experts that no
    validation token selects (0.00x the mean load) in every layer. Per layer, each layer is held
    to balance. For one layer both are the same function (tested).
    """
    losses = []
    for logits in router_logits:
        probs = torch.softmax(logits.float(), dim=-1)
        n_exp = probs.shape[-1]
        chosen = torch.topk(probs, top_k, dim=-1).indices
        f = torch.zeros(n_exp, device=probs.device).scatter_add_(
            0, chosen.reshape(-1), torch.ones(chosen.numel(), device=probs.device)) / probs.shape[0]
        losses.append(n_exp * (f * probs.mean(0)).sum())
    return torch.stack(losses).mean()


def batches(stream: np.ndarray, cfg: TrainConfig):
    """Yield ``[batch_size, seq_len]`` int64 tensors: the token stream cut into non-overlapping
    blocks, visited in a seeded random order, epoch after epoch."""
    n_blocks = len(stream) // cfg.seq_len
    if n_blocks < cfg.batch_size:
        raise ValueError(f"training stream of {len(stream)} tokens holds {n_blocks} blocks of "
                         f"{cfg.seq_len}, fewer than one batch of {cfg.batch_size}")
    blocks = torch.as_tensor(stream[:n_blocks * cfg.seq_len], dtype=torch.long).view(n_blocks, cfg.seq_len)
    rng = np.random.default_rng(cfg.seed)
    while True:
        order = rng.permutation(n_blocks)
        for i in range(0, n_blocks - cfg.batch_size + 1, cfg.batch_size):
            yield blocks[torch.as_tensor(order[i:i + cfg.batch_size])]


def train_lm(model, stream: np.ndarray, cfg: TrainConfig, progress: bool = True,
             desc: str = "train") -> list[dict]:
    """Train ``model`` in place on ``stream`` (1-D token ids); return the loss history.

    For models with a router (``config.output_router_logits``) the loss is the next-token loss
    plus ``router_aux_loss_coef`` times :func:`balance_loss` (per layer); the history records
    both separately.
    """
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
    other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                             {"params": other, "weight_decay": 0.0}], lr=cfg.lr, betas=(0.9, 0.95))
    coef = float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0)
    use_aux = bool(getattr(model.config, "output_router_logits", False))
    model.train()
    history, t0 = [], time.perf_counter()
    data = batches(stream, cfg)
    bar = tqdm(range(cfg.steps), desc=desc, disable=not progress, mininterval=5)
    for step in bar:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        x = next(data)
        out = model(input_ids=x, output_router_logits=use_aux)  # no labels: no pooled aux loss added
        lm_loss = torch.nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, out.logits.shape[-1]),
                                                    x[:, 1:].reshape(-1))
        aux_loss = balance_loss(out.router_logits, model.config.num_experts_per_tok) if use_aux else None
        loss = lm_loss + coef * aux_loss if use_aux else lm_loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            lm = float(lm_loss.detach())
            history.append({"step": step, "tokens": (step + 1) * x.numel(), "lm_loss": lm,
                            "aux_loss": float(aux_loss.detach()) if use_aux else 0.0, "lr": lr_at(step, cfg),
                            "seconds": time.perf_counter() - t0})
            bar.set_postfix(loss=f"{lm:.3f}")
    model.eval()
    return history
