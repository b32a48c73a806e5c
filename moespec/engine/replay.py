"""A published model's expert shape with random weights, its routing replayed from a trace.

Paper 1's kernel timing depends on shapes, format and ids, not on weight values (Section 2). A
whole-model run at a published shape without the published weights therefore needs two things:
experts of that shape (random values, :meth:`moespec.kernels.ExpertWeights.random`) and the ids a
real run would select. :class:`ReplayRouting` supplies the ids: the router of every MoE layer is
replaced by a :class:`ReplayRouter` that returns, for the pass appended at cache position
``start``, the experts that position selected in one document of a :class:`RoutingTrace`
(recorded from the real model, e.g. by vLLM through :mod:`moespec.routing.engines`). The routing is
then a function of the position only, whatever tokens are fed, so a verify pass of drafts routes
as the accepted text did; the gate weights are uniform (1/m), which changes no time.

The skeleton around the experts is transformers' ``OlmoeForCausalLM`` at the published hidden size
(head size 128, or 64 when 128 does not divide H), published layer count (or fewer, ``layers``),
and a small vocabulary: its attention is not the published model's (no GQA/MLA, no shared experts,
no dense layers), and its greedy tokens mean nothing; the draft is the oracle draft
(:class:`moespec.engine.OracleDraft`: the target's greedy token kept with probability a).
"""

from __future__ import annotations

import numpy as np
import psutil
import torch
from torch import nn

from moespec.engine.switch import KernelExperts, Switch, moe_layers
from moespec.engine.target import Engine
from moespec.kernels import ExpertWeights
from moespec.model_shapes import MoESpec, get_spec


