"""Record the experts a model selects on documents, through hooks on its routers.

Paper 1 (Section 2, App. D.2) records, for every token t of a document and every MoE layer l,
the set S_{l,t} of m experts the router selects. :func:`record` does this for the
``transformers`` MoE families (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2, gpt-oss; in transformers
5.x every one has a router module whose forward returns ``(router_logits, top-k weights, top-k
ids)``, and a forward hook reads the ids) and, given an ``observer``, for a dense model
(:mod:`moespec.routing.neurons`: the neuron-cluster routing of SmolLM2).

Dense FFN layers (DeepSeek-V2's first layer, Qwen3-MoE's ``mlp_only_layers``) and shared experts
are not routed slots: the trace holds the MoE layers only, and its ``meta`` lists the decoder
index of each traced layer, the dense layers and the number of shared experts.

Long documents are fed in chunks of ``chunk_size`` tokens with the KV cache, which gives the same
ids as one full pass (tested), and bounds activation memory. A document longer than the model's
context is an error (cut it explicitly with :func:`moespec.corpus.segments`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from moespec.progress import tqdm

from moespec.routing.trace import RoutingTrace

if TYPE_CHECKING:  # torch is imported where a model is recorded: the routing statistics stay numpy-only
    import torch

#: model_type -> class name of the router module whose output[2] holds the top-k expert ids.
ROUTER_CLASSES: dict[str, str] = {
    "olmoe": "OlmoeTopKRouter",
    "qwen3_moe": "Qwen3MoeTopKRouter",
    "mixtral": "MixtralTopKRouter",
    "deepseek_v2": "DeepseekV2TopkRouter",
    "gpt_oss": "GptOssTopKRouter",
}


def decoder_layers(model) -> list[torch.nn.Module]:
    """The decoder layers of a transformers causal LM (``model.model.layers``)."""
    base = getattr(model, "model", model)
    layers = getattr(base, "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__}: no decoder layers found at model.model.layers")
    return list(layers)


def is_router(module, cls: str) -> bool:
    """Whether ``module`` is a router: of the family's router class ``cls`` (:data:`ROUTER_CLASSES`),
    or a stand-in that declares itself one with ``moespec_router = True`` (such as
    :class:`moespec.engine.replay.ReplayRouter`), with the same ``forward -> (logits, weights, ids)``."""
    return type(module).__name__ == cls or getattr(module, "moespec_router", False) is True


def find_routers(model) -> tuple[list[int], list[torch.nn.Module]]:
    """(decoder index, router module) of every MoE layer, in layer order: in each decoder layer the
    one module for which :func:`is_router` holds. moespec's one rule for finding routers (the
    recorder here, the oracle's :class:`moespec.oracle.hf.RouterTap`).

    Raises ValueError for a model family that moespec has no router hook for.
    """
    mtype = getattr(model.config, "model_type", None)
    if mtype not in ROUTER_CLASSES:
        raise ValueError(
            f"{type(model).__name__} (model_type {mtype!r}) has no router hook in moespec; known MoE "
            f"families: {sorted(ROUTER_CLASSES)}. For a dense model pass observer=... "
            f"(moespec.routing.neurons.fit_neuron_clusters) to record neuron-cluster routing.")
    cls = ROUTER_CLASSES[mtype]
    idx, routers = [], []
    for i, layer in enumerate(decoder_layers(model)):
        found = [m for m in layer.modules() if is_router(m, cls)]
        if len(found) > 1:
            raise ValueError(f"decoder layer {i} holds {len(found)} {cls} modules, expected at most one")
        if found:
            idx.append(i)
            routers.append(found[0])
    if not routers:
        raise ValueError(f"{type(model).__name__}: no {cls} module in any decoder layer")
    return idx, routers


def _family_meta(model, moe_layers: list[int]) -> dict:
    cfg = model.config
    n_layers = len(decoder_layers(model))
    shared = int(getattr(cfg, "n_shared_experts", 0) or 0)
    return {"family": cfg.model_type, "layer_indices": moe_layers,
            "dense_layers": [i for i in range(n_layers) if i not in moe_layers],
            "num_shared_experts": shared}


def _expert_bytes(routers: Sequence[torch.nn.Module], model, moe_layers: list[int], num_experts: int):
    """w_l = bytes of one routed expert's tensors (all expert parameters / N, in their dtype)."""
    layers = decoder_layers(model)
    out = []
    for i in moe_layers:
        experts = [m for m in layers[i].modules() if type(m).__name__.endswith("Experts")]
        if len(experts) != 1:
            return None
        total = sum(p.numel() * p.element_size() for p in experts[0].parameters())
        out.append(total / num_experts)
    return out


class _RouterHooks:
    """Forward hooks that collect each router's top-k ids, one array per call."""

    def __init__(self, routers: Sequence[torch.nn.Module]):
        self.calls: list[list[torch.Tensor]] = [[] for _ in routers]
        self.handles = [r.register_forward_hook(self._hook(i)) for i, r in enumerate(routers)]

    def _hook(self, i):
        def fn(module, args, output):
            self.calls[i].append(output[2].detach().reshape(-1, output[2].shape[-1]).cpu())
        return fn

    def remove(self):
        for h in self.handles:
            h.remove()


