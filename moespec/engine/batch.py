"""The engine at batch B: B sequences decoded together, one pass of the model over all their
tokens, attention per sequence.

A pass takes one segment of new tokens per sequence (of any lengths: after speculation the
sequences' caches are ragged) and runs the model once over their concatenation, token-flattened
as serving engines run a batch (vLLM, SGLang): embedding, norms, every MoE layer's router and
expert operation, dense MLPs and the LM head see all ``n = sum of the segments`` tokens in one
call, so the expert operation of a layer runs once per pass through the kernel switch with the
pass size n (a verify pass of B sequences drafting k tokens each: n = B(k + 1)) and the dedup
switch decides by that n. Attention runs per sequence, each segment against its own KV cache
(a transformers ``DynamicCache`` per sequence, cropped per sequence as a paged cache is) with its
own positions and causal mask: the attention module's own forward, called once per sequence with
the arguments a batch-one pass gives it (the rotary angles of the sequence's positions, the mask
transformers builds for that cache and segment). Its q, k, v and output projections run once over
the pass's tokens (their weights read once per pass, not once per sequence), each sequence's
attention taking its own rows (where the module has ``q_proj``, ``k_proj``, ``v_proj`` and
``o_proj``: OLMoE, Qwen-MoE, Mixtral, Llama; DeepSeek-V2's latent projections run per sequence).

:class:`BatchLM` does this for any transformers causal LM whose decoder layers keep their
attention at ``layer.self_attn`` (OLMoE, Qwen-MoE, Mixtral, Llama); :class:`BatchEngine` is the
target, an :class:`moespec.engine.Engine`'s model and switch run that way, or through the lean
path's pass of several sequences where the engine runs the lean path (the same operations, without
transformers' per-pass framework work: docs/engine.md). Prefill runs per
sequence (each prompt its own passes, in :attr:`Engine.prefill_chunk` chunks, as at batch one);
the decode and verify passes are batched.

A sequence's tokens are those of its batch-one run when the model's per-token arithmetic does not
depend on how many rows a matrix product has; on the CPU it does in the last bits (a dense product
of n rows is blocked by n), so a near-tie of two logits or two router scores may resolve
differently at batch B than at batch one, as it may between a verify pass and a one-token pass at
batch one (tests/test_engine_batch.py checks the tokens on the quick profile's models).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


def _ids(tokens, device, where: str) -> torch.Tensor:
    """One sequence's token ids as a 1-D long tensor on ``device``; refuses an empty or non-1-D list."""
    if isinstance(tokens, torch.Tensor):
        out = tokens.to(device=device, dtype=torch.long)
    else:
        out = torch.as_tensor(np.asarray(tokens, dtype=np.int64), device=device)
    if out.dim() != 1 or out.numel() == 0:
        raise ValueError(f"{where}: needs a non-empty 1-D token list, found shape {tuple(out.shape)}")
    return out


def check_batch(batch: int, where: str = "B") -> int:
    """``batch`` as an int, refused (naming ``where``) below one."""
    if int(batch) < 1:
        raise ValueError(f"{where}: the batch size must be >= 1, found {batch}")
    return int(batch)


def decoder_layers(model: torch.nn.Module) -> list:
    """The decoder layers of a transformers causal LM (``model.model.layers``), each with its
    attention at ``self_attn``; refuses, naming the model, one laid out otherwise."""
    layers = getattr(getattr(model, "base_model", model), "layers", None)
    if layers is None or not all(hasattr(layer, "self_attn") for layer in layers):
        raise ValueError(f"{type(model).__name__}: batched passes need decoder layers at model.layers, each with its "
                         "attention at self_attn (transformers' OLMoE, Qwen-MoE, Mixtral and Llama layouts)")
    kinds = sorted(set(getattr(model.config, "layer_types", None) or []))
    if len(kinds) > 1:
        raise ValueError(f"{type(model).__name__}: layer_types mixes {kinds}; a batched pass builds one kind of "
                         "attention mask for every layer")
    return list(layers)


def _positions(embeddings, off: int, n: int):
    """Tokens ``off .. off + n - 1`` of a pass's rotary embeddings: a (cos, sin) pair of ``[1, N, d]``
    tensors (OLMoE, Llama, Qwen, Mixtral) or one ``[1, N, d]`` tensor (DeepSeek-V2's complex angles)."""
    if isinstance(embeddings, (tuple, list)):
        return type(embeddings)(e[:, off:off + n] for e in embeddings)
    return embeddings[:, off:off + n]


#: The attention projections a batched pass runs once over all its tokens (with ``o_proj``).
PROJECTIONS = ("q_proj", "k_proj", "v_proj")


class _Rows(torch.nn.Module):
    """Stands in for a projection inside one sequence's attention: the rows of that sequence's
    segment (``span``) of the projection's output over the whole pass."""

    def __init__(self, full: torch.Tensor):
        super().__init__()
        self.full, self.span = full, (0, 0)

    def forward(self, x):
        off, n = self.span
        return self.full[:, off:off + n]


