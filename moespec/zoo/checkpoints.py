"""Small random-weight checkpoints of every MoE family moespec reads (OLMoE, Qwen3-MoE, Mixtral,
DeepSeek-V2, gpt-oss) and a dense draft, saved as a user's checkpoint folder would be: config.json,
safetensors weights and the embedded models' tokenizer (so that notebook 01 records them on WikiText
and notebook 05 prompts them with text). Built from tiny configs with transformers: nothing is
downloaded. Their weights are random: what they show is the path from a checkpoint folder to the
answer, and the timing of their shapes, not a model's routing or acceptance.

    python -m moespec.zoo.checkpoints olmoe runs/tiny    # -> runs/tiny/tiny-olmoe and runs/tiny/tiny-draft

Each family keeps what makes it itself: Qwen3-MoE a dense MLP layer (``mlp_only_layers``),
DeepSeek-V2 a dense first layer, a shared expert and multi-head latent attention, gpt-oss expert
biases, sliding-window layers and its router (the engine's dedup switch refuses gpt-oss: notebook 05
does not run it; notebooks 01-03 and advise from their fits do).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

VOCAB, HIDDEN, LAYERS, CONTEXT = 4096, 128, 4, 256
EXPERTS, TOP_K, EXPERT_INTERMEDIATE = 16, 4, 64
_COMMON = dict(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4,
               num_key_value_heads=4, max_position_embeddings=CONTEXT, pad_token_id=0, bos_token_id=0, eos_token_id=0)


def _olmoe():
    from transformers import OlmoeConfig, OlmoeForCausalLM

    return OlmoeForCausalLM(OlmoeConfig(**_COMMON, intermediate_size=EXPERT_INTERMEDIATE, num_experts=EXPERTS,
                                        num_experts_per_tok=TOP_K))


def _qwen3_moe():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**_COMMON, intermediate_size=4 * EXPERT_INTERMEDIATE,
                                              moe_intermediate_size=EXPERT_INTERMEDIATE, num_experts=EXPERTS,
                                              num_experts_per_tok=TOP_K, mlp_only_layers=[1], head_dim=32))


def _mixtral():
    from transformers import MixtralConfig, MixtralForCausalLM

    return MixtralForCausalLM(MixtralConfig(**_COMMON, intermediate_size=EXPERT_INTERMEDIATE,
                                            num_local_experts=EXPERTS, num_experts_per_tok=TOP_K))


def _deepseek_v2():
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    return DeepseekV2ForCausalLM(DeepseekV2Config(
        **_COMMON, intermediate_size=4 * EXPERT_INTERMEDIATE, moe_intermediate_size=EXPERT_INTERMEDIATE,
        n_routed_experts=EXPERTS, num_experts_per_tok=TOP_K, n_shared_experts=1, first_k_dense_replace=1,
        kv_lora_rank=32, q_lora_rank=None, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=32, n_group=1,
        topk_group=1))


def _gpt_oss():
    from transformers import GptOssConfig, GptOssForCausalLM

    return GptOssForCausalLM(GptOssConfig(**_COMMON, intermediate_size=EXPERT_INTERMEDIATE, num_local_experts=EXPERTS,
                                          num_experts_per_tok=TOP_K, head_dim=32, sliding_window=64,
                                          layer_types=["sliding_attention", "full_attention"] * (LAYERS // 2)))


#: family -> a function building the random-weight model (transformers' model_type names).
FAMILIES = {"olmoe": _olmoe, "qwen3_moe": _qwen3_moe, "mixtral": _mixtral, "deepseek_v2": _deepseek_v2,
            "gpt_oss": _gpt_oss}


def random_checkpoint(family: str, folder: str | Path, seed: int = 0) -> Path:
    """Save a random-weight checkpoint of ``family`` (:data:`FAMILIES`) with the embedded models'
    tokenizer into ``folder``; return the folder."""
    from moespec import zoo

    if family not in FAMILIES:
        raise ValueError(f"family: expected one of {sorted(FAMILIES)}; found {family!r}")
    torch.manual_seed(seed)
    folder = Path(folder)
    FAMILIES[family]().eval().save_pretrained(folder)
    zoo.load_tokenizer().save_pretrained(str(folder))
    return folder


def random_draft(folder: str | Path, seed: int = 1) -> Path:
    """Save a random-weight dense draft (one Llama layer) with the same tokenizer into ``folder``."""
    from moespec import zoo

    folder = Path(folder)
    zoo.tiny_draft(seed=seed, vocab_size=VOCAB, hidden_size=64, context=CONTEXT).save_pretrained(folder)
    zoo.load_tokenizer().save_pretrained(str(folder))
    return folder


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m moespec.zoo.checkpoints",
                                     description="write a small random-weight MoE checkpoint and a dense draft")
    parser.add_argument("family", choices=sorted(FAMILIES))
    parser.add_argument("out", type=Path, help="folder: <out>/tiny-<family> and <out>/tiny-draft are written")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    target = random_checkpoint(args.family, args.out / f"tiny-{args.family.replace('_', '-')}", seed=args.seed)
    draft = random_draft(args.out / "tiny-draft", seed=args.seed + 1)
    print(f"random-weight {args.family} checkpoint: {target}\ndense draft: {draft}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
