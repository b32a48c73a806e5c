"""Pure-torch expert operation: the fp64 reference and readable per-slot / dedup kernels.

The expert operation of one MoE layer on a pass of ``n`` tokens (SwiGLU experts):

    y_t = sum_s g_ts * W_down[e_ts] ( silu(W_gate[e_ts] x_t) * (W_up[e_ts] x_t) ),   e_ts = ids[t, s].

Two kernels compute it (paper 1, Section 1):

* per-slot (``slot``): one product per (token, slot) pair, each reading its expert -- n*m expert
  reads per pass, like llama.cpp's ``mul_mv_id``;
* deduplicating (``dedup``): the tokens grouped by expert, each distinct expert read once and
  applied to all its tokens -- U expert reads per pass.

Precision of the activations, shared by every backend so that they compute the same thing:
``f32`` keeps them in float32; ``bf16`` rounds x and the hidden h = silu(g)*u to bfloat16 before
each product (fp32 accumulation in the C++/CUDA kernels); ``int8_b32`` quantizes x and h to int8
blocks of 32 with one fp32 scale each (like ggml's Q8_0 activations), so the block dot products
are exact integer sums. :func:`reference_forward` instead uses the unrounded activations and the
exact (dequantized) weights in float64: the ground truth every backend is compared against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moespec.kernels.weights import ExpertWeights, dequantize_blocks, quantize_blocks


def _gates(ids: torch.Tensor, gates: torch.Tensor | None, dtype) -> torch.Tensor:
    return torch.ones(ids.shape, dtype=dtype, device=ids.device) if gates is None else gates.to(dtype)


def groups_by_expert(ids: torch.Tensor) -> list[tuple[int, torch.Tensor, torch.Tensor]]:
    """``[(expert, tokens, slots)]`` for each distinct expert of the pass, in increasing expert
    order: the (token, slot) pairs that select it. This is the grouping a dedup kernel reads by."""
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    experts, counts = torch.unique_consecutive(flat[order], return_counts=True)
    m = ids.shape[1]
    out, start = [], 0
    for e, c in zip(experts.tolist(), counts.tolist()):
        pairs = order[start:start + c]
        out.append((e, pairs // m, pairs % m))
        start += c
    return out


def reference_forward(x: torch.Tensor, ids: torch.Tensor, weights: ExpertWeights,
                      gates: torch.Tensor | None = None, dtype=torch.float64) -> torch.Tensor:
    """The expert operation in ``dtype`` (float64: fp64 accumulation) from the exact weights and
    unrounded activations. Returns ``[n, H]`` in ``dtype``."""
    xd = x.to(dtype)
    g = _gates(ids, gates, dtype)
    y = torch.zeros_like(xd)
    for e, toks, slots in groups_by_expert(ids):
        wg, wu, wd = weights.dequantized([e], dtype)
        xe = xd[toks]
        h = F.silu(xe @ wg[0].T) * (xe @ wu[0].T)
        y.index_add_(0, toks, (h @ wd[0].T) * g[toks, slots].unsqueeze(1))
    return y


# --- the torch backend: what a torch user would write, at the format's precision ---------------
def _expert_linear(v: torch.Tensor, weights: ExpertWeights, which: str, e: int) -> torch.Tensor:
    """``v @ W[e].T`` for one expert matrix (``which`` in gate/up/down) at the format's precision;
    returns float32."""
    w = getattr(weights, which)[e]
    if weights.fmt == "f32":
        return F.linear(v.float(), w)
    if weights.fmt == "bf16":
        return F.linear(v.to(torch.bfloat16), w).float()
    # int8_b32: activations to int8 blocks as the kernels do; the fp32 products of values that are
    # small integers times scales are then the kernels' block sums up to fp32 rounding.
    q, s = quantize_blocks(v)
    wf = dequantize_blocks(w, getattr(weights, which + "_scale")[e])
    return F.linear(dequantize_blocks(q, s), wf)


def expert_mlp(v: torch.Tensor, weights: ExpertWeights, e: int) -> torch.Tensor:
    """Expert ``e`` applied to the rows of ``v`` at the format's precision, as a torch user would
    write it (three ``F.linear``); float32 ``[rows, H]``."""
    h = F.silu(_expert_linear(v, weights, "gate", e)) * _expert_linear(v, weights, "up", e)
    return _expert_linear(h, weights, "down", e)


def non_finite_rows_to_nan(y: torch.Tensor, x: torch.Tensor, gates: torch.Tensor | None) -> torch.Tensor:
    """The non-finite rule every backend follows (docs/kernels.md): a token whose ``x`` row or
    gates hold NaN or +-inf, or whose float32 computation overflowed (a non-finite value anywhere in
    its output row), gets an output row of NaN only; every other row is left as computed. Without
    it the same input gave NaN on one backend, +-inf on another (an infinite gate) and a finite row
    on a third (int8 with NaN activations). In place; returns ``y``."""
    bad = ~torch.isfinite(y).all(dim=1) | ~torch.isfinite(x).all(dim=1)
    if gates is not None:
        bad |= ~torch.isfinite(gates).all(dim=1)
    if bool(bad.any()):
        y[bad] = float("nan")
    return y


def torch_slot(x: torch.Tensor, ids: torch.Tensor, weights: ExpertWeights,
               gates: torch.Tensor | None = None) -> torch.Tensor:
    """Per-slot kernel in torch: one product per (token, slot) pair (n*m expert reads)."""
    g = _gates(ids, gates, torch.float32)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    n, m = ids.shape
    for t in range(n):
        for s in range(m):
            y[t] += g[t, s] * expert_mlp(x[t:t + 1], weights, int(ids[t, s]))[0]
    return non_finite_rows_to_nan(y, x, gates)


def torch_dedup(x: torch.Tensor, ids: torch.Tensor, weights: ExpertWeights,
                gates: torch.Tensor | None = None) -> torch.Tensor:
    """Deduplicating kernel in torch: each distinct expert applied once to all its tokens (U reads)."""
    g = _gates(ids, gates, torch.float32)
    y = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e, toks, slots in groups_by_expert(ids):
        y.index_add_(0, toks, expert_mlp(x[toks], weights, e) * g[toks, slots].unsqueeze(1))
    return non_finite_rows_to_nan(y, x, gates)
