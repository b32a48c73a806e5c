"""Routed-expert weights of one MoE layer in the storage formats the kernels read.

An expert is a SwiGLU block: ``gate`` and ``up`` are ``[I, H]`` and ``down`` is ``[H, I]``, so a
layer of ``N`` experts holds ``gate, up: [N, I, H]`` and ``down: [N, H, I]`` (rows are output
features, the last dimension is the reduction dimension, as in ``torch.nn.Linear.weight``).

Formats (names as in :data:`moespec.model_shapes.FORMATS`):

* ``"f32"``  -- float32 tensors.
* ``"bf16"`` -- bfloat16 tensors.
* ``"int8_b32"`` -- int8 values plus one float32 scale per block of 32 consecutive values along
  the reduction dimension (like ggml's Q8_0, but with an fp32 scale: 36 bytes per 32 weights).
  The weight at ``[e, r, k]`` is ``q[e, r, k] * scale[e, r, k // 32]``; scales are
  ``[N, I, H/32]`` for gate/up and ``[N, H, I/32]`` for down.

The bytes of one expert, ``bytes_per_expert``, come from :func:`moespec.model_shapes.format_bytes`, the
same count the byte model (paper 1, Section 2: ``b = w_l``) uses.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from moespec.model_shapes import MoESpec, format_bytes, get_spec

#: Storage formats the kernels implement, with the torch dtype of their value tensors.
KERNEL_FORMATS: dict[str, torch.dtype] = {"f32": torch.float32, "bf16": torch.bfloat16, "int8_b32": torch.int8}
#: Values per scale in ``int8_b32``.
BLOCK = 32
_ALIASES = {"fp32": "f32", "float32": "f32", "float": "f32", "bfloat16": "bf16", "int8": "int8_b32",
            "q8": "int8_b32"}


def normalize_format(fmt: str) -> str:
    """Canonical format name (accepts ``fp32``/``float32``, ``bfloat16``, ``int8``)."""
    key = _ALIASES.get(str(fmt).lower(), str(fmt).lower())
    if key not in KERNEL_FORMATS:
        raise ValueError(f"unsupported kernel format {fmt!r}; expected one of {sorted(KERNEL_FORMATS)} "
                         f"(aliases {sorted(_ALIASES)})")
    return key


def quantize_blocks(t: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization with one scale per ``block`` values of the last dimension.

    Returns ``(q int8 [..., K], scale float32 [..., K/block])`` with ``scale = max|t| / 127`` per
    block and ``q = round(t / scale)`` (round half to even); an all-zero block gets scale 0. A block
    holding NaN or +-inf gets values 0 and scale NaN, so that it dequantizes to NaN and every
    product with it is NaN (the non-finite rule of docs/kernels.md; the C++ and CUDA quantizers
    do the same).
    """
    k = t.shape[-1]
    if k % block:
        raise ValueError(f"last dimension {k} is not a multiple of the block size {block}")
    tb = t.float().reshape(*t.shape[:-1], k // block, block)
    finite = torch.isfinite(tb).all(dim=-1)
    tb = torch.where(finite.unsqueeze(-1), tb, torch.zeros_like(tb))
    scale = tb.abs().amax(dim=-1) / 127.0
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = torch.round(tb * inv.unsqueeze(-1)).clamp_(-127, 127).to(torch.int8)
    scale = torch.where(finite, scale, torch.full_like(scale, float("nan")))
    return q.reshape(t.shape), scale.float()


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """Inverse of :func:`quantize_blocks`: ``q * scale`` broadcast over each block."""
    k = q.shape[-1]
    block = k // scale.shape[-1]
    v = q.to(dtype).reshape(*q.shape[:-1], scale.shape[-1], block) * scale.to(dtype).unsqueeze(-1)
    return v.reshape(q.shape)


def random_values(n: int, rows: int, k: int, fmt: str, gen: torch.Generator):
    """Random ``[n, rows, k]`` weights in format ``fmt`` and their scales (``None`` for the float
    formats), drawn on the generator's device: N(0, 1/k) values for the float formats; for
    ``int8_b32`` int8 values drawn directly (uniform in [-127, 127]) with positive scales of order
    1/(127 sqrt k), so that a large tensor needs no float copy. Used by
    :meth:`ExpertWeights.random` and by the function-preserving widening of
    :mod:`moespec.engine.widen`."""
    fmt = normalize_format(fmt)
    where = gen.device
    if fmt == "int8_b32":
        if k % BLOCK:
            raise ValueError(f"int8_b32 needs the reduction size {k} to be a multiple of {BLOCK}")
        q = torch.randint(-127, 128, (n, rows, k), generator=gen, dtype=torch.int8, device=where)
        s = ((torch.rand((n, rows, k // BLOCK), generator=gen, device=where) + 0.5)
             * (math.sqrt(3.0) / (127 * math.sqrt(k))))
        return q, s
    w = torch.empty((n, rows, k), dtype=KERNEL_FORMATS[fmt], device=where)
    for e in range(n):  # one expert at a time keeps the float32 temporary small
        w[e] = torch.randn((rows, k), generator=gen, device=where).mul_(1.0 / math.sqrt(k))
    return w, None


def _shape_of(spec_or_shape) -> tuple[int, int, int]:
    """(N, H, I) from a MoESpec, a preset name or a tuple ``(N, H, I)``."""
    if isinstance(spec_or_shape, str):
        spec_or_shape = get_spec(spec_or_shape)
    if isinstance(spec_or_shape, MoESpec):
        return spec_or_shape.num_experts, spec_or_shape.hidden_size, spec_or_shape.expert_intermediate
    try:
        n, h, i = (int(v) for v in spec_or_shape)
    except (TypeError, ValueError):
        raise TypeError(f"expected a MoESpec, a preset name or a tuple (N, H, I); got {spec_or_shape!r}") from None
    return n, h, i


@dataclass
class ExpertWeights:
    """The routed experts of one MoE layer: ``gate, up [N, I, H]``, ``down [N, H, I]``.

    For ``int8_b32`` the value tensors are int8 and ``*_scale`` hold the fp32 block scales;
    for the float formats the scales are ``None``. Build with :meth:`random` or :meth:`from_tensors`.
    Treat it as immutable: derived layouts (the CPU int8 packing) and the cpp backend's call plan
    are computed once per object and kept on it (:meth:`cached`); for other tensors build a new one.
    """

    fmt: str
    gate: torch.Tensor
    up: torch.Tensor
    down: torch.Tensor
    gate_scale: torch.Tensor | None = None
    up_scale: torch.Tensor | None = None
    down_scale: torch.Tensor | None = None
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    def __post_init__(self):
        self.fmt = normalize_format(self.fmt)
        self.validate()

    # --- shape and bytes ------------------------------------------------------------------
    @property
    def num_experts(self) -> int:
        return self.gate.shape[0]

    @property
    def hidden_size(self) -> int:
        return self.gate.shape[2]

    @property
    def intermediate_size(self) -> int:
        return self.gate.shape[1]

    @property
    def shape(self) -> tuple[int, int, int]:
        """(N, H, I)."""
        return self.num_experts, self.hidden_size, self.intermediate_size

    @property
    def device(self) -> torch.device:
        return self.gate.device

    @property
    def bytes_per_expert(self) -> int:
        """b: bytes of one expert in this format (the byte model's ``w_l``)."""
        return format_bytes(3 * self.hidden_size * self.intermediate_size, self.fmt)

    @property
    def total_bytes(self) -> int:
        return self.num_experts * self.bytes_per_expert

    @property
    def is_quantized(self) -> bool:
        return self.fmt == "int8_b32"

    def tensors(self) -> tuple:
        """``(gate, up, down, gate_scale, up_scale, down_scale)`` in the order the ops take them."""
        return self.gate, self.up, self.down, self.gate_scale, self.up_scale, self.down_scale

    def validate(self) -> None:
        """Check shapes, dtypes, devices and contiguity; raise ``ValueError`` naming the problem."""
        dtype = KERNEL_FORMATS[self.fmt]
        g, u, d = self.gate, self.up, self.down
        if g.dim() != 3 or u.dim() != 3 or d.dim() != 3:
            raise ValueError(f"expert weights must be 3-D; got gate {tuple(g.shape)}, up {tuple(u.shape)}, "
                             f"down {tuple(d.shape)}")
        n, i, h = g.shape
        for name, t, want in (("gate", g, (n, i, h)), ("up", u, (n, i, h)), ("down", d, (n, h, i))):
            if tuple(t.shape) != want:
                raise ValueError(f"{name}: expected shape {want} ([N, I, H] for gate/up, [N, H, I] for down), "
                                 f"found {tuple(t.shape)}")
            if t.dtype != dtype:
                raise ValueError(f"{name}: format {self.fmt} stores {dtype}, found {t.dtype}")
            if t.device != g.device:
                raise ValueError(f"{name} is on {t.device}, gate on {g.device}; all weights must share a device")
        scales = (self.gate_scale, self.up_scale, self.down_scale)
        if self.fmt == "int8_b32":
            if h % BLOCK or i % BLOCK:
                raise ValueError(f"int8_b32 needs H and I multiples of {BLOCK}; got H={h}, I={i}")
            for name, s, want in (("gate_scale", scales[0], (n, i, h // BLOCK)),
                                  ("up_scale", scales[1], (n, i, h // BLOCK)),
                                  ("down_scale", scales[2], (n, h, i // BLOCK))):
                if s is None or tuple(s.shape) != want or s.dtype != torch.float32 or s.device != g.device:
                    found = None if s is None else (tuple(s.shape), s.dtype, str(s.device))
                    raise ValueError(f"{name}: expected float32 {want} on {g.device}, found {found}")
        elif any(s is not None for s in scales):
            raise ValueError(f"format {self.fmt} takes no scales")
        for t in (g, u, d) + scales:
            if t is not None and not t.is_contiguous():
                raise ValueError("expert weight tensors must be contiguous (call .contiguous() first)")

    # --- construction ---------------------------------------------------------------------
    @classmethod
    def from_tensors(cls, gate, up, down, fmt: str | None = None, gate_scale=None, up_scale=None,
                     down_scale=None) -> "ExpertWeights":
        """Wrap or convert tensors. Float tensors are cast (``f32``, ``bf16``) or block-quantized
        (``int8_b32``) to ``fmt``; int8 tensors need their scales. ``fmt=None`` keeps the dtype's
        own format."""
        if fmt is None:
            fmt = {torch.float32: "f32", torch.bfloat16: "bf16", torch.int8: "int8_b32"}.get(gate.dtype)
            if fmt is None:
                raise ValueError(f"cannot infer a format from dtype {gate.dtype}; pass fmt=")
        fmt = normalize_format(fmt)
        if fmt == "int8_b32" and gate.dtype != torch.int8:
            (gate, gate_scale), (up, up_scale), (down, down_scale) = (quantize_blocks(t) for t in (gate, up, down))
        elif fmt != "int8_b32":
            gate, up, down = (t.to(KERNEL_FORMATS[fmt]) for t in (gate, up, down))
        c = lambda t: None if t is None else t.contiguous()  # noqa: E731
        return cls(fmt, c(gate), c(up), c(down), c(gate_scale), c(up_scale), c(down_scale))

    @classmethod
    def random(cls, spec_or_shape, fmt: str = "f32", seed: int = 0, device="cpu",
               num_experts: int | None = None, on_device: bool = False) -> "ExpertWeights":
        """Random experts with the shape of a model spec (or ``(N, H, I)``), for timing and tests.

        Values are N(0, 1/K) for reduction length K, so outputs stay O(1) for O(1) inputs;
        int8 values are drawn directly (uniform in [-127, 127], scales positive and O(1/(127 sqrt K)))
        so that a 1.6 GB layer needs no float copy. ``num_experts`` overrides N (tests use fewer).
        ``on_device``: draw them on ``device`` with its own generator (a published layer in f32 is
        up to 3.2 GB; drawing it on the host would dominate a GPU benchmark); the values then differ
        from the host-drawn ones of the same seed.
        """
        fmt = normalize_format(fmt)
        n, h, i = _shape_of(spec_or_shape)
        if num_experts is not None:
            n = int(num_experts)
        where = torch.device(device) if on_device else torch.device("cpu")
        gen = torch.Generator(device=where).manual_seed(int(seed))
        make = lambda rows, k: random_values(n, rows, k, fmt, gen)  # noqa: E731
        (g, gs), (u, us), (d, ds) = make(i, h), make(i, h), make(h, i)
        w = cls(fmt, g, u, d, gs, us, ds)
        return w.to(device)

    def to(self, device) -> "ExpertWeights":
        device = torch.device(device)
        if device == self.device:
            return self
        mv = lambda t: None if t is None else t.to(device)  # noqa: E731
        return ExpertWeights(self.fmt, *(mv(t) for t in self.tensors()))

    def subset(self, experts) -> "ExpertWeights":
        """The experts ``experts`` (a list of indices) as a smaller layer, renumbered 0..len-1."""
        idx = torch.as_tensor(list(experts), dtype=torch.long, device=self.device)
        sel = lambda t: None if t is None else t.index_select(0, idx).contiguous()  # noqa: E731
        return ExpertWeights(self.fmt, *(sel(t) for t in self.tensors()))

    # --- values ---------------------------------------------------------------------------
    def dequantized(self, experts=None, dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact values ``(gate, up, down)`` of the given experts (all if ``None``) in ``dtype``."""
        idx = None if experts is None else torch.as_tensor(experts, dtype=torch.long, device=self.device)
        pick = (lambda t: t) if idx is None else (lambda t: t.index_select(0, idx))
        if self.fmt == "int8_b32":
            return tuple(dequantize_blocks(pick(q), pick(s), dtype)
                         for q, s in ((self.gate, self.gate_scale), (self.up, self.up_scale),
                                      (self.down, self.down_scale)))
        return tuple(pick(t).to(dtype) for t in (self.gate, self.up, self.down))

    def cached(self, key, make):
        """Something derived from the weights (a backend's packed layout, the cpp backend's call
        plan) computed once per weights object by ``make()``."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]
