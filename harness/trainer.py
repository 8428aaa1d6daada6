"""The CPU trainer: TRACE tree rollouts and OpenRLHF's PolicyLoss, in one process, one file.

Read it top to bottom, as CleanRL's `ppo.py`: the config, then `train`, whose loop runs the
phases of a step in order:

1. **data**: take the next `pool_size` prompts of the train split (a seeded, resumable cursor);
2. **rollout**: `TreeRolloutEngine.run_step` lets the allocator spend exactly the step's budget
   (leaves or generated tokens) on roots and turn prefixes (`trace_alloc.run_step`);
3. **predictor**: score Ṽψ on every root and prefix of the step's trees *before* it learns
   them (Brier, AUC), then fit it to V̂, the mean leaf reward under each node;
4. **advantages**: `trace_alloc.tree_advantages` on the trees the allocator says to train on;
5. **update**: every leaf is one sequence; OpenRLHF's `PolicyLoss` on its action tokens
   (observations masked), plus `compute_approx_kl` against the frozen start policy when
   `loss.kl_coef > 0`; one optimizer step per step (and per PPO epoch);
6. **log and checkpoint**: one JSON record per step (`metrics.jsonl`, TensorBoard) and an
   atomic checkpoint every `checkpoint_every` steps, from which `resume=True` continues exactly.

Under `torchrun --nproc_per_node N` the same loop runs data-parallel: rollouts are sharded by
rank wave by wave, leaves are dealt to ranks, the loss is the global token mean, and only rank 0
writes files (`harness.distributed`).

A baseline is an allocator name (`alloc.name`), never another trainer: every method goes
through the same engine, budget, advantages and loss. `train(config)` returns a summary, so
an experiment script can run many configurations from Python.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
import random
import time
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from tqdm.auto import tqdm

from envs import TaskSet, World, WorldConfig
from harness.backends import SamplingParams, TransformersBackend
from harness.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from harness.distributed import (
    ONE_PROCESS,
    Ranks,
    ShardedExecutor,
    all_gather,
    check_same_across_ranks,
    deal,
    init_from_env,
    sum_across_ranks,
)
from harness.engine import TreeRolloutEngine
from harness.episodes import EpisodeCodec, evaluate_policy
from harness.errors import HarnessError
from harness.metrics_log import MetricsLog
from harness.openrlhf.compat import openrlhf_losses
from harness.optimizers import make_optimizer
from harness.tiny_policy.config import EnvSettings, default_world_config
from harness.tiny_policy.pipeline import ARTIFACTS_FILE, is_hard
from retrieval.bm25 import BM25Retriever
from retrieval.cache import CachedRetriever
from trace_alloc import (
    ALLOCATORS,
    AllocatorName,
    BudgetLimit,
    HashedNgramFeaturizer,
    MemoryPredictor,
    MLPPredictor,
    Spend,
    StepResult,
    learn_from_step,
    make_allocator,
    tree_advantages,
)

__all__ = [
    "AllocConfig",
    "BudgetConfig",
    "ConstantPredictor",
    "EvalConfig",
    "LossConfig",
    "OptimConfig",
    "PredictorConfig",
    "RolloutConfig",
    "TaskConfig",
    "TrainConfig",
    "TrainSummary",
    "config_from_dict",
    "load_config",
    "make_predictor",
    "rollout_metrics",
    "train",
    "update_policy",
]

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SUMMARY_FILE = "summary.json"


# --- configuration ---------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """The questions, the corpus and the env (the synthetic world by default)."""

    world_seed: int = 0
    """Seed of the synthetic world (its questions and its BM25-indexed corpus)."""
    world: WorldConfig = field(default_factory=default_world_config)
    """Size and difficulty of the world; must match what the policy was warm-started on (a
    policy built by `tracerl init-model` records it, and a mismatch is an error)."""
    train_split: Literal["train", "all"] = "train"
    """Questions the data cursor walks over."""
    eval_split: Literal["dev", "test", "test_entities", "heldout"] = "dev"
    """Held-out questions for `eval` (`heldout`: test, then test_entities)."""
    questions: Literal["all", "hard"] = "all"
    """`hard`: only 3-4-hop bridges, comparisons and inference questions (train and eval)."""
    env: EnvSettings = field(default_factory=EnvSettings)
    """Turn limit, documents per search, prompt: the policy's own env settings."""


