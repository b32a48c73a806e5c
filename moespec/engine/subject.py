"""The subject of the whole-model notebooks (05, 06, 07, 08): which target, which draft, where they run.

``model=`` names one of five subjects (docs/engine.md, "Subjects"):

* ``"byte-faithful-all"`` (default): the byte-faithful subject below with its attention
  projections and LM head embedded, function-preservingly, in OLMoE-sized matrices too, so that
  every component's share of a step's bytes is OLMoE's (:func:`widen_attention_and_head`).
* ``"byte-faithful"``: the trained default MoE with every expert embedded,
  function-preservingly, in an expert of a published model's shape (``like``, OLMoE by default)
  in the kernels' format (``fmt``, int8_b32 by default): the trained model's routing, tokens and
  draft acceptance, the published expert's bytes and shape per expert (:mod:`moespec.engine.widen`).
  The draft is the trained draft; ``draft_cost`` (a share of the target's expert bytes per token)
  widens its dense MLPs, function-preservingly, to make a drafted token costlier.
* ``"default"``: the trained default MoE and draft as they are (f32).
* ``"replay"``: a published expert shape (``like``) with random weights, routing replayed from a
  :class:`~moespec.routing.RoutingTrace` (``trace_file``), the oracle draft (:mod:`moespec.engine.replay`).
* a path to a local transformers MoE checkpoint (OLMoE, Qwen3-MoE, Mixtral, DeepSeek-V2 layouts;
  gpt-oss is refused by the switch), with ``draft=`` a checkpoint sharing its tokenizer (or none:
  the oracle draft only).

The quick profile builds the same kinds on tiny random models (seconds). Every subject carries a
``label`` that every figure and table made on it names, and a ``description`` of what is real and
what is padding.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from moespec import paths
from moespec import zoo
from moespec.engine import prompts as P
from moespec.engine.operation import layer_weights
from moespec.engine.replay import published_model, replay_engine
from moespec.engine.target import Engine
from moespec.engine.widen import (attention_and_head_in_format, dense_mlp_bytes, dense_mlps, draft_intermediate,
                                  embed_expert_weights, widen_attention_and_head, widen_dense_mlps,
                                  widen_expert_weights, widened_intermediate)
from moespec.model_shapes import MoESpec, get_spec, register
from moespec.routing import RoutingTrace, synthetic

KINDS = ("byte-faithful", "byte-faithful-all", "default", "replay")

#: The quick profile's stand-in for a published expert shape (byte-faithful and replay subjects):
#: small enough for seconds-long runs; not a published model.
QUICK_LIKE = MoESpec(name="quick-like", paper_label="quick-profile stand-in (not a published model)",
                     num_experts=16, top_k=4, num_layers=2, num_moe_layers=2, hidden_size=256,
                     expert_intermediate=128, default_format="int8_b32", num_attention_heads=4,
                     num_key_value_heads=4, head_dim=64, vocab_size=512,
                     source="moespec.engine.subject.QUICK_LIKE (tests and the quick profile)")
register("quick-like", lambda: QUICK_LIKE)

#: The tiny random models of the quick profile.
QUICK_MOE = dict(seed=1, vocab_size=256, num_experts=16, top_k=4, num_layers=2, hidden_size=32)
QUICK_DRAFT = dict(seed=2, vocab_size=256)

_DTYPES = {"": None, "auto": "auto", "f32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "f16": torch.float16, "float16": torch.float16}


@dataclass
class Subject:
    """A target (as a :class:`moespec.engine.Engine`), its draft and what they are."""

    kind: str
    label: str
    engine: object
    draft: torch.nn.Module | None
    tokenizer: object | None
    device: str
    description: dict = field(default_factory=dict)
    replay: object | None = None

    @property
    def target(self) -> torch.nn.Module:
        return self.engine.model

    @property
    def vocab_size(self) -> int:
        return int(self.target.config.vocab_size)

    @property
    def context(self) -> int:
        """Positions a sequence may hold: the model's, or the replayed trace's document length."""
        ctx = int(getattr(self.target.config, "max_position_embeddings", 0) or 0)
        if self.replay is not None:
            ctx = min(ctx, int(min(self.replay.trace.doc_lengths)))
        return ctx

    @property
    def rules_file(self) -> Path:
        """The pre-registered scoring rules for this subject (``data/preregistration/``): the
        byte-faithful-all subject's own file, the default subject's, and for every other kind the
        byte-faithful subject's rules with the round-model protocol (pre-registered for the
        byte-faithful subject, applied to the others: :attr:`preregistered`)."""
        name = {"default": "scoring_rules.json",
                "byte-faithful-all": "scoring_rules_byte_faithful_all.json"}.get(self.kind,
                                                                                 "scoring_rules_round_model.json")
        return paths.data_dir() / "preregistration" / name

    @property
    def preregistered(self) -> bool:
        return self.kind in ("byte-faithful", "byte-faithful-all", "default")

    def depth_prompts(self, depth: int, count: int, seed: int = 0) -> list:
        """``count`` prompts of ``depth`` tokens: WikiText validation articles cut to ``depth``
        (paper 1, Section 4) when the subject has a tokenizer; for a replayed subject one prompt
        per trace document (:meth:`moespec.engine.replay.ReplayRouting.prompt`); else seeded
        random ids (the quick profile's random models)."""


        if self.replay is not None:
            if count > self.replay.trace.num_docs:
                raise ValueError(f"the replayed trace has {self.replay.trace.num_docs} documents; {count} prompts asked")
            return [self.replay.prompt(i, depth, self.vocab_size) for i in range(count)]
        if self.tokenizer is not None:
            return P.validation_prompts(self.tokenizer, depth, count=count)[0]
        rng = np.random.default_rng([seed, depth])
        return [rng.integers(1, self.vocab_size, size=depth) for _ in range(count)]

    def chat_prompts(self, count: int, max_tokens: int, seed: int = 0) -> list:
        """``count`` MT-Bench first turns (evenly spaced over the 80, so every category is
        represented; paper 1, Appendix D.3) cut to ``max_tokens``, or seeded random ids of 12..max
        tokens without a tokenizer."""


        if self.tokenizer is not None:
            turns = P.mt_bench_first_turns()
            picked = [turns[i] for i in _spread(len(turns), count)]
            return P.tokenize_prompts(picked, self.tokenizer, max_tokens=max_tokens)
        rng = np.random.default_rng([seed, 1])
        return [rng.integers(1, self.vocab_size, size=min(12, max_tokens)) for _ in range(count)]

    def calibration_chat_prompts(self, count: int, max_tokens: int, test_count: int, seed: int = 0) -> list:
        """``count`` MT-Bench first turns that :meth:`chat_prompts` with ``test_count`` does not pick
        (evenly spaced over the rest), cut to ``max_tokens``: the round calibration's prompts, so
        that the draft's measured cost and the runs it predicts share no prompt. Without a
        tokenizer, seeded random ids drawn apart from the test prompts'."""

        if self.tokenizer is not None:
            turns = P.mt_bench_first_turns()
            used = set(_spread(len(turns), test_count).tolist())
            rest = [i for i in range(len(turns)) if i not in used]
            if count > len(rest):
                raise ValueError(f"{count} calibration prompts asked; {len(rest)} MT-Bench first turns are not "
                                 f"among the {test_count} test prompts")
            picked = [turns[rest[j]] for j in _spread(len(rest), count)]
            return P.tokenize_prompts(picked, self.tokenizer, max_tokens=max_tokens)
        rng = np.random.default_rng([seed, 3])
        return [rng.integers(1, self.vocab_size, size=min(12, max_tokens)) for _ in range(count)]

    def question_prompts(self, texts: list, max_tokens: int, seed: int = 0) -> list:
        """Prompts for the given question texts (paper 2's Spec-Bench first turns), cut to
        ``max_tokens``: tokenized with the subject's tokenizer; for a replayed subject question i
        replays trace document i mod D; else seeded random ids of ``max_tokens`` tokens."""


        if self.replay is not None:
            D = self.replay.trace.num_docs
            return [self.replay.prompt(i % D, max_tokens, self.vocab_size) for i in range(len(texts))]
        if self.tokenizer is not None:
            return P.tokenize_prompts(texts, self.tokenizer, max_tokens=max_tokens)
        rng = np.random.default_rng([seed, 2])
        return [rng.integers(1, self.vocab_size, size=max_tokens) for _ in texts]

    def expert_bytes_per_token(self) -> float:
        """Bytes the experts of one token read over all MoE layers at n = 1 (L m b)."""

        m = int(self.target.config.num_experts_per_tok)
        return float(sum(m * w.bytes_per_expert for w in layer_weights(self.engine).values()))

    def widened_draft(self, draft_cost: float, seed: int = 0) -> torch.nn.Module:
        """A copy of the subject's draft widened to ``draft_cost`` (:func:`widen_draft`; the subject's
        own draft is left as it is)."""
        draft = copy.deepcopy(self.draft)
        widen_draft(draft, self.expert_bytes_per_token(), float(draft_cost), seed=seed)
        return draft


def _spread(total: int, count: int) -> np.ndarray:
    """``count`` indices evenly spaced over 0..total-1 (both ends included)."""
    return np.linspace(0, total - 1, count).round().astype(int)


def _dtype(dtype: str):
    try:
        return _DTYPES[str(dtype).lower()]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(k for k in _DTYPES if k)} or '' (the default); "
                         f"got {dtype!r}") from None


