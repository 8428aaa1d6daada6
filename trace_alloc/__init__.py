"""Rollout allocation for tree-structured agent RL: trees, predictor, allocators, advantages.

Pure numpy: no torch, files, sockets, logging or global RNG. Functions take arrays and
dataclasses (plus a `np.random.Generator` when they sample) and return values with their
diagnostics. See docs/trace_alloc.md.

This face holds what a user calls; the rest is imported from its module: the solvers
(`trace_alloc.solvers`), calibration reports, tree statistics and training examples
(`trace_alloc.tree`, `Segment` among them). An allocator of your own implements `Allocator`: its
`ask` reads an `AllocView` and answers an `AllocPlan` of `RolloutRequest`s (docs/extending.md).
"""

from trace_alloc.advantages import tree_advantages
from trace_alloc.allocators import (
    DynamicSampling,
    EntropyTree,
    RandomTree,
    Trace,
    Uniform,
    make_allocator,
)
from trace_alloc.base import Allocator, AllocPlan, AllocView, Executor, Predictor, RolloutRequest
from trace_alloc.budget import BudgetLimit
from trace_alloc.calibration import learn_from_step
from trace_alloc.driver import StepResult, run_step
from trace_alloc.errors import (
    AllocError,
    BudgetExceededError,
    ExecutionError,
    TreeFormatError,
    UnknownNameError,
)
from trace_alloc.flip_calibrator import FlipCalibrator
from trace_alloc.memory import MemoryPredictor
from trace_alloc.predictor import ConstantPredictor, HashedNgramFeaturizer, MLPPredictor
from trace_alloc.tree import Node, Prompt, Rollout, RolloutTree, Turn

__all__ = [
    "AllocError",
    "AllocPlan",
    "AllocView",
    "Allocator",
    "BudgetExceededError",
    "BudgetLimit",
    "ConstantPredictor",
    "DynamicSampling",
    "EntropyTree",
    "ExecutionError",
    "Executor",
    "FlipCalibrator",
    "HashedNgramFeaturizer",
    "MLPPredictor",
    "MemoryPredictor",
    "Node",
    "Predictor",
    "Prompt",
    "RandomTree",
    "Rollout",
    "RolloutRequest",
    "RolloutTree",
    "StepResult",
    "Trace",
    "TreeFormatError",
    "Turn",
    "Uniform",
    "UnknownNameError",
    "learn_from_step",
    "make_allocator",
    "run_step",
    "tree_advantages",
]