@dataclass(frozen=True, kw_only=True)
class AllocConfig:
    """Which allocator spends the budget; `None` knobs keep the allocator's own default.

    Setting a knob the chosen allocator does not have is an error, not a silent no-op.
    """

    name: AllocatorName = "trace"
    """One of `trace_alloc.ALLOCATORS`: uniform (GRPO), dynamic_sampling (DAPO),
    prompt_predictor, random_tree (Tree-GRPO), entropy_tree, trace."""
    group_size: int | None = None
    """G: rollouts per prompt (uniform, dynamic_sampling, prompt_predictor; trace with
    stage1=uniform)."""
    max_per_prompt: int | None = None
    """trace: cap on the roots of one prompt."""
    continuations_per_rollout: int | None = None
    """trace: N, Stage-2 continuations per bare rollout (0 turns Stage 2 off)."""
    stage1: Literal["active", "uniform"] | None = None
    """trace: Stage-1 ablation switch."""
    stage2: Literal["active", "uniform"] | None = None
    """trace: Stage-2 ablation switch."""
    explore_frac: float | None = None
    """trace: share of the root budget given as floors to random prompts."""
    p_clip: float | None = None
    """trace: predictions are clipped to [p_clip, 1 - p_clip]."""
    batch_size: int | None = None
    """dynamic_sampling: mixed groups to collect."""
    wave_groups: int | None = None
    """dynamic_sampling: prompts per generation wave."""
    target: float | None = None
    """prompt_predictor: the predicted p to aim for."""
    roots_per_prompt: int | None = None
    """random_tree / entropy_tree: M chains per prompt."""
    expansions_per_iteration: int | None = None
    """random_tree / entropy_tree: N continuations per chain per iteration."""
    iterations: int | None = None
    """random_tree / entropy_tree: L expansion iterations."""
    penalty: float | None = None
    """entropy_tree: score penalty per continuation already placed."""

    def knobs(self) -> dict[str, Any]:
        """The knobs that are set, by name."""
        return {
            f.name: getattr(self, f.name)
            for f in dataclasses.fields(self)
            if f.name != "name" and getattr(self, f.name) is not None
        }

    def build(self) -> Any:
        """The allocator (a `trace_alloc.Allocator`).

        Raises:
            ValueError: a knob set that this allocator does not have.
        """
        cls = ALLOCATORS[self.name]
        accepted = {f.name for f in dataclasses.fields(cls)}
        foreign = sorted(set(self.knobs()) - accepted)
        if foreign:
            raise ValueError(
                f"--alloc.{foreign[0].replace('_', '-')} does not apply to allocator "
                f"{self.name!r} (its knobs: {sorted(accepted)})"
            )
        return make_allocator(self.name, **self.knobs())

    @property
    def uses_predictor(self) -> bool:
        """Whether the allocator reads Ṽψ."""
        return bool(ALLOCATORS[self.name].uses_predictor)


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """The equal-cost budget of every step."""

    currency: Literal["leaves", "tokens"] = "leaves"
    """`leaves` (exact per step) or generated `tokens` (carried over between steps)."""
    per_step: int = 32
    """Budget of one step in `currency`."""
    pool_size: int = 16
    """Candidate prompts per step (the allocator may leave some without rollouts)."""
    tokens_per_leaf_guess: float = 60.0
    """Token currency only: the estimate for the first wave of the first step."""
    max_waves: int = 16
    """Safety bound on allocator waves per step."""

    def __post_init__(self) -> None:
        if self.per_step < 2 or self.pool_size < 1:
            raise ValueError(
                f"per_step={self.per_step}, pool_size={self.pool_size}: a step needs at least "
                "2 leaves' worth of budget and one prompt"
            )


@dataclass(frozen=True, kw_only=True)
class RolloutConfig:
    """How the policy samples each turn."""

    max_new_tokens: int = 48
    """Cap per action."""
    temperature: float = 1.0
    """Sampling temperature (RL samples the policy's own distribution at 1)."""
    top_p: float = 1.0
    top_k: int = 0
    max_total_tokens: int = 1024
    """The policy's context: an episode that would overflow it ends unanswered."""


@dataclass(frozen=True, kw_only=True)
class PredictorConfig:
    """Ṽψ: hashed n-grams of the history into a small numpy MLP (trace_alloc.MLPPredictor)."""

    kind: Literal["mlp", "constant"] = "mlp"
    """`constant`: always predict `prior` and never learn (the predictor-off ablation)."""
    dim: int = 4096
    """Hashed feature dimensions."""
    hidden: int = 64
    """Hidden units (0: logistic regression)."""
    lr: float = 3e-3
    epochs: int = 4
    """Passes over each step's nodes."""
    prior: float = 0.5
    """Prediction before training and far from the training data."""
    memory: bool = True
    """Add each question's own bare-rollout history to the text model (`MemoryPredictor`);
    False: the text model alone (the paper's Ṽψ)."""
    prior_strength: float = 2.0
    """memory: bare rollouts the text model's prediction is worth."""
    memory_decay: float = 0.95
    """memory: weight a past outcome keeps per step (the policy moves)."""
    replay_size: int = 2048
    """memory: root examples replayed into each text-model update."""


@dataclass(frozen=True, kw_only=True)
class LossConfig:
    """Advantages and OpenRLHF's PolicyLoss."""

    advantage: Literal["grpo", "tree_grpo", "treerl"] = "tree_grpo"
    """`trace_alloc.tree_advantages` mode."""
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.28
    """PPO clip range (DAPO's clip-higher by default)."""
    kl_coef: float = 0.0
    """Weight of the KL to the start policy (0: no reference model is kept)."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """OpenRLHF's `compute_approx_kl` estimator."""
    token_level_loss: bool = True
    """Average over all action tokens of the step (True) or per sequence, then over sequences."""


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """The optimizer step."""

    backend: Literal["torch", "deepspeed"] = "torch"
    """`torch` AdamW, or the same AdamW inside a DeepSpeed ZeRO engine (gloo; one process, or
    data-parallel under `torchrun --nproc_per_node N`)."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage (0-3) for `backend=deepspeed`."""
    lr: float = 1e-4
    warmup_steps: int = 0
    """Linear warm-up of the learning rate over this many steps."""
    betas: tuple[float, float] = (0.9, 0.95)
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    micro_batch_size: int = 16
    """Leaves per forward/backward pass (per rank under torchrun)."""
    ppo_epochs: int = 1
    """Updates per step over the step's leaves (1: on-policy, the ratio is exactly 1)."""