def routing_twin(sub: Subject, profile: str, backend: str = "auto") -> Engine | None:
    """An engine on the model a byte-faithful subject was widened from, in the subject's storage
    format: the trained model's experts (and, for ``"byte-faithful-all"``, its attention projections
    and LM head) quantized as the widened ones are, unpadded, on the subject's device and in its
    precision. The widening is function-preserving, so this narrow twin computes what the subject's
    target computes (the same greedy tokens, logits within 1e-5: tests/test_widen_dense.py) and
    routes every token to the same experts, reading its own few bytes instead of OLMoE's: what an
    untimed computation of the subject's routing may run on (paper 2's counterfactual junk tails,
    :func:`moespec.oracle.junk.sequences_junk_tails`; the fits' WikiText routing,
    :func:`moespec.engine.operation.record_trace_on_twin`), each checking it against the subject
    first. ``profile``: the subject's (the trained models, or the quick profile's tiny ones). None
    for a subject that is not widened (default, replay, a checkpoint): its own engine is the narrow one."""

    if sub.kind not in ("byte-faithful", "byte-faithful-all"):
        return None
    fmt = _first_weights(sub.engine).fmt
    dtype = next(name for name in ("f32", "bf16", "f16") if _DTYPES[name] == next(sub.draft.parameters()).dtype)
    twin = load_subject("default", profile=profile, device=sub.device, backend=backend, fmt=fmt, dtype=dtype).engine
    if sub.kind == "byte-faithful-all":
        attention_and_head_in_format(twin.model, fmt, backend="auto" if backend == "cuda" else backend)
    return twin


