"""MoE model shapes: the specifications (shapes and byte counts) that the byte and time models
need, for the published models of paper 1 (:data:`PRESETS`) and from a model's own ``config.json``.
The models themselves (the embedded ones trained here) live in :mod:`moespec.zoo`.

Every architecture number carries its source. Byte counts per expert follow from the shapes and
the storage format (bytes per block of weights), so they are computed, not typed in.

An expert is a SwiGLU block: gate and up ``[I, H]``, down ``[H, I]``, so ``3 * H * I`` weights.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

# --- storage formats: (bytes per block, weights per block) -----------------------------------
# Sources: ggml block layouts (ggml/src/ggml-common.h): block_q8_0 = fp16 scale + 32 int8 = 34 B;
# block_q4_K = 2 fp16 + 12 B scales + 128 B quants per 256 = 144 B; block_q6_K = 210 B per 256;
# block_mxfp4 = 1 E8M0 scale + 16 B of 4-bit values per 32 = 17 B (OCP MX spec v1.0).
# MLX 4-bit affine quantization: group size 64 with a bf16 scale and a bf16 bias per group.
FORMATS: dict[str, tuple[int, int]] = {
    "f32": (4, 1),
    "bf16": (2, 1),
    "f16": (2, 1),
    "q8_0": (34, 32),
    "int8_b32": (36, 32),   # moespec's own int8 block format: 32 int8 + one fp32 scale
    "q4_k": (144, 256),
    "q6_k": (210, 256),
    "mxfp4": (17, 32),
    "mlx_4bit": (32 + 4, 64),
}


def format_bytes(num_weights: int, fmt: str) -> int:
    """Bytes that ``num_weights`` weights occupy in storage format ``fmt`` (whole blocks)."""
    try:
        block_bytes, block_size = FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown storage format {fmt!r}; known: {sorted(FORMATS)}") from None
    if num_weights % block_size:
        raise ValueError(f"{num_weights} weights are not a whole number of {fmt} blocks of {block_size}")
    return num_weights // block_size * block_bytes


def llama_cpp_use_more_bits(layer: int, num_layers: int) -> bool:
    """llama.cpp's rule (src/llama-quant.cpp, ``use_more_bits``) for which layers' ffn_down
    tensors Q4_K_M stores in Q6_K instead of Q4_K: the first and last eighth, and every third
    layer in between."""
    return (layer < num_layers // 8 or layer >= 7 * num_layers // 8
            or (layer - num_layers // 8) % 3 == 2)


@dataclass(frozen=True)
class MoESpec:
    """Architecture of a decoder-only MoE model, as far as expert bytes and timing need it.

    Attributes:
        name: short name used in file names and plots.
        num_experts: N, routed experts per MoE layer.
        top_k: m, experts each token selects (1 <= m < N).
        num_layers: decoder layers in all (MoE and dense).
        num_moe_layers: L, layers with routed experts.
        hidden_size: H.
        expert_intermediate: I, the intermediate size of one routed expert.
        num_shared_experts: experts every token uses (read once per pass whatever the routing).
        shared_intermediate: intermediate size of one shared expert.
        dense_intermediate: intermediate size of the dense FFN layers (0 if none).
        default_format: storage format used in paper 1 for this model.
        num_attention_heads, num_key_value_heads, head_dim, vocab_size: the attention and
            vocabulary shape (0: not recorded for this model; :meth:`attention_shapes` refuses).
        source: where the numbers come from.
    """

    name: str
    num_experts: int
    top_k: int
    num_layers: int
    num_moe_layers: int
    hidden_size: int
    expert_intermediate: int
    num_shared_experts: int = 0
    shared_intermediate: int = 0
    dense_intermediate: int = 0
    default_format: str = "bf16"
    num_attention_heads: int = 0
    num_key_value_heads: int = 0
    head_dim: int = 0
    vocab_size: int = 0
    paper_label: str = ""
    source: str = ""
    extra: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        if not 1 <= self.top_k < self.num_experts:
            raise ValueError(f"{self.name}: need 1 <= m < N, got m={self.top_k}, N={self.num_experts}")
        if not 0 < self.num_moe_layers <= self.num_layers:
            raise ValueError(f"{self.name}: num_moe_layers must be in [1, num_layers]")

    @property
    def weights_per_expert(self) -> int:
        return 3 * self.hidden_size * self.expert_intermediate

    @property
    def q(self) -> float:
        """q = 1 - m/N, the per-token miss probability under independent uniform routing."""
        return 1.0 - self.top_k / self.num_experts

    def attention_shapes(self) -> dict[str, tuple[int, int]]:
        """``{projection: (out, in)}`` of one layer's attention (q, o: heads x head_dim by H; k, v:
        kv heads x head_dim by H), for a model whose attention shape is recorded."""
        if not (self.num_attention_heads and self.num_key_value_heads and self.head_dim and self.vocab_size):
            raise ValueError(f"{self.name}: its attention and vocabulary shape is not recorded (num_attention_heads, "
                             "num_key_value_heads, head_dim, vocab_size)")
        q, kv, h = self.num_attention_heads * self.head_dim, self.num_key_value_heads * self.head_dim, self.hidden_size
        return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q)}

    def expert_bytes(self, fmt: str | None = None, layer: int = 0) -> int:
        """w_l: bytes of one routed expert of MoE layer ``layer`` in format ``fmt``.

        ``q4_k_m`` applies llama.cpp's mixed rule (gate/up Q4_K, down Q6_K on the layers of
        :func:`llama_cpp_use_more_bits`), so its bytes vary by layer.
        """
        fmt = fmt or self.default_format
        third = self.hidden_size * self.expert_intermediate
        if fmt == "q4_k_m":
            down = "q6_k" if llama_cpp_use_more_bits(layer, self.num_moe_layers) else "q4_k"
            return 2 * format_bytes(third, "q4_k") + format_bytes(third, down)
        return format_bytes(3 * third, fmt)

    def layer_expert_bytes(self, fmt: str | None = None) -> list[int]:
        """[w_1, ..., w_L] for every MoE layer."""
        return [self.expert_bytes(fmt, layer) for layer in range(self.num_moe_layers)]

    def total_expert_bytes(self, fmt: str | None = None) -> int:
        """W = sum_l w_l (paper 1, Section 2)."""
        return sum(self.layer_expert_bytes(fmt))


# --- presets ----------------------------------------------------------------------------------
OLMOE = MoESpec(
    name="olmoe", paper_label="OLMoE", num_experts=64, top_k=8, num_layers=16, num_moe_layers=16,
    hidden_size=2048, expert_intermediate=1024, default_format="q8_0",
    num_attention_heads=16, num_key_value_heads=16, head_dim=128, vocab_size=50304,
    source="allenai/OLMoE-1B-7B-0125 config.json (hidden_size 2048, intermediate_size 1024, "
           "num_experts 64, num_experts_per_tok 8, num_hidden_layers 16); paper 1 Sec. 2; "
           "format Q8_0 on llama.cpp (paper 1 App. D); attention and vocabulary: transformers' "
           "OlmoeConfig defaults, documented as allenai/OLMoE-1B-7B-0924's (transformers 5.24.0, "
           "models/olmoe/configuration_olmoe.py: vocab_size 50304, num_attention_heads 16, "
           "num_key_value_heads = num_attention_heads, head_dim = hidden_size / heads = 128, "
           "tie_word_embeddings False)",
)
QWEN3 = MoESpec(
    name="qwen3", paper_label="Qwen3", num_experts=128, top_k=8, num_layers=48, num_moe_layers=48,
    hidden_size=2048, expert_intermediate=768, default_format="q4_k_m",
    source="Qwen/Qwen3-30B-A3B config.json (hidden_size 2048, moe_intermediate_size 768, "
           "num_experts 128, num_experts_per_tok 8, num_hidden_layers 48); format Q4_K_M "
           "(paper 1 App. D)",
)
GPT_OSS = MoESpec(
    name="gpt-oss", paper_label="gpt-oss", num_experts=32, top_k=4, num_layers=24, num_moe_layers=24,
    hidden_size=2880, expert_intermediate=2880, default_format="mxfp4",
    source="openai/gpt-oss-20b config.json (hidden_size 2880, intermediate_size 2880, "
           "num_local_experts 32, num_experts_per_tok 4, num_hidden_layers 24); format MXFP4 "
           "(paper 1 App. D). Expert biases (bf16, 3*2880 values) are ignored in the byte count.",
)
DEEPSEEK_V2_LITE = MoESpec(
    name="deepseek-v2-lite", paper_label="DeepSeek-V2-Lite", num_experts=64, top_k=6,
    num_layers=27, num_moe_layers=26, hidden_size=2048, expert_intermediate=1408,
    num_shared_experts=2, shared_intermediate=1408, dense_intermediate=10944,
    default_format="q4_k_m",
    source="deepseek-ai/DeepSeek-V2-Lite config.json (hidden_size 2048, moe_intermediate_size 1408, "
           "n_routed_experts 64, num_experts_per_tok 6, n_shared_experts 2, num_hidden_layers 27, "
           "first_k_dense_replace 1, intermediate_size 10944); paper 1 Sec. 4.4 (64 routed, 6 per "
           "token, two shared experts, a dense first layer, Q4_K_M)",
)

#: Published model shapes of paper 1, by name (shared by tests and benchmarks).
PRESETS: dict[str, MoESpec] = {s.name: s for s in (OLMOE, QWEN3, GPT_OSS, DEEPSEEK_V2_LITE)}

#: Registry for specs added at run time (the embedded default model registers itself here).
_REGISTRY: dict[str, Callable[[], MoESpec]] = {}


def published_shapes() -> dict[str, tuple[int, int, int, int]]:
    """``{model: (N, H, I, m)}`` (experts, hidden size, expert intermediate size, experts per token)
    for every preset of :data:`PRESETS`."""
    return {name: (s.num_experts, s.hidden_size, s.expert_intermediate, s.top_k) for name, s in PRESETS.items()}


def register(name: str, factory: Callable[[], MoESpec]) -> None:
    _REGISTRY[name] = factory


def get_spec(name: str) -> MoESpec:
    """The spec of a preset or registered model, by name (case-insensitive), or of a model's own
    ``config.json`` (a checkpoint folder holding one, or the file: :func:`config_path`), read by
    :func:`spec_from_config` and named by :func:`config_name`."""
    key = str(name).lower()
    if key in PRESETS:
        return PRESETS[key]
    if key in _REGISTRY:
        return _REGISTRY[key]()
    path = config_path(name)
    if path is not None:
        spec = spec_from_config(path, name=config_name(path))
        return dataclasses.replace(spec, source=f"{path}")
    raise KeyError(f"unknown model {name!r}; expected a preset {sorted(PRESETS)}, a registered model "
                   f"{sorted(_REGISTRY)}, or a checkpoint folder with a config.json (or the config.json itself)")


def config_path(model) -> Path | None:
    """The ``config.json`` that ``model`` names (a folder holding one, a JSON file, or a hub name
    whose config is in the local Hugging Face cache: nothing is downloaded), None when ``model`` is
    none of these."""
    path = Path(str(model)).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        return path / "config.json"
    if path.is_file() and path.suffix == ".json":
        return path
    if "/" in str(model) and not path.exists():   # "org/name": a hub name, in the local cache only
        try:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(str(model), "config.json")
        except (ImportError, ValueError):
            return None
        return Path(cached) if isinstance(cached, str) else None
    return None


def config_name(path) -> str:
    """A short name for the model of a ``config.json`` (file names and labels): the last part of its
    ``_name_or_path`` where the config records one, else its folder's name (a file not named
    config.json: its stem); ``-config`` appended where that is the name of a preset or registered
    model, so that the name never finds another model's shape."""
    path = Path(path)
    recorded = ""
    try:
        recorded = str(json.loads(path.read_text()).get("_name_or_path") or "")
    except (OSError, ValueError, AttributeError):
        pass
    name = recorded.rstrip("/").split("/")[-1] if recorded else (
        path.parent.resolve().name if path.name == "config.json" else path.stem)
    name = name or "model"
    # never the name of a preset: a name is looked up again downstream, and must not find another shape
    return f"{name}-config" if name.lower() in PRESETS or name.lower() in _REGISTRY else name


