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

from moespec.kernels import ExpertWeights, expert_forward

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

    def __init__(self, experts: nn.Module, switch: Switch, layer: int, fmt: str | None = None):
        super().__init__()

        check_expert_layout(experts, layer)
        gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
        inter = gate_up.shape[1] // 2
        if fmt is None:  # the checkpoint's own precision where a kernel format has it, else f32
            fmt = {torch.bfloat16: "bf16"}.get(gate_up.dtype, "f32")
        # OlmoeExperts computes linear(x, gate_up).chunk(2): the first I rows are the gate.
        self.weights = ExpertWeights.from_tensors(gate_up[:, :inter].contiguous(),
                                                  gate_up[:, inter:].contiguous(), down.contiguous(), fmt=fmt)
        self.switch = switch
        self.layer = layer

    @classmethod
    def from_weights(cls, weights, switch: Switch, layer: int) -> "KernelExperts":
        """A layer's experts given directly as :class:`moespec.kernels.ExpertWeights` (e.g. widened
        or random weights at a published shape), with no transformers module behind them."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.weights, self.switch, self.layer = weights, switch, int(layer)
        return self

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor,
                top_k_weights: torch.Tensor) -> torch.Tensor:

        n, hidden = hidden_states.shape
        if self.switch.record is not None:
            self.switch.record.append((self.layer, top_k_index.detach().cpu().numpy().copy()))
        x = hidden_states
        if self.weights.hidden_size > hidden:  # experts embedded in a larger shape (moespec.engine.widen)
            x = torch.nn.functional.pad(x, (0, self.weights.hidden_size - hidden))
        out = expert_forward(x, top_k_index, self.weights, gates=top_k_weights,
                             kernel=self.switch.kernel_for(n), backend=self.switch.backend)
        if self.weights.hidden_size > hidden:
            out = out[:, :hidden]
        return out.to(hidden_states.dtype)


def check_expert_layout(experts: nn.Module, layer: int = 0) -> None:
    """Refuse, naming the problem, an experts module whose layout the kernels do not compute:
    they take transformers' OLMoE / Qwen-MoE / Mixtral / DeepSeek layout (``gate_up_proj
    [N, 2I, H]`` with the gate first, ``down_proj [N, H, I]``, no biases, ``silu(gate) * up``)."""
    name = type(experts).__name__
    if hasattr(experts, "gate_up_proj_bias") or hasattr(experts, "down_proj_bias"):
        raise ValueError(f"layer {layer}: {name} has gate/up and down biases, interleaved gate/up columns "
                         "(gate_up_proj [N, H, 2I], gate = [..., ::2]) and a clamped SwiGLU (gpt-oss); "
                         "moespec's kernels compute silu(gate) * up without biases, so this expert layout is not "
                         "supported by the switch (run the model with Engine(install_kernels=False), its own experts)")
    if not (hasattr(experts, "gate_up_proj") and hasattr(experts, "down_proj")):
        raise ValueError(f"layer {layer}: {name} has no gate_up_proj / down_proj tensors (transformers 5 fused "
                         "expert layout); the switch cannot read its weights")
    gate_up, down = experts.gate_up_proj, experts.down_proj
    if gate_up.dim() != 3 or gate_up.shape[1] % 2 or tuple(down.shape) != (gate_up.shape[0], gate_up.shape[2],
                                                                           gate_up.shape[1] // 2):
        raise ValueError(f"layer {layer}: {name}: expected gate_up_proj [N, 2I, H] and down_proj [N, H, I]; "
                         f"found {tuple(gate_up.shape)} and {tuple(down.shape)}")


def moe_layers(model: nn.Module) -> list[nn.Module]:
    """The decoder layers whose ``mlp`` has ``experts`` (the MoE layers), in order."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers; expected an OlmoeForCausalLM-like model")
    found = [layer for layer in layers if hasattr(getattr(layer, "mlp", None), "experts")]
    if not found:
        raise ValueError(f"{type(model).__name__} has no MoE layers (no layer.mlp.experts)")
    return found


def install(model: nn.Module, backend: str = "auto", slot_max: int = SLOT_MAX, fmt: str | None = None,
            transform=None) -> Switch:
    """Replace every MoE layer's experts module by a :class:`KernelExperts` sharing one
    :class:`Switch`; return the switch (``switch.dedup = True`` turns deduplication on).

    ``fmt``: the kernels' storage format (``f32``, ``bf16``, ``int8_b32``; default: bf16 for a bf16
    checkpoint, else f32). ``transform(weights, layer) -> weights`` may replace each layer's
    :class:`moespec.kernels.ExpertWeights` once converted (the widening of
    :mod:`moespec.engine.widen`). Installing twice returns the existing switch (the weights are
    converted once; ``fmt`` and ``transform`` then must be left out).
    """
    layers = moe_layers(model)
    first = layers[0].mlp.experts
    if isinstance(first, KernelExperts):
        if fmt is not None or transform is not None:
            raise ValueError("the kernels are already installed on this model; fmt and transform apply at the first install")
        first.switch.backend = backend
        return first.switch
    for idx, layer in enumerate(layers):  # refuse before converting anything
        check_expert_layout(layer.mlp.experts, idx)
    switch = Switch(backend=backend, slot_max=slot_max)
    for idx, layer in enumerate(layers):
        experts = KernelExperts(layer.mlp.experts, switch, idx, fmt=fmt)
        if transform is not None:
            experts.weights = transform(experts.weights, idx)
        layer.mlp.experts = experts
    return switch