@dataclass(frozen=True, kw_only=True)
class EvalConfig:
    """Held-out evaluation while training (0 turns it off)."""

    every: int = 0
    """Evaluate before step 1 and every this many steps (0: never)."""
    n_questions: int = 64
    """Questions of the eval split (the first ones)."""
    n_samples: int = 1
    temperature: float = 1.0
    """Sampled EM at the policy's temperature; 0 for greedy."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """`tracerl train`: RL with tree rollouts on CPU (transformers backend)."""

    run_dir: Path = Path("runs/train")
    """Where config, metrics, checkpoints, trees and the final policy go."""
    policy: Path = Path("runs/demo/tiny_policy/policy")
    """Start policy: a transformers model directory with its tokenizer."""
    steps: int = 20
    seed: int = 0
    """Seeds the data order, the allocator, the sampling and the predictor."""
    resume: bool = False
    """Continue the run in `run_dir` from its latest checkpoint, with its saved config (flags
    given explicitly on the command line override it, e.g. a larger --steps)."""
    checkpoint_every: int = 5
    """Steps between checkpoints (the last step always gets one)."""
    keep_checkpoints: int = 2
    save_trees_every: int = 0
    """Write the step's trees to `run_dir/trees/step_NNNNNN.jsonl` this often (0: never)."""
    tensorboard: bool = True
    progress: bool = True
    """A tqdm bar with ETA on stderr."""
    torch_threads: int | None = None
    """torch intra-op threads (None: torch's default)."""
    task: TaskConfig = field(default_factory=TaskConfig)
    alloc: AllocConfig = field(default_factory=AllocConfig)
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    predictor: PredictorConfig = field(default_factory=PredictorConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError(f"steps={self.steps}, checkpoint_every={self.checkpoint_every}: >= 1")
        self.alloc.build()  # an unknown knob fails now, not after the model has loaded

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (paths as strings, tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def config_from_dict(cls: type[Any], data: dict[str, Any]) -> Any:
    """Rebuild a (nested) config dataclass from `dataclasses.asdict`-style JSON.

    Raises:
        ValueError: a key that `cls` does not have.
    """
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{cls.__name__} has no field(s) {unknown}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            kwargs[name] = config_from_dict(kind, value)
        elif kind is Path:
            kwargs[name] = Path(value)
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


@dataclass(frozen=True, kw_only=True)
class TrainSummary:
    """What a finished `train` call reports (also written to `run_dir/summary.json`)."""

    run_dir: Path
    steps: int
    """The last step run."""
    policy_dir: Path
    """The trained policy as a transformers directory."""
    totals: dict[str, int]
    """Budget spent over the run: leaves, tokens, tool_calls."""
    final: dict[str, Any]
    """The last step's metrics record."""
    wall_s: float
    """Wall time of this process's part of the run."""

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            "run_dir": str(self.run_dir),
            "steps": self.steps,
            "policy_dir": str(self.policy_dir),
            "totals": self.totals,
            "final": self.final,
            "wall_s": self.wall_s,
        }


class ResumeError(HarnessError, ValueError):
    """`resume=True` on a run with no checkpoint, or a fresh run over an existing one."""


class ConstantPredictor:
    """A `trace_alloc.Predictor` that always says `p` and learns nothing (predictor off)."""

    def __init__(self, p: float) -> None:
        self.p = p

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """`p` for every history."""
        return np.full(len(histories), self.p)

    def update(
        self, histories: Sequence[str], targets: np.ndarray, **_: np.ndarray | None
    ) -> dict[str, float]:
        """Nothing to learn."""
        return {"n": float(len(histories))}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Its constant."""
        return {"p": np.array([self.p])}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore the constant."""
        self.p = float(state["p"][0])


def make_predictor(
    config: PredictorConfig, *, seed: int
) -> MemoryPredictor | MLPPredictor | ConstantPredictor:
    """The predictor `config.kind` names; the CPU and the OpenRLHF trainers both build it here.

    Args:
        config: Kind, features, MLP and memory settings.
        seed: Seeds the MLP's initial weights.
    """
    if config.kind == "constant":
        return ConstantPredictor(config.prior)
    text = MLPPredictor(
        HashedNgramFeaturizer(dim=config.dim),
        hidden=config.hidden,
        lr=config.lr,
        epochs=config.epochs,
        prior=config.prior,
        seed=seed,
    )
    if not config.memory:
        return text
    return MemoryPredictor(
        text,
        prior_strength=config.prior_strength,
        decay=config.memory_decay,
        replay_size=config.replay_size,
    )


# --- data ------------------------------------------------------------------------------------


@dataclass(slots=True)
class DataCursor:
    """Walks the train split in a seeded random order, epoch after epoch.

    `(epoch, position)` is all its state, so a resumed run takes exactly the prompts an
    uninterrupted one would.
    """

    task_ids: tuple[str, ...]
    seed: int
    epoch: int = 0
    position: int = 0

    def _order(self, epoch: int) -> list[str]:
        rng = np.random.default_rng([self.seed, epoch])
        return [self.task_ids[i] for i in rng.permutation(len(self.task_ids))]

    def take(self, n: int) -> list[str]:
        """The next `n` distinct prompts (a pool never spans an epoch boundary twice)."""
        n = min(n, len(self.task_ids))
        order = self._order(self.epoch)
        if self.position + n > len(order):  # start a fresh epoch rather than repeat an id
            self.epoch, self.position = self.epoch + 1, 0
            order = self._order(self.epoch)
        pool = order[self.position : self.position + n]
        self.position += n
        return pool


# --- one step's pieces -----------------------------------------------------------------------


def _lr(step: int, optim: OptimConfig) -> float:
    """Linear warm-up to `optim.lr`, then constant."""
    if optim.warmup_steps <= 0:
        return optim.lr
    return optim.lr * min(1.0, step / optim.warmup_steps)


def rollout_metrics(result: StepResult) -> dict[str, float]:
    """Contrast, outcome and behaviour statistics of one step's trees.

    One definition of the `rollout/*` keys, shared by this trainer and the OpenRLHF one.

    Args:
        result: One rollout step's trees and allocation statistics.

    Returns:
        The `rollout/*` metrics, NaN where a step has nothing to average.
    """
    stats = result.stats
    rewards, ems, lengths, searches, turns = [], [], [], [], []
    n_actions = n_valid = n_failed = 0
    for tree in result.trees:
        for node in tree.nodes[1:]:  # every generated turn once
            n_actions += 1
            n_valid += bool(node.turn.info.get("valid_action", False))
        for leaf in tree.leaves():
            path = [tree.nodes[n].turn for n in tree.path(leaf)[1:]]
            rewards.append(tree.nodes[leaf].reward)
            ems.append(float(path[-1].info.get("em", 0.0)))
            lengths.append(sum(t.n_tokens for t in path))
            searches.append(sum(t.n_tool_calls for t in path))
            turns.append(len(path))
            n_failed += path[-1].info.get("end") == "failed"
    mean = lambda xs: float(np.mean(xs)) if xs else float("nan")  # noqa: E731
    return {
        "rollout/reward": mean(rewards),
        "rollout/accuracy": mean(ems),
        "rollout/effective_ratio": stats.effective_ratio,
        "rollout/n_active_prompts": stats.n_active,
        "rollout/n_mixed_prompts": stats.n_mixed,
        "rollout/mixed_anchors": stats.n_mixed_anchors,
        "rollout/mixed_prefix_anchors": stats.n_mixed_prefix_anchors,
        "rollout/prefix_anchors": stats.n_prefix_anchors,
        "rollout/n_train_prompts": len(result.train_indices),
        "rollout/response_length": mean(lengths),
        "rollout/turns_per_episode": mean(turns),
        "rollout/searches_per_episode": mean(searches),
        "rollout/valid_action_rate": n_valid / n_actions if n_actions else float("nan"),
        "rollout/waves": len(result.waves),
        "rollout/failed_episodes": n_failed,
    }


@dataclass(slots=True)
class _Batch:
    """Leaves as right-padded tensors, shifted for next-token log-probs."""

    ids: torch.Tensor  # (B, T)
    attention: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T-1) action tokens, aligned with log-probs of ids[:, 1:]
    advantages: torch.Tensor  # (B, T-1)
    rollout_logprobs: torch.Tensor  # (B, T-1)