def preset_name(model: str) -> str:
    """The preset named ``model`` (its key or paper 1's label, case-insensitive), else ``model`` itself."""
    for name, spec in PRESETS.items():
        if model.lower() in (name, spec.paper_label.lower()):
            return name
    return model


# --- specs from a model's own config.json ------------------------------------------------------
#: config.json keys that hold N, m and the routed expert's intermediate size, in the order they are
#: tried (transformers' names: OLMoE/Qwen-MoE ``num_experts``, Mixtral/gpt-oss ``num_local_experts``,
#: DeepSeek ``n_routed_experts``; Qwen/DeepSeek ``moe_intermediate_size``, else ``intermediate_size``).
_CONFIG_KEYS = {
    "num_experts": ("num_experts", "num_local_experts", "n_routed_experts"),
    "top_k": ("num_experts_per_tok", "experts_per_token", "top_k_experts"),
    "expert_intermediate": ("moe_intermediate_size", "intermediate_size"),
}
#: torch_dtype in config.json -> storage format of :data:`FORMATS`.
_CONFIG_DTYPES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}


def read_config(config) -> dict:
    """A transformers ``config.json`` as a dict: ``config`` is a dict, a path to the file, or a
    checkpoint folder holding it. Multimodal configs are reduced to their ``text_config``."""

    if isinstance(config, dict):
        cfg = dict(config)
    else:
        path = Path(config)
        path = path / "config.json" if path.is_dir() else path
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no model config.json")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON: {exc}") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{path}: expected a JSON object (a model's config.json); found {type(cfg).__name__}")
        cfg.setdefault("_name_or_path", str(path.parent))
        cfg["_config_file"] = str(path)
    if isinstance(cfg.get("text_config"), dict):
        cfg = {**cfg["text_config"], "_name_or_path": cfg.get("_name_or_path"), "_config_file": cfg.get("_config_file")}
    return cfg


def _int(cfg: dict, key: str, default: int | None = None) -> int | None:
    """``cfg[key]`` as an int (``default`` where absent or null); anything but a whole number is
    refused naming the config file and the key."""
    value = cfg.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value):
        where = cfg.get("_config_file") or "model config"
        raise ValueError(f"{where}: field {key}: expected a whole number; found {value!r}")
    return int(value)