def _trained_or_tiny(profile: str, device: str, dtype):
    """(target, draft, tokenizer) of the default subject: trained (full) or tiny random (quick)."""

    if profile == "quick":
        target, draft = zoo.tiny_moe(**QUICK_MOE), zoo.tiny_draft(**QUICK_DRAFT)
        if dtype not in (None, "auto"):
            target, draft = target.to(dtype), draft.to(dtype)
        return target.to(device), draft.to(device), None
    dt = torch.float32 if dtype in (None, "auto") else dtype
    return (zoo.load_default_moe(device, dtype=dt), zoo.load_draft(device, dtype=dt), zoo.load_tokenizer())


def widen_draft(draft: torch.nn.Module, target_bytes_per_token: float, draft_cost: float, seed: int = 0) -> dict:
    """Widen ``draft``'s dense MLPs (in place, function-preserving) so that one drafted token reads
    ``draft_cost`` x the target's expert bytes per token of MLP weights (never narrower than
    trained); returns what was done."""

    if draft_cost < 0:
        raise ValueError(f"draft_cost must be >= 0 (a share of the target's expert bytes per token), got {draft_cost}")
    own = int(dense_mlps(draft)[0].gate_proj.weight.shape[0])
    inter = draft_intermediate(draft, draft_cost * target_bytes_per_token) if draft_cost > 0 else own
    widen_dense_mlps(draft, inter, seed=seed)
    return {"draft_cost": float(draft_cost), "draft_intermediate_trained": own, "draft_intermediate": inter,
            "draft_mlp_bytes_per_token": dense_mlp_bytes(draft),
            "draft_mlp_share_of_target_expert_bytes": dense_mlp_bytes(draft) / target_bytes_per_token}


