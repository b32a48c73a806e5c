"""The embedded default models: a small OLMoE-architecture MoE and a small dense draft model,
trained here from scratch on WikiText-2 train with a byte-level BPE tokenizer trained here.

Public API (other parts of moespec build on these names):

- :func:`default_moe_config` -> ``OlmoeConfig`` of the default MoE (N = 64, m = 8).
- :func:`default_draft_config` -> ``LlamaConfig`` of the draft model.
- :func:`load_default_moe`, :func:`load_draft`, :func:`load_tokenizer`: the cached models
  (``paths.models_dir()``); a clear error if they were not built yet.
- :func:`build_default_models`: trains whatever is missing (or everything, ``force=True``) and
  caches it; deterministic for a given seed.
- :func:`tiny_moe`, :func:`tiny_draft`: randomly initialised small models of the same classes,
  no training, for tests.

The MoE is a ``transformers.OlmoeForCausalLM``: its MoE block (``model.model.layers[i].mlp``)
has ``.gate`` (router, returns ``(logits, top-k weights, top-k ids)``) and ``.experts``
(``gate_up_proj [N, 2I, H]``, ``down_proj [N, H, I]``), exactly as the real OLMoE checkpoint.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, OlmoeConfig, OlmoeForCausalLM

from moespec import paths
from moespec.model_shapes import MoESpec, register
from moespec.zoo import experts as _experts
from moespec.zoo import store
from moespec.zoo import tokenizer as _tok

VOCAB_SIZE = 4096
CONTEXT = 256  # trained sequence length = the models' context (RoPE is not trusted beyond it)
EXPERTS_IMPLEMENTATION = _experts.IMPLEMENTATION

MOE_DIR, DRAFT_DIR, TOKENIZER_DIR = "default-moe", "default-draft", "tokenizer"


def default_moe_config(vocab_size: int = VOCAB_SIZE) -> OlmoeConfig:
    """OLMoE architecture, N = 64 experts, m = 8 per token (OLMoE's ratio), 4 layers, H = 128,
    expert intermediate size 64 (so the m active experts hold 4H, a dense FFN's width).

    ``norm_topk_prob=True`` (the top-8 weights renormalised to sum to 1, as Mixtral and Qwen3-MoE
    do; OLMoE-1B-7B uses False): with False, a freshly initialised router's top-8 weights sum to
    about 8/64, the MoE output and the experts' gradients start 8x small, and in this short
    training budget the MoE ended worse than the dense draft (train loss 5.58 vs 5.24 after
    819k tokens, measured here)."""
    return OlmoeConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=64, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=CONTEXT,
        num_experts=64, num_experts_per_tok=8, norm_topk_prob=True,
        output_router_logits=False, router_aux_loss_coef=0.01,
        pad_token_id=0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)


def default_draft_config(vocab_size: int = VOCAB_SIZE) -> LlamaConfig:
    """A dense 1-layer Llama with the MoE's tokenizer, hidden size and context, distilled from the
    MoE (:mod:`moespec.zoo.build`).

    One layer, not two: distilled, a 2-layer draft came within 0.91x of the MoE's perplexity
    (37.7 vs 41.5 per token), no longer a clearly weaker draft; the 1-layer draft distilled on the
    MoE's distribution alone keeps the MoE at 0.79x its perplexity and agrees with it at 0.70
    (benchmarks/results/training/README.md)."""
    return LlamaConfig(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=512, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=CONTEXT,
        pad_token_id=0, bos_token_id=0, eos_token_id=0, tie_word_embeddings=True)


def default_moe_spec() -> MoESpec:
    """The default MoE's shapes as a :class:`moespec.model_shapes.MoESpec` (registered as ``"default"``)."""
    c = default_moe_config()
    return MoESpec(name="default", paper_label="default MoE (trained here)",
                   num_experts=c.num_experts, top_k=c.num_experts_per_tok,
                   num_layers=c.num_hidden_layers, num_moe_layers=c.num_hidden_layers,
                   hidden_size=c.hidden_size, expert_intermediate=c.intermediate_size,
                   default_format="f32", source="moespec.zoo.default_moe_config()")


register("default", default_moe_spec)


def use_sorted_experts(model) -> None:
    """Switch an OLMoE-family model to the grouped-by-expert expert operation of
    :mod:`moespec.zoo.experts` (``torch._grouped_mm`` over the pairs sorted by expert: training
    and batched scoring speed)."""
    model.config._experts_implementation = EXPERTS_IMPLEMENTATION


def tiny_moe(seed: int = 0, vocab_size: int = 256, num_experts: int = 16, top_k: int = 4,
             num_layers: int = 2, hidden_size: int = 32, context: int = 128) -> OlmoeForCausalLM:
    """A randomly initialised small ``OlmoeForCausalLM`` (same family as the default MoE)."""
    torch.manual_seed(seed)
    cfg = OlmoeConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=hidden_size,
                      num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=context, num_experts=num_experts,
                      num_experts_per_tok=top_k, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return OlmoeForCausalLM(cfg).eval()


def tiny_draft(seed: int = 0, vocab_size: int = 256, hidden_size: int = 32,
               context: int = 128) -> LlamaForCausalLM:
    """A randomly initialised small ``LlamaForCausalLM``."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                      num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4,
                      max_position_embeddings=context, pad_token_id=0, bos_token_id=0, eos_token_id=0)
    return LlamaForCausalLM(cfg).eval()


def models_dir() -> Path:
    return paths.models_dir()


def load_tokenizer(folder: Path | None = None):
    """The embedded models' tokenizer (``PreTrainedTokenizerFast``)."""
    return _tok.load(Path(folder) if folder else models_dir() / TOKENIZER_DIR)


def load_default_moe(device: str = "cpu", folder: Path | None = None, dtype=torch.float32) -> OlmoeForCausalLM:
    """The trained default MoE (eval mode) from ``paths.models_dir()/default-moe``, in ``dtype``."""
    return store.load(Path(folder) if folder else models_dir() / MOE_DIR, device, dtype)


def load_draft(device: str = "cpu", folder: Path | None = None, dtype=torch.float32) -> LlamaForCausalLM:
    """The trained draft model (eval mode) from ``paths.models_dir()/default-draft``, in ``dtype``."""
    return store.load(Path(folder) if folder else models_dir() / DRAFT_DIR, device, dtype)


def build_default_models(force: bool = False, profile: str = "full", seed: int = 0,
                         progress: bool = True, out: Path | None = None) -> dict:
    """Reuse the build of the tokenizer, default MoE and draft in ``out`` (default ``data/models/``,
    committed with the full recipe's build), or train them (``force=True``: always train); return
    their folders and how each was obtained.

    See :mod:`moespec.zoo.build` for the recipe and what each profile trains.
    """
    from moespec.zoo.build import build

    return build(force=force, profile=profile, seed=seed, progress=progress, out=out)


__all__ = ["default_moe_config", "default_draft_config", "default_moe_spec", "load_default_moe",
           "load_draft", "load_tokenizer", "build_default_models", "tiny_moe", "tiny_draft",
           "use_sorted_experts", "VOCAB_SIZE", "CONTEXT", "EXPERTS_IMPLEMENTATION"]