def _batches(leaves: list[Any], size: int, pad_id: int) -> list[_Batch]:
    """Length-sorted micro-batches of `TokenAdvantages` (less padding per pass)."""
    order = sorted(range(len(leaves)), key=lambda i: len(leaves[i].token_ids))
    out = []
    for start in range(0, len(order), size):
        chunk = [leaves[i] for i in order[start : start + size]]
        width = max(len(t.token_ids) for t in chunk)
        ids = torch.full((len(chunk), width), pad_id, dtype=torch.long)  # (B, T)
        attention = torch.zeros((len(chunk), width), dtype=torch.long)  # (B, T)
        mask = torch.zeros((len(chunk), width), dtype=torch.float32)  # (B, T)
        adv = torch.zeros((len(chunk), width), dtype=torch.float32)  # (B, T)
        logp = torch.zeros((len(chunk), width), dtype=torch.float32)  # (B, T)
        for row, t in enumerate(chunk):
            n = len(t.token_ids)
            ids[row, :n] = torch.from_numpy(t.token_ids)
            attention[row, :n] = 1
            mask[row, :n] = torch.from_numpy(t.action_mask.astype(np.float32))
            adv[row, :n] = torch.from_numpy(t.advantages.astype(np.float32))
            logp[row, :n] = torch.from_numpy(t.logprobs.astype(np.float32))
        # token t+1 is predicted at position t: drop the first column of per-token fields
        out.append(_Batch(ids, attention, mask[:, 1:], adv[:, 1:], logp[:, 1:]))
    return out


# --- the run ---------------------------------------------------------------------------------