class ReplayRouting:
    """Shared state of the replaying routers: the trace, the document replayed and the position
    of the current pass (set by :meth:`on_pass`, an :class:`moespec.engine.Engine` pass listener)."""

    #: Leading tokens of a registered prompt that identify it (:meth:`prompt`).
    KEY_TOKENS = 16

    def __init__(self, trace, doc: int = 0):
        self.trace = trace
        self.start, self.n = 0, 0
        self.prompts: dict[tuple, int] = {}
        self.select(doc)

    def prompt(self, doc: int, length: int, vocab_size: int) -> np.ndarray:
        """Token ids of a prompt of ``length`` positions for trace document ``doc`` (seeded by
        ``doc``; the model's greedy text means nothing here). The prompt is registered: a
        prefill starting with its first :attr:`KEY_TOKENS` tokens replays document ``doc``."""
        if length > self.trace.doc_lengths[doc]:
            raise ValueError(f"trace document {doc} has {self.trace.doc_lengths[doc]} positions; a prompt of "
                             f"{length} does not fit")
        ids = np.random.default_rng([7, int(doc)]).integers(1, vocab_size, size=int(length))
        key = tuple(int(t) for t in ids[:self.KEY_TOKENS])
        if self.prompts.get(key, doc) != doc:
            raise ValueError(f"prompts of documents {self.prompts[key]} and {doc} start alike; use longer prompts")
        self.prompts[key] = int(doc)
        return ids

    def select(self, doc: int) -> None:
        """Replay document ``doc`` from now on."""
        if not 0 <= int(doc) < self.trace.num_docs:
            raise ValueError(f"doc {doc}: the trace has documents 0..{self.trace.num_docs - 1}")
        self.doc = int(doc)
        self.ids = torch.as_tensor(np.asarray(self.trace.docs[self.doc], dtype=np.int64))

    @property
    def length(self) -> int:
        """Positions the replayed document holds."""
        return int(self.ids.shape[0])

    def on_pass(self, start: int, ids: torch.Tensor) -> None:
        """Pass listener: a pass of ``ids`` appended at cache position ``start``. A pass at position
        0 that begins with a registered prompt (:meth:`prompt`) selects that prompt's document."""
        n = int(ids.numel())
        if start == 0:
            key = tuple(int(t) for t in ids[:self.KEY_TOKENS].tolist())
            if key in self.prompts and self.prompts[key] != self.doc:
                self.select(self.prompts[key])
        if start + n > self.length:
            raise ValueError(f"replayed routing: the pass covers positions {start}..{start + n - 1} but trace "
                             f"document {self.doc} ({self.trace.doc_ids[self.doc]!r}) has {self.length}; use a "
                             "longer document or fewer tokens")
        self.start, self.n = int(start), int(n)

    def layer_ids(self, layer: int, rows: int, device) -> torch.Tensor:
        """The ids of the current pass in MoE layer ``layer`` as ``[rows, m]`` (rows = batch x n)."""
        n = self.n
        if n < 1 or rows % n:
            raise RuntimeError(f"replayed routing: a pass of {rows} rows does not match the announced {n} tokens "
                               "(run the model through Engine, whose pass listener announces each pass)")
        ids = self.ids[self.start:self.start + n, layer]
        return ids.repeat(rows // n, 1).to(device)


class ReplayRouter(nn.Module):
    """Drop-in for a transformers top-k router (``forward(hidden) -> (logits, weights, ids)``)
    returning the replayed ids of its layer with uniform gate weights. It declares itself a router
    (``moespec_router``, :func:`moespec.routing.record.is_router`), so the recorder and the oracle's
    ``RouterTap`` find it; ``num_experts`` and ``top_k`` as a transformers router has them."""

    moespec_router = True

    def __init__(self, layer: int, routing: ReplayRouting, num_experts: int, top_k: int):
        super().__init__()
        self.layer, self.routing = int(layer), routing
        self.num_experts, self.top_k = int(num_experts), int(top_k)
        self.register_buffer("weight", torch.zeros(self.num_experts, 1), persistent=False)

    def forward(self, hidden_states: torch.Tensor):
        rows = hidden_states.reshape(-1, hidden_states.shape[-1]).shape[0]
        ids = self.routing.layer_ids(self.layer, rows, hidden_states.device)
        weights = torch.full(ids.shape, 1.0 / self.top_k, dtype=hidden_states.dtype, device=hidden_states.device)
        logits = torch.zeros(rows, self.num_experts, dtype=hidden_states.dtype, device=hidden_states.device)
        return logits, weights, ids


def check_trace(trace, spec: MoESpec, layers: int) -> None:
    """Refuse a trace that is not of ``spec``'s shape (N, m and its L MoE layers: routing is never
    replayed on another model's shape) or has fewer than the ``layers`` the replay builds."""
    if trace.num_experts != spec.num_experts or trace.top_k != spec.top_k:
        raise ValueError(f"trace {trace.label!r} routes N={trace.num_experts}, m={trace.top_k}; the model "
                         f"{spec.name} has N={spec.num_experts}, m={spec.top_k}")
    if trace.num_layers < layers:
        raise ValueError(f"trace {trace.label!r} has {trace.num_layers} MoE layers; the model runs {layers}")
    if trace.num_layers != spec.num_moe_layers:
        raise ValueError(f"trace {trace.label!r} has {trace.num_layers} MoE layers; the model {spec.name} has "
                         f"{spec.num_moe_layers}: a trace of another model (give like= the model it is of, e.g. its "
                         "config.json)")


def skeleton_bytes(spec: MoESpec, fmt: str, layers: int, vocab_size: int, packed_copy: bool) -> int:
    """Bytes the replay model holds: experts in ``fmt`` (twice on the CPU for int8, whose kernels
    keep a repacked copy) and the f32 attention, norms and embeddings."""
    experts = layers * spec.num_experts * spec.expert_bytes(fmt) * (2 if packed_copy else 1)
    H = spec.hidden_size
    return int(experts + 4 * (layers * (4 * H * H + 2 * H + H * spec.num_experts) + 2 * vocab_size * H))


def published_model(spec: MoESpec | str, trace, fmt: str = "int8_b32", layers: int | None = None,
                    vocab_size: int = 256, device: str = "cpu", seed: int = 0,
                    memory_limit: int | None = None):
    """(model, routing): an ``OlmoeForCausalLM`` skeleton at ``spec``'s expert shape with random
    experts in ``fmt`` already routed through the kernels (one :class:`Switch`), and the
    :class:`ReplayRouting` of ``trace`` that replaces its routers (module docstring).

    ``layers``: MoE layers to build (default the published count; fewer is a stated deviation).
    The context is the trace's longest document. ``memory_limit`` (bytes; default the memory
    available now) refuses a model that would not fit, naming the size. Pass the model to
    :class:`moespec.engine.Engine` and ``routing.on_pass`` to its ``pass_listeners``
    (:func:`replay_engine` does both)."""
    from transformers import OlmoeConfig, OlmoeForCausalLM


    spec = get_spec(spec) if isinstance(spec, str) else spec
    L = int(layers or spec.num_moe_layers)
    if not 1 <= L <= spec.num_moe_layers:
        raise ValueError(f"layers must lie in 1..{spec.num_moe_layers} for {spec.name}, got {layers}")
    check_trace(trace, spec, L)
    need = skeleton_bytes(spec, fmt, L, vocab_size, packed_copy=fmt == "int8_b32" and str(device) == "cpu")
    if memory_limit is None:

        memory_limit = psutil.virtual_memory().available if str(device) == "cpu" else \
            torch.cuda.mem_get_info(torch.device(device))[0]
    if need > memory_limit:
        raise MemoryError(f"{spec.name} at {L} MoE layers in {fmt} needs about {need / 2**30:.1f} GiB; "
                          f"{memory_limit / 2**30:.1f} GiB are available on {device} (pass layers= to build fewer)")
    H = spec.hidden_size
    head = 128 if H % 128 == 0 else 64
    if H % head:
        raise ValueError(f"{spec.name}: hidden size {H} is not a multiple of 64; no attention head size fits")
    context = int(max(trace.doc_lengths))
    torch.manual_seed(seed)
    cfg = OlmoeConfig(vocab_size=vocab_size, hidden_size=H, intermediate_size=1, num_hidden_layers=L,
                      num_attention_heads=H // head, num_key_value_heads=H // head,
                      max_position_embeddings=context, num_experts=spec.num_experts,
                      num_experts_per_tok=spec.top_k, pad_token_id=0, bos_token_id=0, eos_token_id=0,
                      output_router_logits=False)
    model = OlmoeForCausalLM(cfg).to(device).eval()
    cfg.intermediate_size = spec.expert_intermediate  # the experts below, not the placeholder built above
    routing = ReplayRouting(trace)
    switch = Switch()
    for idx, layer in enumerate(moe_layers(model)):
        w = ExpertWeights.random(spec, fmt, seed=seed * 1000 + idx, device=device)
        layer.mlp.experts = KernelExperts.from_weights(w, switch, idx)
        layer.mlp.gate = ReplayRouter(idx, routing, spec.num_experts, spec.top_k).to(device)
    return model, routing


def replay_engine(model, routing: ReplayRouting, backend: str = "auto"):
    """An :class:`moespec.engine.Engine` on a :func:`published_model`, announcing every pass to
    the replaying routers."""

    engine = Engine(model, backend=backend)
    engine.pass_listeners.append(routing.on_pass)
    return engine
