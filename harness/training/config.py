"""The configuration of a training run, shared by both trainers.

`TrainConfig` is what `tracerl train` parses (tyro) and what `harness.training.trainer.train` runs;
its parts (`TaskConfig`, `AllocConfig`, `BudgetConfig`, `RolloutConfig`, `PredictorConfig`,
`LossConfig`, `OptimConfig`, `EvalConfig`) are frozen dataclasses. The OpenRLHF launcher
(`harness.openrlhf.config.TreeTrainConfig`) takes the same `AllocConfig` and `PredictorConfig`.

The allocator is configured with trace_alloc's own dataclasses, one field per allocator
(`--alloc.name trace --alloc.trace.min-per-prompt 2`), so every field an allocator has is a
flag and no list of knobs is kept here (docs/decisions.md, "One config for both trainers"). A
run's config is saved as `run_dir/config.json` and read back by `load_config`, which also
reads the files written before this layout (a flat `alloc` of optional knobs).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from envs import SearchQAConfig, WorldConfig
from harness.errors import PluginError, ResumeError
from harness.plugins import load_plugin, parse_kwargs
from harness.tiny_policy.config import default_world_config, tiny_env_config
from trace_alloc import (
    Allocator,
    ConstantPredictor,
    DynamicSampling,
    EntropyTree,
    FlipCalibrator,
    HashedNgramFeaturizer,
    MemoryPredictor,
    MLPPredictor,
    RandomTree,
    Trace,
    Uniform,
    make_allocator,
)
from trace_alloc.allocators import ALLOCATORS, AllocatorName, PromptPredictor
from trace_alloc.budget import BudgetLimit

__all__ = [
    "CONFIG_FILE",
    "RENAMED_FLAGS",
    "AbortConfig",
    "AdvantageConfig",
    "AdvantageMode",
    "AllocConfig",
    "AllocatorSettings",
    "BudgetConfig",
    "Currency",
    "EvalConfig",
    "EvalSetName",
    "LossConfig",
    "OptimConfig",
    "PredictorConfig",
    "RolloutConfig",
    "TaskConfig",
    "TrainConfig",
    "UserAllocatorFlags",
    "config_from_dict",
    "load_config",
    "renamed_flags",
    "tool_flags",
]

CONFIG_FILE = "config.json"

log = logging.getLogger(__name__)

EvalSetName = Literal["split", "fact_disjoint", "unseen", "decoy"]
"""The held-out sets a run can be evaluated on (`harness.training.task_sources`)."""
AdvantageMode = Literal["grpo", "tree_grpo", "treerl"]
"""`trace_alloc.tree_advantages` modes."""
Currency = Literal["leaves", "tokens"]
"""What a step's budget counts: rollouts (leaves) or generated tokens."""

RENAMED_FLAGS: dict[str, str] = {
    "--advantage": "--loss.advantage",
    "--currency": "--budget.currency",
    "--tokens-per-step": "--budget.per-step",
}
"""Old flag names of `tracerl train --backend openrlhf`, still read (with a warning) as the
names both trainers now share."""


