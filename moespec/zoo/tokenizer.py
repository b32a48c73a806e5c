"""The embedded models' tokenizer: byte-level BPE trained here on the WikiText-2 train split.

Byte-level, so any text (prompts, raw WikiText, MT-Bench) encodes without unknown tokens.
WikiText's literal ``<unk>`` marker is one special token; ``<|endoftext|>`` (id 0) separates
documents and serves as BOS, EOS and padding.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

EOS = "<|endoftext|>"
UNK_MARK = "<unk>"
SPECIAL_TOKENS = [EOS, UNK_MARK]


def train_bpe(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE tokenizer (deterministic for the same texts and vocab size)."""
    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size must cover the 256 byte symbols and {len(SPECIAL_TOKENS)} "
                         f"special tokens, found {vocab_size}")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def wrap(tok: Tokenizer, model_max_length: int = 1 << 30) -> PreTrainedTokenizerFast:
    """A transformers tokenizer around ``tok`` (so ``generate``, padding and saving work).

    Whole articles are tokenized at once and cut to the model's context later, so the default
    ``model_max_length`` is effectively unlimited (no spurious length warnings)."""
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   pad_token=EOS, model_max_length=model_max_length)


def load(folder: Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer saved with ``save_pretrained`` in ``folder``; clear error if absent."""
    folder = Path(folder)
    if not (folder / "tokenizer.json").is_file():
        raise FileNotFoundError(f"{folder / 'tokenizer.json'}: no tokenizer there; build the default "
                                f"models first (moespec build-models, or moespec.zoo.build_default_models())")
    return PreTrainedTokenizerFast.from_pretrained(str(folder))
