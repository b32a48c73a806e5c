"""The lean decode path: an OLMoE-layout model's forward pass written out, with the KV cache in
buffers allocated once and the kernels called without per-call checks.

What it removes from a pass (docs/engine.md, "Where a step's time goes"): transformers' per-pass
framework work (decorators, keyword plumbing, the causal-mask builder, output records), the
rotary angles recomputed every pass (:class:`LeanOlmoe` computes the cos/sin table once per
capacity), the cache's concatenation of every past position each pass (:class:`KVCache` writes the
new positions into its buffer; a crop only moves its length), the zero padding of the
byte-faithful subjects' inputs (written once into a zeroed buffer that is reused) and the argument
checks of the expert and dense kernels (:func:`moespec.kernels.dispatch.expert_call`,
:func:`moespec.kernels.dense.dense_call`: checked once when the plan is built).

What it keeps: every arithmetic operation of transformers' ``OlmoeForCausalLM`` forward (sdpa
attention), in the same order on the same values, so greedy tokens and logits are bit for bit
those of the transformers path (``tests/test_engine_lean.py`` against outputs saved from it).

Which modules it runs inline: ``OlmoeRMSNorm``, ``OlmoeTopKRouter``, ``nn.Linear``, ``nn.Embedding``,
:class:`moespec.engine.widen.PaddedLinear` and :class:`moespec.engine.switch.KernelExperts`, each
when it has no forward hooks and no ``forward`` set on the instance; any other module in their place
(a replayed router, the breakdown's zero experts), or one with hooks or its own ``forward``, is
called as a module, so that they run. Before every pass the model's modules and hooks are read (a
few microseconds) and the plan of that arrangement is taken (:class:`Plans`: built the first time
it is met). Hooks, or a ``forward`` set on the instance, on the containers it does not call (decoder
layers, attention, MoE block, the model) are refused by name.

The cache holds ``[layers, batch, kv_heads, capacity, head_dim]``; the engine's passes have batch
one. A pass of several sequences (:meth:`LeanOlmoe.forward_segments`, the engine at batch B) takes
one batch-one cache per sequence, so that their lengths may differ after speculation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.modules import module as _module

from moespec.engine.switch import KernelExperts
from moespec.engine.widen import PaddedLinear
from moespec.kernels.dense import DenseWeights, dense_call
from moespec.kernels.dispatch import expert_call

#: Smallest capacity a new cache is given (it doubles as positions are appended).
MIN_CAPACITY = 64
#: Most positions a lean cache holds: as transformers' ``DynamicCache``, the engine decodes past the
#: model's ``max_position_embeddings`` (the rotary angles of any position are the rotary module's);
#: only a prompt longer than it is refused (:meth:`moespec.engine.Engine.prefill`).
MAX_POSITIONS = 1 << 20


def unsupported(model: nn.Module) -> str | None:
    """Why :class:`LeanOlmoe` cannot run ``model`` (None when it can): an ``OlmoeForCausalLM`` on
    the CPU in float32 with sdpa attention, no q/k/v clipping, attention without biases."""
    from transformers import OlmoeForCausalLM

    if not isinstance(model, OlmoeForCausalLM):
        return f"{type(model).__name__} is not an OlmoeForCausalLM"
    cfg = model.config
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return f"attention implementation {getattr(cfg, '_attn_implementation', None)!r}, not 'sdpa'"
    if cfg.clip_qkv is not None:
        return f"clip_qkv={cfg.clip_qkv}"
    if getattr(cfg, "attention_bias", False):
        return "attention projections with biases"
    dtypes = {p.dtype for p in model.parameters()}
    if dtypes != {torch.float32}:
        return f"parameters in {sorted(str(d) for d in dtypes)}, not float32 alone"
    devices = {p.device.type for p in model.parameters()}
    if devices != {"cpu"}:
        return f"parameters on {sorted(devices)}, not the CPU"
    return None


class KVCache:
    """Every layer's keys and values in two buffers ``[L, B, kv_heads, capacity, head_dim]``
    allocated once (grown by doubling, up to ``limit`` positions, when a pass needs more); the
    first :attr:`length` positions hold the sequence. :meth:`crop` and :meth:`get_seq_length`
    behave as transformers' ``DynamicCache``'s (a crop moves the length; nothing is copied)."""

    def __init__(self, layers: int, batch: int, kv_heads: int, head_dim: int, capacity: int, limit: int,
                 dtype=torch.float32, device="cpu"):
        self.limit = int(limit)
        shape = (layers, batch, kv_heads, min(int(capacity), self.limit), head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    @property
    def capacity(self) -> int:
        return int(self.keys.shape[3])

    def get_seq_length(self) -> int:
        return self.length

    def crop(self, max_length: int) -> None:
        """Keep ``max_length`` positions (a negative count removes that many, as ``DynamicCache``)."""
        keep = self.length + max_length if max_length < 0 else max_length
        if not 0 <= keep <= self.length:
            raise ValueError(f"cannot crop a cache of {self.length} positions to {keep}")
        self.length = keep

    def reserve(self, total: int) -> None:
        """Room for ``total`` positions (the held ones copied into larger buffers when needed)."""
        if total <= self.capacity:
            return
        if total > self.limit:
            raise ValueError(f"a cache of at most {self.limit} positions cannot hold {total}")
        cap = min(self.limit, max(total, 2 * self.capacity))
        for name in ("keys", "values"):
            old = getattr(self, name)
            new = old.new_zeros((*old.shape[:3], cap, old.shape[4]))
            new[:, :, :, :self.length] = old[:, :, :, :self.length]
            setattr(self, name, new)


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``OlmoeRMSNorm.forward`` on float32: torch's ``rms_norm``, whose CPU kernel runs the same
    operations (pow, mean, add, rsqrt, mul, mul by the weight) in one call."""
    return F.rms_norm(x, weight.shape, weight, eps)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _plain(module: nn.Module) -> bool:
    """No forward hooks on ``module`` and no ``forward`` set on the instance (it may be run inline)."""
    return not (module._forward_hooks or module._forward_pre_hooks or "forward" in module.__dict__)