@dataclass(frozen=True, kw_only=True)
class TaskConfig:
    """The questions, the corpus and the env (the synthetic world by default).

    `harness.training.task_sources` builds them: the training source (`source`) and the held-out
    sets (`EvalConfig.sets`).
    """

    source: Literal["world", "stream", "file"] = "world"
    """`world`: the questions of world `world_seed`; `stream`: a freshly generated world per
    step (seeds from `stream_first_seed`), each with its own BM25 index; `file`: the questions
    of `train_file` over `index`."""
    world_seed: int = 0
    """Seed of the synthetic world (its questions and its BM25-indexed corpus); with a stream
    or a file, the world of the `split`, `fact_disjoint` and `decoy` held-out sets."""
    stream_first_seed: int = 100_000
    """`stream`: step s trains on world `stream_first_seed + s - 1`; the seeds must miss
    `world_seed`, the held-out worlds and the policy's warm-start worlds."""
    stream_bank: int = 0
    """`stream`: 0 for a fresh world every step; K > 0 cycles over a bank of K worlds (step s
    trains on world `stream_first_seed + (s - 1) mod K`), so each world and its questions come
    back every K steps: a fixed training set revisited for epochs, where a question's own past
    outcomes can inform its next allocation (`PredictorConfig.memory`)."""
    train_file: Path | None = None
    """`file`: the questions, in any format `tracerl bench` reads (HotpotQA JSON, FlashRAG
    JSONL, ...)."""
    eval_file: Path | None = None
    """`file`: the held-out questions of the `split` set (same format, same index)."""
    file_format: str | None = None
    """`file`: force a format instead of detecting it from the content."""
    index: str | None = None
    """`file`: an index directory (`tracerl index build`, `tracerl corpus`) or a retriever
    URL (`tracerl serve-retriever`, a Search-R1 server)."""
    unseen_world_seeds: tuple[int, ...] = (5_000, 5_001)
    """Worlds of the `unseen` held-out set: never trained on by any source."""
    decoy_world_seed: int = 5_100
    """The `decoy` set asks world `world_seed`'s training questions over this world's
    documents."""
    demo_world_seeds: tuple[int, ...] = tuple(range(1_000, 1_040))
    """Worlds the policy was warm-started on with every question they ask (a tiny policy's
    demonstration worlds, its `tiny_policy.json`'s `demos`; the default: the shipped warm
    start's): the `fact_disjoint` set also asks their questions that no demonstration chains.
    Empty: world `world_seed`'s only (a dozen questions: too few to measure)."""
    world: WorldConfig = field(default_factory=default_world_config)
    """Size and difficulty of the world; must match what the policy was warm-started on (a
    policy built by `tracerl init-model` records it, and a mismatch is an error)."""
    train_split: Literal["train", "all"] = "train"
    """Questions the data cursor walks over."""
    eval_split: Literal["dev", "test", "test_entities", "heldout"] = "dev"
    """Held-out questions for `eval` (`heldout`: test, then test_entities)."""
    questions: Literal["all", "hard"] = "all"
    """`hard`: only 3-4-hop bridges, comparisons and inference questions (train and eval)."""
    env: SearchQAConfig = field(default_factory=tiny_env_config)
    """Turn limit, documents per search, prompt, reward: the env the policy plays (by default
    the tiny policy's own, `harness.tiny_policy.tiny_env_config`)."""

    def __post_init__(self) -> None:
        given = {"train_file": self.train_file, "index": self.index}
        if self.source == "file" and None in given.values():
            missing = [f"--task.{k.replace('_', '-')}" for k, v in given.items() if v is None]
            raise ValueError(f"--task.source file needs {' and '.join(missing)}")
        if self.source != "file" and any(
            v is not None for v in (self.train_file, self.eval_file, self.index)
        ):
            raise ValueError(
                f"--task.train-file, --task.eval-file and --task.index need --task.source file "
                f"(the source is {self.source!r})"
            )
        if self.stream_bank < 0 or (self.stream_bank and self.source != "stream"):
            raise ValueError(
                f"--task.stream-bank {self.stream_bank}: a bank of K >= 1 worlds needs "
                f"--task.source stream (the source is {self.source!r}); 0 turns it off"
            )
        if self.world_seed in {self.decoy_world_seed, *self.unseen_world_seeds}:
            raise ValueError(
                f"world_seed={self.world_seed} is also a held-out world "
                f"(unseen {self.unseen_world_seeds}, decoy {self.decoy_world_seed})"
            )

    def stream_overlap(self, steps: int, others: Iterable[int] = ()) -> list[int]:
        """The seeds a stream of `steps` steps would share with a held-out world or `others`."""
        n = min(steps, self.stream_bank) if self.stream_bank else steps
        stream = range(self.stream_first_seed, self.stream_first_seed + n)
        held = {self.world_seed, self.decoy_world_seed, *self.unseen_world_seeds, *others}
        return sorted(seed for seed in held if seed in stream)


@dataclass(frozen=True, kw_only=True)
class AllocatorSettings:
    """Every allocator's own settings: one field per `trace_alloc.allocators.ALLOCATORS` entry."""

    trace: Trace = field(default_factory=Trace)
    """TRACE: Stage-1 roots, Stage-2 prefix continuations."""
    uniform: Uniform = field(default_factory=Uniform)
    """GRPO: G rollouts per prompt."""
    dynamic_sampling: DynamicSampling = field(default_factory=DynamicSampling)
    """DAPO: resample until enough groups are mixed."""
    prompt_predictor: PromptPredictor = field(default_factory=PromptPredictor)
    """Prompts whose predicted success is nearest a target."""
    random_tree: RandomTree = field(default_factory=RandomTree)
    """Tree-GRPO: chains branched at random turns."""
    entropy_tree: EntropyTree = field(default_factory=EntropyTree)
    """Chains branched at the turn of highest policy entropy."""

    def changed(self, name: str) -> dict[str, Any]:
        """The fields of allocator `name` that differ from its defaults, by name."""
        ours, default = getattr(self, name), ALLOCATORS[name]()
        return {
            f.name: getattr(ours, f.name)
            for f in dataclasses.fields(ours)
            if getattr(ours, f.name) != getattr(default, f.name)
        }