def load_subject(model: str = "byte-faithful-all", profile: str = "full", device: str = "cpu", backend: str = "auto",
                 fmt: str = "", like: str = "", draft: str = "", trace_file: str = "", dtype: str = "",
                 draft_cost: float = 0.0, layers: int = 0, layout: str = "published", seed: int = 0) -> Subject:
    """Build the subject ``model`` (module docstring) for ``profile`` on ``device``.

    ``fmt``: the kernels' storage format ('' = int8_b32 for the byte-faithful and replay subjects,
    else the model's own precision). ``like``: the published shape (a :mod:`moespec.model_shapes` name;
    '' = OLMoE, or the quick stand-in in the quick profile). ``dtype``: the precision the
    checkpoints load in ('' = f32 for the trained models, the checkpoint's own for a path).
    ``layout``: the byte-faithful widening, ``"published"`` (experts embedded in the published
    shape) or ``"intermediate"`` (only I widened, H kept; see docs/engine.md for why published is
    the default). ``layers``: MoE layers of the replay model (0 = the published count).
    """

    if profile not in ("quick", "full"):
        raise ValueError(f"profile must be 'quick' or 'full', found {profile!r}")
    device = str(device)
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r}: no CUDA device is visible to torch here")
    dt = _dtype(dtype)
    like = like or ("quick-like" if profile == "quick" else "olmoe")
    kind = model if model in KINDS else "checkpoint"

    if kind == "checkpoint":
        return _checkpoint_subject(model, draft, device, backend, fmt, dt, seed, draft_cost)
    if draft:
        raise ValueError(f"draft={draft!r} applies to a checkpoint path (model=<folder>); the {kind} subject "
                         "brings its own draft")
    if kind == "replay":
        return _replay_subject(like, trace_file, profile, device, backend, fmt or "int8_b32", layers, seed)
    if trace_file:
        raise ValueError(f"trace_file applies to model='replay', not to {kind!r}")
    target, drafter, tok = _trained_or_tiny(profile, device, dt)
    origin = "tiny random OLMoE (quick profile)" if profile == "quick" else "default MoE (trained here)"
    return subject_from_models(kind, target, drafter, tok, origin, like=like, fmt=fmt, layout=layout,
                               device=device, backend=backend, seed=seed, draft_cost=draft_cost)


def subject_from_models(kind: str, target, draft, tokenizer, origin: str, like: str = "olmoe", fmt: str = "",
                        layout: str = "published", device: str = "cpu", backend: str = "auto", seed: int = 0,
                        draft_cost: float = 0.0) -> Subject:
    """The ``"default"`` or ``"byte-faithful"`` subject made of the given OLMoE-family ``target`` and
    dense ``draft`` (``origin`` says what they are, e.g. "default MoE (trained here)"); the
    arguments are those of :func:`load_subject`. The models are changed in place."""

    if kind == "default":
        engine = Engine(target, backend=backend, fmt=fmt or None)
        w = _first_weights(engine)
        desc = {"real": "everything: the target and draft as given", "padding": "none",
                "expert_shape": list(w.shape), "expert_bytes": w.bytes_per_expert, "fmt": w.fmt}
        sub = Subject(kind, f"{origin}, {w.fmt}", engine, draft, tokenizer, device, desc)
    elif kind in ("byte-faithful", "byte-faithful-all"):
        sub = _byte_faithful(target, draft, tokenizer, origin, like, fmt or "int8_b32", layout, device, backend, seed)
        if kind == "byte-faithful-all":
            _widen_dense_parts(sub, like, fmt or "int8_b32", backend, seed)
    else:
        raise ValueError(f"kind must be 'default', 'byte-faithful' or 'byte-faithful-all', got {kind!r}")
    sub.description.update(widen_draft(sub.draft, sub.expert_bytes_per_token(), draft_cost, seed=seed + 1))
    if sub.description["draft_intermediate"] > sub.description["draft_intermediate_trained"]:
        sub.label += f"; draft MLPs widened to {draft_cost:g} of the target's expert bytes per token"
    return sub


def _first_weights(engine):

    return layer_weights(engine)[0]


