"""The OpenRLHF policy actor's movement metrics on CPU: optimizer steps from the engine's
counters, and ‖Δθ‖ summed over each rank's own share of the weights (ZeRO-3 partitions faked
as flat, padded slices), which must equal the norm over the whole model."""

from __future__ import annotations

import math
from types import SimpleNamespace as NS

import pytest
import torch

from harness.openrlhf.actor import measure_movement, own_shards, squared_change

SHAPES = [(4, 3), (5,), (2, 2, 2)]


def _params() -> list[torch.Tensor]:
    torch.manual_seed(0)
    return [torch.randn(shape) for shape in SHAPES]


def _zero3(params: list[torch.Tensor], rank: int, world: int) -> list[NS]:
    """Each parameter as ZeRO-3 holds it on `rank`: a placeholder with its own padded slice."""
    out = []
    for p in params:
        size = -(-p.numel() // world)
        flat = torch.cat([p.flatten(), torch.zeros(size * world - p.numel())])
        out.append(NS(ds_tensor=flat[rank * size : (rank + 1) * size]))
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("zero3", [False, True])
def test_the_ranks_squared_changes_add_up_to_the_whole_models_update_norm(world, zero3):
    before = _params()
    after = [p + 0.1 * torch.randn_like(p) for p in before]
    whole = math.sqrt(sum(float((a - b).pow(2).sum()) for a, b in zip(after, before, strict=True)))
    total = 0.0
    for rank in range(world):
        if zero3:
            b_own = own_shards(_zero3(before, rank, world), rank=rank, world_size=world)
            a_own = own_shards(_zero3(after, rank, world), rank=rank, world_size=world)
            assert len(b_own) == len(SHAPES)  # a slice of every parameter
        else:  # replicated weights: each rank takes every world-th parameter
            b_own = own_shards(before, rank=rank, world_size=world)
            a_own = own_shards(after, rank=rank, world_size=world)
        total += squared_change(b_own, a_own)
    assert math.sqrt(total) == pytest.approx(whole, rel=1e-6)  # float32 sums


class _Engine:
    """A DeepSpeed engine's step counters and module; `step` moves one weight."""

    def __init__(self) -> None:
        self.module = torch.nn.Linear(3, 2)
        self.global_steps = 7  # a resumed run: counters do not start at 0
        self.skipped_steps = 1

    def step(self, skipped: bool = False) -> None:
        self.global_steps += 1
        if skipped:  # an overflow: DeepSpeed counts the step but applies nothing
            self.skipped_steps += 1
            return
        with torch.no_grad():
            self.module.weight[0, 0] += 0.3
            self.module.bias[1] -= 0.4


def test_a_tree_step_reports_the_optimizer_steps_it_applied_and_how_far_they_moved():
    engine = _Engine()
    reduced = []

    def train():
        engine.step()
        engine.step(skipped=True)
        engine.step()
        return {"policy_loss": 0.1}

    def all_reduce(total):  # one rank: the sum is its own
        reduced.append(float(total[0]))

    status = measure_movement(
        engine, train, update_norm=True, rank=0, world_size=1, all_reduce=all_reduce
    )
    assert status["policy/optimizer_steps"] == 2
    assert status["policy/update_norm"] == pytest.approx(math.hypot(0.6, 0.8))
    assert reduced and status["policy_loss"] == 0.1


def test_without_update_norm_nothing_is_copied_and_the_steps_are_still_counted():
    engine = _Engine()

    def all_reduce(total):
        raise AssertionError("no collective without --update-norm")

    status = measure_movement(
        engine, lambda: {}, update_norm=False, rank=0, world_size=1, all_reduce=all_reduce
    )
    assert status == {"policy/optimizer_steps": 0.0}
