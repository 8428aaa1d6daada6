"""The embedded default policy: a tiny Qwen3 warm-started on oracle demonstrations.

`init_model(config, run_dir)` builds it (tokenizer, demonstrations, supervised warm start,
checkpoint selection, held-out evaluation) or reuses the cached one, and returns the
`PolicyArtifacts` a trainer needs. `tracerl init-model` is the command-line face of it.
"""

from harness.tiny_policy.config import (
    DemonstrationConfig,
    InitModelArgs,
    ModelConfig,
    SFTConfig,
    TinyPolicyConfig,
    WarmStartEvalConfig,
    tiny_env_config,
)
from harness.tiny_policy.pipeline import PolicyArtifacts, init_model, is_hard, load_artifacts
from harness.tiny_policy.report import summary_table

__all__ = [
    "DemonstrationConfig",
    "InitModelArgs",
    "ModelConfig",
    "PolicyArtifacts",
    "SFTConfig",
    "TinyPolicyConfig",
    "WarmStartEvalConfig",
    "init_model",
    "is_hard",
    "load_artifacts",
    "summary_table",
    "tiny_env_config",
]