def _byte_faithful(target, drafter, tok, origin, like, fmt, layout, device, backend, seed) -> Subject:

    spec = get_spec(like)
    cfg = target.config
    H, I = int(cfg.hidden_size), int(cfg.intermediate_size)
    if layout == "published":
        transform = lambda w, layer: embed_expert_weights(w, spec.hidden_size, spec.expert_intermediate,  # noqa: E731
                                                          seed=seed * 1000 + layer)
        shape = (spec.hidden_size, spec.expert_intermediate)
        padding = (f"each expert is embedded in an expert of {spec.paper_label or spec.name}'s shape "
                   f"(H = {shape[0]}, I = {shape[1]}): the trained [I = {I}, H = {H}] gate/up block and [H, I] "
                   f"down block in the corner; every other gate/up entry and the down rows {H}..{shape[0] - 1} "
                   f"random; the down entries of rows 0..{H - 1} past column {I - 1} zero; the hidden state is "
                   f"padded with zeros to {shape[0]} for the expert call and outputs {H}..{shape[0] - 1} dropped")
    elif layout == "intermediate":
        inter = widened_intermediate(H, spec, fmt)
        transform = lambda w, layer: widen_expert_weights(w, inter, seed=seed * 1000 + layer)  # noqa: E731
        shape = (H, inter)
        padding = (f"each expert has {inter - I} added intermediate neurons (I = {I} -> {inter}) with random "
                   "gate/up rows and zero down-projection columns")
    else:
        raise ValueError(f"layout must be 'published' or 'intermediate', got {layout!r}")
    engine = Engine(target, backend=backend, fmt=fmt, transform=transform)
    w = _first_weights(engine)
    if w.bytes_per_expert != spec.expert_bytes(fmt):
        raise AssertionError(f"byte-faithful experts hold {w.bytes_per_expert} bytes, {spec.name} {spec.expert_bytes(fmt)}")
    desc = {"real": f"{origin}: its attention, routers, routing, tokens; the draft and its acceptance; the "
                    f"trained expert weights (in {fmt})",
            "padding": padding, "like": spec.name, "layout": layout, "fmt": fmt,
            "expert_shape": [w.num_experts, w.hidden_size, w.intermediate_size],
            "expert_bytes": w.bytes_per_expert, "published_expert_bytes": spec.expert_bytes(fmt),
            "expert_bytes_per_token_per_layer": int(cfg.num_experts_per_tok) * w.bytes_per_expert,
            "published_expert_bytes_per_token_per_layer": spec.top_k * spec.expert_bytes(fmt)}
    how = "byte-faithful" if layout == "published" else "byte-faithful, only I widened"
    label = f"{origin}, experts at {spec.paper_label or spec.name}'s expert bytes ({fmt}, {how})"
    return Subject("byte-faithful", label, engine, drafter, tok, device, desc)


def _widen_dense_parts(sub: Subject, like: str, fmt: str, backend: str, seed: int) -> None:
    """The byte-faithful-all subject from the byte-faithful one (in place): its attention projections
    and LM head padded to ``like``'s shapes in ``fmt`` (:func:`moespec.engine.widen.widen_attention_and_head`),
    its description and label saying so, with the step's byte shares beside the published model's."""
    from moespec.engine.byte_shares import byte_shares, max_share_gap

    spec = get_spec(like)
    shapes = widen_attention_and_head(sub.target, spec, fmt, seed=seed + 7,
                                      backend="auto" if backend == "cuda" else backend)
    shares = byte_shares(sub.engine, spec, fmt)
    name = spec.paper_label or spec.name
    sub.kind = "byte-faithful-all"
    sub.label = sub.label.replace("experts at", "experts, attention and LM head at").replace(
        "byte-faithful)", "byte-faithful-all)")
    sub.description["real"] = sub.description["real"].replace("its attention, ", "its attention (the trained "
                                                                "projections, in the padded ones), ")
    sub.description["dense_padding"] = (
        f"every attention projection is the trained [out, in] matrix in the corner of one of {name}'s "
        f"projection shape, the LM head the trained (tied) head in a [{shapes['lm_head'][0]}, {shapes['lm_head'][1]}] "
        f"matrix ({name}'s {spec.vocab_size} rows x {sub.engine.num_layers} of its {spec.num_layers} "
        f"layers), all in {fmt}; other entries random; inputs padded with zeros, outputs past the trained "
        f"ones dropped (moespec.engine.widen.PaddedLinear); embedding, norms, routers and KV cache are the trained "
        f"model's")
    sub.description["dense_shapes"] = shapes
    sub.description["byte_shares"] = {r.component: [float(r.subject_share), float(r.published_share)]
                                      for r in shares.itertuples()}
    sub.description["byte_share_max_gap"] = max_share_gap(shares)


