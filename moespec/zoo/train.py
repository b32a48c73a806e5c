"""Training loop for the embedded models: next-token loss, the router's load-balancing loss and
optionally a distillation loss towards a teacher's next-token distribution.

Deterministic: the model is initialised under ``torch.manual_seed(seed)`` by the caller, batches
are drawn by a ``numpy`` generator seeded with ``seed``, and the step count is fixed (never a
time budget), so two runs on the same machine, thread count and recipe give the same weights.

Speed (``benchmarks/bench_training.py``, numbers in docs/models.md): the MoE trains with the
grouped expert operation (:mod:`moespec.zoo.experts`) in f32; the dense draft with its loss
compiled by ``torch.compile`` under bf16 autocast (``precision="bf16-autocast"``), which pays
only where the CPU has native bf16 arithmetic (:func:`bf16_native`). Both use the fused AdamW.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from moespec.progress import tqdm

PRECISIONS = ("f32", "bf16-autocast")


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser, schedule and loss. ``steps`` batches of ``batch_size`` sequences of ``seq_len`` tokens.

    ``precision``: ``"f32"``, or ``"bf16-autocast"`` (f32 weights and optimiser state, matrix
    products in bf16). ``compile``: run the forward and loss through ``torch.compile`` (dense
    models; the MoE's grouped expert operation does not compile on the CPU). ``distill``: weight
    ``lambda`` of the distillation term, loss ``(1 - lambda) * CE + lambda * T^2 * KL(teacher_T ||
    student_T)`` at temperature ``T = distill_temperature``; needs a teacher in :func:`train_lm`.
    ``router_z``: coefficient of the router z-loss (ST-MoE, Zoph et al. 2022), 0 for none.
    ``fused_optimizer``: torch's fused AdamW (one kernel over all parameters; False: the
    multi-tensor ``foreach`` version, the previous training path).
    """

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
    balance_window: int = 1     # steps over which the selection shares f_i are averaged (1: this batch)
    router_z: float = 0.0
    precision: str = "f32"
    compile: bool = False
    distill: float = 0.0
    distill_temperature: float = 1.0
    fused_optimizer: bool = True

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, found {self.precision!r}")
        if not 0.0 <= self.distill <= 1.0:
            raise ValueError(f"distill must lie in [0, 1], found {self.distill}")
        if self.distill_temperature <= 0:
            raise ValueError(f"distill_temperature must be > 0, found {self.distill_temperature}")
        for name in ("steps", "batch_size", "seq_len", "balance_window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, found {getattr(self, name)}")

    def to_dict(self) -> dict:
        return asdict(self)


def bf16_native() -> bool:
    """Whether this CPU multiplies bf16 natively (oneDNN's check: AVX512-BF16 / AMX)."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warm-up, then cosine decay to ``min_lr_ratio * lr``."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    frac = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.lr * (cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def selection_shares(router_logits, top_k: int) -> torch.Tensor:
    """``[L, N]``: per layer, the share f_i of the batch's top-k slots that go to expert i, times
    k (so each row sums to k). Not differentiable (a count)."""
    rows = []
    with torch.no_grad():
        for logits in router_logits:
            n_exp = logits.shape[-1]
            chosen = torch.topk(logits.float(), top_k, dim=-1).indices
            rows.append(torch.bincount(chosen.reshape(-1), minlength=n_exp).float() / logits.shape[0])
    return torch.stack(rows)


def balance_loss(router_logits, top_k: int, shares: torch.Tensor | None = None) -> torch.Tensor:
    """Switch-Transformer load-balancing loss of each MoE layer, averaged over layers:
    ``N * sum_i f_i P_i`` with f_i the share of the layer's top-k slots that go to expert i times
    k (so sum_i f_i = k) and P_i its mean router probability over the batch; ``k`` when
    perfectly balanced. ``shares`` (``[L, N]``) replaces this batch's f_i, e.g. by their average
    over recent steps (:class:`Trainer` with ``balance_window > 1``).

    transformers' ``load_balancing_loss_func`` pools f and P over all layers before the product,
    so layers that prefer different experts cancel out; measured here, that left experts that no
    validation token selects (0.00x the mean load) in every layer. Per layer, each layer is held
    to balance. For one layer both are the same function (tested).
    """
    f_all = selection_shares(router_logits, top_k) if shares is None else shares
    losses = []
    for f, logits in zip(f_all, router_logits):
        probs = torch.softmax(logits.float(), dim=-1)
        losses.append(probs.shape[-1] * (f * probs.mean(0)).sum())
    return torch.stack(losses).mean()


class ShareAverage:
    """Moving average of the selection shares f_i over about ``window`` steps (exponential, weight
    ``1 / window`` on the newest batch, started at the first batch's shares).

    The balancing loss then holds experts to balance over a global batch of ``window`` steps
    rather than over each batch of a few documents, which leaves a router free to send one
    document's tokens to a subset of experts (Qiu et al., 2025, "Demons in the Detail: On
    Implementing Load Balancing Loss for Training Specialized Mixture-of-Expert Models": the
    global-batch balance gives more specialised experts). ``window = 1``: this batch's own shares.
    """

    def __init__(self, window: int):
        if window < 1:
            raise ValueError(f"window must be >= 1 step, found {window}")
        self.window, self.value = window, None

    def update(self, shares: torch.Tensor) -> torch.Tensor:
        if self.value is None:
            self.value = shares.clone()
        else:
            self.value += (shares - self.value) / self.window
        return self.value


def router_z_loss(router_logits) -> torch.Tensor:
    """ST-MoE's router z-loss, ``mean_t (log sum_i exp z_ti)^2``, averaged over layers."""
    return torch.stack([torch.logsumexp(z.float(), dim=-1).square().mean() for z in router_logits]).mean()


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


