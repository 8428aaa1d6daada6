"""`TreePolicyModelActor`: OpenRLHF's DeepSpeed policy actor, with two changes for tree steps.

OpenRLHF 0.11.2's `PolicyModelActor` is used as it is (model, DeepSpeed strategy, replay buffer,
`ppo_train`, weight sync, checkpoints), except:

1. **The learning-rate schedule counts tree steps.** DeepSpeed steps the scheduler after every
   optimizer step, and upstream sizes it from `prompts x n_samples_per_prompt /
   train.batch_size`. A tree step trains on however many leaves had a signal (plus fillers), so
   its optimizer steps vary: in the leaves currency the schedule would end late (a cosine never
   decays), in the tokens currency it could overrun (a cosine rises again). Here a whole tree
   step trains at one learning rate and the schedule then advances by one, so its length is the
   number of tree steps, known exactly in both currencies (`TreePPOTrainerBase.get_max_steps`).
2. **A micro-batch of fillers logs no NaN.** Its token-weighted metrics (`ppo_kl`,
   `ppo_clip_ratio`, `logprobs_diff`, `vllm_kl`) are means over zero action tokens, 0/0;
   `ppo_train` weighs them by that zero count, and NaN x 0 is still NaN. Setting them to 0 is
   exact: they weigh nothing in the step's mean.

Upstream builds its `ActorPPOTrainer` inside the 100-line `init_model_from_pretrained`, so the
one overridden method (`training_step`) is brought in by making that object an instance of the
subclass, which adds no state.
"""

from __future__ import annotations

from harness.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf.trainer.ray.ppo_actor imports openrlhf.models (openrlhf_compat.py)

import contextlib  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor  # noqa: E402

__all__ = [
    "TreeActorPPOTrainer",
    "TreePolicyModelActor",
    "TreePolicyModelActorBase",
    "finite_filler_metrics",
    "one_schedule_step",
    "skip_zero_learning_rate",
    "tree_steps",
]


def _plain_class(actor: Any) -> type[Any]:
    """The user class behind a `@ray.remote` actor class (the class itself without Ray)."""
    modified = getattr(getattr(actor, "__ray_metadata__", None), "modified_class", actor)
    return getattr(modified, "__ray_actor_class__", modified)


def finite_filler_metrics(status: dict[str, Any]) -> dict[str, Any]:
    """Zero the token-weighted metrics of a micro-batch without action tokens, in place.

    Args:
        status: What `ActorPPOTrainer.training_step` returns (`metrics`, `weights`,
            `num_action_tokens`).

    Returns:
        `status`.
    """
    if status["num_action_tokens"] > 0:
        return status
    metrics = status["metrics"]
    for key, weight in status["weights"].items():
        value = metrics.get(key)
        if weight == "token" and isinstance(value, torch.Tensor):
            metrics[key] = torch.nan_to_num(value, nan=0.0)
    return status


@contextlib.contextmanager
def one_schedule_step(engine: Any) -> Iterator[None]:
    """Train the body at one learning rate, then advance the engine's scheduler by one step.

    DeepSpeed steps `engine.lr_scheduler` after each optimizer step when it is set; it is
    unset while the body runs and stepped once after it succeeds.

    Args:
        engine: A `deepspeed.DeepSpeedEngine` (or anything with an `lr_scheduler` attribute).
    """
    scheduler = engine.lr_scheduler
    engine.lr_scheduler = None
    try:
        yield
    finally:
        engine.lr_scheduler = scheduler
    if scheduler is not None:
        scheduler.step()


def skip_zero_learning_rate(scheduler: Any) -> None:
    """Step a scheduler that starts at learning rate 0 once, so the first tree step trains.

    A linear warm-up gives its step 0 a factor of 0: upstream loses one optimizer step to it, a
    tree step (which trains at one learning rate) would lose all of its own. A scheduler already
    past 0 (no warm-up, or restored from a checkpoint) is left as it is.
    """
    if scheduler is not None and all(lr == 0 for lr in scheduler.get_last_lr()):
        scheduler.step()


def tree_steps(n_prompts: int, batch_size: int, n_episodes: int) -> int:
    """Tree steps in a run: each draws `batch_size` prompts until the dataset is used up.

    >>> tree_steps(24, 8, 1), tree_steps(25, 8, 2)
    (3, 8)
    """
    return -(-n_prompts // batch_size) * n_episodes


class TreeActorPPOTrainer(ActorPPOTrainer):
    """`ActorPPOTrainer` whose filler-only micro-batches log finite metrics."""

    def training_step(
        self,
        experience: Any,
        kl_ctl: float,
        step: int,
        loss_batch_info: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """OpenRLHF's training step, then `finite_filler_metrics`."""
        return finite_filler_metrics(
            super().training_step(experience, kl_ctl, step, loss_batch_info)
        )


class TreePolicyModelActorBase(_plain_class(PolicyModelActor)):  # type: ignore[misc]
    """OpenRLHF's `PolicyModelActor` with the two changes of the module docstring."""

    def init_model_from_pretrained(
        self,
        strategy: Any,
        pretrain: str,
        max_steps: int | None = None,
        vllm_engines: Any = None,
    ) -> None:
        """Upstream's set-up; `max_steps` is the schedule length in tree steps."""
        super().init_model_from_pretrained(strategy, pretrain, max_steps, vllm_engines)
        self.trainer.__class__ = TreeActorPPOTrainer  # one method overridden, no new state
        skip_zero_learning_rate(self.actor.model.lr_scheduler)

    def fit(self, kl_ctl: float = 0) -> dict[str, Any]:
        """Train on the replay buffer (one tree step) at one learning rate."""
        with one_schedule_step(self.actor.model):
            return super().fit(kl_ctl)

    def advance_schedule(self) -> None:
        """Advance the schedule for a tree step that kept no leaf to train on."""
        with one_schedule_step(self.actor.model):
            pass


TreePolicyModelActor = ray.remote(num_gpus=1)(TreePolicyModelActorBase)
"""`TreePolicyModelActorBase` as a Ray actor (one per DeepSpeed rank), as upstream declares it."""