@dataclass(frozen=True, kw_only=True)
class AllocConfig(AllocatorSettings):
    """Which allocator spends the budget (`name`), with its own settings (`--alloc.NAME.FIELD`).

    Setting a field of an allocator that `name` does not choose is an error, not a silent
    no-op.
    """

    name: AllocatorName = "trace"
    """One of `trace_alloc.allocators.ALLOCATORS`: uniform (GRPO), dynamic_sampling (DAPO),
    prompt_predictor, random_tree (Tree-GRPO), entropy_tree, trace."""

    def __post_init__(self) -> None:
        if self.name not in ALLOCATORS:
            make_allocator(self.name)  # raises UnknownNameError with the closest names
        for other in ALLOCATORS:
            changed = self.changed(other) if other != self.name else {}
            if changed:
                flag = f"--alloc.{other}.{next(iter(changed))}".replace("_", "-")
                raise ValueError(
                    f"{flag} does not apply to allocator {self.name!r}: pass "
                    f"--alloc.name {other}, or set --alloc.{self.name}.* instead"
                )

    @classmethod
    def of(cls, name: str, **fields: Any) -> AllocConfig:
        """The config that builds allocator `name` with `fields` (the rest its defaults).

        >>> AllocConfig.of("uniform", group_size=4).build()
        Uniform(group_size=4)
        """
        return cls(name=name, **{name: make_allocator(name, **fields)})  # type: ignore[arg-type]

    def build(self) -> Allocator:
        """The allocator `name` chooses, with its settings."""
        return getattr(self, self.name)

    @property
    def uses_predictor(self) -> bool:
        """Whether the allocator reads Ṽψ."""
        return bool(ALLOCATORS[self.name].uses_predictor)


TRAINER_MAX_WAVES = 16
"""The wave cap of a training step, in both trainers (docs/decisions.md, "One tree step")."""


@dataclass(frozen=True, kw_only=True)
class UserAllocatorFlags:
    """A user's own allocator, named on the command line in place of `--alloc.name`.

    Both trainers take these flags (`tracerl train`, `tracerl train --backend openrlhf`);
    docs/extending.md shows an allocator and its command.
    """

    allocator: str | None = None
    """`MODULE:CLASS` of a `trace_alloc.Allocator` of your own; replaces `--alloc.name`."""
    allocator_kwargs: str = "{}"
    """The allocator's keyword arguments, as a JSON object (`'{"group_size": 4}'`)."""

    def __post_init__(self) -> None:
        parse_kwargs(self.allocator_kwargs, flag="--allocator-kwargs")  # bad JSON fails here
        if self.allocator is None and self.allocator_kwargs.strip() != "{}":
            raise PluginError("--allocator-kwargs needs --allocator MODULE:CLASS")

    def build_allocator(self, alloc: AllocConfig) -> Allocator:
        """The user's allocator when `--allocator` names one, else the one `alloc` names.

        Raises:
            PluginError: `--allocator` cannot be imported or built, or is no `Allocator`.
        """
        if self.allocator is None:
            return alloc.build()
        kwargs = parse_kwargs(self.allocator_kwargs, flag="--allocator-kwargs")
        allocator: Allocator = load_plugin(
            self.allocator, Allocator, kwargs=kwargs, flag="--allocator"
        )
        return allocator