def _required(cfg: dict, key: str) -> int:
    if cfg.get(key) is None:
        raise ValueError(f"{cfg.get('_config_file') or 'model config'}: field {key}: expected a whole number; found "
                         "nothing (the field is absent)")
    return _int(cfg, key)


def _config_value(cfg: dict, what: str):
    for key in _CONFIG_KEYS[what]:
        if cfg.get(key) is not None:
            return _int(cfg, key)
    raise ValueError(f"{cfg.get('_config_file') or 'model config'}: none of the fields {list(_CONFIG_KEYS[what])} "
                     f"(needed for {what})")


def config_moe_layers(config) -> list[int]:
    """Decoder indices of the layers with routed experts, from the config's own rules:
    DeepSeek-V2/V3 ``first_k_dense_replace`` and ``moe_layer_freq`` (layer i is MoE iff
    i >= first_k_dense_replace and i % moe_layer_freq == 0); Qwen2/Qwen3-MoE ``mlp_only_layers``
    and ``decoder_sparse_step`` (MoE iff i not in mlp_only_layers and (i + 1) % step == 0); every
    layer otherwise (OLMoE, Mixtral, gpt-oss)."""
    cfg = read_config(config)
    n = _required(cfg, "num_hidden_layers")
    first_dense = _int(cfg, "first_k_dense_replace", 0)
    freq = _int(cfg, "moe_layer_freq", 1) or 1
    mlp_only = set(cfg.get("mlp_only_layers") or [])
    step = _int(cfg, "decoder_sparse_step", 1) or 1
    return [i for i in range(n) if i >= first_dense and i % freq == 0
            and i not in mlp_only and (i + 1) % step == 0]


