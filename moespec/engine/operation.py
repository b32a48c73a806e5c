"""The engine's own expert operation timed alone by :mod:`moespec.bench.expert_op` (paper 1,
Section 2): the per-layer operation times of the measured-time version and the passes the fits
(4)/(E.1) are made on, with the model's real expert weights and its recorded routing."""

from __future__ import annotations

import dataclasses

import numpy as np

from moespec.engine.switch import KernelExperts, moe_layers
from moespec.models import MoESpec, register


def engine_spec(engine, name: str) -> MoESpec:
    """Register (under ``name``) and return the MoESpec of the engine's model (f32 experts)."""
    cfg = engine.model.config
    spec = MoESpec(name=name, paper_label=f"{name} (engine model)", num_experts=cfg.num_experts,
                   top_k=cfg.num_experts_per_tok, num_layers=cfg.num_hidden_layers,
                   num_moe_layers=engine.num_layers, hidden_size=cfg.hidden_size,
                   expert_intermediate=cfg.intermediate_size, default_format="f32",
                   source="moespec.engine.operation.engine_spec")
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


def record_trace(engine, docs: list, context: int, source: str):
    """Routing of ``docs`` (token arrays) recorded by teacher forcing through the engine, each
    document in consecutive segments of at most ``context`` tokens (each segment its own
    document, as :func:`moespec.corpus.segments`); returns a RoutingTrace."""
    from moespec.corpus import segments
    from moespec.routing import RoutingTrace

    out = []
    for doc in docs:
        for seg in segments(np.asarray(doc), context):
            if len(seg) < 2:
                continue
            engine.reset()
            out.append(engine.record_routing(seg))
    cfg = engine.model.config
    b = [w.bytes_per_expert for w in layer_weights(engine).values()]
    return RoutingTrace(out, num_experts=cfg.num_experts, expert_bytes=b, source=source)


def bench_engine(engine, name: str, trace, out_dir=None, progress: bool = True, **config):
    """Run :func:`moespec.bench.expert_op.run` on the engine's layers with their real weights and
    the windows of ``trace``; ``config`` overrides :class:`BenchConfig` fields; ``out_dir``: the
    benchmark's folder (default ``paths.expert_op_dir()``, the run's). Returns the run folder."""
    from moespec.bench.expert_op import BenchConfig, run

    engine_spec(engine, name)
    fields = {f.name for f in dataclasses.fields(BenchConfig)}
    if unknown := set(config) - fields:
        raise ValueError(f"unknown BenchConfig field(s) {sorted(unknown)}")
    config.setdefault("layers", tuple(range(engine.num_layers)))
    cfg = BenchConfig(model=name, fmt="f32", **config)
    return run(cfg, out_dir=out_dir, weights=layer_weights(engine), trace=trace, progress=progress)