@dataclass(frozen=True, kw_only=True)
class BudgetConfig:
    """The equal-cost budget of every step."""

    currency: Currency = "leaves"
    """`leaves` (exact per step) or generated `tokens` (carried over between steps)."""
    per_step: int = 32
    """Budget of one step in `currency`."""
    pool_size: int = 16
    """Candidate prompts per step (the allocator may leave some without rollouts)."""
    tokens_per_leaf_guess: float = 60.0
    """Token currency only: the estimate for the first wave of the first step."""
    max_waves: int = TRAINER_MAX_WAVES
    """Safety bound on allocator waves per step."""

    def __post_init__(self) -> None:
        if self.per_step < 2 or self.pool_size < 1:
            raise ValueError(
                f"per_step={self.per_step}, pool_size={self.pool_size}: a step needs at least "
                "2 leaves' worth of budget and one prompt"
            )

    def limit(self) -> BudgetLimit:
        """The per-step limit `trace_alloc` meters (currency, size, wave cap)."""
        return BudgetLimit(currency=self.currency, per_step=self.per_step, max_waves=self.max_waves)


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
    flip_calibration: float = 20.0
    """Stage 2's flip chances are Platt-scaled online against the flips that happened
    (`trace_alloc.FlipCalibrator`), with a prior toward the identity worth this many
    continuations; 0 turns the calibration off."""

    def build_flip_calibrator(self) -> FlipCalibrator | None:
        """The online calibration of Stage 2's flip chances, or None when it is off."""
        if self.flip_calibration < 0:
            raise ValueError(f"flip_calibration={self.flip_calibration}: must be >= 0")
        if not self.flip_calibration:
            return None
        return FlipCalibrator(prior_strength=self.flip_calibration)

    def build(self, *, seed: int) -> MemoryPredictor | MLPPredictor | ConstantPredictor:
        """The predictor `kind` names; the CPU and the OpenRLHF trainers both build it here.

        Args:
            seed: Seeds the MLP's initial weights.
        """
        if self.kind == "constant":
            return ConstantPredictor(self.prior)
        text = MLPPredictor(
            HashedNgramFeaturizer(dim=self.dim),
            hidden=self.hidden,
            lr=self.lr,
            epochs=self.epochs,
            prior=self.prior,
            seed=seed,
        )
        if not self.memory:
            return text
        return MemoryPredictor(
            text,
            prior_strength=self.prior_strength,
            decay=self.memory_decay,
            replay_size=self.replay_size,
        )


@dataclass(frozen=True, kw_only=True)
class AdvantageConfig:
    """The tree advantage: the part of the loss both trainers set (`--loss.advantage`)."""

    advantage: AdvantageMode = "tree_grpo"
    """`trace_alloc.tree_advantages` mode."""


@dataclass(frozen=True, kw_only=True)
class LossConfig(AdvantageConfig):
    """Advantages and OpenRLHF's PolicyLoss.

    The OpenRLHF trainer takes `advantage` only; its PolicyLoss reads OpenRLHF's own flags.
    """

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
    sets: tuple[EvalSetName, ...] = ("split",)
    """Held-out sets (`harness.training.task_sources.EVAL_SETS`): `split` (the world's `eval_split`,
    or `eval_file`), `fact_disjoint`, `unseen`, `decoy`. The first is logged as `eval/em`,
    each as `eval/NAME/em`."""
    n_questions: int = 64
    """Questions of each held-out set: the first ones, equally from each of its corpora
    (`harness.training.task_sources.held_out`, as the demo's table takes them)."""
    n_samples: int = 1
    temperature: float | None = None
    """Sampling temperature of the held-out episodes (0: greedy). None: the rollout's
    (`--rollout.temperature`), so the policy is judged as it samples in training."""
    seed: int | None = None
    """Seeds every evaluation's sampling stream, the same at every point of the curve, so
    two points differ by the policy, not the draw. None: the run's `--seed`."""
    batch_size: int = 64
    """Episodes in flight at once (the draws depend on it, as on the seed)."""

    def __post_init__(self) -> None:
        if self.every < 0 or self.n_questions < 1 or self.n_samples < 1 or self.batch_size < 1:
            raise ValueError(
                f"--eval.every {self.every} must be >= 0; --eval.n-questions "
                f"{self.n_questions}, --eval.n-samples {self.n_samples} and --eval.batch-size "
                f"{self.batch_size} >= 1"
            )

    def temperature_for(self, rollout: RolloutConfig) -> float:
        """The temperature held-out episodes are played at."""
        return rollout.temperature if self.temperature is None else self.temperature


