"""Rollout allocation for tree-structured agent RL: trees, predictor, allocators, advantages.

Pure numpy: no torch, files, sockets, logging or global RNG. Functions take arrays and
dataclasses (plus a `np.random.Generator` when they sample) and return values with their
diagnostics. See docs/trace_alloc.md.
"""

from trace_alloc.advantages import (
    ADVANTAGE_MODES,
    AdvantageMode,
    LeafAdvantage,
    TokenAdvantages,
    tree_advantages,
)
from trace_alloc.allocators import (
    ALLOCATORS,
    AllocatorName,
    DynamicSampling,
    EntropyTree,
    PromptPredictor,
    RandomTree,
    Trace,
    Uniform,
    make_allocator,
)
from trace_alloc.base import (
    Allocator,
    AllocPlan,
    AllocView,
    Executor,
    Featurizer,
    Predictor,
    RolloutRequest,
)
from trace_alloc.budget import BudgetLimit, Currency, Spend
from trace_alloc.calibration import CalibrationReport, calibration_report, learn_from_step
from trace_alloc.driver import StepResult, WaveRecord, run_step
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
from trace_alloc.solvers import (
    RootSolution,
    prefix_gain,
    root_gain,
    solve_prefixes,
    solve_roots,
    split_budget,
    v_prefix,
    v_root,
)
from trace_alloc.tree import (
    SCHEMA_VERSION,
    ForestStats,
    Node,
    Prompt,
    Rollout,
    RolloutTree,
    Segment,
    TrainingExamples,
    Turn,
    bare_leaves,
    forest_stats,
    training_examples,
)

__all__ = [
    "ADVANTAGE_MODES",
    "ALLOCATORS",
    "SCHEMA_VERSION",
    "AdvantageMode",
    "AllocError",
    "AllocPlan",
    "AllocView",
    "Allocator",
    "AllocatorName",
    "BudgetExceededError",
    "BudgetLimit",
    "CalibrationReport",
    "ConstantPredictor",
    "Currency",
    "DynamicSampling",
    "EntropyTree",
    "ExecutionError",
    "Executor",
    "Featurizer",
    "FlipCalibrator",
    "ForestStats",
    "HashedNgramFeaturizer",
    "LeafAdvantage",
    "MLPPredictor",
    "MemoryPredictor",
    "Node",
    "Predictor",
    "Prompt",
    "PromptPredictor",
    "RandomTree",
    "Rollout",
    "RolloutRequest",
    "RolloutTree",
    "RootSolution",
    "Segment",
    "Spend",
    "StepResult",
    "TokenAdvantages",
    "Trace",
    "TrainingExamples",
    "TreeFormatError",
    "Turn",
    "Uniform",
    "UnknownNameError",
    "WaveRecord",
    "bare_leaves",
    "calibration_report",
    "forest_stats",
    "learn_from_step",
    "make_allocator",
    "prefix_gain",
    "root_gain",
    "run_step",
    "solve_prefixes",
    "solve_roots",
    "split_budget",
    "training_examples",
    "tree_advantages",
    "v_prefix",
    "v_root",
]
