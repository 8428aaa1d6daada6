"""The contracts of allocation: requests, the allocator's view, and the pluggable Protocols.

The driver (`trace_alloc.driver.run_step`) runs an ask-tell loop. Each *wave* it shows the
allocator an `AllocView` of the forest so far and the budget left; the allocator answers with an
`AllocPlan` of `RolloutRequest`s ("run n rollouts from node X of tree T"; node 0 is the prompt
root); an `Executor` (the LLM engine, or the simulator) runs them to the end, batched, and the
driver attaches the leaves and meters the budget. Allocators are stateless: everything they need
to decide the next wave is in the view, so the same objects drive the real engine and the
simulator, and a test can hand any forest to `ask`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar, Protocol, runtime_checkable

import numpy as np

from trace_alloc.budget import Currency, Spend
from trace_alloc.errors import AllocError
from trace_alloc.tree import Rollout, RolloutTree

__all__ = [
    "AllocPlan",
    "AllocView",
    "Allocator",
    "Executor",
    "Featurizer",
    "Predictor",
    "RolloutRequest",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class RolloutRequest:
    """Run `n` independent rollouts from node `node_id` of tree `tree_index` to their ends.

    `node_id == 0` starts fresh rollouts from the prompt (Stage-1 roots); any other non-leaf
    node is a fork: the engine restores the env snapshot of that turn and continues from the
    node's token prefix (Stage-2 continuations).
    """

    tree_index: int
    node_id: int
    n: int
    p_flip: float | None = None
    """Stage 2: the allocator's chance that one continuation from this node ends with another
    outcome than the one every earlier leaf under it agreed on (logged against the realised
    flips to calibrate it: `harness.training.metrics_log.flip_calibration`); None for roots.
    Calibrated when the run calibrates flips (`AllocView.flip_calibration`)."""
    p_flip_raw: float | None = None
    """`p_flip` before calibration (what the calibrator is fitted on); equal without one."""

    def __post_init__(self) -> None:
        if self.n < 1:
            raise AllocError(f"a request needs n >= 1 rollouts, got n={self.n}")
        if self.tree_index < 0 or self.node_id < 0:
            raise AllocError(f"negative index in {self!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocView:
    """What an allocator sees when asked for the next wave. Treat `trees` as read-only."""

    trees: Sequence[RolloutTree]
    """One tree per prompt of the candidate pool, in pool (sampling) order."""
    wave: int
    """0 for the first wave of the step."""
    currency: Currency
    """The limiting currency of the run."""
    remaining: float
    """Budget left this step, in `currency` (> 0 whenever `ask` is called)."""
    leaves_left: int
    """`remaining` in leaves: exact when `currency == "leaves"` (a plan must not exceed it),
    else an estimate from the measured tokens per leaf, rounded up."""
    spent: Spend = field(default_factory=Spend)
    """Spend so far this step, in all three currencies."""
    flip_calibration: Callable[[np.ndarray], np.ndarray] | None = None
    """Maps Stage 2's raw flip chances to calibrated ones (`trace_alloc.FlipCalibrator`);
    None leaves them raw."""

    @property
    def exact(self) -> bool:
        """Whether `leaves_left` is a hard limit (leaf currency) rather than an estimate."""
        return self.currency == "leaves"

    @property
    def started(self) -> bool:
        """Whether any tree already has a leaf this step (i.e. the root stage has run)."""
        return any(len(tree.nodes) > 1 for tree in self.trees)


@dataclass(frozen=True, slots=True, kw_only=True)
class AllocPlan:
    """An allocator's answer for one wave: the requests, and why (for logs and tests)."""

    requests: tuple[RolloutRequest, ...] = ()
    """Empty means: this allocator has nothing more to spend this step."""
    stage: str = ""
    """Which stage produced the wave (e.g. `roots`, `prefixes`, `expand`)."""
    diagnostics: Mapping[str, float] = field(default_factory=dict)
    """Numbers that explain the plan (e.g. expected mixed prompts, active prompts)."""

    @property
    def n_leaves(self) -> int:
        """Leaves this plan will produce (one per requested rollout)."""
        return sum(r.n for r in self.requests)


@runtime_checkable
class Predictor(Protocol):
    """Ṽψ: maps prefix histories to success probabilities; trained online against V̂."""

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """Success probability in [0, 1] for each history; shape `(len(histories),)`."""
        ...

    def update(
        self,
        histories: Sequence[str],
        targets: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        is_root: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Fit to targets V̂ in [0, 1]; returns training diagnostics.

        `weights` are the outcomes behind each target (leaf counts; 1 each if None) and
        `is_root` flags the prompt roots (`trace_alloc.tree.training_examples` gives both).
        """
        ...

    def state_dict(self) -> dict[str, np.ndarray]:
        """All learnt state as named plain arrays (the harness writes them to disk)."""
        ...

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore `state_dict` output."""
        ...


@runtime_checkable
class Featurizer(Protocol):
    """Turns histories into fixed-size float vectors for a `Predictor`."""

    @property
    def dim(self) -> int:
        """Length of each feature vector."""
        ...

    def featurize(self, histories: Sequence[str]) -> np.ndarray:
        """Feature matrix of shape `(len(histories), dim)`, float32."""
        ...


@runtime_checkable
class Allocator(Protocol):
    """A rollout-allocation strategy. Stateless: `ask` is a function of its arguments."""

    name: ClassVar[str]
    uses_predictor: ClassVar[bool]

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """The next wave of requests given the forest and the budget left."""
        ...

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """Which trees the trainer should learn from (e.g. DAPO keeps only mixed groups)."""
        ...


class Executor(Protocol):
    """Runs rollout requests to the end: the LLM engine, or the simulator.

    Must return, for each request in order, exactly `request.n` rollouts that start at the
    requested node. It reads the trees (prefix tokens, snapshot ids) but never modifies them:
    the driver attaches the results.
    """

    def __call__(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> Sequence[Sequence[Rollout]]:
        """Run every request; one list of `n` rollouts per request."""
        ...
