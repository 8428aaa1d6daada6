"""The embedded default policy: a tiny Qwen3 warm-started on oracle demonstrations.

`init_model(config, run_dir)` builds it (tokenizer, demonstrations, supervised warm start,
checkpoint selection, held-out evaluation) or reuses the cached one, and returns the
`PolicyArtifacts` a trainer needs. `tracerl init-model` is the command-line face of it. The
pieces (`build_model`, `save_policy`, `train_tokenizer`, `load_tokenizer`) import transformers on
first use (`harness.lazy`).
"""

from typing import TYPE_CHECKING

from harness.lazy import lazy_names
from harness.tiny_policy.config import (
    DemonstrationConfig,
    InitModelArgs,
    ModelConfig,
    SFTConfig,
    TinyPolicyConfig,
    WarmStartEvalConfig,
    default_world_config,
    tiny_env_config,
)
from harness.tiny_policy.model import build_model, save_policy
from harness.tiny_policy.pipeline import (
    ARTIFACTS_FILE,
    SHIPPED_DIR,
    PolicyArtifacts,
    init_model,
    is_hard,
    load_artifacts,
)
from harness.tiny_policy.report import summary_table

if TYPE_CHECKING:
    from harness.tiny_policy.tokenizer import load_tokenizer, train_tokenizer

__all__ = [
    "ARTIFACTS_FILE",
    "SHIPPED_DIR",
    "DemonstrationConfig",
    "InitModelArgs",
    "ModelConfig",
    "PolicyArtifacts",
    "SFTConfig",
    "TinyPolicyConfig",
    "WarmStartEvalConfig",
    "build_model",
    "default_world_config",
    "init_model",
    "is_hard",
    "load_artifacts",
    "load_tokenizer",
    "save_policy",
    "summary_table",
    "tiny_env_config",
    "train_tokenizer",
]

__getattr__ = lazy_names(
    __name__,
    {name: "harness.tiny_policy.tokenizer" for name in ("load_tokenizer", "train_tokenizer")},
)