def is_moe(model) -> bool:
    """Whether ``model`` routes tokens to experts (has a top-k router)."""
    return getattr(model.config, "num_experts_per_tok", None) is not None


def _losses(model, x: torch.Tensor, teacher_logits, cfg: TrainConfig, coef: float,
            shares: ShareAverage | None = None):
    """(total loss, next-token loss, balance loss or None, z-loss or None, distillation KL or None).

    Calls the decoder and the LM head directly, so transformers' own pooled balancing loss is
    not computed (it would be discarded)."""
    moe = is_moe(model)
    kwargs = {"output_router_logits": True} if moe else {}
    hidden = model.model(input_ids=x, **kwargs)
    logits = model.lm_head(hidden.last_hidden_state[:, :-1]).float()
    vocab = logits.shape[-1]
    lm_loss = F.cross_entropy(logits.reshape(-1, vocab), x[:, 1:].reshape(-1))
    loss, kd, aux, z = lm_loss, None, None, None
    if teacher_logits is not None:
        t = cfg.distill_temperature
        kd = F.kl_div(F.log_softmax(logits.reshape(-1, vocab) / t, -1),
                      F.log_softmax(teacher_logits.reshape(-1, vocab).float() / t, -1),
                      log_target=True, reduction="batchmean") * t * t
        loss = (1 - cfg.distill) * lm_loss + cfg.distill * kd
    if moe:
        top_k = model.config.num_experts_per_tok
        f = selection_shares(hidden.router_logits, top_k)
        aux = balance_loss(hidden.router_logits, top_k, shares.update(f) if shares is not None else f)
        loss = loss + coef * aux
        if cfg.router_z:
            z = router_z_loss(hidden.router_logits)
            loss = loss + cfg.router_z * z
    return loss, lm_loss, aux, z, kd


class Trainer:
    """One model's optimiser, batch stream and loss: :meth:`step` runs one training step.

    :func:`train_lm` loops over it; ``benchmarks/bench_training.py`` times its steps.
    """

    def __init__(self, model, stream: np.ndarray, cfg: TrainConfig, teacher=None):
        if cfg.distill > 0 and teacher is None:
            raise ValueError("cfg.distill > 0 needs a teacher model")
        if teacher is not None and cfg.distill == 0:
            raise ValueError("a teacher was given but cfg.distill is 0")
        self.model, self.cfg, self.teacher = model, cfg, teacher
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "norm" not in n]
        other = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and "norm" not in n)]
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": cfg.weight_decay},
                                      {"params": other, "weight_decay": 0.0}],
                                     lr=cfg.lr, betas=(0.9, 0.95),
                                     fused=cfg.fused_optimizer or None)
        self.coef = float(getattr(model.config, "router_aux_loss_coef", 0.0) or 0.0)
        self.loss_fn = torch.compile(_losses, dynamic=False) if cfg.compile else _losses
        self.data = batches(stream, cfg)
        self.shares = ShareAverage(cfg.balance_window) if is_moe(model) else None
        self.tokens_per_step = cfg.batch_size * cfg.seq_len
        self.steps_done = 0
        model.train()
        if teacher is not None:
            teacher.eval()

    def step(self) -> dict:
        """One step at the schedule's learning rate; returns the step's loss terms (floats)."""
        cfg, lr = self.cfg, lr_at(self.steps_done, self.cfg)
        for group in self.opt.param_groups:
            group["lr"] = lr
        x = next(self.data)
        teacher_logits = None
        if self.teacher is not None:
            with torch.no_grad():
                teacher_logits = self.teacher(input_ids=x).logits[:, :-1]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16-autocast"):
            loss, lm_loss, aux, z, kd = self.loss_fn(self.model, x, teacher_logits, cfg, self.coef,
                                                      self.shares)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        self.steps_done += 1
        return {"lm_loss": float(lm_loss.detach()),
                "aux_loss": float(aux.detach()) if aux is not None else 0.0,
                "z_loss": float(z.detach()) if z is not None else 0.0,
                "distill_kl": float(kd.detach()) if kd is not None else 0.0, "lr": lr}


def train_lm(model, stream: np.ndarray, cfg: TrainConfig, progress: bool = True,
             desc: str = "train", teacher=None) -> list[dict]:
    """Train ``model`` in place on ``stream`` (1-D token ids); return the loss history.

    For models with a router the loss adds ``router_aux_loss_coef`` times :func:`balance_loss`
    (per layer) and ``cfg.router_z`` times :func:`router_z_loss`; with ``cfg.distill > 0`` it
    mixes in the KL divergence to ``teacher``'s next-token distribution (the teacher runs in
    eval mode, without gradients). The history records each term separately, the tokens seen
    and the seconds elapsed, every ``cfg.log_every`` steps. The progress bar (tqdm.auto: a
    terminal, papermill's log and JupyterLab) shows tokens/s and the next-token loss.
    """
    trainer = Trainer(model, stream, cfg, teacher)
    history, t0 = [], time.perf_counter()
    bar = tqdm(total=cfg.steps * trainer.tokens_per_step, desc=desc, unit="tok", unit_scale=True,
               disable=not progress, mininterval=2)
    for step in range(cfg.steps):
        terms = trainer.step()
        bar.update(trainer.tokens_per_step)
        if step % cfg.log_every == 0 or step == cfg.steps - 1:
            history.append({"step": step, "tokens": (step + 1) * trainer.tokens_per_step, **terms,
                            "seconds": time.perf_counter() - t0})
            bar.set_postfix(loss=f"{terms['lm_loss']:.3f}", refresh=False)
    bar.close()
    model.eval()
    return history