class _Padded:
    """A zeroed input buffer ``[rows, width]`` reused across passes: the first ``used`` columns
    take each pass's input, the rest stay zero (the padding :class:`PaddedLinear` and
    :class:`KernelExperts` apply with ``F.pad``)."""

    def __init__(self, width: int):
        self.width, self.buf = int(width), torch.zeros(0, int(width))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n, used = x.shape
        if n > self.buf.shape[0]:
            self.buf = torch.zeros(max(n, 2 * self.buf.shape[0]), self.width)
        out = self.buf[:n]
        out[:, :used] = x
        return out


def _pad(pads: dict, width: int, used: int) -> _Padded:
    """The buffer of inputs of ``used`` columns padded to ``width``, shared by every call of those
    two sizes (each writes all ``used`` columns, so the rest stay zero)."""
    return pads.setdefault((int(width), int(used)), _Padded(width))


def _linear(module: nn.Module, pads: dict):
    """A function ``x [..., K] -> [..., N]`` computing ``module(x)`` with the same operations:
    inline for a hook-free :class:`PaddedLinear` (the cpp or torch dense kernel, resolved once) or
    bias-free ``nn.Linear``; the module itself otherwise."""
    if type(module) is PaddedLinear and _plain(module):
        call = dense_call(module.weights, module.backend)
        k_pad, k, out = module.weights.shape[1], module.in_features, module.out_features
        pad = _pad(pads, k_pad, k) if k_pad > k else None

        def padded(x: torch.Tensor) -> torch.Tensor:
            flat = x.reshape(-1, k)
            y = call(pad(flat) if pad is not None else flat.contiguous())
            return (y[:, :out] if y.shape[1] > out else y).reshape(*x.shape[:-1], out)
        return padded
    if type(module) is nn.Linear and module.bias is None and _plain(module):
        weight = module.weight
        return lambda x: F.linear(x, weight)
    return module


def _fused_qkv(mods, pads: dict):
    """One dense call for the q, k and v projections of a layer when all three are hook-free
    :class:`PaddedLinear` of one format, backend and input: their matrices stacked row-wise (a copy
    made once), each output row the same dot product of the same input as in its own matrix, so
    the three outputs are the separate calls' bit for bit (``tests/test_engine_lean.py``); None
    otherwise."""
    if not all(type(m) is PaddedLinear and _plain(m) for m in mods):
        return None
    first = mods[0]
    key = (first.weights.fmt, first.backend, first.weights.shape[1], first.in_features)
    if any((m.weights.fmt, m.backend, m.weights.shape[1], m.in_features) != key for m in mods):
        return None
    ws = [m.weights for m in mods]
    kept = ws[0]._cache.get("lean_qkv")       # made once per weights: a rebuilt plan reuses it
    if kept is None or any(a is not b for a, b in zip(kept[0], ws)):
        fused = DenseWeights(key[0], torch.cat([w.values for w in ws]).contiguous(),
                             None if ws[0].scale is None else torch.cat([w.scale for w in ws]).contiguous())
        kept = ws[0]._cache["lean_qkv"] = (tuple(ws), fused)
    call = dense_call(kept[1], first.backend)
    k_pad, k = key[2], key[3]
    pad = _pad(pads, k_pad, k) if k_pad > k else None
    bounds, start = [], 0
    for m in mods:
        bounds.append((start, start + m.out_features))
        start += m.weights.shape[0]

    def qkv(x: torch.Tensor):
        flat = x.reshape(-1, k)
        y = call(pad(flat) if pad is not None else flat.contiguous())
        return tuple(y[:, a:b].reshape(*x.shape[:-1], b - a) for a, b in bounds)
    return qkv


