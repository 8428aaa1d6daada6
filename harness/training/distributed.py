"""Data-parallel CPU training (`torchrun --nproc_per_node N tracerl ... train`): the ranks' share.

Every rank runs the same trainer loop. What is split, and how
(docs/decisions.md, "Data-parallel CPU training"):

- **Rollouts, wave by wave.** Every rank runs the allocator on the same trees with the same
  generator and predictor, so every rank computes the same wave of requests. `ShardedExecutor`
  runs each rank's share of the wave's episodes and all-gathers the finished rollouts, so after
  every wave every rank holds the same trees again. The driver (`trace_alloc.run_step`) is
  untouched: the step's exact budget and the fork law hold as in one process. A continuation
  runs on the rank that parked its anchor (the live env snapshot exists there only); fresh roots
  go to the least-loaded rank.
- **The update.** Every rank derives the same global list of leaves; `deal` gives each rank every
  `world_size`-th leaf by length, and the loss is normalised by the *global* action-token count,
  so the ranks' losses add up to the one-process token mean. DeepSpeed (or `TorchOptimizer`'s
  all-reduce) averages the gradients; the loss carries OpenRLHF's `dp_size` factor to undo that
  average (`openrlhf.models.loss.aggregate_loss`). Every rank runs the same number of
  micro-batches (ZeRO-3's forward is a collective), padding with zero-weight ones.
- **The predictor** learns the same nodes on every rank, so it stays the same;
  `check_same_across_ranks` verifies its digest after each update, and `ShardedExecutor` that
  every rank asked for the same wave.
- **Files**: only rank 0 writes the config, metrics, trees, checkpoints and the policy.

One process (no `WORLD_SIZE`, or 1) is `Ranks(0, 1)`, and every function here is then the
identity: the single-process trainer is unchanged.
"""

from __future__ import annotations

import atexit
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from harness.errors import RankMismatchError
from trace_alloc import Rollout, RolloutRequest, RolloutTree

if TYPE_CHECKING:
    from harness.rollout.engine import TreeRolloutEngine

__all__ = [
    "ONE_PROCESS",
    "RankMismatchError",
    "Ranks",
    "ShardedExecutor",
    "all_gather",
    "check_same_across_ranks",
    "deal",
    "init_from_env",
    "sum_across_ranks",
]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's place in the data-parallel group."""

    rank: int = 0
    world_size: int = 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that writes files."""
        return self.rank == 0


ONE_PROCESS = Ranks()
"""No data parallelism: every function here is then the identity."""


def init_from_env() -> Ranks:
    """Join the group torchrun describes (`WORLD_SIZE` > 1) on gloo, or stay one process.

    A group that is already up (DeepSpeed's one-process group in an earlier run of the same
    process) is used as it is. A group joined here is taken down when the process exits.
    """
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("gloo")
        # left up, gloo's worker threads meet C++'s exit-time destructors, which can abort a
        # rank that finished well ("terminate called without an active exception")
        atexit.register(_leave_group)
    if dist.is_initialized():
        return Ranks(dist.get_rank(), dist.get_world_size())
    return Ranks()


def _leave_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_gather(value: T, ranks: Ranks) -> list[T]:
    """Every rank's `value` (any picklable object), in rank order."""
    if ranks.world_size == 1:
        return [value]
    out: list[Any] = [None] * ranks.world_size
    dist.all_gather_object(out, value)
    return out


def sum_across_ranks(values: Mapping[str, float], ranks: Ranks) -> dict[str, float]:
    """Each entry summed over the ranks (float64, so the sum is exact enough to compare)."""
    if ranks.world_size == 1:
        return dict(values)
    keys = sorted(values)
    total = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64)  # (K,)
    dist.all_reduce(total)
    return dict(zip(keys, total.tolist(), strict=True))


def check_same_across_ranks(state: Mapping[str, np.ndarray], ranks: Ranks, what: str) -> None:
    """Raise unless `state`'s arrays are bit-identical on every rank.

    Raises:
        RankMismatchError: some rank holds other values.
    """
    if ranks.world_size == 1:
        return
    digest = hashlib.sha256()
    for key in sorted(state):
        array = np.ascontiguousarray(state[key])
        digest.update(key.encode() + str(array.dtype).encode() + array.tobytes())
    digests = all_gather(digest.hexdigest(), ranks)
    if len(set(digests)) > 1:
        raise RankMismatchError(f"the {what} differs across ranks (digests {digests})")


def deal(items: Sequence[T], ranks: Ranks, *, size: Any) -> list[T]:
    """This rank's share: every `world_size`-th item in order of `size` (balanced lengths).

    At one rank: all items, sorted by `size` (stable).
    """
    order = sorted(range(len(items)), key=lambda i: size(items[i]))
    return [items[i] for i in order[ranks.rank :: ranks.world_size]]


class ShardedExecutor:
    """A `trace_alloc.Executor` that runs each wave's episodes across the ranks.

    Build one per step (it remembers which rank parked which snapshot during that step) around
    the rank's own engine, whose snapshot ids carry the rank (`snapshot_prefix`), and pass it to
    `TreeRolloutEngine.run_step(..., execute=...)`.

    Args:
        engine: This rank's engine (its store holds the episodes this rank parked).
        ranks: This process's rank and the world size.
    """

    def __init__(self, engine: TreeRolloutEngine, ranks: Ranks) -> None:
        self.engine = engine
        self.ranks = ranks
        self._owner: dict[str, int] = {}  # snapshot id -> the rank whose store holds it

    def shares(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> list[list[int]]:
        """For each request, how many of its rollouts each rank runs (the same on every rank).

        A continuation goes whole to the rank that holds its anchor; root episodes then go one
        by one to the rank with the fewest episodes in this wave (the lowest rank on a tie).
        """
        world = self.ranks.world_size
        load = [0] * world
        shares = [[0] * world for _ in requests]
        for share, request in zip(shares, requests, strict=True):
            turn = trees[request.tree_index].nodes[request.node_id].turn
            if turn is not None:  # a fork: only the anchor's owner can continue it
                owner = self._owner[str(turn.snapshot_id)]
                share[owner] = request.n
                load[owner] += request.n
        for share, request in zip(shares, requests, strict=True):
            if request.node_id == 0:
                for _ in range(request.n):
                    rank = min(range(world), key=load.__getitem__)
                    share[rank] += 1
                    load[rank] += 1
        return shares

    def __call__(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> list[list[Rollout]]:
        """Run this rank's share, then gather everyone's: the wave's rollouts, in request order.

        Raises:
            RankMismatchError: the ranks' allocators asked for different waves.
        """
        shares = self.shares(trees, requests)
        me = self.ranks.rank
        mine = [
            RolloutRequest(tree_index=r.tree_index, node_id=r.node_id, n=share[me])
            for r, share in zip(requests, shares, strict=True)
            if share[me]
        ]
        wave = [(r.tree_index, r.node_id, r.n) for r in requests]
        gathered = all_gather((wave, self.engine(trees, mine)), self.ranks)
        if any(other != wave for other, _ in gathered):  # the split assumes one wave everywhere
            raise RankMismatchError(f"rank {me}'s allocator asked for another wave than a peer's")
        parts = [iter(results) for _, results in gathered]  # each rank's groups, in its order
        out: list[list[Rollout]] = []
        for share in shares:
            group: list[Rollout] = []
            for rank, n in enumerate(share):
                if n:
                    rollouts = next(parts[rank])
                    group += rollouts
                    for rollout in rollouts:
                        for turn in rollout.turns:
                            if turn.snapshot_id is not None:
                                self._owner[turn.snapshot_id] = rank
            out.append(group)
        return out
