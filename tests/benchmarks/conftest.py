"""Shared pieces of the benchmark tests."""

from __future__ import annotations

import pytest

from envs import WorldConfig
from harness.tiny_policy import (
    DemoConfig as DemosConfig,
)
from harness.tiny_policy import (
    EnvSettings,
    EvalConfig,
    ModelConfig,
    SFTConfig,
    TinyPolicyConfig,
)

_TINY_RECIPE = TinyPolicyConfig(
    world=WorldConfig(
        n_countries=3,
        n_cities=8,
        n_people=60,
        n_films=8,
        n_books=6,
        n_companies=4,
        n_universities=3,
        n_distractors=5,
        sentences_per_doc=2,
        questions_per_kind=2,
    ),
    vocab_size=600,
    model=ModelConfig(hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128),
    demos=DemosConfig(n_worlds=1, target_variants=1),
    sft=SFTConfig(max_steps=6, batch_size=4, warmup_steps=2, eval_from=3, eval_every=3),
    env=EnvSettings(max_turns=3),
    eval=EvalConfig(n_unseen_questions=4, n_dev_samples=1, n_samples=1, max_action_tokens=12),
)


@pytest.fixture
def tiny_recipe() -> TinyPolicyConfig:
    """A tiny policy recipe that builds in seconds (its accuracy is near zero)."""
    return _TINY_RECIPE
