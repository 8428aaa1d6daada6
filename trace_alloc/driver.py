"""The ask-tell loop that spends one step's budget: the same code drives every engine.

`run_step` builds one tree per prompt, then repeats a *wave*: show the allocator the forest and
the budget left, take its requests, hand them to the executor (batched), attach the rollouts,
meter the spend. It stops when the budget is spent, the allocator returns nothing, or
`budget.max_waves` is reached. In the token currency it stops issuing once the limit is reached
and returns the signed difference as `carry`, which the caller passes to the next step: debt (an
overshoot) shrinks the next step's limit and credit (an undershoot) grows it, so equal budget
holds exactly in aggregate (docs/trace_alloc.md, "Budget").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from trace_alloc.base import Allocator, AllocView, Executor, Predictor, RolloutRequest
from trace_alloc.budget import BudgetLimit, Spend
from trace_alloc.errors import AllocError, BudgetExceededError, ExecutionError
from trace_alloc.tree import ForestStats, Prompt, Rollout, RolloutTree, forest_stats

__all__ = ["StepResult", "WaveRecord", "run_step"]


@dataclass(frozen=True, slots=True, kw_only=True)
class WaveRecord:
    """What one wave asked for and what it cost."""

    wave: int
    stage: str
    n_requests: int
    spend: Spend
    alloc_s: float
    """Wall time the allocator's `ask` took."""
    diagnostics: Mapping[str, float] = field(default_factory=dict)
    requests: tuple[RolloutRequest, ...] = ()
    """What the allocator asked for (with its Stage-2 flip probabilities)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepResult:
    """One step's trees and the budget they cost."""

    trees: list[RolloutTree]
    """One tree per prompt, in pool order; filtered prompts keep a bare root."""
    train_indices: list[int]
    """The trees the trainer should learn from (the allocator decides, e.g. DAPO's filter)."""
    spent: Spend
    limit: float
    """This step's limit in the limiting currency (per_step minus the incoming carry)."""
    carry: float
    """spent − limit: positive is debt, negative credit; pass it to the next `run_step`."""
    tokens_per_leaf: float
    """Generated tokens per leaf of this step's first wave (the next step's first estimate)."""
    waves: tuple[WaveRecord, ...]

    @property
    def alloc_s(self) -> float:
        """Total wall time spent inside the allocator this step."""
        return sum(w.alloc_s for w in self.waves)

    @property
    def stats(self) -> ForestStats:
        """Effective ratio, mixed anchors and spend of the step's trees."""
        return forest_stats(self.trees)