def context_length(model) -> int | None:
    return getattr(model.config, "max_position_embeddings", None)


def _as_ids(doc: Any, index: int, vocab: int | None) -> "torch.Tensor":
    import torch

    arr = np.asarray(doc.cpu() if isinstance(doc, torch.Tensor) else doc)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"document {index}: expected a non-empty 1-D array of token ids, found shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"document {index}: token ids must be integers, found dtype {arr.dtype}")
    if arr.min() < 0 or (vocab is not None and arr.max() >= vocab):
        raise ValueError(f"document {index}: token ids must lie in [0, {vocab}), found "
                         f"min {int(arr.min())}, max {int(arr.max())}")
    return torch.as_tensor(arr, dtype=torch.long)


def record(model, documents: Sequence[Any], *, chunk_size: int | None = None,
           doc_ids: Sequence[str] | None = None, source: str | None = None,
           model_name: str | None = None, observer=None, expert_bytes=None,
           meta: dict | None = None, device: str | None = None, progress: bool = True) -> RoutingTrace:
    """Run ``model`` over each document (teacher forcing, batch 1) and return its routing.

    Args:
        model: a transformers causal LM of a family in :data:`ROUTER_CLASSES`, or any Llama-style
            dense model together with ``observer``.
        documents: token-id sequences (1-D int arrays or tensors), each at most the model's
            context (``config.max_position_embeddings``) long.
        chunk_size: feed each document in pieces of this many tokens, carrying the KV cache
            (default: the whole document at once).
        doc_ids, source, model_name, meta: stored in the trace (``source`` is its plot label).
        observer: a :class:`moespec.routing.neurons.NeuronClusters`, for dense models.
        expert_bytes: w_l per traced layer; default, bytes of one expert's parameters in the
            model's dtype (None, i.e. 1 per layer, for observers).
    Returns:
        RoutingTrace with documents ``[T, L, m]`` (L = MoE layers) of expert ids.
    """
    # torch and transformers are imported here, not with moespec.routing (statistics need neither)
    import torch
    from transformers import DynamicCache

    if len(documents) == 0:
        raise ValueError("record: no documents given")
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, found {chunk_size}")
    device = device or next(model.parameters()).device
    ctx = context_length(model)
    vocab = getattr(model.config, "vocab_size", None)
    docs = [_as_ids(d, i, vocab) for i, d in enumerate(documents)]
    for i, d in enumerate(docs):
        if ctx is not None and len(d) > ctx:
            raise ValueError(f"document {i} has {len(d)} tokens, longer than the model's context of "
                             f"{ctx} (config.max_position_embeddings); cut it into pieces with "
                             f"moespec.corpus.segments(ids, {ctx}) and record each piece")
    if observer is not None:
        hooks = observer.attach(model)
        num_experts, info = observer.num_groups, observer.meta()
    else:
        layer_idx, routers = find_routers(model)
        hooks = _RouterHooks(routers)
        num_experts = int(routers[0].num_experts)  # every family's router stores N
        info = _family_meta(model, layer_idx)
        if expert_bytes is None:
            expert_bytes = _expert_bytes(routers, model, layer_idx, num_experts)
    # transformers >= 5.2x names the KV-cache argument ``cache``; earlier ``past_key_values``
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    was_training = model.training
    model.eval()
    out_docs = []
    grad = torch.is_grad_enabled()
    torch.set_grad_enabled(False)
    try:
        what = str(model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type)
        for d in tqdm(docs, desc=f"recording the routing of {what.rstrip('/').split('/')[-1]} (documents)",
                      disable=not progress, mininterval=5):
            step = chunk_size or len(d)
            cache = DynamicCache(config=model.config)  # filled in place by each chunk's forward
            for c in hooks.calls:
                c.clear()
            for start in range(0, len(d), step):
                piece = d[start:start + step][None].to(device)
                model(input_ids=piece, use_cache=True, **{cache_arg: cache})
            per_layer = []
            for li, calls in enumerate(hooks.calls):
                ids = torch.cat(calls, dim=0) if calls else torch.empty(0)
                if ids.shape[0] != len(d):
                    raise RuntimeError(f"layer {li}: hooks saw {ids.shape[0]} tokens, expected {len(d)} "
                                       f"(router called more or fewer times than once per chunk)")
                per_layer.append(ids.numpy())
            out_docs.append(np.stack(per_layer, axis=1))
    finally:
        hooks.remove()
        model.train(was_training)
        torch.set_grad_enabled(grad)
    name = model_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
    return RoutingTrace(out_docs, num_experts, expert_bytes, doc_ids, model=name, source=source,
                        meta={**info, "chunk_size": chunk_size, **(meta or {})})
