"""One tree step, the part both trainers share: from a step's pool to the leaves to train.

The CPU trainer (`harness.training.trainer`) and the OpenRLHF sample generator
(`harness.openrlhf.samples`) both call `TreeStep.run`, which runs the phases in one order:

1. **rollout**: `TreeRolloutEngine.run_step` lets the allocator spend the step's budget
   (`trace_alloc.BudgetLimit`: its currency, its size and its wave cap) on roots and turn
   prefixes; the budget's carry and the first wave's leaf cost are threaded to the next step;
2. **predictor**: Ṽψ is scored on the step's nodes before it learns them, then fitted to V̂
   (`trace_alloc.learn_from_step`);
3. **flip calibrator**: fitted on this step's Stage-2 flips, used from the next step;
4. **advantages**: `trace_alloc.tree_advantages` on the trees the allocator keeps, leaves a fault
   ended left out (`harness.rollout.engine.leaves_to_train`);
5. **the leaves with signal**: what the trainer turns into its own batches (CPU token tensors,
   OpenRLHF `Experience`s).

Everything else is the trainer's own: the optimizer and the ranks (CPU), experiences, fillers
and Ray (OpenRLHF). docs/decisions.md, "One tree step", says why the order and the wave cap are
the ones they are.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from harness.rollout.engine import EngineStats, TreeRolloutEngine, leaves_to_train
from harness.training.metrics_log import advantage_metrics, rollout_metrics
from trace_alloc import (
    Allocator,
    BudgetLimit,
    Executor,
    FlipCalibrator,
    Predictor,
    RolloutTree,
    StepResult,
    learn_from_step,
)
from trace_alloc.advantages import LeafAdvantage
from trace_alloc.budget import Spend

__all__ = ["TreeStep", "TreeStepOutput", "allocator_rng"]


def allocator_rng(seed: int) -> np.random.Generator:
    """The allocator's generator of a run seeded `seed`: the same stream in both trainers."""
    return np.random.default_rng([seed, 1])


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeStepOutput:
    """What one tree step produced."""

    result: StepResult
    """Every tree of the pool, the spend and the waves."""
    kept: list[RolloutTree]
    """The trees the allocator keeps for training (`result.train_indices`)."""
    leaves: list[LeafAdvantage]
    """The leaves with a training signal, indexing `kept`."""
    metrics: dict[str, Any]
    """`rollout/*`, `predictor/*`, `stage2/*`, `advantage/*`, `budget/*` and `perf/*` keys."""
    stats: EngineStats
    """What the engine ran this step (generated tokens, rollouts, wall time)."""


@dataclass(slots=True, kw_only=True)
class TreeStep:
    """The allocator's state between steps and the phases of one step (module docstring).

    Both trainers build one per run and call `run` once per step; a checkpoint saves `rng`,
    `carry`, `tokens_per_leaf`, `spent` and the predictor's and calibrator's state dicts.
    """

    engine: TreeRolloutEngine
    allocator: Allocator
    budget: BudgetLimit
    predictor: Predictor
    flip_calibrator: FlipCalibrator | None
    """Online calibration of Stage 2's flip chances (None when off)."""
    advantage: str
    """The `trace_alloc.tree_advantages` mode."""
    rng: np.random.Generator
    """The allocator's only source of randomness."""
    tokens_per_leaf: float
    """Token currency: the estimate the next step's first wave is planned with."""
    carry: float = 0.0
    """Token currency: budget carried over to the next step (debt > 0, credit < 0)."""
    spent: Spend = field(default_factory=Spend)
    """Budget spent over the run so far."""

    def run(self, task_ids: Sequence[str], *, execute: Executor | None = None) -> TreeStepOutput:
        """Spend one step's budget on `task_ids`, learn from the trees, pick the leaves to train.

        Args:
            task_ids: The step's pool, in sampling order.
            execute: What runs the waves (default: the engine; the CPU trainer's ranks pass a
                `ShardedExecutor`).

        Returns:
            The trees, the leaves with signal and the step's metrics.
        """
        engine = self.engine
        engine.reset_stats()
        result = engine.run_step(
            self.allocator,
            task_ids,
            budget=self.budget,
            rng=self.rng,
            # an allocator that reads no predictor is not handed one (it must not depend on it)
            predictor=self.predictor if self.allocator.uses_predictor else None,
            carry=self.carry,
            tokens_per_leaf=self.tokens_per_leaf,
            execute=execute,
            flip_calibration=self.flip_calibrator,
        )
        stats = engine.stats
        self.carry = result.carry
        self.tokens_per_leaf = result.tokens_per_leaf or self.tokens_per_leaf
        self.spent = self.spent + result.spent
        metrics = rollout_metrics(result)
        # the predictor is scored on the nodes before it learns them, then fitted; the flip
        # calibrator is fitted on this step's flips and used from the next step
        metrics |= learn_from_step(self.predictor, result.trees)
        if self.flip_calibrator is not None:
            self.flip_calibrator.observe(metrics["stage2/p_flip_raw"], metrics["stage2/flipped"])
        kept = [result.trees[i] for i in result.train_indices]
        # leaves without signal carry no weight (docs/decisions.md, "One objective"); leaves a
        # fault ended are left out of the advantages altogether
        leaves, n_failed = leaves_to_train(kept, self.advantage)
        metrics |= advantage_metrics(kept, leaves)
        metrics |= {
            "rollout/failed_leaves_excluded": n_failed,
            "budget/leaves": result.spent.n_leaves,
            "budget/tokens": result.spent.n_tokens,
            "budget/tool_calls": result.spent.n_tool_calls,
            "budget/limit": result.limit,
            "budget/carry": result.carry,
            "budget/total_leaves": self.spent.n_leaves,
            "budget/total_tokens": self.spent.n_tokens,
            "budget/total_tool_calls": self.spent.n_tool_calls,
            "perf/tokens_per_s": stats.tokens_per_s,
            "perf/rollout_s": stats.generate_s,
            "perf/alloc_s": result.alloc_s,
        }
        return TreeStepOutput(result=result, kept=kept, leaves=leaves, metrics=metrics, stats=stats)

    def predictor_state(self) -> dict[str, np.ndarray]:
        """The predictor's and the flip calibrator's learnt state, as named arrays."""
        arrays = dict(self.predictor.state_dict())
        if self.flip_calibrator is not None:
            arrays |= self.flip_calibrator.state_dict()
        return arrays

    def load_predictor_state(self, arrays: dict[str, np.ndarray]) -> None:
        """Restore `predictor_state` output."""
        self.predictor.load_state_dict(arrays)
        if self.flip_calibrator is not None:
            self.flip_calibrator.load_state_dict(arrays)