def train(config: TrainConfig) -> TrainSummary:
    """Run (or resume) RL training with tree rollouts; see the module docstring.

    Args:
        config: Every setting. With `resume=True` the run continues from the latest checkpoint
            in `run_dir`; the caller passes the config to continue with (`tracerl train`
            rebuilds it from `run_dir/config.json` plus explicit flags).

    Returns:
        The summary (also in `run_dir/summary.json`).

    Raises:
        ResumeError: resume without a checkpoint, or a fresh run in a directory that has one.
        BackendUnavailable: OpenRLHF (for PolicyLoss) or DeepSpeed is missing.
    """
    wall_start = time.perf_counter()
    run_dir = config.run_dir
    checkpoint_path = latest_checkpoint(run_dir)
    if config.resume and checkpoint_path is None:
        raise ResumeError(f"--resume: {run_dir} has no checkpoint to resume from")
    if not config.resume and checkpoint_path is not None:
        raise ResumeError(f"{run_dir} already holds a run; pass --resume or use a new --run-dir")
    _check_policy_task(config)
    ranks = init_from_env()  # torchrun's group on gloo, or one process
    run_dir.mkdir(parents=True, exist_ok=True)
    if ranks.is_main:
        (run_dir / CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2), encoding="utf-8")
    if config.torch_threads is not None:
        torch.set_num_threads(config.torch_threads)
    random.seed(config.seed)
    torch.manual_seed(config.seed)
    losses = openrlhf_losses()

    # the policy, its tokenizer, and the frozen reference for the KL term
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(config.policy)
    model = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32)
    model.config.use_cache = False  # training passes need no KV cache
    reference = None
    if config.loss.kl_coef > 0:
        reference = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32).eval()
        reference.requires_grad_(False)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    n_params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    # the world, its index, the env, the engine
    world = World.generate(config.task.world_seed, config.task.world)
    split = world.split()
    train_tasks = world.tasks if config.task.train_split == "all" else split.train
    if config.task.eval_split == "heldout":
        eval_tasks = TaskSet([*split.test, *split.test_entities])
    else:
        eval_tasks = getattr(split, config.task.eval_split)
    if config.task.questions == "hard":
        train_tasks = TaskSet([t for t in train_tasks if is_hard(t)])
        eval_tasks = TaskSet([t for t in eval_tasks if is_hard(t)])
    if len(train_tasks) == 0 or (config.eval.every and len(eval_tasks) == 0):
        raise HarnessError(
            f"no questions to train or evaluate on ({len(train_tasks)} train, {len(eval_tasks)} "
            f"eval) with --task.questions {config.task.questions}"
        )
    # cached: the engine sends each turn's searches in one batched call through the cache
    retriever = CachedRetriever(BM25Retriever.build(world.documents))
    env = config.task.env.make_env(train_tasks, retriever)
    codec = EpisodeCodec(tokenizer)
    ckpt = load_checkpoint(checkpoint_path) if config.resume and checkpoint_path else None
    if ckpt is not None:  # before the optimizer wraps the model: ZeRO-3 then partitions them
        model.load_state_dict(ckpt.model)
    # ZeRO-3 partitions the weights, so every forward of `model` becomes a collective, which
    # rollouts (a different amount of generation on each rank) cannot be: rollouts and
    # evaluation then use a whole copy, refreshed from the gathered weights before every step
    # (OpenRLHF's weight sync to its vLLM engines, in miniature)
    partitioned = config.optim.backend == "deepspeed" and config.optim.zero_stage == 3
    rollout_model = copy.deepcopy(model) if partitioned else model
    backend = TransformersBackend(rollout_model, tokenizer)
    sampling = SamplingParams(
        max_new_tokens=config.rollout.max_new_tokens,
        temperature=config.rollout.temperature,
        top_p=config.rollout.top_p,
        top_k=config.rollout.top_k,
    )
    engine = TreeRolloutEngine(
        backend,
        env,
        codec,
        sampling=sampling,
        max_total_tokens=config.rollout.max_total_tokens,
        # ranks sample with their own streams (the same one would repeat samples across ranks)
        seed=config.seed + 1_000_003 * ranks.rank,
        snapshot_prefix=f"r{ranks.rank}s" if ranks.world_size > 1 else "s",
    )
    allocator = config.alloc.build()
    budget = BudgetLimit(currency=config.budget.currency, per_step=config.budget.per_step)
    alloc_rng = np.random.default_rng([config.seed, 1])
    predictor = make_predictor(config.predictor, seed=config.seed)
    optimizer = make_optimizer(
        model,
        backend=config.optim.backend,
        zero_stage=config.optim.zero_stage,
        lr=config.optim.lr,
        betas=config.optim.betas,
        weight_decay=config.optim.weight_decay,
        grad_clip=config.optim.grad_clip,
    )
    policy_loss = losses.PolicyLoss(
        clip_eps_low=config.loss.clip_eps_low,
        clip_eps_high=config.loss.clip_eps_high,
        token_level_loss=config.loss.token_level_loss,
    )
    cursor = DataCursor(tuple(train_tasks.ids), config.seed)
    carry = 0.0
    tokens_per_leaf = config.budget.tokens_per_leaf_guess
    totals = Spend()
    start_step = 0

    if ckpt is not None:
        optimizer.load_state_dict(ckpt.optimizer)
        predictor.load_state_dict(ckpt.predictor)
        torch.set_rng_state(ckpt.torch_rng)
        s = ckpt.state
        random.setstate(_python_rng_from_json(s["python_rng"]))
        alloc_rng.bit_generator.state = s["alloc_rng"]
        engine.set_rng_state(_rank_engine_rng(s, ranks))
        cursor.epoch, cursor.position = int(s["cursor"]["epoch"]), int(s["cursor"]["position"])
        carry, tokens_per_leaf = float(s["carry"]), float(s["tokens_per_leaf"])
        totals = Spend(**s["totals"])
        start_step = ckpt.step
        log.info("resuming %s from step %d (%s)", run_dir, start_step, checkpoint_path)
    metrics_log = (
        MetricsLog(
            run_dir,
            tensorboard=config.tensorboard,
            resume_step=start_step if config.resume else None,
        )
        if ranks.is_main
        else None
    )

    # the run's size, before the first step (nanoGPT)
    per_step = f"{config.budget.per_step:,} {config.budget.currency}"
    log.info(
        "policy %s: %s parameters | %d train / %d eval questions | allocator %s | budget %s "
        "per step over a pool of %d prompts | steps %d-%d | total budget %s %s | rank %d of %d",
        config.policy,
        f"{n_params:,}",
        len(train_tasks),
        len(eval_tasks),
        repr(allocator),
        per_step,
        config.budget.pool_size,
        start_step + 1,
        config.steps,
        f"{config.budget.per_step * (config.steps - start_step):,}",
        config.budget.currency,
        ranks.rank,
        ranks.world_size,
    )

    def evaluate(step: int) -> dict[str, float]:
        eval_env = config.task.env.make_env(eval_tasks, retriever)
        ids = list(eval_tasks.ids[: config.eval.n_questions])
        result = evaluate_policy(
            backend,
            eval_env,
            ids,
            codec,
            temperature=config.eval.temperature,
            n_samples=config.eval.n_samples,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=config.seed + 7919 * step,
            max_total_tokens=config.rollout.max_total_tokens,
        )
        return {
            "eval/em": result.em,
            "eval/mixed": result.mixed,
            "eval/searches_per_episode": result.searches_per_episode,
            "eval/answered": result.answered,
        }

    last: dict[str, Any] = {}
    if config.eval.every and start_step == 0 and metrics_log is not None:
        rollout_model.eval()
        metrics_log.write(0, evaluate(0))
    bar = tqdm(
        total=config.steps,
        initial=start_step,
        desc="train",
        disable=not (config.progress and ranks.is_main),
    )
    for step in range(start_step + 1, config.steps + 1):
        t_step = time.perf_counter()

        # 1. data
        pool = cursor.take(config.budget.pool_size)

        # 2. rollout: the allocator spends exactly this step's budget (across the ranks, wave by
        # wave, when there are several: every rank ends with the same trees)
        if partitioned:
            rollout_model.load_state_dict(optimizer.model_state_dict())
        rollout_model.eval()
        engine.reset_stats()
        result = engine.run_step(
            allocator,
            pool,
            budget=budget,
            rng=alloc_rng,
            predictor=predictor if config.alloc.uses_predictor else None,
            carry=carry,
            tokens_per_leaf=tokens_per_leaf,
            max_waves=config.budget.max_waves,
            execute=ShardedExecutor(engine, ranks) if ranks.world_size > 1 else None,
        )
        rollout_stats = engine.stats
        carry, tokens_per_leaf = result.carry, result.tokens_per_leaf or tokens_per_leaf
        totals = totals + result.spent
        record: dict[str, Any] = rollout_metrics(result)
        if ranks.world_size > 1:  # the rollout shards: how evenly the ranks shared the step
            record["perf/rollouts_by_rank"] = all_gather(rollout_stats.n_rollouts, ranks)

        # 3. predictor: calibration on unseen nodes first (roots and prefixes apart), then
        # learn every node, weighted by its outcomes
        record |= learn_from_step(predictor, result.trees)
        check_same_across_ranks(predictor.state_dict(), ranks, "predictor")

        # 4. advantages on the trees the allocator keeps for training
        trees = [result.trees[i] for i in result.train_indices]
        # leaves without signal carry no weight: not in the gradient, not in the token mean
        # (docs/decisions.md, "One objective"; the OpenRLHF path does the same)
        leaves = [
            a.to_tokens(trees[a.tree_index])
            for a in tree_advantages(trees, config.loss.advantage)
            if a.has_signal
        ]

        # 5. policy update
        t_update = time.perf_counter()
        lr = _lr(step, config.optim)
        update = update_policy(
            optimizer,
            reference,
            policy_loss,
            losses,
            leaves,
            config,
            pad_id=pad_id,
            lr=lr,
            ranks=ranks,
        )
        record |= update

        # 6. log and checkpoint
        now = time.perf_counter()
        record |= {
            "budget/leaves": result.spent.n_leaves,
            "budget/tokens": result.spent.n_tokens,
            "budget/tool_calls": result.spent.n_tool_calls,
            "budget/limit": result.limit,
            "budget/carry": result.carry,
            "budget/total_leaves": totals.n_leaves,
            "budget/total_tokens": totals.n_tokens,
            "budget/total_tool_calls": totals.n_tool_calls,
            "perf/tokens_per_s": rollout_stats.tokens_per_s,
            "perf/rollout_s": rollout_stats.generate_s,
            "perf/alloc_s": result.alloc_s,
            "perf/update_s": now - t_update,
            "perf/step_s": now - t_step,
            "policy/lr": lr,
            "data/epoch": cursor.epoch,
            "data/pool": pool,
            "data/trained": [result.trees[i].prompt_id for i in result.train_indices],
        }
        if config.eval.every and step % config.eval.every == 0 and ranks.is_main:
            rollout_model.eval()
            record |= evaluate(step)
        if metrics_log is not None:
            metrics_log.write(step, record)
        last = {"step": step, **record}
        if config.save_trees_every and step % config.save_trees_every == 0 and ranks.is_main:
            _save_trees(run_dir, step, result)
        if step % config.checkpoint_every == 0 or step == config.steps:
            # collectives under several ranks (ZeRO-3 weights, ZeRO partitions, rng streams)
            weights, optimizer_state = optimizer.model_state_dict(), optimizer.state_dict()
            engine_rngs = all_gather(engine.rng_state(), ranks)
            state = {
                "python_rng": _python_rng_to_json(random.getstate()),
                "alloc_rng": alloc_rng.bit_generator.state,
                "engine_rng": engine_rngs[0],
                "cursor": {"epoch": cursor.epoch, "position": cursor.position},
                "carry": carry,
                "tokens_per_leaf": tokens_per_leaf,
                "totals": dataclasses.asdict(totals),
            }
            if ranks.world_size > 1:
                state["engine_rng_by_rank"] = engine_rngs
            if ranks.is_main:
                save_checkpoint(
                    run_dir,
                    step,
                    model=weights,
                    optimizer=optimizer_state,
                    predictor=predictor.state_dict(),
                    state=state,
                    keep=config.keep_checkpoints,
                )
        bar.update(1)
        bar.set_postfix(
            reward=f"{record['rollout/reward']:.2f}",
            eff=f"{record['rollout/effective_ratio']:.2f}",
            refresh=False,
        )
    bar.close()
    if metrics_log is not None:
        metrics_log.close()

    policy_dir = run_dir / "policy"
    weights = optimizer.model_state_dict()  # a collective under ZeRO-3
    if ranks.is_main:
        model.save_pretrained(policy_dir, state_dict=weights)
        tokenizer.save_pretrained(policy_dir)
    summary = TrainSummary(
        run_dir=run_dir,
        steps=config.steps,
        policy_dir=policy_dir,
        totals={
            "leaves": totals.n_leaves,
            "tokens": totals.n_tokens,
            "tool_calls": totals.n_tool_calls,
        },
        final=last,
        wall_s=time.perf_counter() - wall_start,
    )
    if ranks.is_main:
        (run_dir / SUMMARY_FILE).write_text(
            json.dumps(summary.to_json(), indent=2), encoding="utf-8"
        )
    return summary


