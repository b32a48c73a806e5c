"""Where a decode step's bytes go, per component: the subject's (counted from its modules) beside
a published model's at the same number of layers (computed from its config), paper 1's D + kv(n - 1)
split into its parts.

Components of one decode step (one token, KV cache of ``depth`` positions):

* ``attention``: the four projections of every layer (q, k, v, o);
* ``experts``: the m routed experts every layer reads for the token (paper 1's U x b at n = 1);
* ``lm_head``: the LM head, once per step;
* ``kv_cache``: the keys and values of ``depth`` cached positions, every layer (bf16 in the published
  model, as its engines keep them; the subject's own element size);
* ``other``: routers, norms and the token's embedding row.

The published model's step at ``layers`` layers takes its per-layer bytes as they are and its LM
head scaled by ``layers / L_pub`` (:func:`moespec.engine.widen.published_head_rows`), so the shares
are the published model's own whatever the number of layers.
"""

from __future__ import annotations

import pandas as pd
from torch import nn

from moespec.engine.operation import layer_weights
from moespec.engine.widen import ATTENTION_PROJECTIONS, PaddedLinear, attention_modules, published_head_rows
from moespec.model_shapes import MoESpec, format_bytes, get_spec
from moespec.routing.record import find_routers

COMPONENTS = ("attention", "experts", "lm_head", "kv_cache", "other")
#: Bytes per value of the published model's KV cache (bf16, as its engines keep it) and of the
#: float parameters counted in ``other`` (float32, as the subject keeps routers and norms).
KV_BYTES, FLOAT_BYTES = 2, 4


def _linear_bytes(module: nn.Module) -> int:
    if isinstance(module, PaddedLinear):
        return module.nbytes
    w = module.weight
    return w.numel() * w.element_size()


def subject_step_bytes(engine, depth: int = 0) -> dict[str, int]:
    """Bytes of one decode step of the subject's target (an :class:`moespec.engine.Engine`) per
    component (module docstring), counted from its modules: padded projections and head at their
    padded size in their format, experts at the kernels' bytes per expert."""
    model = engine.model
    cfg = model.config
    attns = attention_modules(model)
    attention = sum(_linear_bytes(getattr(a, p)) for a in attns for p in ATTENTION_PROJECTIONS)
    m = int(cfg.num_experts_per_tok)
    experts = sum(m * w.bytes_per_expert for w in layer_weights(engine).values())
    head = _linear_bytes(model.get_output_embeddings())
    float_bytes = next(model.parameters()).element_size()
    kv_dim = int(cfg.num_key_value_heads) * int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    kv = len(attns) * int(depth) * 2 * kv_dim * float_bytes
    routers = sum(p.numel() * p.element_size() for r in find_routers(model)[1] for p in r.parameters())
    norms = sum(p.numel() * p.element_size() for name, mod in model.named_modules()
                if "norm" in type(mod).__name__.lower() for p in mod.parameters(recurse=False))
    embedding_row = int(cfg.hidden_size) * model.get_input_embeddings().weight.element_size()
    return {"attention": attention, "experts": experts, "lm_head": head, "kv_cache": kv,
            "other": routers + norms + embedding_row}


def published_step_bytes(like: MoESpec | str, fmt: str, layers: int, depth: int = 0) -> dict[str, int]:
    """Bytes of one decode step of the published model ``like`` at ``layers`` layers (module
    docstring) with its weights in ``fmt``, from its config (:meth:`MoESpec.attention_shapes`)."""
    spec = get_spec(like) if isinstance(like, str) else like
    shapes = spec.attention_shapes()
    L, H = int(layers), spec.hidden_size
    attention = L * sum(format_bytes(o * i, fmt) for o, i in shapes.values())
    experts = L * spec.top_k * spec.expert_bytes(fmt)
    head = format_bytes(published_head_rows(spec, L) * H, fmt)
    kv = L * int(depth) * 2 * spec.num_key_value_heads * spec.head_dim * KV_BYTES
    q_dim, kv_dim = shapes["q_proj"][0], shapes["k_proj"][0]
    per_layer = spec.num_experts * H + 2 * H + q_dim + kv_dim        # router, two norms, q/k norms
    other = (L * per_layer + H + H) * FLOAT_BYTES                       # + final norm, embedding row
    return {"attention": attention, "experts": experts, "lm_head": head, "kv_cache": kv, "other": other}


def byte_shares(engine, like: MoESpec | str, fmt: str, depths=(0,)) -> pd.DataFrame:
    """The subject's step bytes and shares per component beside the published model's, one row per
    (depth, component): ``subject_bytes``, ``subject_share``, ``published_bytes``,
    ``published_share``, ``share_difference`` (subject minus published, in share points) and
    ``share_ratio`` (subject over published share; issue 27's goal: within 5 % of 1 for attention,
    experts and the LM head)."""
    spec = get_spec(like) if isinstance(like, str) else like
    layers = len(attention_modules(engine.model))
    rows = []
    for d in depths:
        ours, theirs = subject_step_bytes(engine, d), published_step_bytes(spec, fmt, layers, d)
        total_o, total_t = sum(ours.values()), sum(theirs.values())
        for c in COMPONENTS:
            rows.append({"depth": int(d), "component": c, "subject_bytes": ours[c], "subject_share": ours[c] / total_o,
                         "published_bytes": theirs[c], "published_share": theirs[c] / total_t,
                         "published": spec.name, "layers": layers, "fmt": fmt})
    out = pd.DataFrame(rows)
    out["share_difference"] = out["subject_share"] - out["published_share"]
    out["share_ratio"] = out["subject_share"] / out["published_share"].where(out["published_share"] > 0)
    return out


def max_share_gap(shares: pd.DataFrame, components=("attention", "experts", "lm_head")) -> float:
    """The largest relative gap |subject share / published share - 1| over ``components`` and depths."""
    sel = shares[shares["component"].isin(components)]
    return float((sel["share_ratio"] - 1).abs().max())