@dataclass(frozen=True, kw_only=True)
class AbortConfig:
    """When a run stops itself instead of training on nothing (`harness.training.run_guard`)."""

    failed_share: float = 0.5
    """A step is failed when more than this share of its episodes a fault ended (the retriever
    did not answer): such episodes are left out of training."""
    steps: int = 3
    """Abort after this many failed steps in a row, with the cause in one line (0: never)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.failed_share < 1.0 or self.steps < 0:
            raise ValueError(
                f"--abort.failed-share {self.failed_share} must lie in [0, 1) and "
                f"--abort.steps {self.steps} be >= 0"
            )


@dataclass(frozen=True, kw_only=True)
class TrainConfig(UserAllocatorFlags):
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
    abort: AbortConfig = field(default_factory=AbortConfig)
    task_source: str | None = None
    """`MODULE:CLASS` of a `harness.training.TaskSource` of your own: the questions and the
    index each step trains on, in place of `--task.source` (docs/extending.md)."""
    task_source_kwargs: str = "{}"
    """The task source's keyword arguments, as a JSON object."""

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_kwargs(self.task_source_kwargs, flag="--task-source-kwargs")
        if self.task_source is None and self.task_source_kwargs.strip() != "{}":
            raise PluginError("--task-source-kwargs needs --task-source MODULE:CLASS")
        if self.steps < 1 or self.checkpoint_every < 1:
            raise ValueError(f"steps={self.steps}, checkpoint_every={self.checkpoint_every}: >= 1")
        if self.keep_checkpoints < 1:  # 0 would keep none and still write them, to prune them
            raise ValueError(f"--keep-checkpoints {self.keep_checkpoints}: must be >= 1")
        if self.torch_threads is not None and self.torch_threads < 1:
            raise ValueError(f"--torch-threads {self.torch_threads}: must be >= 1 (or unset)")
        shared = self.task.stream_overlap(self.steps) if self.task.source == "stream" else []
        if shared:
            raise ValueError(
                f"the world stream's seeds {self.task.stream_first_seed}.."
                f"{self.task.stream_first_seed + self.steps - 1} include the held-out world(s) "
                f"{shared}: move --task.stream-first-seed"
            )

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict (paths as strings, tuples as lists)."""
        return json.loads(json.dumps(dataclasses.asdict(self), default=str))


def renamed_flags(argv: Sequence[str], renamed: Mapping[str, str] = RENAMED_FLAGS) -> list[str]:
    """`argv` with every old flag name of `renamed` replaced by its new one, with a warning.

    `--old VALUE` and `--old=VALUE` both count, spelled with `_` or `-`.

    >>> renamed_flags(["--currency=tokens", "--tokens_per_step", "900", "--seed", "1"])
    ['--budget.currency=tokens', '--budget.per-step', '900', '--seed', '1']
    """
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        new = renamed.get(name.replace("_", "-")) if name.startswith("--") else None
        if new is not None:
            log.warning("%s is deprecated: use %s (the same flag in both trainers)", name, new)
            arg = new + eq + value
        out.append(arg)
    return out


def tool_flags(argv: Sequence[str]) -> list[str]:
    """`argv` with its `--tool MODULE:CLASS` flags (repeatable) as one `--task.env.tools`.

    >>> tool_flags(["--tool", "a:A", "--steps", "2", "--tool=b:B"])
    ['--steps', '2', '--task.env.tools', 'a:A', 'b:B']
    """
    out: list[str] = []
    specs: list[str] = []
    args = iter(argv)
    for arg in args:
        if arg == "--tool":
            specs.append(next(args, ""))  # a missing value: "" is refused as no MODULE:CLASS
        elif arg.startswith("--tool="):
            specs.append(arg.removeprefix("--tool="))
        else:
            out.append(arg)
    return [*out, "--task.env.tools", *specs] if specs else out


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
            kwargs[name] = config_from_dict(kind, value)  # type: ignore[arg-type]
        elif kind is Path or (value is not None and Path in typing.get_args(kind)):
            kwargs[name] = Path(value)  # `Path` and `Path | None` fields
        elif isinstance(value, list):
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


def load_config(run_dir: Path) -> TrainConfig:
    """The config a run was started with (`run_dir/config.json`), in this layout.

    A file written before the allocators' own settings were nested under `alloc` (a flat
    `alloc` of optional knobs) is read as the same allocator with the same settings.

    Raises:
        ResumeError: the run has no config file.
    """
    path = Path(run_dir) / CONFIG_FILE
    if not path.exists():
        raise ResumeError(f"{path} not found: is {run_dir} a `tracerl train` run directory?")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "alloc" in data:
        data["alloc"] = _upgrade_alloc(data["alloc"])
    return config_from_dict(TrainConfig, data)


def _upgrade_alloc(alloc: dict[str, Any]) -> dict[str, Any]:
    """A saved `alloc` in this layout; the old flat one (`{"name", knob: value | None}`) mapped.

    Raises:
        ResumeError: an old knob that the named allocator does not take.
    """
    if set(alloc) <= {"name", *ALLOCATORS}:
        return alloc
    name = alloc.get("name", "trace")
    knobs = {k: v for k, v in alloc.items() if k != "name" and v is not None}
    try:
        upgraded = AllocConfig.of(name, **{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in knobs.items()})  # fmt: skip
    except TypeError as err:
        raise ResumeError(
            f"the saved config's alloc {alloc} does not fit allocator {name!r} ({err}): "
            "start a new --run-dir"
        ) from err
    return json.loads(json.dumps(dataclasses.asdict(upgraded)))
