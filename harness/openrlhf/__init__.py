"""OpenRLHF integration: train with trace-rl's tree rollouts on Ray + DeepSpeed + vLLM.

Coded against OpenRLHF 0.11.2 (pinned in the `gpu` extra). OpenRLHF has no tree support, so
trace-rl subclasses its extension points instead of forking it (docs/openrlhf.md):

- `harness.openrlhf.samples.TreeSamplesGenerator` (a `SamplesGenerator`) runs the tree-rollout
  engine against OpenRLHF's Ray vLLM engines and turns every leaf into an `Experience` whose
  `advantages` already hold the per-token tree advantages;
- `harness.openrlhf.experience_maker.TreeExperienceMaker` (a `RemoteExperienceMaker`) keeps them;
- `harness.openrlhf.tree_trainer.TreePPOTrainer` (a `BasePPOTrainer`) and
  `harness.openrlhf.launcher.main` reuse OpenRLHF's argument parser, DeepSpeed strategy, actor,
  reference model, `PolicyLoss` and weight sync. `tracerl train --backend openrlhf` calls
  `launcher.main`.

Importing this package imports nothing heavy: each name of the face below is imported on first
use (`harness.lazy`), its module imports OpenRLHF itself, and
`harness.training.openrlhf_compat.ensure_flash_attn` makes that work where flash-attn is missing.
"""

from typing import TYPE_CHECKING

from harness.lazy import lazy_names

if TYPE_CHECKING:
    from harness.openrlhf.actor import TreePolicyModelActorBase
    from harness.openrlhf.config import TreeTrainConfig
    from harness.openrlhf.experience_maker import TreeExperienceMaker
    from harness.openrlhf.launcher import parse_args
    from harness.openrlhf.rehearsal import read_prompt_file, tree_step_generator
    from harness.openrlhf.samples import TreeSamplesGenerator
    from harness.openrlhf.tree_trainer import TreePPOTrainerBase

__all__ = [
    "TreeExperienceMaker",
    "TreePPOTrainerBase",
    "TreePolicyModelActorBase",
    "TreeSamplesGenerator",
    "TreeTrainConfig",
    "parse_args",
    "read_prompt_file",
    "tree_step_generator",
]

__getattr__ = lazy_names(
    __name__,
    {
        "TreePolicyModelActorBase": "harness.openrlhf.actor",
        "TreeTrainConfig": "harness.openrlhf.config",
        "TreeExperienceMaker": "harness.openrlhf.experience_maker",
        "parse_args": "harness.openrlhf.launcher",
        "read_prompt_file": "harness.openrlhf.rehearsal",
        "tree_step_generator": "harness.openrlhf.rehearsal",
        "TreeSamplesGenerator": "harness.openrlhf.samples",
        "TreePPOTrainerBase": "harness.openrlhf.tree_trainer",
    },
)