def run_step(
    allocator: Allocator,
    prompts: Sequence[Prompt],
    *,
    execute: Executor,
    budget: BudgetLimit,
    rng: np.random.Generator,
    predictor: Predictor | None = None,
    carry: float = 0.0,
    tokens_per_leaf: float | None = None,
    flip_calibration: Callable[[np.ndarray], np.ndarray] | None = None,
) -> StepResult:
    """Spend one step's budget on rollouts from `prompts`, as `allocator` directs.

    Args:
        allocator: the strategy (see `trace_alloc.allocators.ALLOCATORS`).
        prompts: the candidate pool, in sampling order.
        execute: runs requests to the end (the engine or the simulator).
        budget: limiting currency, per-step amount and wave cap.
        rng: the only source of randomness of the allocator.
        predictor: Ṽψ, for the allocators that use one.
        carry: the previous step's `StepResult.carry` (0 for the first step).
        tokens_per_leaf: token-currency cost of a leaf before any leaf of this step exists (the
            previous step's `StepResult.tokens_per_leaf`, or a guess); later waves use the cost
            measured on the previous wave. Required for the token currency.
        flip_calibration: maps Stage 2's raw flip chances to calibrated ones (a
            `FlipCalibrator` fitted on earlier steps); None leaves them raw.

    Returns:
        The trees, what the trainer should use, the spend and the carry for the next step.

    Raises:
        BudgetExceededError: an allocator asked for more leaves than an exact budget has left.
        ExecutionError: the executor returned the wrong number or kind of rollouts.
        AllocError: a request names a tree or node that cannot be continued.
    """
    if not budget.exact and (tokens_per_leaf is None or tokens_per_leaf <= 0):
        raise ValueError(
            "the token currency needs tokens_per_leaf > 0 for its first wave: pass the previous "
            "step's StepResult.tokens_per_leaf, or a guess for the first step"
        )
    trees = [RolloutTree.from_prompt(p) for p in prompts]
    limit = budget.per_step - carry
    spent = Spend()
    waves: list[WaveRecord] = []
    for wave in range(budget.max_waves):
        remaining = limit - spent.amount(budget.currency)
        leaves_left = budget.leaves_left(remaining, _tokens_per_leaf(waves, tokens_per_leaf))
        if leaves_left <= 0:
            break
        view = AllocView(
            trees=trees,
            wave=wave,
            currency=budget.currency,
            remaining=remaining,
            leaves_left=leaves_left,
            spent=spent,
            flip_calibration=flip_calibration,
        )
        start = time.perf_counter()
        plan = allocator.ask(view, predictor=predictor, rng=rng)
        alloc_s = time.perf_counter() - start
        if not plan.requests:
            break
        _check_requests(trees, plan.requests, leaves_left if budget.exact else None)
        results = execute(trees, plan.requests)
        wave_spend = _attach(trees, plan.requests, results, wave)
        spent = spent + wave_spend
        waves.append(
            WaveRecord(
                wave=wave,
                stage=plan.stage,
                n_requests=len(plan.requests),
                spend=wave_spend,
                alloc_s=alloc_s,
                diagnostics=dict(plan.diagnostics),
                requests=tuple(plan.requests),
            )
        )
    first = next((w.spend for w in waves if w.spend.n_leaves), None)
    measured = first.n_tokens / first.n_leaves if first else (tokens_per_leaf or 0.0)
    return StepResult(
        trees=trees,
        train_indices=allocator.train_indices(trees),
        spent=spent,
        limit=limit,
        carry=spent.amount(budget.currency) - limit,
        tokens_per_leaf=float(measured),
        waves=tuple(waves),
    )


def _tokens_per_leaf(waves: Sequence[WaveRecord], prior: float | None) -> float:
    """Token cost of one more leaf: the last wave's, else the caller's prior.

    The last wave's requests resemble the next one's (a continuation costs less than a rollout
    from the root), so its cost per leaf is the better estimate.
    """
    for record in reversed(waves):
        if record.spend.n_leaves:
            return record.spend.n_tokens / record.spend.n_leaves
    return prior or 1.0


def _check_requests(
    trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest], exact_left: int | None
) -> None:
    for r in requests:
        if r.tree_index >= len(trees) or not trees[r.tree_index].can_expand(r.node_id):
            raise AllocError(
                f"allocator requested {r}: tree {r.tree_index} has no expandable node {r.node_id}"
            )
    asked = sum(r.n for r in requests)
    if exact_left is not None and asked > exact_left:
        raise BudgetExceededError(f"allocator asked for {asked} leaves with {exact_left} left")


def _attach(
    trees: list[RolloutTree],
    requests: Sequence[RolloutRequest],
    results: Sequence[Sequence[Rollout]],
    wave: int,
) -> Spend:
    if len(results) != len(requests):
        raise ExecutionError(
            f"executor returned {len(results)} results for {len(requests)} requests"
        )
    spend = Spend()
    for request, rollouts in zip(requests, results, strict=True):
        if len(rollouts) != request.n:
            raise ExecutionError(f"executor returned {len(rollouts)} rollouts for {request}")
        for rollout in rollouts:
            if not isinstance(rollout, Rollout):
                raise ExecutionError(f"executor returned {type(rollout).__name__}, not Rollout")
            trees[request.tree_index].add_rollout(request.node_id, rollout, wave=wave)
            spend = spend + Spend(
                n_leaves=1,
                n_tokens=sum(t.n_tokens for t in rollout.turns),
                n_tool_calls=sum(t.n_tool_calls for t in rollout.turns),
            )
    return spend
