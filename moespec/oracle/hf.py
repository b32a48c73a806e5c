"""Small helpers on top of ``transformers`` models that the oracle needs and the engine does not expose:
reading the router's choices of every forward pass, and cutting a prefix out of a KV cache.

``RouterTap`` hooks each MoE layer's router (found by :func:`moespec.routing.record.find_routers`,
the rule the recorder uses: a module whose forward returns ``(router_logits, scores, top_k_index)``,
as ``OlmoeTopKRouter`` in transformers 5.x) and keeps the selected expert ids of the last pass; the
hook only stores a reference, so it adds almost nothing to a timed pass.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import DynamicCache

from moespec.routing.record import find_routers


class RouterTap:
    """Context manager recording the top-k expert ids chosen by every router in each forward pass."""

    def __init__(self, model):
        self.routers = find_routers(model)[1]
        self.num_experts = int(getattr(self.routers[0], "num_experts", None) or self.routers[0].weight.shape[0])
        self.top_k = int(self.routers[0].top_k)
        self._calls: list[torch.Tensor] = []
        self._handles = []

    def __enter__(self):
        for r in self.routers:
            self._handles.append(r.register_forward_hook(self._hook))
        return self

    def __exit__(self, *exc):
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def _hook(self, module, inputs, output):
        self._calls.append(output[2])

    def clear(self) -> None:
        self._calls.clear()

    def passes(self, batch: int = 1) -> list[np.ndarray]:
        """Every recorded pass, oldest first, each ``[batch, T, layers, topk]``; clears the record."""
        n = len(self.routers)
        if len(self._calls) % n:
            raise RuntimeError(f"router tap holds {len(self._calls)} layer calls, not a multiple of {n}")
        out = [torch.stack([c.reshape(batch, -1, self.top_k) for c in self._calls[j:j + n]], dim=2)
               .cpu().numpy().astype(np.int64) for j in range(0, len(self._calls), n)]
        self._calls.clear()
        return out

    def take(self, batch: int = 1) -> np.ndarray:
        """Ids of the last forward pass as ``[batch, T, layers, topk]``; clears the record."""
        n = len(self.routers)
        if len(self._calls) < n:
            raise RuntimeError(f"router tap holds {len(self._calls)} layer calls; a pass has {n}")
        last = self._calls[-n:]
        self._calls.clear()
        ids = torch.stack([c.reshape(batch, -1, self.top_k) for c in last], dim=2)
        return ids.cpu().numpy().astype(np.int64)


def cache_prefix(cache, length: int, batch: int, config):
    """A new ``DynamicCache`` holding the first ``length`` positions of ``cache`` repeated ``batch`` times."""
    data = [(layer.keys[:, :, :length].expand(batch, -1, -1, -1),
             layer.values[:, :, :length].expand(batch, -1, -1, -1)) for layer in cache.layers]
    return DynamicCache(data, config=config)


@torch.inference_mode()
def full_cache(model, ids):
    """Run ``model`` once over ``ids`` (1-D) with a fresh cache; return (logits [T, V], cache)."""
    cache = DynamicCache(config=model.config)
    device = model.get_input_embeddings().weight.device
    out = model(input_ids=torch.as_tensor(np.asarray(ids, dtype=np.int64), device=device).view(1, -1),
                cache=cache, use_cache=True)
    return out.logits[0], cache
