"""The tiny policy's architecture: a small Qwen3 causal LM, saved as a standard directory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from harness.tiny_policy.config import ModelConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["build_model", "count_parameters", "save_policy"]


def build_model(config: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> PreTrainedModel:
    """A randomly initialised Qwen3 causal LM sized for `tokenizer`.

    Args:
        config: The shape.
        tokenizer: Gives the vocabulary size and the bos/eos/pad ids.

    Returns:
        The model, in float32, in training mode.
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    hf_config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.n_layers,
        num_attention_heads=config.n_heads,
        num_key_value_heads=config.n_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seeded init without touching the global RNG
        torch.manual_seed(config.seed)
        model = Qwen3ForCausalLM(hf_config)
    return model.float().train()


def count_parameters(model: PreTrainedModel) -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())


def save_policy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, path: Path) -> Path:
    """Write a standard transformers directory (config, safetensors, tokenizer).

    `AutoModelForCausalLM.from_pretrained(path)`, `TransformersBackend(path)` and
    `VLLMBackend(path)` all load it.

    Returns:
        `path`.
    """
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
