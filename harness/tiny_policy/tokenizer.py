"""A small byte-level BPE tokenizer for the tiny policy, trained locally with `tokenizers`.

The Search-R1 tags are added tokens: each is one id, never split and never merged with its
neighbours, so generation stops on one id and a tag cannot be half-generated. They are *not*
marked special, so the usual `decode(..., skip_special_tokens=True)` (vLLM's default, and most
clients') still shows them; only bos/eos/pad are special. The result is a standard
`PreTrainedTokenizerFast` directory that transformers and vLLM load as is.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from transformers import PreTrainedTokenizerFast

__all__ = ["BOS", "EOS", "PAD", "TAGS", "load_tokenizer", "train_tokenizer"]

BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
TAGS: tuple[str, ...] = (
    "<search>",
    "</search>",
    "<answer>",
    "</answer>",
    "<information>",
    "</information>",
    "<think>",
    "</think>",
)
"""Every Search-R1 tag, one id each."""


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 2048, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer with bos/eos/pad and the tags as single tokens.

    Byte-level means any text encodes (no unknown token), so names from worlds the tokenizer
    never saw still round-trip, only in more pieces.

    Args:
        texts: Training text (documents, questions, whole demonstrations).
        vocab_size: Target size, including the 256 bytes, the special tokens and the tags.
        min_frequency: A merge must be seen this often.

    Returns:
        A fast tokenizer that pads on the left (for batched generation).

    Raises:
        ValueError: for a vocabulary too small to hold the bytes and the added tokens.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + 3 + len(TAGS):
        raise ValueError(f"vocab_size={vocab_size}: needs room for 256 bytes, 3 specials and tags")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(TAGS),
        min_frequency=min_frequency,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in TAGS])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def load_tokenizer(path: str | Path) -> PreTrainedTokenizerFast:
    """Load a tokenizer directory written by `save_pretrained`."""
    return PreTrainedTokenizerFast.from_pretrained(str(path))
