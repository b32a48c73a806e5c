"""Function-preserving widening: experts (and a draft's dense MLPs) that read and multiply more
bytes per token while computing exactly the same function.

Why. Paper 1's and paper 2's whole-model findings concern targets whose decode step is dominated
by reading expert weights (paper 1, Section 2: the expert operation of one MoE layer reads
``U x b`` bytes). The default MoE trained here is small (H = 128, I = 64), so its expert operation
is a few percent of a decode step and per-pass framework overhead dominates. The byte-faithful
subject keeps the trained model's function -- its routing, tokens, draft acceptance -- and gives
each expert the bytes of a published model's expert (docs/engine.md, "The byte-faithful subject").

How. A SwiGLU expert computes ``y = W_down (silu(W_gate x) * (W_up x))`` with ``W_gate, W_up``
``[I, H]`` and ``W_down`` ``[H, I]``. Appending ``I' - I`` intermediate neurons whose gate and up
rows are random and whose down-projection columns are zero leaves ``y`` unchanged: each added
neuron's activation is finite and is multiplied by a zero column. The kernels have no zero test
(docs/kernels.md), so every added byte is read and multiplied like the trained ones.

Formats. The widening is done in the kernel's storage format (:mod:`moespec.kernels.weights`):
for ``int8_b32`` the trained rows are quantized first (blocks of 32 along H, untouched by the
widening) and the added down columns are whole zero blocks with scale 0, so the widened int8
layer computes what the unwidened int8 layer computes. For f32/bf16 the trained values are
copied bit for bit. Only the summation order of the kernels' reductions may differ (longer rows
are split into other chunks), so outputs agree to the format's rounding, not bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from moespec.kernels.dense import DenseWeights, dense_forward
from moespec.kernels.weights import BLOCK, ExpertWeights, normalize_format, random_values
from moespec.model_shapes import MoESpec, format_bytes, get_spec


def widened_intermediate(hidden_size: int, like: MoESpec | str, fmt: str) -> int:
    """I' such that an expert of hidden size ``hidden_size`` and intermediate size I' occupies, in
    kernel format ``fmt``, exactly the bytes of one expert of the published model ``like``
    (:meth:`moespec.model_shapes.MoESpec.expert_bytes`): ``3 H I' = 3 H_pub I_pub`` weights.

    Raises when no whole I' exists (H_pub I_pub not a multiple of H) or when I' is not a whole
    number of the format's blocks along the down projection's reduction dimension."""
    spec = get_spec(like) if isinstance(like, str) else like
    fmt = normalize_format(fmt)
    weights = spec.hidden_size * spec.expert_intermediate
    if weights % hidden_size:
        raise ValueError(f"{spec.name}: H*I = {weights} is not a multiple of the subject's hidden size "
                         f"{hidden_size}; no whole intermediate size gives the same bytes")
    inter = weights // hidden_size
    if fmt == "int8_b32" and inter % BLOCK:
        raise ValueError(f"{spec.name}: widened intermediate size {inter} is not a multiple of the "
                         f"int8_b32 block ({BLOCK})")
    if format_bytes(3 * hidden_size * inter, fmt) != spec.expert_bytes(fmt):
        raise AssertionError("widened expert bytes differ from the published expert's")  # cannot happen
    return inter


def widen_expert_weights(weights: ExpertWeights, intermediate: int, seed: int = 0) -> ExpertWeights:
    """The layer ``weights`` with intermediate size ``intermediate`` (>= its own): the trained
    gate/up rows and down columns first, then ``intermediate - I`` added neurons per expert with
    random gate/up rows (:func:`moespec.kernels.weights.random_values`, seeded) and zero down
    columns (int8: zero values and zero scales). Same device and format; the function of every
    expert is unchanged (module docstring)."""
    n, h, i = weights.shape
    extra = int(intermediate) - i
    if extra < 0:
        raise ValueError(f"cannot widen an intermediate size of {i} to {intermediate} (smaller)")
    if extra == 0:
        return weights
    if weights.is_quantized and int(intermediate) % BLOCK:
        raise ValueError(f"int8_b32 needs the widened intermediate size ({intermediate}) to be a multiple of {BLOCK}")
    gen = torch.Generator().manual_seed(int(seed))
    dev = weights.device

    def rows(trained, trained_scale):
        """[N, I', H]: trained rows, then random ones (values and, for int8, scales)."""
        pad, pad_scale = random_values(n, extra, h, weights.fmt, gen)
        vals = torch.cat([trained, pad.to(dev)], dim=1)
        scales = None if trained_scale is None else torch.cat([trained_scale, pad_scale.to(dev)], dim=1)
        return vals, scales

    gate, gate_s = rows(weights.gate, weights.gate_scale)
    up, up_s = rows(weights.up, weights.up_scale)
    down = torch.zeros((n, h, intermediate), dtype=weights.down.dtype, device=dev)
    down[:, :, :i] = weights.down
    down_s = None
    if weights.is_quantized:
        down_s = torch.zeros((n, h, intermediate // BLOCK), dtype=torch.float32, device=dev)
        down_s[:, :, :i // BLOCK] = weights.down_scale
    return ExpertWeights(weights.fmt, gate.contiguous(), up.contiguous(), down.contiguous(),
                         None if gate_s is None else gate_s.contiguous(),
                         None if up_s is None else up_s.contiguous(), down_s)


def embed_expert_weights(weights: ExpertWeights, hidden_size: int, intermediate: int,
                         seed: int = 0) -> ExpertWeights:
    """The layer ``weights`` ``(N, H, I)`` embedded in experts of shape ``(N, hidden_size,
    intermediate)`` (a published model's H_pub >= H and I_pub >= I): each trained expert is the
    top-left corner of a larger SwiGLU expert.

    gate/up ``[I_pub, H_pub]``: the trained ``[I, H]`` block, random values in every other entry
    (:func:`moespec.kernels.weights.random_values`, seeded). down ``[H_pub, I_pub]``: rows 0..H-1
    hold the trained ``[H, I]`` block followed by zeros; rows H..H_pub-1 are random. Fed the
    token's hidden state padded with zeros to H_pub (:class:`moespec.engine.switch.KernelExperts`
    does this), the first H outputs are exactly the trained expert's: the random gate/up columns
    meet zero inputs, the added neurons meet zero down columns; outputs H..H_pub-1 are computed
    and dropped. So the kernel runs at the published shape and reads the published expert's
    bytes in the format (int8_b32: the trained blocks of 32 quantize as in the unwidened layer).
    """
    n, h, i = weights.shape
    H, I = int(hidden_size), int(intermediate)
    if H < h or I < i:
        raise ValueError(f"cannot embed experts of H={h}, I={i} in a smaller shape H={H}, I={I}")
    if (H, I) == (h, i):
        return weights
    if weights.is_quantized and (H % BLOCK or I % BLOCK or h % BLOCK):
        raise ValueError(f"int8_b32 needs H={H}, I={I} and the trained H={h} to be multiples of {BLOCK}")
    gen = torch.Generator().manual_seed(int(seed))
    dev = weights.device
    out = []
    for trained, scale, rows, k, zero_cols in ((weights.gate, weights.gate_scale, I, H, False),
                                               (weights.up, weights.up_scale, I, H, False),
                                               (weights.down, weights.down_scale, H, I, True)):
        vals, scales = random_values(n, rows, k, weights.fmt, gen)
        vals, scales = vals.to(dev), None if scales is None else scales.to(dev)
        r, c = trained.shape[1], trained.shape[2]      # the trained block [r, c]
        if zero_cols:                                   # down: rows 0..H-1 zero past the trained columns
            vals[:, :r, :] = 0
            if scales is not None:
                scales[:, :r, :] = 0
        vals[:, :r, :c] = trained
        if scales is not None:
            scales[:, :r, :c // BLOCK] = scale
        out += [vals.contiguous(), None if scales is None else scales.contiguous()]
    gate, gate_s, up, up_s, down, down_s = out
    return ExpertWeights(weights.fmt, gate, up, down, gate_s, up_s, down_s)


# --- the draft: dense SwiGLU MLPs (Llama-style gate_proj / up_proj / down_proj) -----------------
def dense_mlps(model: nn.Module) -> list[nn.Module]:
    """The decoder layers' dense SwiGLU MLPs (``mlp.gate_proj``, ``mlp.up_proj``, ``mlp.down_proj``)."""
    layers = getattr(getattr(model, "model", model), "layers", None)
    mlps = [layer.mlp for layer in (layers or []) if all(hasattr(getattr(layer, "mlp", None), p)
                                                       for p in ("gate_proj", "up_proj", "down_proj"))]
    if not mlps:
        raise ValueError(f"{type(model).__name__} has no dense SwiGLU MLPs (layer.mlp.gate_proj/up_proj/down_proj)")
    return mlps


def dense_mlp_bytes(model: nn.Module) -> int:
    """Bytes of the dense MLP weights one token reads (every layer's gate, up and down)."""
    return sum(sum(p.weight.numel() * p.weight.element_size() for p in (m.gate_proj, m.up_proj, m.down_proj))
               for m in dense_mlps(model))


def widen_dense_mlps(model: nn.Module, intermediate: int, seed: int = 0) -> nn.Module:
    """Widen every dense SwiGLU MLP of ``model`` (in place) to ``intermediate`` neurons: random
    gate/up rows (N(0, 1/H), seeded) and zero down-projection columns, so the model computes the
    same function while each token reads ``3 H intermediate`` weights per layer. Biases, if any,
    get zeros for the added gate/up rows. Returns ``model`` (its config's ``intermediate_size`` is
    updated)."""
    gen = torch.Generator().manual_seed(int(seed))
    for mlp in dense_mlps(model):
        g, u, d = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        i, h = g.weight.shape
        extra = int(intermediate) - i
        if extra < 0:
            raise ValueError(f"cannot widen an MLP of {i} neurons to {intermediate} (smaller)")
        if extra == 0:
            continue
        for lin in (g, u):
            pad = random_values(1, extra, h, "f32", gen)[0][0].to(lin.weight.dtype).to(lin.weight.device)
            new = nn.Linear(h, int(intermediate), bias=lin.bias is not None, dtype=lin.weight.dtype,
                            device=lin.weight.device)
            with torch.no_grad():
                new.weight.copy_(torch.cat([lin.weight, pad], dim=0))
                if lin.bias is not None:
                    new.bias.copy_(torch.cat([lin.bias, lin.bias.new_zeros(extra)]))
            setattr(mlp, "gate_proj" if lin is g else "up_proj", new)
        new = nn.Linear(int(intermediate), h, bias=d.bias is not None, dtype=d.weight.dtype, device=d.weight.device)
        with torch.no_grad():
            new.weight.zero_()
            new.weight[:, :i] = d.weight
            if d.bias is not None:
                new.bias.copy_(d.bias)
        mlp.down_proj = new
        if hasattr(mlp, "intermediate_size"):
            mlp.intermediate_size = int(intermediate)
    if hasattr(model, "config"):
        model.config.intermediate_size = int(intermediate)
    return model


def draft_intermediate(model: nn.Module, mlp_bytes: float) -> int:
    """The dense-MLP width at which one token of ``model`` reads ``mlp_bytes`` bytes of MLP
    weights in all (at least the model's own width; rounded to a multiple of 32)."""
    mlps = dense_mlps(model)
    i, h = mlps[0].gate_proj.weight.shape
    per_neuron = 3 * h * mlps[0].gate_proj.weight.element_size() * len(mlps)
    want = int(round(float(mlp_bytes) / per_neuron / 32.0)) * 32
    return max(i, want)


# --- attention projections and the LM head: dense matrices padded to a published model's ---------
#: The attention projections of an OLMoE-family decoder layer (``layer.self_attn.<name>``).
ATTENTION_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


class PaddedLinear(nn.Module):
    """A bias-free ``nn.Linear`` weight ``[out, in]`` embedded in a dense matrix ``[out_pad, in_pad]``
    in a kernel format (:class:`moespec.kernels.dense.DenseWeights`), run by
    :func:`moespec.kernels.dense.dense_forward`.

    The trained block is the top-left corner (int8_b32: quantized in blocks of 32 along ``in`` as
    the unpadded layer is); every other entry is random (:func:`moespec.kernels.weights.random_values`,
    seeded). x is padded with zeros to ``in_pad``, the whole matrix is multiplied (every byte read;
    the kernels have no zero test) and the first ``out`` outputs are kept: the random columns meet
    zero inputs (exact zeros; int8: an all-zero activation block has scale 0) and the random rows are
    computed and dropped. With ``out_pad = out`` and ``in_pad = in`` it is the layer itself in the
    format: the reference its padding preserves (tests/test_widen_dense.py)."""

    def __init__(self, weight: torch.Tensor, in_pad: int, out_pad: int, fmt: str, seed: int = 0,
                 backend: str = "auto"):
        super().__init__()
        out, inp = (int(v) for v in weight.shape)
        in_pad, out_pad = int(in_pad), int(out_pad)
        fmt = normalize_format(fmt)
        if in_pad < inp or out_pad < out:
            raise ValueError(f"cannot pad a [{out}, {inp}] matrix to a smaller [{out_pad}, {in_pad}]")
        if fmt == "int8_b32" and (inp % BLOCK or in_pad % BLOCK):
            raise ValueError(f"int8_b32 needs the input sizes {inp} and {in_pad} to be multiples of {BLOCK}")
        trained = DenseWeights.from_float(weight.detach().float().cpu(), fmt)
        if (out_pad, in_pad) != (out, inp):
            vals, scales = random_values(1, out_pad, in_pad, fmt, torch.Generator().manual_seed(int(seed)))
            vals, scales = vals[0], None if scales is None else scales[0]
            vals[:out, :inp] = trained.values
            if scales is not None:
                scales[:out, :inp // BLOCK] = trained.scale
            trained = DenseWeights(fmt, vals.contiguous(), None if scales is None else scales.contiguous())
        dev = weight.device
        self.weights = DenseWeights(fmt, trained.values.to(dev),
                                    None if trained.scale is None else trained.scale.to(dev))
        self.in_features, self.out_features, self.backend = inp, out, backend

    @property
    def nbytes(self) -> int:
        """Bytes one pass reads (the whole padded matrix in its format)."""
        return self.weights.nbytes

    def extra_repr(self) -> str:
        n, k = self.weights.shape
        return f"[{self.out_features}, {self.in_features}] in [{n}, {k}] {self.weights.fmt}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        flat = x.reshape(-1, x.shape[-1]).float()
        pad = self.weights.shape[1] - self.in_features
        if pad:
            flat = nn.functional.pad(flat, (0, pad))
        y = dense_forward(flat, self.weights, self.backend)[:, :self.out_features]
        return y.reshape(*lead, self.out_features).to(x.dtype)


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The decoder layers' attention modules (``layer.self_attn`` with q/k/v/o projections)."""
    layers = getattr(getattr(model, "model", model), "layers", None) or []
    found = [layer.self_attn for layer in layers
             if all(hasattr(getattr(layer, "self_attn", None), p) for p in ATTENTION_PROJECTIONS)]
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention modules with {ATTENTION_PROJECTIONS}")
    return found


def attention_projections(model: nn.Module) -> list[nn.Module]:
    """Every dense projection of every decoder layer's attention (``layer.self_attn``'s
    ``nn.Linear`` / :class:`PaddedLinear` submodules, in module order): q, k, v and o in the OLMoE
    family, DeepSeek-V2's latent-attention projections (``q_proj`` or ``q_a_proj``/``q_b_proj``,
    ``kv_a_proj_with_mqa``, ``kv_b_proj``, ``o_proj``), whatever a family has."""
    layers = getattr(getattr(model, "model", model), "layers", None) or []
    found = [mod for layer in layers if getattr(layer, "self_attn", None) is not None
             for mod in layer.self_attn.modules() if isinstance(mod, (nn.Linear, PaddedLinear))]
    if not found:
        raise ValueError(f"{type(model).__name__} has no attention projections (no nn.Linear in layer.self_attn)")
    return found


def published_head_rows(spec: MoESpec, layers: int) -> int:
    """LM-head rows for a subject of ``layers`` decoder layers whose per-step head bytes stand to its
    layers' bytes as the published model's do: ``V_pub * layers / L_pub`` (e.g. OLMoE, 4 of 16
    layers: 50304 / 4 = 12576 rows of H_pub)."""
    rows = spec.vocab_size * int(layers)
    if rows % spec.num_layers:
        raise ValueError(f"{spec.name}: V = {spec.vocab_size} x {layers} layers is not a multiple of its "
                         f"{spec.num_layers} layers")
    return rows // spec.num_layers


def widen_attention_and_head(model: nn.Module, like: MoESpec | str, fmt: str, seed: int = 0,
                             backend: str = "auto") -> dict:
    """Replace, in place, every attention projection of ``model`` by a :class:`PaddedLinear` of the
    published model ``like``'s projection shape (q, o: ``heads * head_dim`` by H_pub; k, v:
    ``kv_heads * head_dim`` by H_pub) and its LM head by one of :func:`published_head_rows` rows of
    H_pub, all in ``fmt``; the embedding stays the trained one (one row per token: its bytes per
    step are negligible in both). Returns the widened shapes. The model must be bias-free there."""
    spec = get_spec(like) if isinstance(like, str) else like
    rows = published_head_rows(spec, len(attention_modules(model)))
    return _pad_dense(model, spec.attention_shapes(), (rows, spec.hidden_size), fmt, seed, backend)


def attention_and_head_in_format(model: nn.Module, fmt: str, backend: str = "auto") -> dict:
    """The unpadded reference of :func:`widen_attention_and_head`: every attention projection and
    the LM head of ``model`` replaced, in place, by itself in ``fmt`` (a :class:`PaddedLinear`
    without padding), so that the two compute the same function by construction."""
    attn = attention_modules(model)[0]
    shapes = {p: tuple(getattr(attn, p).weight.shape) for p in ATTENTION_PROJECTIONS}
    return _pad_dense(model, shapes, tuple(model.get_output_embeddings().weight.shape), fmt, 0, backend)


def _pad_dense(model: nn.Module, shapes: dict, head_shape: tuple, fmt: str, seed: int, backend: str) -> dict:
    for li, attn in enumerate(attention_modules(model)):
        for j, name in enumerate(ATTENTION_PROJECTIONS):
            lin = getattr(attn, name)
            if getattr(lin, "bias", None) is not None:
                raise ValueError(f"layer {li} {name} has a bias; the padded projections are bias-free")
            out_pad, in_pad = shapes[name]
            setattr(attn, name, PaddedLinear(lin.weight, in_pad, out_pad, fmt, seed=seed * 1000 + li * 10 + j,
                                             backend=backend))
    head = model.get_output_embeddings()
    if getattr(head, "bias", None) is not None:
        raise ValueError("the LM head has a bias; the padded head is bias-free")
    model.lm_head = PaddedLinear(head.weight, head_shape[1], head_shape[0], fmt, seed=seed * 1000 + 999,
                                 backend=backend)
    if hasattr(model, "config"):
        model.config.tie_word_embeddings = False      # the head is its own (padded) matrix now
    return {**{name: list(shapes[name]) for name in ATTENTION_PROJECTIONS}, "lm_head": list(head_shape)}