def update_policy(
    optimizer: Any,
    reference: Any,
    policy_loss: Any,
    losses: Any,
    leaves: list[Any],
    config: TrainConfig,
    *,
    pad_id: int,
    lr: float,
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, float]:
    """PPO epochs over the step's leaves: one optimizer step per epoch; returns the metrics.

    The update phase of `train`, public so that `benchmarks.perf.data_parallel` can drive it on
    fixed leaves. `leaves` is the step's global list, the same on every rank; each rank trains
    on its dealt share (`harness.distributed.deal`), normalised by the global token count, and
    the metrics are summed over the ranks, so N ranks report and step as one process would.
    """
    nan = float("nan")
    if not leaves:  # no contrast this step: nothing to learn from
        return {"loss/policy": nan, "policy/n_train_leaves": 0, "policy/n_train_tokens": 0}
    mbs = config.optim.micro_batch_size
    batches = _batches(deal(leaves, ranks, size=lambda t: len(t.token_ids)), mbs, pad_id)
    # ZeRO-3's forward and backward are collectives: every rank runs as many micro-batches as
    # the rank with the most, the missing ones with zero weight
    n_micro = math.ceil(math.ceil(len(leaves) / ranks.world_size) / mbs)
    filler = batches[0] if batches else _batches(leaves[:1], mbs, pad_id)[0]
    batches += [_weightless(filler)] * (n_micro - len(batches))
    # the step's action tokens over every rank (the shift drops each leaf's first token)
    n_tokens = float(sum(int(t.action_mask[1:].sum()) for t in leaves))
    dp = ranks.world_size  # undoes the gradient average over ranks (OpenRLHF's dp_size)
    model = optimizer.model
    kl_coef = config.loss.kl_coef
    temperature = config.rollout.temperature
    old_logprobs: list[torch.Tensor] = []
    if config.optim.ppo_epochs > 1:  # the behaviour policy's log-probs, before any update
        with torch.no_grad():
            old_logprobs = [_logprobs(model, b, losses, temperature)[0] for b in batches]
    ref_logprobs: list[torch.Tensor] = []
    if reference is not None:
        with torch.no_grad():
            ref_logprobs = [_logprobs(reference, b, losses, temperature)[0] for b in batches]
    sums = {"loss": 0.0, "kl": 0.0, "entropy": 0.0, "clip": 0.0, "ppo_kl": 0.0, "gap": 0.0}
    grad_norm = nan
    model.train()
    for _ in range(config.optim.ppo_epochs):
        for i, batch in enumerate(batches):
            logprobs, logits = _logprobs(model, batch, losses, temperature)  # (B,T-1), (B,T-1,V)
            old = old_logprobs[i] if old_logprobs else logprobs.detach()  # on-policy: ratio 1
            # per-token loss summed over the batch and divided by the step's token count, so the
            # micro-batches add up to OpenRLHF's token-level mean over the whole step
            loss, clip_ratio, ppo_kl, _, _ = policy_loss(
                logprobs,
                old,
                batch.advantages,
                batch.mask,
                dp_size=dp,
                batch_num_tokens=n_tokens if config.loss.token_level_loss else None,
                global_batch_size=float(len(leaves)) if not config.loss.token_level_loss else None,
            )
            share = float(batch.mask.sum()) / n_tokens  # this batch's share of the step's tokens
            if reference is not None:
                kl = losses.compute_approx_kl(
                    logprobs, ref_logprobs[i], kl_estimator=config.loss.kl_estimator
                )  # (B, T-1)
                kl_mean = (kl * batch.mask).sum() / n_tokens
                loss = loss + kl_coef * kl_mean * dp
                sums["kl"] += float(kl_mean)
            optimizer.backward(loss, last=i == len(batches) - 1)
            with torch.no_grad():
                entropy = losses.compute_entropy(logits.detach())  # (B, T-1)
                sums["entropy"] += float((entropy * batch.mask).sum()) / n_tokens
                gap = (batch.rollout_logprobs - logprobs.detach()).abs()  # (B, T-1)
                sums["gap"] += float((gap * batch.mask).sum()) / n_tokens
            sums["loss"] += loss.item() / dp
            if share > 0:  # a weightless filler's masked means are 0/0
                sums["clip"] += float(clip_ratio) * share
                sums["ppo_kl"] += float(ppo_kl) * share
        grad_norm = optimizer.step(lr)
    model.eval()
    sums = sum_across_ranks(sums, ranks)
    epochs = config.optim.ppo_epochs
    return {
        "loss/policy": sums["loss"] / epochs,
        "loss/kl": sums["kl"] / epochs if reference is not None else 0.0,
        "policy/entropy": sums["entropy"] / epochs,
        "policy/kl": sums["kl"] / epochs if reference is not None else 0.0,
        "policy/clip_ratio": sums["clip"] / epochs,
        "policy/approx_kl": sums["ppo_kl"] / epochs,
        "policy/rollout_logprob_gap": sums["gap"] / epochs,
        "policy/grad_norm": grad_norm,
        "policy/n_train_leaves": len(leaves),
        "policy/n_train_tokens": int(n_tokens),
    }


