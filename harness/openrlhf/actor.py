"""`TreePolicyModelActor`: OpenRLHF's DeepSpeed policy actor, with these changes for tree steps.

OpenRLHF 0.11.2's `PolicyModelActor` is used as it is (model, DeepSpeed strategy, replay buffer,
`ppo_train`, weight sync, checkpoints), except:

1. **The learning-rate schedule counts tree steps.** DeepSpeed steps the scheduler after every
   optimizer step, and upstream sizes it from `prompts x n_samples_per_prompt /
   train.batch_size`. A tree step trains on however many leaves had a signal (plus fillers), so
   its optimizer steps vary: in the leaves currency the schedule would end late (a cosine never
   decays), in the tokens currency it could overrun (a cosine rises again). Here a whole tree
   step trains at one learning rate and the schedule then advances by one, so its length is the
   number of tree steps, known exactly in both currencies (`TreePPOTrainerBase.get_max_steps`).
2. **Movement is logged.** Every tree step reports the optimizer steps it took
   (`policy/optimizer_steps`, from the engine's step counters) and, when the trainer turns it on
   (`--update-norm`), how far they moved the weights, `policy/update_norm` = ‖θ_after −
   θ_before‖ (`measure_movement`): each rank copies its own share of the weights to host memory
   before the step (under ZeRO-3 its partition, never a gathered copy), sums the squared
   changes of that share after it, and the ranks all-reduce the sums.
3. **A micro-batch of fillers logs no NaN.** Its token-weighted metrics (`ppo_kl`,
   `ppo_clip_ratio`, `logprobs_diff`, `vllm_kl`) are means over zero action tokens, 0/0;
   `ppo_train` weighs them by that zero count, and NaN x 0 is still NaN. Setting them to 0 is
   exact: they weigh nothing in the step's mean.
4. **The first tree step never trains at learning rate 0.** A warm-up's step 0 has a factor
   of 0, which would cost a whole tree step here (upstream loses one optimizer step); a
   scheduler that starts at 0 is stepped once at set-up (`skip_zero_learning_rate`).

Upstream builds its `ActorPPOTrainer` inside the 100-line `init_model_from_pretrained`, so the
one overridden method (`training_step`) is brought in by making that object an instance of the
subclass, which adds no state.
"""

from __future__ import annotations

from harness.training.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf.trainer.ray.ppo_actor imports openrlhf.models (openrlhf_compat.py)

import contextlib  # noqa: E402
import math  # noqa: E402
from collections.abc import Callable, Iterator, Sequence  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer, PolicyModelActor  # noqa: E402

__all__ = [
    "TreeActorPPOTrainer",
    "TreePolicyModelActor",
    "TreePolicyModelActorBase",
    "finite_filler_metrics",
    "measure_movement",
    "one_schedule_step",
    "own_shards",
    "skip_zero_learning_rate",
    "squared_change",
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


def own_shards(params: Sequence[torch.Tensor], *, rank: int, world_size: int) -> list[torch.Tensor]:
    """This rank's share of the weights; the ranks' shares are disjoint and cover every weight.

    Under ZeRO-3 a parameter's `ds_tensor` is this rank's partition of it (its padding is zero
    and stays zero). Otherwise every rank holds every parameter whole, and a rank takes every
    `world_size`-th of them.
    """
    out = []
    for i, p in enumerate(params):
        partition = getattr(p, "ds_tensor", None)
        if partition is not None:
            out.append(partition)
        elif i % world_size == rank:
            out.append(p)
    return out


def squared_change(before: Sequence[torch.Tensor], after: Sequence[torch.Tensor]) -> float:
    """Σ (after − before)² over matching tensors, in float64 (`before` may sit on the host).

    >>> squared_change([torch.zeros(2)], [torch.tensor([3.0, 4.0])])
    25.0
    """
    total = 0.0
    for a, b in zip(before, after, strict=True):
        diff = b.detach().float() - a.to(b.device).float()  # one tensor on the device at a time
        total += float(diff.pow(2).sum(dtype=torch.float64))
    return total


def measure_movement(
    engine: Any,
    train: Callable[[], dict[str, Any]],
    *,
    update_norm: bool,
    rank: int,
    world_size: int,
    all_reduce: Callable[[torch.Tensor], None],
) -> dict[str, Any]:
    """Run `train` (one tree step's fit) and add what it did to the weights to its status.

    Args:
        engine: The DeepSpeed engine (`global_steps`, `skipped_steps`, `module`).
        train: Trains and returns the status dict.
        update_norm: Also measure ‖θ_after − θ_before‖ (costs a host copy of this rank's share).
        rank: This rank.
        world_size: The data-parallel ranks.
        all_reduce: Sums a float64 tensor over the ranks in place.

    Returns:
        `train`'s status with `policy/optimizer_steps` (steps DeepSpeed applied, overflow-skipped
        ones left out) and, with `update_norm`, `policy/update_norm`; the same on every rank.
    """
    taken = engine.global_steps - engine.skipped_steps
    shards = own_shards(list(engine.module.parameters()), rank=rank, world_size=world_size)
    before = [t.detach().to("cpu", copy=True) for t in shards] if update_norm else []
    status = train()
    status["policy/optimizer_steps"] = float(engine.global_steps - engine.skipped_steps - taken)
    if update_norm:
        own = torch.tensor([squared_change(before, shards)], dtype=torch.float64)
        all_reduce(own)
        status["policy/update_norm"] = math.sqrt(float(own[0]))
    return status


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
    """OpenRLHF's `PolicyModelActor` with the changes of the module docstring."""

    update_norm = False
    """Measure `policy/update_norm` (set by `measure_update_norm`)."""

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
        """Train on the replay buffer (one tree step) at one learning rate; log its movement."""
        import torch.distributed as dist

        engine = self.actor.model

        def all_reduce(total: torch.Tensor) -> None:
            on_device = total.to(torch.cuda.current_device())  # NCCL reduces device tensors
            dist.all_reduce(on_device)
            total.copy_(on_device.cpu())

        with one_schedule_step(engine):
            return measure_movement(
                engine,
                lambda: super(TreePolicyModelActorBase, self).fit(kl_ctl),
                update_norm=self.update_norm,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                all_reduce=all_reduce,
            )

    def measure_update_norm(self, enabled: bool) -> None:
        """Log `policy/update_norm` from now on (`--update-norm`; see the module docstring)."""
        self.update_norm = enabled

    def advance_schedule(self) -> None:
        """Advance the schedule for a tree step that kept no leaf to train on."""
        with one_schedule_step(self.actor.model):
            pass


TreePolicyModelActor = ray.remote(num_gpus=1)(TreePolicyModelActorBase)
"""`TreePolicyModelActorBase` as a Ray actor (one per DeepSpeed rank), as upstream declares it."""
