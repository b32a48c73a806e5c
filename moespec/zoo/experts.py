"""Expert operation for training: tokens grouped by expert, one batched matmul per projection.

The reference OLMoE block loops over experts in Python; for training on CPU we sort the n*m
(token, slot) pairs by expert, scatter them into a padded ``[N, C, H]`` block (C = largest
expert load in the batch), and run the gate/up and down projections as two ``torch.bmm`` calls.
It is registered in transformers' experts interface under :data:`IMPLEMENTATION`, so
``model.config._experts_implementation = IMPLEMENTATION`` switches an OLMoE-family model to it
without touching the model class. Same mathematics as the reference loop (tests check equality).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

IMPLEMENTATION = "moespec_sorted"


def sorted_experts_forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                           top_k_weights: torch.Tensor) -> torch.Tensor:
    """out[t] = sum_j w[t, j] * E_{id[t, j]}(x[t]) with SwiGLU experts, grouped by expert.

    Signature of transformers' experts forward: ``self`` is an OLMoE-style experts module with
    ``gate_up_proj [N, 2I, H]``, ``down_proj [N, H, I]`` and ``act_fn``.
    """
    num_tokens, hidden = hidden_states.shape
    k = top_k_index.shape[-1]
    n_exp = self.num_experts
    ids = top_k_index.reshape(-1)
    ids_sorted, perm = torch.sort(ids, stable=True)
    counts = torch.bincount(ids_sorted, minlength=n_exp)
    cap = int(counts.max())
    starts = torch.cumsum(counts, 0) - counts
    # row of each sorted pair inside its expert's block of the padded [N * C, H] buffer
    row = ids_sorted * cap + (torch.arange(ids.numel(), device=ids.device) - starts[ids_sorted])
    x = hidden_states.new_zeros(n_exp * cap, hidden).index_copy(0, row, hidden_states[perm // k])
    h = torch.bmm(x.view(n_exp, cap, hidden), self.gate_up_proj.transpose(1, 2))
    gate, up = h.chunk(2, dim=-1)
    h = torch.bmm(self.act_fn(gate) * up, self.down_proj.transpose(1, 2)).reshape(n_exp * cap, hidden)
    out = h[row] * top_k_weights.reshape(-1)[perm, None].to(h.dtype)
    # back to (token, slot) order, then sum the m slots of each token (deterministic, no atomics)
    out = torch.zeros_like(out).index_copy(0, perm, out)
    return out.view(num_tokens, k, hidden).sum(dim=1).to(hidden_states.dtype)


ALL_EXPERTS_FUNCTIONS.register(IMPLEMENTATION, sorted_experts_forward)