def config_format(config) -> str:
    """The storage format of the checkpoint's experts: MXFP4 when ``quantization_config`` says so
    (gpt-oss), else its ``torch_dtype`` (default bf16)."""
    cfg = read_config(config)
    quant = cfg.get("quantization_config") or {}
    if str(quant.get("quant_method", "")).lower() == "mxfp4":
        return "mxfp4"
    dtype = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").replace("torch.", "")
    if dtype not in _CONFIG_DTYPES:
        raise ValueError(f"model config: torch_dtype {dtype!r} has no storage format here; "
                         f"known: {sorted(_CONFIG_DTYPES)} (pass a format explicitly)")
    return _CONFIG_DTYPES[dtype]


#: Checkpoint families (``model_type``) whose expert function moespec's kernels do not compute
#: (they compute ``down(silu(gate x) * up x)`` without biases), with what differs: such a model's
#: whole-model run (notebooks 05-07) is refused before it starts; its routing, the benchmark at its
#: shape and the fits (notebooks 01-03) take it.
EXPERT_FUNCTION_NOT_COMPUTED = {
    "gpt_oss": "gate/up and down biases, interleaved gate/up columns and a clamped SwiGLU"}


def expert_function_difference(config) -> str | None:
    """What in the checkpoint's experts moespec's kernels do not compute
    (:data:`EXPERT_FUNCTION_NOT_COMPUTED`), or None when they compute its experts."""
    return EXPERT_FUNCTION_NOT_COMPUTED.get(str(read_config(config).get("model_type", "")))