class _Layer:
    """One decoder layer's resolved pieces (see :class:`LeanOlmoe`)."""

    def __init__(self, layer: nn.Module, index: int, pads: dict):
        attn, mlp = layer.self_attn, layer.mlp
        for name, mod in (("layer", layer), ("self_attn", attn), ("mlp", mlp)):
            if not _plain(mod):
                raise ValueError(f"layer {index}: {name} has forward hooks or a forward set on it, which the lean "
                                 "path does not run; build the Engine with lean=False")
        self.index = index
        self.norms = tuple(self._norm(m) for m in (layer.input_layernorm, attn.q_norm, attn.k_norm,
                                                   layer.post_attention_layernorm))
        projections = [getattr(attn, p) for p in ("q_proj", "k_proj", "v_proj")]
        self.qkv = _fused_qkv(projections, pads)
        if self.qkv is None:
            q, k, v = (_linear(m, pads) for m in projections)
            self.qkv = lambda x: (q(x), k(x), v(x))
        self.o = _linear(attn.o_proj, pads)
        self.head_dim, self.groups, self.scaling = attn.head_dim, attn.num_key_value_groups, attn.scaling
        gate = mlp.gate
        self.router = ((gate.weight, gate.top_k, gate.norm_topk_prob, gate.hidden_dim)
                       if type(gate).__name__ == "OlmoeTopKRouter" and _plain(gate) else gate)
        experts = mlp.experts
        self.experts = experts
        if type(experts) is KernelExperts and _plain(experts):
            w = experts.weights
            self.switch = experts.switch
            self.kernels = {k: expert_call(w, k, experts.switch.backend) for k in ("slot", "dedup")}
            self.expert_pad = _pad(pads, w.hidden_size, layer.input_layernorm.weight.shape[0])
        else:
            self.kernels = None

    @staticmethod
    def _norm(module):
        if type(module).__name__ == "OlmoeRMSNorm" and _plain(module):
            return module.weight, module.variance_epsilon
        return module


def _norm(spec, x: torch.Tensor) -> torch.Tensor:
    return _rms(x, *spec) if type(spec) is tuple else spec(x)