@dataclass
class _Pass:
    """What the per-sequence attention of one pass reads: each segment's offset and length in the
    flattened tokens, its cache, positions and (built at the first layer) causal mask."""

    spans: list
    caches: list
    positions: list
    masks: list = field(default_factory=list)


class BatchLM:
    """B sequences of one causal LM with a KV cache each (module docstring).

    ``prefill(prompts)`` starts B sequences and returns each prompt's greedy next token;
    ``forward(segments)`` appends one segment per sequence in one pass and returns each
    sequence's argmax at every position of its segment; ``crop(lengths)`` keeps each sequence's
    first ``lengths[b]`` positions.
    """

    def __init__(self, model: torch.nn.Module, prefill_chunk: int = 512, fuse_projections: bool = True):
        self.model = model.eval()
        #: run every attention's q/k/v and output projections once over the pass's tokens (its weights
        #: read once per pass, as an engine's batched GEMM); only where it has all four (not DeepSeek-V2's)
        self.fuse_projections = bool(fuse_projections)
        self.layers = decoder_layers(model)
        self.prefill_chunk = int(prefill_chunk)
        self.caches: list = []
        #: called as ``listener(starts, segments)`` before every pass (the cache lengths and the
        #: 1-D id tensors of the sequences taking part)
        self.pass_listeners: list = []
        self._pass: _Pass | None = None

    @property
    def device(self) -> torch.device:
        return self.model.get_input_embeddings().weight.device

    @property
    def batch(self) -> int:
        return len(self.caches)

    @property
    def lengths(self) -> list[int]:
        return [int(c.get_seq_length()) for c in self.caches]

    def reset(self, batch: int) -> None:
        """Start ``batch`` empty sequences."""
        self.caches = [self._new_cache() for _ in range(check_batch(batch))]

    def _new_cache(self):
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def crop(self, lengths) -> None:
        """Keep the first ``lengths[b]`` cached positions of sequence b (rejected drafts are dropped this way)."""
        lengths = [int(v) for v in lengths]
        if len(lengths) != self.batch:
            raise ValueError(f"lengths: one per sequence ({self.batch}), found {len(lengths)}")
        for b, (cache, keep) in enumerate(zip(self.caches, lengths)):
            cur = int(cache.get_seq_length())
            if not 0 <= keep <= cur:
                raise ValueError(f"lengths[{b}]: cannot crop a cache of {cur} positions to {keep}")
            if keep < cur:
                cache.crop(keep - cur)  # transformers 5: a negative count removes positions

    # --- one pass ------------------------------------------------------------------------
    def _attention(self, attn, own_forward):
        """The forward that runs ``attn`` once per sequence of the current pass, its q/k/v and
        output projections (where it has all four) once over the pass's tokens."""

        def forward(hidden_states, position_embeddings, attention_mask=None, **kwargs):
            from transformers import masking_utils

            # the builder the model's own forward picks (Mixtral, Qwen-MoE: a sliding window where set)
            build = (masking_utils.create_sliding_window_causal_mask
                     if getattr(self.model.config, "sliding_window", None) is not None
                     else masking_utils.create_causal_mask)
            ctx = self._pass
            first = not ctx.masks
            own = {p: getattr(attn, p, None) for p in PROJECTIONS + ("o_proj",)}
            fused = (self.fuse_projections and len(ctx.spans) > 1  # one segment: the module's own calls
                     and all(isinstance(m, torch.nn.Module) for m in own.values()))
            rows = {p: _Rows(own[p](hidden_states)) for p in PROJECTIONS} if fused else {}
            outs = []
            try:
                for p, r in rows.items():
                    setattr(attn, p, r)
                if fused:
                    attn.o_proj = torch.nn.Identity()
                for j, (off, n) in enumerate(ctx.spans):
                    part = hidden_states[:, off:off + n]
                    if first:  # before any layer writes this pass into the cache, as the model's own builder
                        ctx.masks.append(build(config=self.model.config, inputs_embeds=part, attention_mask=None,
                                               cache=ctx.caches[j], position_ids=ctx.positions[j]))
                    for r in rows.values():
                        r.span = (off, n)
                    out = own_forward(hidden_states=part, position_embeddings=_positions(position_embeddings, off, n),
                                      attention_mask=ctx.masks[j], cache=ctx.caches[j],
                                      position_ids=ctx.positions[j], use_cache=True)
                    outs.append(out[0])
            finally:
                if fused:
                    for p, m in own.items():
                        setattr(attn, p, m)
            out = torch.cat(outs, dim=1)
            return (own["o_proj"](out) if fused else out), None

        return forward

    @torch.inference_mode()
    def run(self, rows: list[int], segments: list[torch.Tensor]) -> list[torch.Tensor]:
        """One pass: ``segments[j]`` (1-D ids) appended to sequence ``rows[j]``'s cache; returns each
        segment's logits ``[len, vocab]``. Attention per sequence, every other module once over all
        the segments' tokens (module docstring)."""
        caches = [self.caches[r] for r in rows]
        starts = [int(c.get_seq_length()) for c in caches]
        for listener in self.pass_listeners:
            listener(starts, segments)
        sizes = [int(s.numel()) for s in segments]
        offsets = np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist()
        spans = list(zip(offsets, sizes))
        logits = self._logits(caches, starts, spans, segments)
        return [logits[o:o + n] for o, n in spans]

    def _logits(self, caches, starts, spans, segments) -> torch.Tensor:
        """Logits ``[N, vocab]`` of the pass over the segments' tokens (``spans``: each segment's
        offset and length among them): the model's own forward, each attention module run once per
        sequence."""
        positions = [torch.arange(s, s + n, device=self.device).view(1, -1) for s, (_, n) in zip(starts, spans)]
        self._pass = _Pass(spans, caches, positions)
        patched = []  # (module, the forward set on the instance before, if any)
        try:
            for layer in self.layers:
                attn = layer.self_attn
                patched.append((attn, attn.__dict__.get("forward")))
                attn.forward = self._attention(attn, attn.forward)
            out = self.model(input_ids=torch.cat(segments).view(1, -1), position_ids=torch.cat(positions, dim=1),
                             use_cache=False)
        finally:
            for attn, before in patched:
                if before is None:
                    del attn.forward  # the class's forward again
                else:
                    attn.forward = before
            self._pass = None
        return out.logits[0]

    def prefill(self, prompts) -> list[int]:
        """Start one sequence per prompt (each prompt its own passes, in chunks of
        :attr:`prefill_chunk`); return each prompt's greedy next token."""
        prompts = list(prompts)
        check_batch(len(prompts), "prompts")
        ids = [_ids(p, self.device, f"prompts[{b}]") for b, p in enumerate(prompts)]
        limit = getattr(self.model.config, "max_position_embeddings", None)
        for b, seq in enumerate(ids):
            if limit is not None and seq.numel() > limit:
                raise ValueError(f"prompts[{b}]: {seq.numel()} tokens exceed the model's "
                                 f"max_position_embeddings={limit}")
        self.reset(len(ids))
        first = []
        for b, seq in enumerate(ids):
            for start in range(0, seq.numel(), self.prefill_chunk):
                logits = self.run([b], [seq[start:start + self.prefill_chunk]])[0]
            first.append(int(logits[-1].argmax()))
        return first

    def forward(self, segments) -> list[list[int]]:
        """One pass of one segment per sequence (segments may differ in length); each sequence's
        argmax at every position of its segment."""
        segments = list(segments)
        if self.batch == 0:
            raise ValueError("call prefill() before forward()")
        if len(segments) != self.batch:
            raise ValueError(f"segments: one per sequence ({self.batch}), found {len(segments)}")
        ids = [_ids(s, self.device, f"segments[{b}]") for b, s in enumerate(segments)]
        return [lg.argmax(-1).tolist() for lg in self.run(list(range(self.batch)), ids)]

    def greedy(self, currents, count: int) -> list[list[int]]:
        """Plain decoding: ``count`` greedy tokens per sequence, one pass of B tokens each, starting
        by feeding ``currents[b]`` (the token after sequence b's cache)."""
        toks = [int(t) for t in currents]
        out: list[list[int]] = [[] for _ in toks]
        for _ in range(int(count)):
            toks = [a[0] for a in self.forward([[t] for t in toks])]
            for row, t in zip(out, toks):
                row.append(t)
        return out


