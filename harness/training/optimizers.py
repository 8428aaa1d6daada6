"""The trainer's optimizer step, plain PyTorch or DeepSpeed ZeRO, in one CPU process or several.

Both wrappers take a loss that is already normalised over the whole step's batch (the trainer
divides by the step's action-token count, across all ranks), accumulate gradients over
micro-batches with `backward`, and apply one update with `step`:

- `TorchOptimizer`: `torch.optim.AdamW` with gradient-norm clipping; under torchrun it averages
  the gradients over the ranks before clipping (what DDP does), so every rank takes the same step;
- `DeepSpeedOptimizer`: the same AdamW as DeepSpeed's *client* optimizer, wrapped by
  `deepspeed.initialize` with ZeRO stage 0-3 on the gloo backend: one process, or the
  torchrun group (DeepSpeed averages the gradients and partitions optimizer state, gradients
  and, at stage 3, the weights across the ranks). A client torch optimizer avoids the
  multi-minute JIT build of DeepSpeed's fused CPU Adam; DeepSpeed's CPU accelerator still
  JIT-builds its shared-memory comm op on first use (cached in `~/.cache/torch_extensions`; its
  cost: docs/design.md §5).

Gradients are *averaged* over ranks, as in DDP and DeepSpeed; the trainer multiplies its loss by
the world size (OpenRLHF's `dp_size`) so that the averaged gradient is the global token mean's.

Under torchrun, DeepSpeed reads its rendezvous from `MASTER_ADDR`, `MASTER_PORT`, `RANK`,
`LOCAL_RANK` and `WORLD_SIZE`. In one process, `DeepSpeedOptimizer` starts a one-process gloo
group on an in-process store instead: no port to choose, none to race for.
"""

from __future__ import annotations

import enum
import logging
import os
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
import torch.distributed as dist

from harness.policies.base import BackendUnavailable

if TYPE_CHECKING:
    from torch import nn

__all__ = ["DeepSpeedOptimizer", "OptimizerStep", "TorchOptimizer", "make_optimizer"]

log = logging.getLogger(__name__)


class OptimizerStep(Protocol):
    """Accumulate gradients, then update: what the trainer needs from an optimizer."""

    model: nn.Module
    """The module to call forward on (DeepSpeed's engine, or the model itself)."""

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Accumulate the gradients of one micro-batch's share of the loss.

        `last` marks the step's final micro-batch (DeepSpeed reduces gradients there).
        """
        ...

    def step(self, lr: float) -> float:
        """Apply the accumulated gradients at learning rate `lr`; returns the gradient norm."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state (tensors, numbers, lists and dicts only)."""
        ...

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full weights, whole on every rank (gathered where ZeRO-3 splits them)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output."""
        ...


def _adamw(
    model: nn.Module, lr: float, betas: tuple[float, float], weight_decay: float
) -> torch.optim.AdamW:
    decay: list[Any] = []
    no_decay: list[Any] = []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "norm" in name else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=lr, betas=betas)


class TorchOptimizer:
    """AdamW with gradient-norm clipping.

    Args:
        model: The policy.
        lr: Initial learning rate (`step` sets it each update).
        betas: Adam's betas.
        weight_decay: Decoupled weight decay on matrices (not on norms and biases).
        grad_clip: Clip the global gradient norm to this (0 disables).
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
    ) -> None:
        self.model = model
        self.optimizer = _adamw(model, lr, betas, weight_decay)
        self.grad_clip = grad_clip

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """`loss.backward()`: gradients add up over micro-batches."""
        loss.backward()

    def step(self, lr: float) -> float:
        """Average over ranks, clip, update, zero the gradients; returns the pre-clip norm."""
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        world = _world_size()
        if world > 1:  # DDP's gradient all-reduce, once per step (every rank then steps alike)
            for p in params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        if self.grad_clip > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip))
        else:
            norm = float(torch.linalg.vector_norm(torch.stack([_norm(p) for p in params])))
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def state_dict(self) -> dict[str, Any]:
        """AdamW's state dict."""
        return self.optimizer.state_dict()

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's state dict (its parameters are whole)."""
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore AdamW's state dict."""
        self.optimizer.load_state_dict(state)