def _replay_subject(like, trace_file, profile, device, backend, fmt, layers, seed) -> Subject:

    spec = get_spec(like)
    L = int(layers or spec.num_moe_layers)
    if trace_file == "synthetic" or (not trace_file and profile == "quick"):
        trace = synthetic.sticky(4, 256 if profile == "full" else 160, spec.num_moe_layers, spec.num_experts,
                                 spec.top_k, keep=0.4, seed=seed, source="synthetic sticky routing (keep 0.4)")
    elif trace_file:
        trace = RoutingTrace.load(trace_file)
    else:
        raise ValueError("model='replay' needs trace_file=: a RoutingTrace .npz of the published model's routing "
                         "(e.g. from moespec import-routing), or trace_file='synthetic' for a labelled synthetic one")
    model, routing = published_model(spec, trace, fmt=fmt, layers=L, device=device, seed=seed)
    engine = replay_engine(model, routing, backend=backend)
    w = _first_weights(engine)
    desc = {"real": f"the routing: replayed exactly from {trace.label!r} (position by position, per document)",
            "padding": f"every weight: random experts at {spec.name}'s shape (N = {spec.num_experts}, H = "
                       f"{spec.hidden_size}, I = {spec.expert_intermediate}) in {fmt}, random attention "
                       "(OLMoE architecture, no shared experts or dense layers), a 256-token vocabulary; the draft "
                       "is the oracle draft (acceptance set by a)",
            "like": spec.name, "fmt": fmt, "layers": L, "published_layers": spec.num_moe_layers,
            "expert_shape": list(w.shape), "expert_bytes": w.bytes_per_expert, "trace": trace.label}
    label = (f"{spec.paper_label or spec.name} expert shape, random weights ({fmt}, {L} MoE layers), "
             f"routing replayed from {trace.label}")
    return Subject("replay", label, engine, None, None, device, desc, replay=routing)


def _load_checkpoint(path: str, device: str, dtype):
    from transformers import AutoModelForCausalLM

    folder = Path(path)
    if not folder.is_dir() or not (folder / "config.json").is_file():
        raise FileNotFoundError(f"model={path!r}: not a name of {KINDS} and not a checkpoint folder with a config.json")
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=dtype or "auto",
                                                local_files_only=True).to(device).eval()


def _checkpoint_subject(path, draft_path, device, backend, fmt, dtype, seed, draft_cost) -> Subject:

    target = _load_checkpoint(path, device, dtype)
    drafter = _load_checkpoint(draft_path, device, dtype) if draft_path else None
    if drafter is not None and drafter.config.vocab_size != target.config.vocab_size:
        raise ValueError(f"draft={draft_path!r} has a vocabulary of {drafter.config.vocab_size} tokens, the target "
                         f"{target.config.vocab_size}: a draft must share the target's tokenizer")
    tok = None
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception:  # a checkpoint without tokenizer files: prompts must then be token ids
        tok = None
    engine = Engine(target, backend=backend, fmt=fmt or None)
    w = _first_weights(engine)
    desc = {"real": "everything: the checkpoint's weights and routing" + ("; the draft checkpoint" if drafter
                                                                            else "; the oracle draft (no draft=)"),
            "padding": "none", "expert_shape": list(w.shape), "expert_bytes": w.bytes_per_expert, "fmt": w.fmt,
            "dtype": str(target.dtype), "checkpoint": str(path), "draft": str(draft_path or "")}
    sub = Subject("checkpoint", f"{Path(path).name} ({w.fmt} experts, {target.dtype})".replace("torch.", ""),
                  engine, drafter, tok, device, desc)
    if drafter is not None and draft_cost > 0:
        sub.description.update(widen_draft(drafter, sub.expert_bytes_per_token(), draft_cost, seed=seed + 1))
    return sub