def _weightless(batch: _Batch) -> _Batch:
    """`batch` with no action tokens: a forward and backward that add nothing to the step."""
    return dataclasses.replace(batch, mask=torch.zeros_like(batch.mask))


def _rank_engine_rng(state: Mapping[str, Any], ranks: Ranks) -> dict[str, Any]:
    """This rank's engine generator state from a checkpoint's `state.json`.

    Raises:
        ResumeError: the checkpoint was written by another number of ranks.
    """
    by_rank = state.get("engine_rng_by_rank", [state["engine_rng"]])
    if len(by_rank) != ranks.world_size:
        raise ResumeError(
            f"the checkpoint was written by {len(by_rank)} rank(s), this run has "
            f"{ranks.world_size}: resume with the same --nproc_per_node"
        )
    return dict(by_rank[ranks.rank])


def _logprobs(
    model: Any, batch: _Batch, losses: Any, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next-token log-probs of the batch's tokens under the sampling temperature, and the logits.

    The logits are divided by the rollout temperature before the log-softmax, as OpenRLHF's
    `Actor.forward` does (0.11.2, models/actor.py): the loss then scores the distribution the
    rollouts were sampled from, which is what the rollout log-probs are measured under. Greedy
    sampling (temperature 0) scores the raw logits.
    """
    logits = model(input_ids=batch.ids, attention_mask=batch.attention).logits[:, :-1].float()
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature  # (B, T-1, V)
    # (B, T-1, V) -> (B, T-1); OpenRLHF's pure-torch path (no flash_attn.ops here)
    logprobs = losses.log_probs_from_logits(logits, batch.ids[:, 1:])
    return logprobs, logits


def _check_policy_task(config: TrainConfig) -> None:
    """A policy from `tracerl init-model` must meet the world and env it was warm-started on.

    Raises:
        HarnessError: the policy's `tiny_policy.json` names another world or env.
    """
    path = Path(config.policy) / ARTIFACTS_FILE
    if not path.is_file():
        return  # any other transformers model: the task flags are the user's call
    recorded = json.loads(path.read_text(encoding="utf-8"))["config"]
    ours = config.task
    expected = {
        "world_seed": ours.world_seed,
        "world": json.loads(json.dumps(dataclasses.asdict(ours.world))),
        "env": dataclasses.asdict(ours.env),
    }
    for key, value in expected.items():
        if recorded[key] != value:
            raise HarnessError(
                f"{config.policy} was warm-started with {key}={recorded[key]!r}, but this run "
                f"has {key}={value!r}: pass the matching --task flags"
            )


def _save_trees(run_dir: Path, step: int, result: StepResult) -> None:
    """The step's trees as JSON lines (`tracerl tree show` reads them)."""
    folder = run_dir / "trees"
    folder.mkdir(exist_ok=True)
    lines = "".join(tree.to_json() + "\n" for tree in result.trees if tree.n_leaves)
    (folder / f"step_{step:06d}.jsonl").write_text(lines, encoding="utf-8")


def _python_rng_to_json(state: tuple[Any, ...]) -> list[Any]:
    version, internal, gauss = state
    return [version, list(internal), gauss]


def _python_rng_from_json(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)


def load_config(run_dir: Path) -> TrainConfig:
    """The config a run was started with (`run_dir/config.json`).

    Raises:
        ResumeError: the run has no config file.
    """
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise ResumeError(f"{path} not found: is {run_dir} a `tracerl train` run directory?")
    return config_from_dict(TrainConfig, json.loads(path.read_text(encoding="utf-8")))
