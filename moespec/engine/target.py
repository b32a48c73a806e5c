"""The whole-model engine: a causal LM with a KV cache, run one pass at a time at batch one.

:class:`Engine` wraps an ``OlmoeForCausalLM`` whose experts run through :mod:`moespec.kernels`
(see :mod:`moespec.engine.switch`). The speculative loop talks to any object with the same four
members (``prefill``, ``forward``, ``crop``, ``length``; the sweeps that switch between prompts also
``hold`` and ``resume``); the tests' stand-in is ``tests/fakes.py``'s ``FakeTarget``.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from moespec.engine.lean import KVCache, LeanOlmoe, Plans, unsupported
from moespec.engine.switch import install, moe_layers


@dataclass
class HeldPrompt:
    """A prefilled prompt set aside by :meth:`Engine.hold`: its KV cache (the object itself, not a
    copy), the prompt's length, its greedy next token and the logits that chose it."""
    cache: object
    length: int
    first: int
    last_logits: torch.Tensor | None


class Engine:
    """A target model with a KV cache and the dedup switch.

    ``prefill(ids)`` starts a new sequence and returns the greedy next token; ``forward(ids)``
    appends ``ids`` (one pass of ``len(ids)`` tokens) and returns the argmax at each position;
    ``crop(length)`` drops cached positions beyond ``length``.
    """

    def __init__(self, model: torch.nn.Module, backend: str = "auto", install_kernels: bool = True,
                 prefill_chunk: int = 512, fmt: str | None = None, transform=None, lean: bool = True):
        self.model = model.eval()
        self.switch = install(model, backend, fmt=fmt, transform=transform) if install_kernels else None
        #: the lean decode path (:mod:`moespec.engine.lean`) when asked for and the model is one it runs;
        #: otherwise transformers' forward with a ``DynamicCache``
        self.lean = bool(lean) and unsupported(model) is None
        self._plan: Plans | None = None
        self.num_layers = len(moe_layers(model))
        self.prefill_chunk = int(prefill_chunk)
        self.cache = None
        self.last_logits: torch.Tensor | None = None
        #: called as ``listener(start, ids)`` before every pass of the token ids ``ids`` (1-D tensor)
        #: appended at cache position ``start`` (replayed routing, :mod:`moespec.engine.replay`,
        #: reads the positions there)
        self.pass_listeners: list = []

    @property
    def device(self) -> torch.device:
        """The device of the model's input embedding: token ids are built there."""
        return self.model.get_input_embeddings().weight.device

    # --- the switch -----------------------------------------------------------------------
    @property
    def dedup(self) -> bool:
        return bool(self.switch and self.switch.dedup)

    @dedup.setter
    def dedup(self, on: bool) -> None:
        if self.switch is None:
            raise ValueError("this engine runs the model's own experts module; there is no dedup switch")
        self.switch.dedup = bool(on)

    @contextmanager
    def dedup_as(self, on: bool):
        """The dedup switch at ``on`` for the block, then back where it was."""
        was = self.dedup
        self.dedup = on
        try:
            yield
        finally:
            self.dedup = was

    # --- the KV cache ---------------------------------------------------------------------
    @property
    def length(self) -> int:
        return 0 if self.cache is None else int(self.cache.get_seq_length())

    def crop(self, length: int) -> None:
        """Keep the first ``length`` cached positions (rejected drafts are dropped this way)."""
        cur = self.length
        if not 0 <= length <= cur:
            raise ValueError(f"cannot crop a cache of {cur} positions to {length}")
        if length < cur:
            self.cache.crop(length - cur)  # transformers 5: a negative count removes positions

    @torch.inference_mode()
    def _run(self, ids: torch.Tensor) -> torch.Tensor:
        for listener in self.pass_listeners:
            listener(self.length, ids)
        if isinstance(self.cache, KVCache):
            return self.plan().forward(ids.view(1, -1), self.cache)[0]
        out = self.model(input_ids=ids.view(1, -1), cache=self.cache, use_cache=True)
        return out.logits[0]

    def plan(self) -> LeanOlmoe:
        """The lean path's plan of the model as it is now (one per arrangement of its modules and hooks)."""
        if self._plan is None:
            self._plan = Plans(self.model)
        return self._plan.current()

    def variant(self, lean: bool) -> "Engine":
        """An engine on the same model and switch that runs the lean path or transformers' forward
        (``lean``), with no sequence: the two paths side by side (the breakdown benchmark)."""
        other = copy.copy(self)
        other.cache, other.last_logits, other._plan = None, None, None
        other.lean = bool(lean) and unsupported(self.model) is None
        return other

    def _ids(self, ids) -> torch.Tensor:
        """Token ids as a 1-D long tensor on the model's device."""
        if isinstance(ids, torch.Tensor):
            return ids.to(device=self.device, dtype=torch.long).view(-1)
        return torch.as_tensor(np.asarray(ids, dtype=np.int64), device=self.device).view(-1)

    def reset(self, positions: int = 0) -> None:
        """Start an empty sequence (an empty KV cache; the lean path's with room for ``positions``)."""
        if self.lean and unsupported(self.model) is None:
            self.cache = self.plan().new_cache(positions)
            return
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.model.config)

    @torch.inference_mode()
    def prefill(self, ids) -> int:
        """Start a sequence with the prompt ``ids`` (in chunks); return its greedy next token."""
        shape = tuple(np.shape(ids))
        if len(shape) != 1 or shape[0] == 0:
            raise ValueError(f"prefill needs a non-empty 1-D token list, got shape {shape}")
        ids = self._ids(ids)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        if limit is not None and ids.numel() > limit:
            raise ValueError(f"prompt of {ids.numel()} tokens exceeds the model's max_position_embeddings={limit}")
        self.reset(ids.numel())
        for start in range(0, ids.numel(), self.prefill_chunk):
            logits = self._run(ids[start:start + self.prefill_chunk])
        self.last_logits = logits[-1]
        return int(logits[-1].argmax())

    def hold(self, first: int) -> HeldPrompt:
        """Set the current sequence aside (a prefilled prompt, ``first`` its greedy next token) to
        go on with it later by :meth:`resume` instead of prefilling it again; the engine is left
        with no sequence. No tensor is copied: a run on the resumed prompt appends to the same cache
        and crops back to the prompt, and positions before the prompt's end are never written
        after its prefill, so the resumed cache is the prefill's, value for value."""
        if self.cache is None:
            raise ValueError("no sequence to hold: call prefill() first")
        held = HeldPrompt(self.cache, self.length, int(first), self.last_logits)
        self.cache, self.last_logits = None, None
        return held

    def resume(self, held: HeldPrompt) -> int:
        """Go on with a prompt :meth:`hold` set aside (positions a run left beyond the prompt are
        dropped); returns the prompt's greedy next token."""
        if not isinstance(held, HeldPrompt):
            raise TypeError(f"resume() takes what hold() returned, not {type(held).__name__}")
        self.cache, self.last_logits = held.cache, held.last_logits
        if self.length < held.length:
            raise ValueError(f"held prompt of {held.length} positions has only {self.length} left in its cache")
        self.crop(held.length)
        return held.first

    @torch.inference_mode()
    def forward(self, ids) -> list[int]:
        """One pass over ``ids`` appended to the cache; the argmax token at each position."""
        if self.cache is None:
            raise ValueError("call prefill() before forward()")
        logits = self._run(self._ids(ids))
        self.last_logits = logits
        return logits.argmax(-1).tolist()

    def greedy(self, first: int, count: int) -> list[int]:
        """``count`` greedy tokens decoded one per pass from the current cache, starting by feeding
        ``first`` (the token after the cache); the cache grows by ``count`` positions."""
        out, tok = [], int(first)
        for _ in range(count):
            tok = self.forward([tok])[0]
            out.append(tok)
        return out

    @contextmanager
    def routing_tap(self):
        """Within the block, count each pass's distinct (expert, layer) pairs: the experts the
        deduplicating kernel reads, summed over the MoE layers (paper 1's u(n) per layer, times
        L). Yields a list that holds one count per pass once the block ends. The taps add one
        copy of each layer's ``[n, m]`` expert ids per pass (microseconds against a pass of
        milliseconds); the counting happens after the block."""
        if self.switch is None:
            raise ValueError("routing is recorded by the kernel switch; build the engine with install_kernels=True")
        if self.switch.record is not None:
            raise ValueError("a routing record is already open on this engine")
        counts: list[int] = []
        starts: list[int] = []
        record: list = []

        def mark(start, ids):
            starts.append(len(record))

        self.switch.record = record
        self.pass_listeners.append(mark)
        try:
            yield counts
        finally:
            self.pass_listeners.remove(mark)
            self.switch.record = None
        for a, b in zip(starts, starts[1:] + [len(record)]):
            counts.append(int(sum(len(np.unique(ids)) for _, ids in record[a:b])))

    def record_routing(self, ids) -> np.ndarray:
        """Teacher-force ``ids`` in one pass and return the experts each token chose,
        ``[len(ids), L, m]`` (the routing of the verified text); the cache is restored."""
        if self.switch is None:
            raise ValueError("routing is recorded by the kernel switch; build the engine with install_kernels=True")
        start = self.length
        self.switch.record = []
        try:
            self.forward(ids)
            calls = self.switch.record
        finally:
            self.switch.record = None
        self.crop(start)
        calls.sort(key=lambda c: c[0])
        return np.stack([ids_ for _, ids_ in calls], axis=1)
