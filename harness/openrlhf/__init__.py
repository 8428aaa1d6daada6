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

Importing this package imports nothing heavy: each module above imports OpenRLHF itself, and
`harness.training.openrlhf_compat.ensure_flash_attn` makes that work where flash-attn is missing.
"""

__all__: list[str] = []