class BatchEngine(BatchLM):
    """The target at batch B: an :class:`moespec.engine.Engine`'s model, with its kernel switch,
    run by :class:`BatchLM`, or, where the engine runs the lean path (``engine.lean``), by the lean
    path's pass of several sequences (:meth:`moespec.engine.lean.LeanOlmoe.forward_segments`: one
    lean cache per sequence, the same logits bit for bit). The engine's own (batch-one) sequence is
    left as it is; both share the model and the switch, so ``dedup`` here is the engine's."""

    def __init__(self, engine):
        if getattr(engine, "pass_listeners", None):
            raise ValueError("engine: it has pass listeners (replayed routing reads one sequence's positions); "
                             "a batched pass runs the model's own routers")
        super().__init__(engine.model, prefill_chunk=engine.prefill_chunk)
        self.engine = engine
        self.switch = engine.switch
        self.num_layers = engine.num_layers
        self.lean = bool(engine.lean)

    def _new_cache(self):
        return self.engine.plan().new_cache(0) if self.lean else super()._new_cache()

    def _logits(self, caches, starts, spans, segments) -> torch.Tensor:
        if not self.lean:
            return super()._logits(caches, starts, spans, segments)
        return self.engine.plan().forward_segments(list(segments), caches)

    @property
    def dedup(self) -> bool:
        return self.engine.dedup

    @dedup.setter
    def dedup(self, on: bool) -> None:
        self.engine.dedup = on
