"""harness's training room: the CPU trainer and what both trainers share.

    from harness.training import TrainConfig, train

    summary = train(TrainConfig(run_dir=Path("runs/rl"), steps=10))

- **config** (`config.py`): `TrainConfig` and its parts, `load_config` (a run's saved config);
- **tasks** (`task_sources.py`): `build_tasks` (the training source), `eval_set` and
  `fact_disjoint_questions` (the held-out sets); `TaskSource` and `TaskCorpus`, to train on
  questions of your own (`train(config, task_source=...)`, docs/extending.md);
- **the trainer** (`trainer.py`): `train`, and `update_policy` (its update phase); the phases
  of a tree step both trainers share are `tree_step.TreeStep`;
- **a run's files**: `MetricsLog`, `read_metrics`, `plot_run`, `plot_learning_curve`,
  `tree_health` (`metrics_log.py`); `latest_checkpoint`, `load_checkpoint`, `policy_distance`
  (`checkpoint.py`);
- **the rest of a step**: `make_optimizer` (`optimizers.py`), `Ranks`, `init_from_env`,
  `all_gather` (`distributed.py`, data-parallel ranks), `openrlhf_losses` and
  `ensure_flash_attn` (`openrlhf_compat.py`, OpenRLHF's losses for both trainers);
- the commands `tracerl init-model`, `train`, `plot`, `doctor` (`cli.py`; `doctor.py` holds the
  checks).

The names from torch-based modules (the trainer, checkpoints, optimizers, ranks) are imported
on first use (`harness.lazy`).
"""

from typing import TYPE_CHECKING

from harness.lazy import lazy_names
from harness.training.config import (
    AllocatorSettings,
    AllocConfig,
    BudgetConfig,
    EvalConfig,
    LossConfig,
    OptimConfig,
    PredictorConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    load_config,
)
from harness.training.metrics_log import (
    MetricsLog,
    plot_learning_curve,
    plot_run,
    read_metrics,
    tree_health,
)
from harness.training.openrlhf_compat import ensure_flash_attn, openrlhf_losses
from harness.training.task_sources import (
    TaskCorpus,
    TaskSource,
    build_tasks,
    eval_set,
    fact_disjoint_questions,
)

if TYPE_CHECKING:
    from harness.training.checkpoint import latest_checkpoint, load_checkpoint, policy_distance
    from harness.training.distributed import Ranks, all_gather, init_from_env
    from harness.training.optimizers import make_optimizer
    from harness.training.trainer import train, update_policy

__all__ = [
    "AllocConfig",
    "AllocatorSettings",
    "BudgetConfig",
    "EvalConfig",
    "LossConfig",
    "MetricsLog",
    "OptimConfig",
    "PredictorConfig",
    "Ranks",
    "RolloutConfig",
    "TaskConfig",
    "TaskCorpus",
    "TaskSource",
    "TrainConfig",
    "all_gather",
    "build_tasks",
    "ensure_flash_attn",
    "eval_set",
    "fact_disjoint_questions",
    "init_from_env",
    "latest_checkpoint",
    "load_checkpoint",
    "load_config",
    "make_optimizer",
    "openrlhf_losses",
    "plot_learning_curve",
    "plot_run",
    "policy_distance",
    "read_metrics",
    "train",
    "tree_health",
    "update_policy",
]

__getattr__ = lazy_names(
    __name__,
    {
        "latest_checkpoint": "harness.training.checkpoint",
        "load_checkpoint": "harness.training.checkpoint",
        "policy_distance": "harness.training.checkpoint",
        "Ranks": "harness.training.distributed",
        "all_gather": "harness.training.distributed",
        "init_from_env": "harness.training.distributed",
        "make_optimizer": "harness.training.optimizers",
        "train": "harness.training.trainer",
        "update_policy": "harness.training.trainer",
    },
)
