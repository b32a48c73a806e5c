"""Expert operations for training the default MoE: tokens grouped by expert.

The reference OLMoE block loops over experts in Python. For training on a CPU the n*m (token,
slot) pairs are sorted by expert and the gate/up and down projections run per expert group.
Two implementations, both registered in transformers' experts interface, so
``model.config._experts_implementation = <name>`` switches an OLMoE-family model to one of them
without touching the model class:

- :data:`IMPLEMENTATION` (``"moespec_grouped"``, the training path): the sorted pairs stay one
  ``[n*m, H]`` block and ``torch._grouped_mm`` multiplies each expert's rows by its weights,
  with no padding.
- :data:`PADDED_IMPLEMENTATION` (``"moespec_padded"``, the previous training path, kept for the
  training-speed benchmark ``benchmarks/bench_training.py`` and as an independent
  implementation in the tests): pairs scattered into a padded ``[N, C, H]`` block (C = the
  largest expert load of the batch) and two ``torch.bmm``. Early in training a router sends far
  more than the mean n*m/N pairs to a few experts, so most of that block is padding.

Both compute ``out[t] = sum_j w[t, j] * E_{id[t, j]}(x[t])`` with SwiGLU experts, the reference
loop's mathematics (tests check outputs and gradients against it).
"""

from __future__ import annotations

import torch
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

IMPLEMENTATION = "moespec_grouped"
PADDED_IMPLEMENTATION = "moespec_padded"


def _sort_pairs(top_k_index: torch.Tensor, num_experts: int):
    """(expert ids of the sorted pairs, permutation of the flat (token, slot) pairs, pairs per expert)."""
    ids = top_k_index.reshape(-1)
    ids_sorted, perm = torch.sort(ids, stable=True)
    return ids_sorted, perm, torch.bincount(ids_sorted, minlength=num_experts)


def _combine(rows: torch.Tensor, perm: torch.Tensor, top_k_weights: torch.Tensor, num_tokens: int,
             k: int, dtype: torch.dtype) -> torch.Tensor:
    """Weight each sorted pair's expert output, put it back in (token, slot) order and sum the
    m slots of each token (deterministic: no atomics)."""
    rows = rows * top_k_weights.reshape(-1)[perm, None].to(rows.dtype)
    rows = torch.zeros_like(rows).index_copy(0, perm, rows)
    return rows.view(num_tokens, k, rows.shape[-1]).sum(dim=1).to(dtype)


class _ContiguousGrad(torch.autograd.Function):
    """Identity whose backward makes the incoming gradient contiguous: ``torch._grouped_mm``'s
    CPU backward refuses expanded (stride-0) gradients such as the one ``.sum()`` produces."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad.contiguous()


def grouped_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                            top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output with one ``torch._grouped_mm`` per projection over the sorted pairs.

    Signature of transformers' experts forward: ``self`` is an OLMoE-style experts module with
    ``gate_up_proj [N, 2I, H]``, ``down_proj [N, H, I]`` and ``act_fn``.
    """
    num_tokens, _ = hidden_states.shape
    k = top_k_index.shape[-1]
    _, perm, counts = _sort_pairs(top_k_index, self.num_experts)
    offsets = torch.cumsum(counts, 0).to(torch.int32)  # end row of each expert's group
    x = _ContiguousGrad.apply(hidden_states[perm // k])
    h = torch._grouped_mm(x, self.gate_up_proj.transpose(1, 2), offs=offsets)
    gate, up = h.chunk(2, dim=-1)
    h = _ContiguousGrad.apply(self.act_fn(gate) * up)
    h = torch._grouped_mm(h, self.down_proj.transpose(1, 2), offs=offsets)
    return _combine(h, perm, top_k_weights, num_tokens, k, hidden_states.dtype)


def padded_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """The experts' output with the pairs in a padded ``[N, C, H]`` block and two ``torch.bmm``."""
    num_tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    n_exp = self.num_experts
    ids_sorted, perm, counts = _sort_pairs(top_k_index, n_exp)
    cap = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    # row of each sorted pair inside its expert's block of the padded [N * C, H] buffer
    row = ids_sorted * cap + (torch.arange(ids_sorted.numel(), device=ids_sorted.device) - starts[ids_sorted])
    x = hidden_states.new_zeros(n_exp * cap, hidden).index_copy(0, row, hidden_states[perm // k])
    h = torch.bmm(x.view(n_exp, cap, hidden), self.gate_up_proj.transpose(1, 2))
    gate, up = h.chunk(2, dim=-1)
    h = torch.bmm(self.act_fn(gate) * up, self.down_proj.transpose(1, 2)).reshape(n_exp * cap, hidden)
    return _combine(h[row], perm, top_k_weights, num_tokens, k, hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, grouped_experts_forward)
ALL_EXPERTS_FUNCTIONS.register(PADDED_IMPLEMENTATION, padded_experts_forward)