def _world_size() -> int:
    """Ranks in the default process group (1 without one)."""
    return dist.get_world_size() if dist.is_initialized() else 1


def _norm(p: torch.Tensor) -> torch.Tensor:
    return torch.zeros(()) if p.grad is None else torch.linalg.vector_norm(p.grad.detach())


class DeepSpeedOptimizer:
    """AdamW wrapped by a DeepSpeed ZeRO engine (stage 0-3) on gloo, one process or torchrun's.

    Gradient accumulation is driven here: every micro-batch but the step's last runs with the
    engine's accumulation boundary off, the last with it on (DeepSpeed reduces the gradients
    there), then one `engine.step()`: the documented `set_gradient_accumulation_boundary`
    pattern, so a step may have any number of micro-batches (a tree step's leaf count varies).

    Args:
        model: The policy (the engine wraps it; call `self.model` for forward passes).
        zero_stage: ZeRO stage, 0 to 3.
        lr: Initial learning rate.
        betas: Adam's betas.
        weight_decay: Weight decay on matrices.
        grad_clip: DeepSpeed's `gradient_clipping` (0 disables).

    Raises:
        BackendUnavailable: deepspeed is not installed (the `train` extra).
        ValueError: a stage outside 0-3.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        zero_stage: int,
        lr: float,
        betas: tuple[float, float] = (0.9, 0.95),
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
    ) -> None:
        if zero_stage not in (0, 1, 2, 3):
            raise ValueError(f"zero_stage={zero_stage}: DeepSpeed ZeRO has stages 0 to 3")
        try:
            import deepspeed
        except ImportError as err:
            raise BackendUnavailable(
                "--optim.backend deepspeed needs deepspeed: pip install 'trace-rl[train]' "
                "(DS_BUILD_OPS=0 keeps the install from compiling CUDA ops)"
            ) from err
        if not torch.distributed.is_initialized():
            if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # a launcher's rendezvous (env://)
                deepspeed.init_distributed(dist_backend="gloo")
            else:
                _one_process_group()
        os.environ.setdefault("LOCAL_RANK", "0")  # DeepSpeed's engine reads it
        config = {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": 1,
            "gradient_clipping": grad_clip,
            "zero_optimization": {"stage": zero_stage},
            "bf16": {"enabled": False},
            "fp16": {"enabled": False},
            "steps_per_print": 1 << 30,
            "wall_clock_breakdown": False,
        }
        optimizer = _adamw(model, lr, betas, weight_decay)
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=optimizer, config=config
        )
        self.engine = engine
        self.model = engine
        self.zero_stage = zero_stage
        self._ds_optimizer = ds_optimizer
        self._boundary = False
        self.world_size = _world_size()
        log.info("DeepSpeed ZeRO-%d engine ready (gloo, %d rank(s))", zero_stage, self.world_size)

    def backward(self, loss: torch.Tensor, *, last: bool) -> None:
        """Accumulate; on the `last` micro-batch DeepSpeed also reduces the gradients."""
        self.engine.set_gradient_accumulation_boundary(last)
        self.engine.backward(loss, scale_wrt_gas=False)  # the trainer already scaled the loss
        self._boundary = last

    def step(self, lr: float) -> float:
        """Apply the reduced gradients; returns DeepSpeed's gradient norm.

        Raises:
            RuntimeError: the last backward was not marked `last`.
        """
        if not self._boundary:
            raise RuntimeError("step() needs a backward(..., last=True) just before it")
        for group in self._ds_optimizer.param_groups:
            group["lr"] = lr
        norm: Any = None
        if self.zero_stage == 0:  # the engine keeps no norm without ZeRO: measure it here
            params = list(self.engine.module.parameters())
            norm = torch.linalg.vector_norm(torch.stack([_norm(p) for p in params]))
        self.engine.step()
        self.engine.zero_grad()
        self._boundary = False
        norm = self.engine.get_global_grad_norm() if norm is None else norm
        return float(norm) if norm is not None else float("nan")

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full weights, copied out; under ZeRO-3 gathered from every rank first.

        ZeRO-3 keeps only each rank's partition of a parameter (the module's own tensors are
        empty placeholders once the group has more than one rank), so a plain `state_dict()`
        would save empty tensors. `GatheredParameters` assembles them for the copy.
        """
        module = self.engine.module
        if self.zero_stage < 3:
            return {k: v.detach().clone() for k, v in module.state_dict().items()}
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in module.state_dict().items()}

    def state_dict(self) -> dict[str, Any]:
        """The ZeRO optimizer's state: its entries made of tensors, numbers and strings only.

        The rest (the loss scaler object, the stage enum) follows from the config and is rebuilt
        by the engine, so a checkpoint loads with `torch.load(weights_only=True)`. With several
        ranks and ZeRO 1-3, each rank holds a partition: this is then a collective, and returns
        `{"ranks": [rank 0's, rank 1's, ...]}` on every rank.
        """
        own = {k: v for k, v in self._ds_optimizer.state_dict().items() if _plain(v)}
        if self.world_size == 1 or self.zero_stage == 0:  # whole (stage 0 is replicated)
            return own
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, own)
        return {"ranks": gathered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore `state_dict` output over this engine's own (config-derived) entries.

        Load the model's weights first; ZeRO's fp32 master copies come from `state`.

        Raises:
            ValueError: a state saved by another number of ranks.
        """
        saved = list(state["ranks"]) if "ranks" in state else [state]
        partitioned = self.zero_stage > 0 and self.world_size > 1
        if len(saved) != (self.world_size if partitioned else 1):
            raise ValueError(
                f"the optimizer state holds {len(saved)} ZeRO-{self.zero_stage} partition(s); "
                f"this run has {self.world_size} rank(s): resume with the saving run's "
                "--nproc_per_node"
            )
        own = self._ds_optimizer.state_dict()
        merged = [own | dict(s) for s in saved]
        if self.zero_stage == 0:  # the client AdamW itself
            self._ds_optimizer.load_state_dict(merged[0])
        else:  # one state per data-parallel rank; each rank loads its own
            self._ds_optimizer.load_state_dict(merged, load_from_fp32_weights=True)


def _plain(value: Any) -> bool:
    """Whether a value holds only what `torch.load(weights_only=True)` accepts."""
    if isinstance(value, torch.Tensor | int | float | bool | str | type(None)):
        return not isinstance(value, enum.Enum)
    if isinstance(value, list | tuple):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _one_process_group() -> None:
    """A one-process gloo group whose store lives in this process; DeepSpeed adopts it.

    It binds no rendezvous port: a port picked free and bound later can be taken in between by
    another process (two test workers), and a `MASTER_PORT` written into `os.environ` was
    inherited by child processes, which then bound the port this process's store still held
    (EADDRINUSE).
    """
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("gloo", store=store, rank=0, world_size=1)


def make_optimizer(
    model: nn.Module,
    *,
    backend: Literal["torch", "deepspeed"],
    zero_stage: int = 0,
    lr: float,
    betas: tuple[float, float] = (0.9, 0.95),
    weight_decay: float = 0.0,
    grad_clip: float = 1.0,
) -> OptimizerStep:
    """The optimizer wrapper a trainer config names.

    Raises:
        ValueError: an unknown backend.
    """
    if backend == "torch":
        return TorchOptimizer(
            model, lr=lr, betas=betas, weight_decay=weight_decay, grad_clip=grad_clip
        )
    if backend == "deepspeed":
        return DeepSpeedOptimizer(
            model,
            zero_stage=zero_stage,
            lr=lr,
            betas=betas,
            weight_decay=weight_decay,
            grad_clip=grad_clip,
        )
    raise ValueError(f"optim backend {backend!r}: choose 'torch' or 'deepspeed'")
