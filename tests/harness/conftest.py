"""Fixtures of the harness tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

TINY_VOCAB = 50


def _tiny_model() -> torch.nn.Module:
    """A 1-layer Qwen3 of vocabulary 50, seeded: the same weights on every call."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=TINY_VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).float()


@pytest.fixture
def tiny_model() -> Callable[[], torch.nn.Module]:
    """Builds a fresh seeded tiny Qwen3 (vocabulary 50) per call, the same weights each time."""
    return _tiny_model