class LeanOlmoe:
    """The forward pass of one OLMoE-layout model as its modules stand (module docstring)."""

    def __init__(self, model: nn.Module):
        why = unsupported(model)
        if why is not None:
            raise ValueError(f"the lean path cannot run this model: {why}")
        self.model = model
        inner = model.model
        if _module._global_forward_hooks or _module._global_forward_pre_hooks:
            raise ValueError("global forward hooks are registered, which the lean path does not run; build the "
                             "Engine with lean=False")
        if not (_plain(model) and _plain(inner)):
            raise ValueError("the model has forward hooks or a forward set on it, which the lean path does not run; "
                             "build the Engine with lean=False")
        cfg = model.config
        pads: dict = {}
        self.layers = [_Layer(layer, i, pads) for i, layer in
                       enumerate(inner.layers[:cfg.num_hidden_layers])]
        emb = inner.embed_tokens
        self.embed = ((emb.weight, emb.padding_idx) if type(emb) is nn.Embedding and _plain(emb)
                      and emb.max_norm is None else emb)
        self.final_norm = _Layer._norm(inner.norm)
        self.head = _linear(model.lm_head, pads)
        self.rotary = inner.rotary_emb
        self.table_ok = (cfg.rope_parameters or {}).get("rope_type", "default") == "default" and _plain(self.rotary)
        self.cos = self.sin = None
        attn = inner.layers[0].self_attn
        self.kv_heads, self.head_dim = cfg.num_key_value_heads, attn.head_dim
        self.limit = MAX_POSITIONS


    # --- the cache and the rotary table ------------------------------------------------------
    def new_cache(self, positions: int, batch: int = 1) -> KVCache:
        """An empty cache with room for ``positions`` (at least :data:`MIN_CAPACITY`)."""
        return KVCache(len(self.layers), batch, self.kv_heads, self.head_dim, max(MIN_CAPACITY, positions),
                       self.limit)

    def _angles(self, start: int, n: int, like: torch.Tensor):
        """cos, sin ``[1, n, head_dim]`` of positions start..start+n-1: rows of a table computed by
        the model's own rotary module once per capacity (default rope), else by it every pass."""
        if not self.table_ok:
            pos = torch.arange(start, start + n).unsqueeze(0)
            return self.rotary(like, pos)
        if self.cos is None or self.cos.shape[1] < start + n:
            size = max(start + n, MIN_CAPACITY, 0 if self.cos is None else 2 * self.cos.shape[1])
            self.cos, self.sin = self.rotary(like, torch.arange(size).unsqueeze(0))
        return self.cos[:, start:start + n], self.sin[:, start:start + n]

    # --- the pass ---------------------------------------------------------------------------------
    def forward(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Logits ``[B, n, V]`` of the pass ``ids [B, n]`` appended to ``cache`` (which grows by n)."""
        batch, n = ids.shape
        start = cache.length
        cache.reserve(start + n)
        h = self._embed(ids)
        cos, sin = self._angles(start, n, h)
        angles = (cos.unsqueeze(1), sin.unsqueeze(1))
        mask = _mask(start, n)
        for lay, keys, values in zip(self.layers, cache.keys, cache.values):
            q, k, v = self._project(lay, h)
            out = self._attend(lay, q, k, v, angles, keys, values, start, mask)
            h = self._moe(lay, h + lay.o(out))
        cache.length = start + n
        return self.head(_norm(self.final_norm, h))

    def forward_segments(self, segments: list[torch.Tensor], caches: list[KVCache]) -> torch.Tensor:
        """Logits ``[N, V]`` of one pass of several sequences: ``segments[j]`` (1-D ids) appended to
        ``caches[j]`` (a batch-one cache each; the sequences' lengths may differ), N the segments'
        tokens together. Every module but attention runs once over all N tokens (the norms, the q/k/v
        and output projections, the router, the expert operation with the pass size N, the LM head);
        attention runs per sequence, against its own cache at its own positions, as
        :class:`moespec.engine.batch.BatchLM` runs transformers' modules (the same operations on the
        same shapes: its logits bit for bit, ``tests/test_engine_batch.py``). One segment is
        :meth:`forward`."""
        if len(segments) != len(caches) or not segments:
            raise ValueError(f"segments: one per cache ({len(caches)}), found {len(segments)}")
        if len(segments) == 1:
            return self.forward(segments[0].view(1, -1), caches[0])[0]
        sizes = [int(s.numel()) for s in segments]
        starts = [c.length for c in caches]
        for c, start, n in zip(caches, starts, sizes):
            c.reserve(start + n)
        h = self._embed(torch.cat(segments).view(1, -1))
        spans, off = [], 0
        for start, n in zip(starts, sizes):
            cos, sin = self._angles(start, n, h)
            spans.append((off, n, start, (cos.unsqueeze(1), sin.unsqueeze(1)), _mask(start, n)))
            off += n
        for i, lay in enumerate(self.layers):
            q, k, v = self._project(lay, h)
            outs = [self._attend(lay, q[:, a:a + n], k[:, a:a + n], v[:, a:a + n], angles, c.keys[i], c.values[i],
                                 start, mask)
                    for (a, n, start, angles, mask), c in zip(spans, caches)]
            h = self._moe(lay, h + lay.o(torch.cat(outs, dim=1)))
        for c, start, n in zip(caches, starts, sizes):
            c.length = start + n
        return self.head(_norm(self.final_norm, h))[0]

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, *self.embed) if type(self.embed) is tuple else self.embed(ids)

    @staticmethod
    def _project(lay: _Layer, h):
        """The layer's input norm, then q, k, v ``[B, n, width]`` with q and k normed."""
        norm_in, q_norm, k_norm, _ = lay.norms
        q, k, v = lay.qkv(_norm(norm_in, h))
        return _norm(q_norm, q), _norm(k_norm, k), v

    @staticmethod
    def _attend(lay: _Layer, q, k, v, angles, keys, values, start: int, mask) -> torch.Tensor:
        """One sequence's attention ``[B, n, heads * head_dim]`` (before the output projection): the
        rotary angles on q and k, k and v written into the layer's cache buffers at ``start``, sdpa
        over the cache's first start + n positions (``mask`` from :func:`_mask`)."""
        batch, n = q.shape[:2]
        shape = (batch, n, -1, lay.head_dim)
        cos, sin = angles
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        q = (q * cos) + (_rotate_half(q) * sin)
        end = start + n
        keys[:, :, start:end] = (k * cos) + (_rotate_half(k) * sin)
        values[:, :, start:end] = v
        k, v = keys[:, :, :end], values[:, :, :end]
        attn_mask, causal = mask
        extra = {}
        if lay.groups > 1:           # as transformers' sdpa_attention_forward
            if attn_mask is None:
                extra["enable_gqa"] = True
            else:
                k, v = k.repeat_interleave(lay.groups, dim=1), v.repeat_interleave(lay.groups, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=0.0, scale=lay.scaling,
                                             is_causal=causal, **extra)
        out = out.reshape(batch, -1, n, lay.head_dim).transpose(1, 2).contiguous()
        return out.reshape(batch, n, -1).contiguous()

    def _moe(self, lay: _Layer, h):
        """The MoE block with its residual: ``h`` + the experts' output over every token of ``h``."""
        x = _norm(lay.norms[3], h)
        batch, n, hidden = x.shape
        flat = x.view(-1, hidden)
        if type(lay.router) is tuple:
            weight, top_k, norm_topk, _ = lay.router
            logits = F.linear(flat, weight)
            probs = torch.nn.functional.softmax(logits, dtype=torch.float, dim=-1)
            gates, idx = torch.topk(probs, top_k, dim=-1)
            if norm_topk:
                gates /= gates.sum(dim=-1, keepdim=True)
            gates = gates.to(logits.dtype)
        else:
            _, gates, idx = lay.router(flat)
        if lay.kernels is None:
            out = lay.experts(flat, idx, gates)
        else:
            switch = lay.switch
            if switch.record is not None:
                switch.record.append((lay.index, idx.detach().cpu().numpy().copy()))
            wide = lay.expert_pad.width > hidden
            out = lay.kernels[switch.kernel_for(batch * n)](lay.expert_pad(flat) if wide else flat, idx, gates)
            if wide:
                out = out[:, :hidden]
        return h + out.reshape(batch, n, hidden)


def _mask(start: int, n: int):
    """The attention mask of a pass of n tokens after ``start`` cached ones, as transformers' sdpa
    takes it: none for one token, causal for the whole sequence, else a boolean ``[1, 1, n, start + n]``.
    Returns (mask, is_causal)."""
    if n == 1 or start == 0:
        return None, n > 1
    end = start + n
    return (torch.arange(end)[None, :] <= torch.arange(start, end)[:, None]).view(1, 1, n, end), False


def _signature(model: nn.Module) -> tuple:
    """The modules the lean path reads or calls, whether each has forward hooks or a forward set on the
    instance, whether any global
    forward hooks exist, and the kernels' backend (read through ``_modules``: a pass checks it)."""
    mods = model._modules
    inner = mods["model"]
    im = inner._modules
    found = [model, inner, im["embed_tokens"], im["norm"], im["rotary_emb"], mods["lm_head"]]
    backend = None
    for layer in im["layers"]._modules.values():
        lm = layer._modules
        attn, mlp = lm["self_attn"], lm["mlp"]
        am, mm = attn._modules, mlp._modules
        found += [layer, attn, mlp, lm["input_layernorm"], lm["post_attention_layernorm"], am["q_norm"], am["k_norm"],
                  am["q_proj"], am["k_proj"], am["v_proj"], am["o_proj"], mm["gate"], mm["experts"]]
        backend = getattr(getattr(mm["experts"], "switch", None), "backend", None)
    hooks = tuple(not _plain(m) for m in found)
    global_hooks = bool(_module._global_forward_hooks or _module._global_forward_pre_hooks)
    return (*found, *hooks, global_hooks, backend)


class Plans:
    """The plans of one model, one per arrangement of its modules met so far (a benchmark that swaps
    a module in and out between passes switches between two plans; nothing is rebuilt)."""

    #: Arrangements kept (the oldest is dropped beyond).
    KEEP = 4

    def __init__(self, model: nn.Module):
        self.model, self.plans = model, {}

    def current(self) -> LeanOlmoe:
        sig = _signature(self.model)
        plan = self.plans.get(sig)
        if plan is None:
            plan = self.plans[sig] = LeanOlmoe(self.model)
            while len(self.plans) > self.KEEP:
                self.plans.pop(next(iter(self.plans)))
        return plan
