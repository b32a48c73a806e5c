"""The engine's own expert operation timed alone by :mod:`moespec.measure.expert_op` (paper 1,
Section 2): the per-layer operation times of the measured-time version and the passes the fits
(4)/(E.1) are made on, with the model's real expert weights and its recorded routing."""

from __future__ import annotations

import dataclasses

import numpy as np

from moespec.corpus import segments
from moespec.engine.switch import KernelExperts, moe_layers
from moespec.measure.expert_op import BenchConfig, run
from moespec.model_shapes import MoESpec, register
from moespec.model_shapes import spec_from_config
from moespec.routing import RoutingTrace


def engine_spec(engine, name: str) -> MoESpec:
    """Register (under ``name``) and return the MoESpec of the engine's model as its kernels run
    it: N, H, I and the format from the installed expert weights (so Qwen3-MoE's and DeepSeek-V2's
    ``moe_intermediate_size``, not their dense ``intermediate_size``, and a widened expert's own
    shape), m and the layer counts from the config; DeepSeek's shared experts and dense FFN size
    from :func:`moespec.model_shapes.spec_from_config` when the config names them."""
    cfg = engine.model.config
    w = layer_weights(engine)[0]
    n_exp, hidden, inter = w.shape
    shared, shared_i, dense_i = 0, 0, 0
    if getattr(cfg, "n_shared_experts", None):

        full = spec_from_config(cfg.to_dict())
        shared, shared_i = full.num_shared_experts, full.shared_intermediate
        dense_i = int(getattr(cfg, "intermediate_size", 0) or 0)
    spec = MoESpec(name=name, paper_label=f"{name} (engine model)", num_experts=n_exp,
                   top_k=cfg.num_experts_per_tok, num_layers=cfg.num_hidden_layers,
                   num_moe_layers=engine.num_layers, hidden_size=hidden, expert_intermediate=inter,
                   num_shared_experts=shared, shared_intermediate=shared_i, dense_intermediate=dense_i,
                   default_format=w.fmt, source="moespec.engine.operation.engine_spec (installed expert weights)")
    register(name, lambda: spec)
    return spec


def layer_weights(engine) -> dict:
    """Layer index -> the :class:`moespec.kernels.ExpertWeights` the engine runs."""
    out = {}
    for i, layer in enumerate(moe_layers(engine.model)):
        if not isinstance(layer.mlp.experts, KernelExperts):
            raise ValueError("the engine's experts are not routed through moespec.kernels (install first)")
        out[i] = layer.mlp.experts.weights
    return out


def record_trace(engine, docs: list, context: int, source: str, bytes_of=None):
    """Routing of ``docs`` (token arrays) recorded by teacher forcing through the engine, each
    document in consecutive segments of at most ``context`` tokens (each segment its own
    document, as :func:`moespec.corpus.segments`); returns a RoutingTrace whose expert bytes are
    ``bytes_of``'s (an engine; default ``engine``'s own)."""

    out = []
    for doc in docs:
        for seg in segments(np.asarray(doc), context):
            if len(seg) < 2:
                continue
            engine.reset()
            out.append(engine.record_routing(seg))
    weights = layer_weights(bytes_of if bytes_of is not None else engine)
    b = [w.bytes_per_expert for w in weights.values()]
    return RoutingTrace(out, num_experts=weights[0].num_experts, expert_bytes=b, source=source)


def record_trace_on_twin(engine, twin, docs: list, context: int, source: str):
    """:func:`record_trace` of ``engine``'s routing, run on its narrow ``twin``
    (:func:`moespec.engine.subject.routing_twin`) when the first segment's routing is the same on
    both, expert for expert, else on ``engine`` itself; the trace carries ``engine``'s expert bytes.
    Returns (trace, what ran it: ``"twin"``, ``"engine"`` (the twin disagreed) or ``None`` (no twin))."""

    if twin is None:
        return record_trace(engine, docs, context, source), None
    first = next((seg for doc in docs for seg in segments(np.asarray(doc), context) if len(seg) >= 2), None)
    if first is None:
        raise ValueError("no document segment of at least 2 tokens to record")
    engine.reset()
    twin.reset()
    same = np.array_equal(engine.record_routing(first), twin.record_routing(first))
    return record_trace(twin if same else engine, docs, context, source, bytes_of=engine), ("twin" if same else "engine")


def bench_engine(engine, name: str, trace, out_dir=None, progress: bool = True, **config):
    """Run :func:`moespec.measure.expert_op.run` on the engine's layers with their real weights and
    the windows of ``trace``; ``config`` overrides :class:`BenchConfig` fields; ``out_dir``: the
    benchmark's folder (default ``paths.expert_op_dir()``, the run's). Returns the run folder."""

    engine_spec(engine, name)
    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    if unknown := set(config) - fields:
        raise ValueError(f"unknown BenchConfig field(s) {sorted(unknown)}")
    config.setdefault("layers", tuple(range(engine.num_layers)))
    config.setdefault("device", str(layer_weights(engine)[0].device))
    cfg = BenchConfig(model=name, fmt=layer_weights(engine)[0].fmt, **config)
    return run(cfg, out_dir=out_dir, weights=layer_weights(engine), trace=trace, progress=progress)