def spec_from_config(config, name: str | None = None) -> MoESpec:
    """A :class:`MoESpec` from a transformers ``config.json`` (dict, file or checkpoint folder):
    N, m, the MoE layers (:func:`config_moe_layers`), H, the routed expert's intermediate size,
    shared experts, the default format (:func:`config_format`), and the attention and vocabulary
    shape where the config has them (``head_dim`` defaults to H / heads, kv heads to heads; a
    multi-head latent attention config, DeepSeek's, is not a q/k/v/o shape: not used by the
    padded attention, :func:`moespec.engine.widen.widen_attention_and_head`)."""
    cfg = read_config(config)
    moe = config_moe_layers(cfg)
    shared = _int(cfg, "n_shared_experts", 0)
    label = name or cfg.get("_name_or_path") or cfg.get("model_type") or "model"
    heads = 0 if cfg.get("kv_lora_rank") else _int(cfg, "num_attention_heads", 0)   # MLA: no q/k/v/o shape
    hidden = _required(cfg, "hidden_size")
    head_dim = _int(cfg, "head_dim") or (hidden // heads if heads else 0)
    return MoESpec(name=str(label), paper_label=str(label), num_experts=_config_value(cfg, "num_experts"),
                   top_k=_config_value(cfg, "top_k"), num_layers=_required(cfg, "num_hidden_layers"),
                   num_moe_layers=len(moe), hidden_size=hidden,
                   expert_intermediate=_config_value(cfg, "expert_intermediate"),
                   num_shared_experts=shared,
                   shared_intermediate=_int(cfg, "moe_intermediate_size", 0) if shared else 0,
                   default_format=config_format(cfg), num_attention_heads=heads,
                   num_key_value_heads=(_int(cfg, "num_key_value_heads") or heads) if heads else 0, head_dim=head_dim,
                   vocab_size=_int(cfg, "vocab_size", 0), source="model config.json",
                   extra={"moe_layers": moe})
