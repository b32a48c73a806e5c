"""The engine's one switch: which expert kernel runs a pass of n tokens (paper 1, Section 4 and
Appendix E, Table 6).

Each MoE layer's ``experts`` module of a ``transformers`` ``OlmoeForCausalLM`` (in transformers 5.x
an ``OlmoeExperts`` holding ``gate_up_proj [N, 2I, H]`` and ``down_proj [N, H, I]``, called as
``experts(hidden [n, H], top_k_index [n, m], top_k_weights [n, m])``) is replaced by
:class:`KernelExperts`, which makes one call of :func:`moespec.kernels.expert_forward` per layer.

Dispatch, as the paper's engines (Table 6):

* n = 1: the per-slot kernel with deduplication off and on;
* 2 <= n <= ``slot_max`` (9): the per-slot kernel with deduplication off, the deduplicating kernel
  with it on;
* n > ``slot_max`` (prefill): the deduplicating (grouped) kernel either way, as the engines' tiled
  kernels above their per-slot caps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

#: Largest pass the per-slot kernel runs with deduplication off (the paper's engines: n <= 9).
SLOT_MAX = 9


@dataclass
class Switch:
    """Shared state of every :class:`KernelExperts` of one model: the dedup switch, the backend,
    and an optional routing record (one ``[n, m]`` id array per layer call)."""

    dedup: bool = False
    backend: str = "auto"
    slot_max: int = SLOT_MAX
    record: list | None = field(default=None, repr=False)

    def kernel_for(self, n: int) -> str:
        """The kernel a pass of ``n`` tokens runs under this setting (module docstring)."""
        if n < 1:
            raise ValueError(f"a pass needs at least one token, got n={n}")
        if n == 1:
            return "slot"
        if n <= self.slot_max:
            return "dedup" if self.dedup else "slot"
        return "dedup"


class KernelExperts(nn.Module):
    """Drop-in for ``OlmoeExperts``: the layer's experts as :class:`moespec.kernels.ExpertWeights`,
    run by one :func:`moespec.kernels.expert_forward` call per forward."""

    def __init__(self, experts: nn.Module, switch: Switch, layer: int):
        super().__init__()
        from moespec.kernels import ExpertWeights

        gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        n_exp, two_i, hidden = gate_up.shape
        if two_i % 2 or tuple(down.shape) != (n_exp, hidden, two_i // 2):
            raise ValueError(f"layer {layer}: expected gate_up_proj [N, 2I, H] and down_proj [N, H, I]; "
                             f"found {tuple(gate_up.shape)} and {tuple(down.shape)}")
        inter = two_i // 2
        # OlmoeExperts computes linear(x, gate_up).chunk(2): the first I rows are the gate.
        self.weights = ExpertWeights.from_tensors(gate_up[:, :inter].contiguous(),
                                                  gate_up[:, inter:].contiguous(), down.contiguous())
        self.switch = switch
        self.layer = layer

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:
        from moespec.kernels import expert_forward

        n = hidden_states.shape[0]
        if self.switch.record is not None:
            self.switch.record.append((self.layer, top_k_index.detach().cpu().numpy().copy()))
        out = expert_forward(hidden_states, top_k_index, self.weights, gates=top_k_weights,
                             kernel=self.switch.kernel_for(n), backend=self.switch.backend)
        return out.to(hidden_states.dtype)


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers whose ``mlp`` has ``experts`` (the MoE layers), in order."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers; expected an OlmoeForCausalLM-like model")
    found = [layer for layer in layers if hasattr(getattr(layer, "mlp", None), "experts")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no MoE layers (no layer.mlp.experts)")
    return found


def install(model: nn.Module, backend: str = "auto", slot_max: int = SLOT_MAX) -> Switch:
    """Replace every MoE layer's experts module by a :class:`KernelExperts` sharing one
    :class:`Switch`; return the switch (``switch.dedup = True`` turns deduplication on).

    Installing twice returns the existing switch (the weights are converted once).
    """
    layers = moe_layers(model)
    first = layers[0].mlp.experts
    if isinstance(first, KernelExperts):
        first.switch.backend = backend
        return first.switch
    switch = Switch(backend=backend, slot_max=slot_max)
    for idx, layer in enumerate(layers):
        layer.mlp.experts = KernelExperts(layer.mlp.experts, switch, idx)
    return switch
