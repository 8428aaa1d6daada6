"""The headline experiment: TRACE against the baselines at equal sampling cost, with ablations.

One command trains the warm-started tiny policy with every allocation method, from the same
checkpoint, for the same number of steps, at the same budget per step, with several seeds,
and evaluates every trained policy on the same held-out questions with the same sampling
stream:

- **methods**: `trace`, `uniform` (GRPO), `dynamic_sampling` (DAPO), `prompt_predictor`,
  `random_tree` (Tree-GRPO), `entropy_tree` (branch at the turn of highest policy entropy);
  a method is an allocator name, and everything else (engine, advantages, loss, optimizer) is
  shared (`harness.training.trainer.train`);
- **series**: the budget counted in leaves per step, and in generated tokens per step (the
  token budget is the leaf budget times the start policy's measured tokens per episode);
- **ablations** (leaf series): TRACE's Stage 1 x Stage 2 (uniform or active), the budget
  configurations (M roots, N continuations per root) against GRPO at the same leaves, and
  the predictor off (a constant p);
- **test sets**: the held-out questions of the training world (its test and test_entities
  splits: the primary figure), and the questions of a world generated with a fresh seed
  (`test_world_seed`, never trained on: it measures reading rather than remembering);
- **outputs**: sampled EM and F1 (mean, spread, paired differences against GRPO), the
  effective ratio, mixed anchors per step, the predictor's calibration, the budget in each
  currency and the wall time; `experiment-NAME.json`, `experiment-NAME.md` and
  `experiment-NAME.png` in `--results-dir` (a record there includes the .md in RESULTS.md:
  `python -m benchmarks.records`).

Every run lives in its own directory under `--out-dir`; its evaluations are cached next to it.
Rerunning the command resumes: finished runs and evaluations are read back, and a killed run
continues from its latest checkpoint. `--workers 2` trains two runs at a time (one torch
thread each: the fastest use of two cores for these tiny models).

With `--backend openrlhf --model Qwen/Qwen3-8B --dataset hotpotqa` it prints (or, with
`--launch`, runs one after another) the GPU commands of the same comparison through
`scripts/train_qwen3_8b_hotpotqa.sh`; see docs/experiment.md.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tyro

from benchmarks.meta import run_key, run_meta
from benchmarks.research.lr_axis import best_multiplier, check_disjoint, curve_table
from harness.training import AllocatorSettings

__all__ = ["ExperimentConfig", "RunSpec", "choose_rates", "cli", "main", "run_specs"]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
METHODS = (
    "trace",
    "uniform",
    "dynamic_sampling",
    "prompt_predictor",
    "random_tree",
    "entropy_tree",
)
BASELINE = "uniform"
HEADLINE = ("trace", BASELINE)
"""The methods run on every seed of `seeds`; the others use `ablation_seeds`."""


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig:
    """`python -m benchmarks.research.experiment`: TRACE vs the baselines at equal cost."""

    name: str = "full"
    """Names the results files (`experiment-NAME.{json,md,png}`; a record includes the .md)."""
    out_dir: Path = Path("runs/experiment")
    """Run directories (one per method, series, seed) and the cached evaluations."""
    policy_run_dir: Path = Path("runs/demo")
    """Where `tracerl init-model` caches the default tiny policy (shared with `make run`)."""
    methods: tuple[str, ...] = ("trace", "uniform", "dynamic_sampling", "random_tree")
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    """Seeds of TRACE and GRPO (`uniform`), the headline pair."""
    steps: int = 32
    """RL steps of every run (32 pools of 24 = 3.0 epochs over the 254 training questions)."""
    eval_at: tuple[int, ...] = (8, 16, 32)
    """Steps after which the main runs are evaluated (the last must be `steps`); ablation
    runs are evaluated after the last one only."""
    leaves_per_step: int = 48
    """The leaf series' budget per step (the demo's)."""
    pool_size: int = 24
    """Candidate questions per step."""
    token_series: bool = True
    """Also run the methods with the budget counted in generated tokens."""
    token_methods: tuple[str, ...] | None = HEADLINE
    """Methods of the token series (None: all of `methods`)."""
    ablation_seeds: tuple[int, ...] | None = (0, 1, 2)
    """Seeds of the ablation runs and of the methods other than TRACE and GRPO (None: all of
    `seeds`)."""
    stage_ablation: bool = True
    """TRACE with Stage 1 and Stage 2 each uniform or active (leaf series)."""
    budgets: tuple[tuple[int, int], ...] = ()
    """(M, N) budget configurations, e.g. `16 2 32 1`: TRACE with N continuations per root at
    M(1+N) leaves per step, against GRPO at the same leaves (leaf series)."""
    predictor_ablation: bool = False
    """TRACE with a constant p = 0.5 (the predictor off)."""
    continue_from: Path | None = None
    """Start every run of seed s from the policy GRPO trained in an earlier experiment,
    `CONTINUE_FROM/main-leaves-uniform-s{s}/policy`, instead of the warm start: the
    contrast-scarce regime (most training questions already solved; docs/experiment.md)."""
    reuse_from: Path | None = None
    """A recorded `experiment-NAME.json` whose runs of `reuse_methods` are read back instead of
    trained (same run ids); valid only where those methods' code path is unchanged."""
    reuse_methods: tuple[str, ...] = ()
    """Main-comparison methods (and `budget` labels) taken from `reuse_from` where recorded,
    read at step `steps` (the record must have evaluated there)."""
    rollout_temperature: float = 1.0
    """Sampling temperature of the training rollouts (evaluation stays at T = 1); below 1 the
    policy's groups agree more often: one way to make contrast scarce."""
    alloc: AllocatorSettings = field(default_factory=AllocatorSettings)
    """Every method's allocator settings (`--alloc.trace.min-per-prompt 2`); the ablations
    change theirs on top. Unchanged fields keep the run directories of earlier runs valid."""
    lr: float = 3e-4
    """Policy learning rate (the demo's)."""
    lr_multipliers: tuple[float, ...] = (1.0,)
    """Multipliers of `lr` at which every main-comparison run is trained (e.g. `0.25 0.5 1 2`;
    ablations run at 1). With several, each method's is chosen by its mean EM on the validation
    world (`validation_world_seed`), and the tables compare each method at its own rate."""
    validation_world_seed: int = 2027
    """The world whose questions choose each method's learning rate (with several
    `lr_multipliers`): never trained on, and distinct from the test world and the policy's
    training, warm-start and dev worlds."""
    validation_questions: int = 160
    """Questions of the validation world (0: all of them)."""
    validation_samples: int = 1
    """T=1 samples per validation question."""
    questions: Literal["all", "hard"] = "all"
    """Train and test on every question kind, or only the `hard` ones (3-4-hop bridges,
    comparisons, inference)."""
    test_world_seed: int = 2026
    """The fresh world (never trained on): the second test set."""
    test_questions: int = 160
    """Questions of the fresh world (0: all of them)."""
    test_samples: int = 1
    """T=1 samples per fresh-world question."""
    heldout_samples: int = 4
    """T=1 samples per held-out question of the training world."""
    eval_seed: int = 12345
    """One sampling stream for every evaluation: every policy is compared on the same draws."""
    workers: int = 1
    """Runs trained at once (processes; one torch thread each)."""
    results_dir: Path = Path("benchmarks/results")
    quick: bool = False
    """Reduced: TRACE, GRPO and DAPO, one seed, 6 steps of 32 leaves, no token series and no
    ablations, 48 fresh-world questions, in OUT_DIR/quick (its run time: benchmarks/RESULTS.md,
    "The reduced run")."""
    progress: bool = True
    json: bool = False
    """Print one JSON object as the last line of stdout."""
    backend: Literal["transformers", "openrlhf"] = "transformers"
    """`openrlhf`: the GPU recipe (prints the commands; `--launch` runs them)."""
    model: str = "Qwen/Qwen3-8B"
    """openrlhf backend: the policy to train."""
    dataset: Literal["hotpotqa"] = "hotpotqa"
    """openrlhf backend: the training data (prepared by scripts/prepare_hotpotqa.py)."""
    launch: bool = False
    """openrlhf backend: run the commands (needs GPUs) instead of printing them."""

    def __post_init__(self) -> None:
        unknown = sorted((set(self.methods) | set(self.token_methods or ())) - set(METHODS))
        if unknown:
            raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
        if not self.seeds or not self.methods:
            raise ValueError("need at least one method and one seed")
        at = self.eval_at
        if not self.quick and (not at or at[-1] != self.steps or list(at) != sorted(set(at))):
            raise ValueError(f"eval_at={at} must increase, start >= 1 and end at steps")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers}: must be >= 1")
        rates = self.lr_multipliers
        if not rates or min(rates) <= 0 or len(set(rates)) != len(rates):
            raise ValueError(f"--lr-multipliers {rates}: give distinct positive numbers")

    def resolved(self) -> ExperimentConfig:
        """The configuration actually run (`quick` applied)."""
        if not self.quick:
            return self
        return dataclasses.replace(
            self,
            name="quick" if self.name == "full" else self.name,
            out_dir=self.out_dir / "quick",
            methods=tuple(m for m in ("trace", "uniform", "dynamic_sampling") if m in self.methods)
            or self.methods,
            seeds=self.seeds[:1],
            ablation_seeds=None,  # every method on that one seed
            steps=6,
            eval_at=(6,),
            leaves_per_step=32,
            pool_size=16,
            token_series=False,
            stage_ablation=False,
            budgets=(),
            predictor_ablation=False,
            test_questions=min(self.test_questions or 48, 48),
            heldout_samples=2,
            quick=False,
        )


@dataclass(frozen=True)
class RunSpec:
    """One training run of the experiment.

    Attributes:
        group: `main` (a method), `stages`, `budget` or `predictor` (ablations).
        label: The method, or the ablation's variant.
        series: The budget's currency.
        seed: The trainer's seed (data order, sampling, allocator, predictor).
        alloc: The allocator's name and the fields of it that differ from its defaults (the
            method's `--alloc.NAME.*` settings, then the ablation's).
        per_step: Budget per step in `series` units; None for the token budget, which is
            known once the start policy has been measured.
        predictor: `mlp` or `constant`.
        lr_multiplier: The run's learning rate over the experiment's `lr`.
    """

    group: Literal["main", "stages", "budget", "predictor"]
    label: str
    series: Literal["leaves", "tokens"]
    seed: int
    alloc: tuple[tuple[str, Any], ...]
    per_step: int | None
    predictor: Literal["mlp", "constant"] = "mlp"
    lr_multiplier: float = 1.0

    @property
    def run_id(self) -> str:
        """The run's directory name under `out_dir` (at multiplier 1, the name it always had)."""
        rate = "" if self.lr_multiplier == 1.0 else f"-lr{self.lr_multiplier:g}"
        return f"{self.group}-{self.series}-{self.label}-s{self.seed}{rate}"

    def key(self) -> dict[str, Any]:
        """The spec as a run's cache key holds it (at multiplier 1, the key it always had)."""
        fields = dataclasses.asdict(self)
        if self.lr_multiplier == 1.0:
            del fields["lr_multiplier"]
        return fields


def run_specs(config: ExperimentConfig) -> list[RunSpec]:
    """Every run of the experiment, main comparisons first."""
    specs: list[RunSpec] = []
    series: list[Literal["leaves", "tokens"]] = ["leaves"]
    if config.token_series:
        series.append("tokens")
    ablation_seeds = config.seeds if config.ablation_seeds is None else config.ablation_seeds
    for currency in series:
        per_step = config.leaves_per_step if currency == "leaves" else None
        methods = config.methods if currency == "leaves" else config.token_methods or config.methods
        for method in methods:
            for seed in config.seeds if method in HEADLINE else ablation_seeds:
                alloc = _alloc(config, method)
                for rate in config.lr_multipliers:
                    specs.append(
                        RunSpec("main", method, currency, seed, alloc, per_step, lr_multiplier=rate)
                    )
    for seed in ablation_seeds:
        if config.stage_ablation:
            for s1, s2 in (("uniform", "uniform"), ("uniform", "active"), ("active", "uniform")):
                alloc = _alloc(config, "trace", stage1=s1, stage2=s2)
                label = f"s1_{s1}-s2_{s2}"
                specs.append(
                    RunSpec("stages", label, "leaves", seed, alloc, config.leaves_per_step)
                )
        for m, n in config.budgets:
            leaves = m * (1 + n)
            trace = _alloc(config, "trace", continuations_per_rollout=n)
            specs.append(RunSpec("budget", f"trace-M{m}-N{n}", "leaves", seed, trace, leaves))
            if leaves != config.leaves_per_step:  # else the main GRPO run is the reference
                uniform = _alloc(config, "uniform")
                specs.append(
                    RunSpec("budget", f"uniform-L{leaves}", "leaves", seed, uniform, leaves)
                )
        if config.predictor_ablation:
            alloc = _alloc(config, "trace")
            specs.append(
                RunSpec("predictor", "trace-constant_p", "leaves", seed, alloc,
                        config.leaves_per_step, predictor="constant")
            )  # fmt: skip
    return specs


def _alloc(config: ExperimentConfig, name: str, **ablation: Any) -> tuple[tuple[str, Any], ...]:
    """A run's allocator: its name, its `--alloc.NAME.*` settings, then the ablation's fields."""
    return (("name", name), *{**config.alloc.changed(name), **ablation}.items())


# --- the shared start: policy, test sets, token budget -----------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Context:
    """What every run needs; built once, passed to the workers."""

    policy_dir: Path
    tokens_per_step: int
    train_questions: int
    config: ExperimentConfig
    start_by_seed: dict[int, dict[str, Any]] = field(default_factory=dict)
    """`continue_from`: each seed's start policy's evaluation."""

    def tokens_for(self, seed: int) -> int:
        """The token series' budget per step for a run of `seed`.

        The leaf budget times the tokens per episode of the policy it starts from (its own
        start policy when continuing).
        """
        start = self.start_by_seed.get(seed)
        if start is None:
            return self.tokens_per_step
        return round(self.config.leaves_per_step * start["heldout"]["tokens"])

    def policy_for(self, seed: int) -> Path:
        """The policy a run of `seed` starts from."""
        if self.config.continue_from is None:
            return self.policy_dir
        return _continued_policy(self.config.continue_from, seed)


def _continued_policy(root: Path, seed: int) -> Path:
    """GRPO's trained policy of `seed` in the experiment directory `root`.

    Raises:
        FileNotFoundError: that run has not finished (one line, with the command to run).
    """
    policy = root / f"main-leaves-uniform-s{seed}" / "policy"
    if not (policy / "config.json").is_file():
        raise FileNotFoundError(
            f"--continue-from {root}: no trained GRPO policy for seed {seed} at {policy}; run "
            f"the experiment with --methods uniform --seeds {seed} --out-dir {root} first"
        )
    return policy


def _keep(config: ExperimentConfig, task: Any) -> bool:
    """Whether `task` is in the experiment's question set (`--questions`)."""
    from harness.tiny_policy import is_hard

    return config.questions == "all" or is_hard(task)


def _world_set(
    config: ExperimentConfig, artifacts: Any, seed: int, questions: int, samples: int
) -> tuple[Any, Any, int]:
    """A generated world's questions (the first `questions`, 0: all) over its own BM25 index."""
    from envs import World
    from retrieval.bm25 import BM25Retriever

    world = World.generate(seed, artifacts.config.world)
    tasks = [t for t in world.tasks if _keep(config, t)]
    if questions:
        tasks = tasks[:questions]
    retriever = BM25Retriever.build(world.documents)
    env = artifacts.config.env
    return (lambda: env.make_env(world.tasks, retriever), tasks, samples)


def _test_sets(config: ExperimentConfig, artifacts: Any) -> dict[str, tuple[Any, Any, int]]:
    """The two test sets: name -> (env factory, tasks, samples per question)."""
    from retrieval.bm25 import BM25Retriever

    world = artifacts.world()
    held_ids = [*artifacts.split["test"], *artifacts.split["test_entities"]]
    held_tasks = [world.tasks[i] for i in held_ids if _keep(config, world.tasks[i])]
    world_retriever = BM25Retriever.build(world.documents)
    env = artifacts.config.env
    return {
        "fresh_world": _world_set(
            config, artifacts, config.test_world_seed, config.test_questions, config.test_samples
        ),
        "heldout": (
            lambda: env.make_env(world.tasks, world_retriever),
            held_tasks,
            config.heldout_samples,
        ),
    }


def _validation_set(config: ExperimentConfig, artifacts: Any) -> dict[str, tuple[Any, Any, int]]:
    """The validation set that chooses each method's learning rate: a world of its own."""
    return {
        "validation": _world_set(
            config,
            artifacts,
            config.validation_world_seed,
            config.validation_questions,
            config.validation_samples,
        )
    }


def _check_validation_disjoint(config: ExperimentConfig, artifacts: Any) -> None:
    """The validation world must be no world the policy or a test set has seen or uses.

    Raises:
        ValueError: the validation world's seed is another set's world, or one of its
            questions is also a test question.
    """
    policy = artifacts.config
    first = policy.demos.first_world_seed
    demos = range(first, first + policy.demos.n_worlds)
    check_disjoint(
        [config.validation_world_seed],
        {
            "test world (--test-world-seed)": [config.test_world_seed],
            "training world": [policy.world_seed],
            "warm start's demo and dev worlds": [*demos, policy.eval.dev_world_seed],
        },
        what="--validation-world-seed",
    )
    validation = _validation_set(config, artifacts)["validation"][1]
    check_disjoint(
        [t.question for t in validation],
        {f"{name} test set": [t.question for t in tasks]
         for name, (_, tasks, _) in _test_sets(config, artifacts).items()},
        what=f"--validation-world-seed {config.validation_world_seed} (questions)",
    )  # fmt: skip


def _validation_key(config: ExperimentConfig) -> dict[str, Any]:
    return {
        "questions": config.questions,
        "validation_world_seed": config.validation_world_seed,
        "validation_questions": config.validation_questions,
        "validation_samples": config.validation_samples,
        "eval_seed": config.eval_seed,
    }


def _evaluate(
    policy_dir: Path,
    label: str,
    config: ExperimentConfig,
    artifacts: Any,
    test_sets: dict[str, Any],
) -> dict[str, Any]:
    """EM, F1 and tokens per episode of one policy on every test set (same seed for all)."""
    from harness.evaluation import evaluate_policy_dir

    max_new_tokens = artifacts.config.eval.max_action_tokens
    out: dict[str, Any] = {}
    for name, (env_factory, tasks, n_samples) in test_sets.items():
        report = evaluate_policy_dir(
            policy_dir,
            env_factory,
            [t for t in tasks for _ in range(n_samples)],
            name=label,
            max_new_tokens=max_new_tokens,
            seed=config.eval_seed,
        )
        m = report.overall
        out[name] = {
            "em": m.em,
            "f1": m.f1,
            "tokens": m.tokens,
            "searches": m.searches,
            "answered": m.answered,
            "n": m.n,
        }
    return out


def _start(config: ExperimentConfig, policy_config: Any) -> tuple[_Context, dict[str, Any]]:
    """Build (or reuse) the tiny policy, evaluate it once, and fix the token budget."""
    from harness.tiny_policy import TinyPolicyConfig, init_model

    artifacts = init_model(
        policy_config or TinyPolicyConfig(), config.policy_run_dir, progress=config.progress
    )
    if len(config.lr_multipliers) > 1:
        _check_validation_disjoint(config, artifacts)
    path = config.out_dir / "start_eval.json"
    key = {"policy": artifacts.config_hash, "eval": _eval_key(config)}
    cached = _read_json(path)
    if cached and cached.get("key") == key:
        start_eval = cached["eval"]
    else:
        log.info("evaluating the start policy on the test sets")
        test_sets = _test_sets(config, artifacts)
        start_eval = _evaluate(artifacts.policy_dir, "start", config, artifacts, test_sets)
        _write_json(path, {"key": key, "eval": start_eval})
    start_by_seed: dict[int, dict[str, Any]] = {}
    if config.continue_from is not None:
        # every seed starts from its own GRPO-trained policy: evaluate each once (cached)
        for seed in sorted({*config.seeds, *(config.ablation_seeds or ())}):
            policy = _continued_policy(config.continue_from, seed)
            path = config.out_dir / f"start_eval-s{seed}.json"
            key = {"policy": str(policy), "eval": _eval_key(config)}
            cached = _read_json(path)
            if cached and cached.get("key") == key:
                start_by_seed[seed] = cached["eval"]
                continue
            # the GRPO run evaluated its final policy already, with the same test sets
            done = _read_json(policy.parent / "experiment_evals.json") or {}
            if done.get("key", {}).get("eval") == key["eval"] and done.get("evals"):
                start_by_seed[seed] = done["evals"][str(max(int(k) for k in done["evals"]))]
                _write_json(path, {"key": key, "eval": start_by_seed[seed]})
                continue
            log.info("evaluating seed %d's start policy %s", seed, policy)
            test_sets = _test_sets(config, artifacts)
            start_by_seed[seed] = _evaluate(policy, f"start-s{seed}", config, artifacts, test_sets)
            _write_json(path, {"key": key, "eval": start_by_seed[seed]})
        start_eval = {
            name: {k: sum(e[name][k] for e in start_by_seed.values()) / len(start_by_seed)
                   for k in start_eval[name]}
            for name in start_eval
        }  # fmt: skip
    # The token series' budget: what the leaf budget costs the start policy (the seed mean when
    # continuing) on the training world, rounded to whole tokens.
    tokens_per_step = round(config.leaves_per_step * start_eval["heldout"]["tokens"])
    world = artifacts.world()
    train = [i for i in artifacts.split["train"] if _keep(config, world.tasks[i])]
    context = _Context(
        policy_dir=artifacts.policy_dir,
        tokens_per_step=tokens_per_step,
        train_questions=len(train),
        config=config,
        start_by_seed=start_by_seed,
    )
    return context, start_eval


def _eval_key(config: ExperimentConfig) -> dict[str, Any]:
    return {
        "questions": config.questions,
        "test_world_seed": config.test_world_seed,
        "test_questions": config.test_questions,
        "test_samples": config.test_samples,
        "heldout_samples": config.heldout_samples,
        "eval_seed": config.eval_seed,
    }


# --- one run ------------------------------------------------------------------------------------


def _train_config(
    spec: RunSpec, context: _Context, artifacts: Any, steps: int, resume: bool
) -> Any:
    from harness.training import (
        AllocConfig,
        BudgetConfig,
        OptimConfig,
        PredictorConfig,
        RolloutConfig,
        TaskConfig,
        TrainConfig,
    )

    config = context.config
    per_step = spec.per_step if spec.per_step is not None else context.tokens_for(spec.seed)
    return TrainConfig(
        run_dir=config.out_dir / spec.run_id,
        policy=context.policy_for(spec.seed),
        steps=steps,
        seed=spec.seed,
        resume=resume,
        checkpoint_every=2,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
        torch_threads=1 if config.workers > 1 else None,
        task=TaskConfig(
            world_seed=artifacts.config.world_seed,
            world=artifacts.config.world,
            env=artifacts.config.env,
            questions=config.questions,
        ),
        alloc=AllocConfig.of(**dict(spec.alloc)),
        budget=BudgetConfig(currency=spec.series, per_step=per_step, pool_size=config.pool_size),
        rollout=RolloutConfig(
            temperature=config.rollout_temperature,
            max_new_tokens=artifacts.config.eval.max_action_tokens,
            max_total_tokens=artifacts.config.model.max_positions,
        ),
        predictor=PredictorConfig(kind=spec.predictor),
        optim=OptimConfig(lr=config.lr * spec.lr_multiplier),
    )


def _run(spec: RunSpec, context: _Context) -> dict[str, Any]:
    """Train one run segment by segment, evaluating after each; resumes whatever is done."""
    from harness.tiny_policy import load_artifacts
    from harness.training import latest_checkpoint, policy_distance, read_metrics, train

    config = context.config
    run_dir = config.out_dir / spec.run_id
    evals_path = run_dir / "experiment_evals.json"
    key = {"spec": spec.key(), "tokens_per_step": context.tokens_for(spec.seed),
           "eval": _eval_key(config), "lr": config.lr, "pool_size": config.pool_size}  # fmt: skip
    if config.continue_from is not None:
        key["start_policy"] = str(context.policy_for(spec.seed))
    if config.rollout_temperature != 1.0:
        key["rollout_temperature"] = config.rollout_temperature
    artifacts = load_artifacts(config.policy_run_dir)  # the policy's world and env, read once
    # everything that decides the run (code, resolved config, start policy, libraries): a run
    # trained under another key is refused below, never resumed or reused
    resolved = _train_config(spec, context, artifacts, config.steps, resume=False).to_json()
    key["run_key"] = run_key(resolved)
    key = json.loads(json.dumps(key))  # as it reads back (tuples become lists)
    record = _read_json(evals_path)
    if record is None:
        if latest_checkpoint(run_dir) is not None:
            raise ValueError(f"{run_dir} holds a run that this script did not start")
        record = {"key": key, "evals": {}}
        _write_json(evals_path, record)  # before training: a rerun can tell whose run it is
    elif record.get("key") != key:
        raise ValueError(
            f"{run_dir} holds a run with other settings ({evals_path}); "
            "use another --out-dir or delete it"
        )
    test_sets = None
    # the main runs draw the EM-against-tokens curves; an ablation needs its final EM only
    for at in config.eval_at if spec.group == "main" else config.eval_at[-1:]:
        if str(at) in record["evals"]:
            continue
        checkpoint = latest_checkpoint(run_dir)
        done = _checkpoint_step(checkpoint)
        if done < at:
            train(_train_config(spec, context, artifacts, at, resume=checkpoint is not None))
        test_sets = test_sets or _test_sets(config, artifacts)
        policy = run_dir / "policy"
        record["evals"][str(at)] = _evaluate(policy, spec.run_id, config, artifacts, test_sets)
        _write_json(evals_path, record)
    validation_em = None
    if spec.group == "main" and len(config.lr_multipliers) > 1:  # the rate is chosen on it
        validation_key = json.loads(json.dumps(_validation_key(config)))
        validated = record.get("validation") or {}
        if validated.get("key") != validation_key:
            evaluated = _evaluate(
                run_dir / "policy", spec.run_id, config, artifacts,
                _validation_set(config, artifacts),
            )  # fmt: skip
            validated = {"key": validation_key, "eval": evaluated["validation"]}
            record["validation"] = validated
            _write_json(evals_path, record)
        validation_em = validated["eval"]["em"]
    metrics = [r for r in read_metrics(run_dir) if "rollout/effective_ratio" in r]
    start = context.start_by_seed.get(spec.seed)
    displacement = policy_distance(context.policy_for(spec.seed), run_dir / "policy")
    return {"spec": spec, "evals": record["evals"], "metrics": metrics,
            "start_em": None if start is None else start["heldout"]["em"],
            "validation_em": validation_em, "displacement": displacement,
            "key": key["run_key"], "commit": run_meta()["commit"]}  # fmt: skip


def _checkpoint_step(checkpoint: Path | None) -> int:
    if checkpoint is None:
        return 0
    state = _read_json(checkpoint / "state.json") or {}
    return int(state.get("step", 0))


def _run_in_worker(spec: RunSpec, context: _Context) -> dict[str, Any]:
    import torch

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)  # the workers share the cores: one thread each, evaluation too
    return _run(spec, context)


# --- summaries ----------------------------------------------------------------------------------


def _mean_std(values: Sequence[float | None]) -> dict[str, float]:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    n = len(finite)
    if n == 0:
        return {"mean": float("nan"), "std": float("nan"), "n": 0}
    mean = sum(finite) / n
    std = math.sqrt(sum((v - mean) ** 2 for v in finite) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "std": std, "n": n}


def _run_summary(result: dict[str, Any], last: int) -> dict[str, Any]:
    metrics = result["metrics"]

    def series(key: str) -> list[float]:
        return [float(r[key]) for r in metrics if r.get(key) is not None]

    def mean(key: str) -> float:
        values = [v for v in series(key) if math.isfinite(v)]
        return sum(values) / len(values) if values else float("nan")

    def p90(key: str) -> float | None:
        values = [v for v in series(key) if math.isfinite(v)]
        return float(np.percentile(values, 90)) if values else None

    def peak(key: str) -> float | None:
        values = [v for v in series(key) if math.isfinite(v)]
        return max(values) if values else None

    final = metrics[-1] if metrics else {}
    evals = result["evals"]
    # a record from before the count was logged: this trainer steps once per step with signal
    # (the experiment's ppo_epochs is 1), so its count is exact
    taken = [int(r.get("policy/optimizer_steps", 1 if r.get("policy/n_train_leaves") else 0))
             for r in metrics]  # fmt: skip
    norms = [float(r["policy/update_norm"]) for r in metrics if r.get("policy/optimizer_steps")]
    first8 = [v for v in series("rollout/effective_ratio")[:8] if math.isfinite(v)]
    return {
        "start_em": result.get("start_em"),
        "em": evals[str(last)]["heldout"]["em"],
        "f1": evals[str(last)]["heldout"]["f1"],
        "fresh_em": evals[str(last)]["fresh_world"]["em"],
        "fresh_f1": evals[str(last)]["fresh_world"]["f1"],
        "evals": evals,
        "validation_em": result.get("validation_em"),
        "optimizer_steps": sum(taken) if metrics else None,
        "update_norm": sum(norms) / len(norms) if norms else None,
        "displacement": result.get("displacement"),
        "effective_ratio": mean("rollout/effective_ratio"),
        "effective_ratio_by_step": series("rollout/effective_ratio"),
        "effective_ratio_first8": sum(first8) / len(first8) if first8 else None,
        "reward_var_per_leaf": mean("rollout/reward_var_per_leaf"),
        "flips_per_continuation": mean("rollout/flips_per_continuation"),
        "max_leaves_per_tree": peak("rollout/max_leaves_per_tree"),
        "max_abs_advantage": mean("advantage/max_abs"),
        "top_tree_share": mean("advantage/top_tree_share"),
        "top_tree_share_p90": p90("advantage/top_tree_share"),
        "effective_trees": mean("advantage/effective_trees"),
        "grad_norm_p90": p90("policy/grad_norm"),
        "logprob_gap_max": peak("policy/rollout_logprob_gap"),
        "mixed_anchors": mean("rollout/mixed_anchors"),
        "mixed_prefix_anchors": mean("rollout/mixed_prefix_anchors"),
        "brier": mean("predictor/brier"),
        "auc": mean("predictor/auc"),
        "auc_root": mean("predictor/auc_root"),
        "signal_leaves": mean("policy/n_train_leaves"),
        "rollout_accuracy": mean("rollout/accuracy"),
        "leaves_by_step": series("budget/total_leaves"),
        "tokens_by_step": series("budget/total_tokens"),
        "total_leaves": final.get("budget/total_leaves"),
        "total_tokens": final.get("budget/total_tokens"),
        "total_tool_calls": final.get("budget/total_tool_calls"),
        "wall_s": sum(series("perf/step_s")),
    }


HEALTH = ("effective_ratio_first8", "reward_var_per_leaf", "flips_per_continuation",
          "max_leaves_per_tree", "max_abs_advantage", "top_tree_share", "top_tree_share_p90",
          "effective_trees", "grad_norm_p90", "logprob_gap_max")  # fmt: skip
"""The health metrics of issue 20, summarised per run beside the effective ratio."""


def _aggregate(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Mean and spread across seeds of every (group, series, label)."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for summary in runs.values():
        grouped.setdefault(summary["cell"], []).append(summary)
    cells: dict[str, dict[str, Any]] = {}
    for cell, members in sorted(grouped.items()):
        keys = ("em", "f1", "fresh_em", "fresh_f1", "validation_em", "optimizer_steps",
                "update_norm", "displacement", "effective_ratio", "mixed_anchors",
                "mixed_prefix_anchors", "brier", "auc", "auc_root", "signal_leaves",
                "rollout_accuracy", "total_leaves", "total_tokens",
                "total_tool_calls", "wall_s", *HEALTH)  # fmt: skip
        cells[cell] = {k: _mean_std([m.get(k) for m in members]) for k in keys}
        cells[cell]["seeds"] = sorted(m["seed"] for m in members)
    return cells


def validation_curves(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[float, list[float]]]:
    """`series/method` -> learning-rate multiplier -> each seed's validation EM (main runs).

    Raises:
        ValueError: a method trained at several rates lacks a run's validation EM (a run read
            back with `--reuse-from` was never evaluated on the validation world).
    """
    curves: dict[str, dict[float, list[Any]]] = {}
    for s in runs.values():
        if s["group"] == "main":
            rate = float(s.get("lr_multiplier", 1.0))
            curves.setdefault(f"{s['series']}/{s['label']}", {}).setdefault(rate, [])
            curves[f"{s['series']}/{s['label']}"][rate].append(s.get("validation_em"))
    for cell, curve in curves.items():
        missing = [rate for rate, ems in curve.items() if any(em is None for em in ems)]
        if len(curve) > 1 and missing:
            raise ValueError(
                f"{cell} at lr x{missing[0]:g} has a run without validation EM (read back with "
                "--reuse-from?): train it here to choose its learning rate"
            )
    return curves


def choose_rates(runs: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    """Each main method's learning-rate multiplier per series, on validation EM only.

    A method trained at one rate keeps it; otherwise `lr_axis.best_multiplier` of its
    validation curve (test-set results never enter).
    """
    return {
        cell: next(iter(curve)) if len(curve) == 1 else best_multiplier(curve)
        for cell, curve in validation_curves(runs).items()
    }


def _paired(runs: dict[str, dict[str, Any]], series: str, method: str) -> dict[str, Any] | None:
    """`method` minus GRPO, seed by seed (same data order and eval draws), on held-out EM."""
    from scipy import stats

    by_seed: dict[int, dict[str, dict[str, Any]]] = {}
    for s in runs.values():
        if s["group"] == "main" and s["series"] == series:
            by_seed.setdefault(s["seed"], {})[s["label"]] = s
    diffs = [
        (v[method]["em"] - v[BASELINE]["em"], v[method]["fresh_em"] - v[BASELINE]["fresh_em"])
        for v in by_seed.values()
        if method in v and BASELINE in v
    ]
    if not diffs:
        return None
    held = [d[0] for d in diffs]
    fresh = [d[1] for d in diffs]
    p = float(stats.ttest_1samp(held, 0.0).pvalue) if len(held) > 1 else float("nan")
    return {"em_diff": _mean_std(held), "em_diffs": held, "p_value": p,
            "fresh_em_diff": _mean_std(fresh)}  # fmt: skip


def _em_curve(summary: dict[str, Any], start_em: float) -> tuple[list[float], list[float]]:
    """Held-out EM against cumulative generated tokens: the start, then each evaluation."""
    start = summary.get("start_em")
    xs, ys = [0.0], [start_em if start is None else start]
    for at in sorted(int(k) for k in summary["evals"]):
        xs.append(float(summary["tokens_by_step"][at - 1]))
        ys.append(float(summary["evals"][str(at)]["heldout"]["em"]))
    return xs, ys


def _curve_series(runs: dict[str, dict[str, Any]], method: str) -> str:
    """The series in which `method` is compared with GRPO at equal generated tokens.

    The token series where `method` was run in it (its budgets equal GRPO's by construction),
    else the leaf series (the curves are then read at equal tokens).
    """
    in_tokens = any(
        s["group"] == "main" and s["series"] == "tokens" and s["label"] == method
        for s in runs.values()
    )
    return "tokens" if in_tokens else "leaves"


def _main_by_seed(runs: dict[str, dict[str, Any]], series: str) -> dict[int, dict[str, Any]]:
    by_seed: dict[int, dict[str, Any]] = {}
    for s in runs.values():
        if s["group"] == "main" and s["series"] == series:
            by_seed.setdefault(s["seed"], {})[s["label"]] = s
    return by_seed


def _paired_tokens(
    runs: dict[str, dict[str, Any]], start_em: float, method: str
) -> dict[str, Any] | None:
    """`method` minus GRPO in held-out EM at equal generated tokens, paired over seeds.

    Each seed compares both curves at the smaller of their final token totals, in the series
    of `_curve_series`.
    """
    import numpy as np
    from scipy import stats

    series = _curve_series(runs, method)
    diffs = []
    for pair in _main_by_seed(runs, series).values():
        if method in pair and BASELINE in pair:
            a, b = _em_curve(pair[method], start_em), _em_curve(pair[BASELINE], start_em)
            at = min(a[0][-1], b[0][-1])
            diffs.append(float(np.interp(at, *a) - np.interp(at, *b)))  # piecewise linear
    if not diffs:
        return None
    p = float(stats.ttest_1samp(diffs, 0.0).pvalue) if len(diffs) > 1 else float("nan")
    return {"diff": sum(diffs) / len(diffs), "p": p, "diffs": diffs, "series": series}


def _tokens_to_grpo_final(
    runs: dict[str, dict[str, Any]], start_em: float, method: str
) -> float | None:
    """Tokens `method` needs to reach GRPO's final held-out EM, over the tokens GRPO spent.

    On the seed-mean curves (EM and tokens averaged at each evaluation) over the seeds both
    ran, first crossing by linear interpolation; None when `method` never reaches it (or
    either is missing).
    """
    pairs = [
        p for p in _main_by_seed(runs, _curve_series(runs, method)).values()
        if method in p and BASELINE in p
    ]  # fmt: skip
    curves: dict[str, tuple[list[float], list[float]]] = {}
    for label in (method, BASELINE):
        members = [_em_curve(p[label], start_em) for p in pairs]
        if not members or len({len(m[0]) for m in members}) != 1:
            return None
        curves[label] = (
            [sum(m[0][i] for m in members) / len(members) for i in range(len(members[0][0]))],
            [sum(m[1][i] for m in members) / len(members) for i in range(len(members[0][1]))],
        )
    goal_x, goal_y = curves[BASELINE][0][-1], curves[BASELINE][1][-1]
    xs, ys = curves[method]
    for i in range(1, len(xs)):
        (x0, y0), (x1, y1) = (xs[i - 1], ys[i - 1]), (xs[i], ys[i])
        if y1 >= goal_y:
            x = x1 if y1 == y0 or y0 >= goal_y else x0 + (x1 - x0) * (goal_y - y0) / (y1 - y0)
            return x / goal_x if goal_x > 0 else None
    return None


# --- outputs ------------------------------------------------------------------------------------


def _plot(runs: dict[str, dict[str, Any]], start: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series_list = sorted({s["series"] for s in runs.values() if s["group"] == "main"})
    fig, axes = plt.subplots(
        2, len(series_list), figsize=(6.5 * len(series_list), 8), squeeze=False
    )
    for col, series in enumerate(series_list):
        main = [s for s in runs.values() if s["group"] == "main" and s["series"] == series]
        unit = "tokens" if series == "tokens" else "leaves"
        for method in METHODS:
            members = [s for s in main if s["label"] == method]
            if not members:
                continue
            # held-out EM against cumulative generated tokens (both series), band = ± std
            curves = [_em_curve(s, start["heldout"]["em"]) for s in members]
            points = min(len(c[0]) for c in curves)
            xs = [sum(c[0][i] for c in curves) / len(curves) for i in range(points)]
            ems = [_mean_std([c[1][i] for c in curves]) for i in range(points)]
            ys = [e["mean"] for e in ems]
            (line,) = axes[0][col].plot(xs, ys, marker="o", label=method)
            axes[0][col].fill_between(
                xs,
                [e["mean"] - e["std"] for e in ems],
                [e["mean"] + e["std"] for e in ems],
                color=line.get_color(),
                alpha=0.2,
            )
            ratios = [s["effective_ratio_by_step"] for s in members]
            length = min(len(r) for r in ratios)
            mean_ratio = [sum(r[i] for r in ratios) / len(ratios) for i in range(length)]
            axes[1][col].plot(range(1, length + 1), mean_ratio, marker=".", label=method)
        axes[0][col].set(
            title=f"budget in {unit}: held-out EM (band: ± std over seeds)",
            xlabel="generated tokens spent",
            ylabel="sampled EM",
        )
        axes[1][col].set(
            title=f"budget in {unit}: effective ratio", xlabel="step", ylabel="mixed share"
        )
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _fmt(cell: dict[str, float], scale: float = 100.0, digits: int = 1) -> str:
    if cell["n"] == 0:
        return "-"
    if cell["n"] == 1:
        return f"{cell['mean'] * scale:.{digits}f}"
    return f"{cell['mean'] * scale:.{digits}f} ± {cell['std'] * scale:.{digits}f}"


def _markdown(result: dict[str, Any], command: str) -> str:
    cells = result["cells"]
    start = result["start_eval"]
    c = result["config"]
    lines = [
        f"Measured {result['date']} on {result['machine']}; this invocation took "
        f"{result['wall_s'] / 60:.0f} min with {c['workers']} worker(s) (runs and evaluations "
        f"finished earlier are read back). Command: `{command}`",
        "",
        f"Start policy (the warm-started tiny policy, `{c['policy_run_dir']}`): held-out "
        f"EM {start['heldout']['em'] * 100:.1f} ({start['heldout']['n']} episodes), "
        f"fresh-world EM {start['fresh_world']['em'] * 100:.1f} "
        f"({start['fresh_world']['n']} episodes); questions: {c['questions']}. "
        f"Every run: {c['steps']} steps, {c['leaves_per_step']} leaves or "
        f"{result['tokens_per_step']} generated tokens per step, pool {c['pool_size']} "
        f"({result['epochs']:.1f} epochs over the {result['train_questions']} training "
        f"questions), lr {c['lr']}; seeds {list(c['seeds'])} for trace and uniform, "
        f"{list(c['ablation_seeds'] or c['seeds'])} for the other methods and the ablations; "
        "EM and F1 in points, mean ± std over seeds.",
        "",
    ]
    header = (
        "| method | held-out EM | held-out F1 | fresh-world EM | optimizer steps | "
        "‖Δθ‖/update | ‖θ_end − θ_start‖ | effective ratio | "
        "contrast/leaf | flips/cont. | max leaves/tree | top-tree share | eff. trees | "
        "max abs A | grad-norm p90 | log-prob gap | mixed anchors/step | "
        "signal leaves/step | rollout acc. | Brier | root AUC | leaves | tokens | tool calls | "
        "wall s |"
    )
    rule = "|---" * 25 + "|"
    rates = result["lr_multipliers"]["chosen"]
    several = len(c["lr_multipliers"]) > 1
    groups = (("main", "leaves"), ("main", "tokens"), ("stages", "leaves"),
              ("budget", "leaves"), ("predictor", "leaves"))  # fmt: skip
    titles = {
        ("main", "leaves"): "Main comparison, budget in leaves",
        ("main", "tokens"): "Main comparison, budget in generated tokens",
        ("stages", "leaves"): "Ablation: TRACE Stage 1 x Stage 2 (active/active is the main "
        "`trace` row)",
        ("budget", "leaves"): "Ablation: budget configurations (M roots, N continuations per "
        "root) against GRPO at the same leaves",
        ("predictor", "leaves"): "Ablation: predictor off (constant p = 0.5)",
    }
    for group, series in groups:
        prefix = f"{group}/{series}/"
        rows = [(k[len(prefix) :], v) for k, v in cells.items() if k.startswith(prefix)]
        if not rows:
            continue
        lines += [f"**{titles[(group, series)]}**", "", header, rule]
        for label, cell in rows:
            rate = rates.get(f"{series}/{label}") if group == "main" and several else None
            shown = label if rate is None else f"{label} (lr ×{rate:g})"
            lines.append(
                f"| {shown} | {_fmt(cell['em'])} | {_fmt(cell['f1'])} | "
                f"{_fmt(cell['fresh_em'])} | {_fmt(cell['optimizer_steps'], 1, 1)} | "
                f"{_fmt(cell['update_norm'], 1, 3)} | {_fmt(cell['displacement'], 1, 3)} | "
                f"{_fmt(cell['effective_ratio'], 1, 3)} | "
                f"{_fmt(cell['reward_var_per_leaf'], 1, 3)} | "
                f"{_fmt(cell['flips_per_continuation'], 1, 2)} | "
                f"{_fmt(cell['max_leaves_per_tree'], 1, 0)} | "
                f"{_fmt(cell['top_tree_share'], 1, 2)} | {_fmt(cell['effective_trees'], 1, 1)} | "
                f"{_fmt(cell['max_abs_advantage'], 1, 1)} | {_fmt(cell['grad_norm_p90'], 1, 2)} | "
                f"{_fmt(cell['logprob_gap_max'], 1, 6)} | "
                f"{_fmt(cell['mixed_anchors'], 1, 1)} | "
                f"{_fmt(cell['signal_leaves'], 1, 1)} | {_fmt(cell['rollout_accuracy'], 1, 3)} | "
                f"{_fmt(cell['brier'], 1, 3)} | {_fmt(cell['auc_root'], 1, 3)} | "
                f"{cell['total_leaves']['mean']:.0f} | "
                f"{cell['total_tokens']['mean']:.0f} | {cell['total_tool_calls']['mean']:.0f} | "
                f"{cell['wall_s']['mean']:.0f} |"
            )
        lines.append("")
    if several:
        lines += [f"**Learning rate: validation curve** (mean EM in points over seeds on the "
                  f"{c['validation_questions'] or 'all'} questions x {c['validation_samples']} of "
                  f"validation world {c['validation_world_seed']}, by multiplier of lr {c['lr']}; "
                  "bold: the rate each method is compared at above, chosen on this set only)",
                  ""]  # fmt: skip
        for series in ("leaves", "tokens"):
            curves = {
                k.split("/", 1)[1]: {float(m): v for m, v in curve.items()}
                for k, curve in result["lr_multipliers"]["validation"].items()
                if k.startswith(f"{series}/")
            }
            if curves:
                chosen = {k.split("/", 1)[1]: v for k, v in rates.items() if k.startswith(series)}
                lines += [f"Budget in {series}:", "", curve_table(curves, chosen=chosen), ""]
    paired = result["paired"]
    if paired:
        lines += ["**Paired differences against GRPO (`uniform`), same seed; held-out EM "
                  "points (one-sample t-test p), fresh-world EM points**", "",
                  "| series | method | held-out EM diff | per seed | p | fresh-world EM diff |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for series, methods in paired.items():
            for method, d in methods.items():
                per_seed = ", ".join(f"{x * 100:+.1f}" for x in d["em_diffs"])
                lines.append(
                    f"| {series} | {method} | {_fmt(d['em_diff'])} | {per_seed} | "
                    f"{d['p_value']:.2f} | {_fmt(d['fresh_em_diff'])} |"
                )
        lines.append("")
    if result["paired_tokens"]:
        lines += ["**At equal generated tokens, paired over seeds** (held-out EM minus GRPO's, "
                  "each seed's two curves read at the smaller of their final token totals; "
                  "one-sample t-test), and the tokens each method needs to reach GRPO's final "
                  "held-out EM over the tokens GRPO spent (seed-mean curves; – = never)", "",
                  "| method | series | EM diff | per seed | p | tokens to GRPO's final |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for method, d in result["paired_tokens"].items():
            per_seed = ", ".join(f"{x * 100:+.1f}" for x in d["diffs"])
            ratio = result["tokens_to_grpo_final"].get(method)
            lines.append(
                f"| {method} | {d['series']} | {d['diff'] * 100:+.1f} | {per_seed} | "
                f"{d['p']:.3f} | {'–' if ratio is None else f'{ratio:.2f}×'} |"
            )
        lines.append("")
    summary = result["summary"]
    lines += ["**Summary (issue 20)**: EM differences in points, paired over seeds, with the "
              "lower end of the 95 % t interval; health figures are TRACE's (leaf series). "
              "Health columns above: contrast/leaf = mean within-tree reward variance per leaf; "
              "flips/cont. = continuations whose reward differs from their anchor's agreed "
              "outcome; top-tree share = the heaviest tree's share of |advantage|-weighted "
              "tokens; eff. trees = (Σw)²/Σw²; \"-\" = not logged (runs read back from a "
              "record that predates the metric).", "",
              "| key | value |", "|---|---|"]  # fmt: skip
    for key, value in summary.items():
        shown = f"{value:.3f}" if isinstance(value, float) else str(value)
        lines.append(f"| `{key}` | {shown} |")
    lines.append("")
    lines.append(f"Figure: `{result['files']['plot']}`; raw: `{result['files']['json']}`.")
    return "\n".join(lines)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    tmp.replace(path)  # atomic: a kill never leaves a torn file


# --- main ---------------------------------------------------------------------------------------


def _priority(spec: RunSpec) -> int:
    """The headline pair in both currencies first, then the other methods, then ablations."""
    if spec.group == "main":
        return 0 if spec.label in HEADLINE else 1
    return 2


def _run_all(
    specs: list[RunSpec], context: _Context, on_done: Callable[[dict[str, Any]], None]
) -> None:
    workers = context.config.workers
    if workers == 1:
        for spec in specs:
            on_done(_run(spec, context))
        return
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(_run_in_worker, spec, context) for spec in specs]
        for future in as_completed(futures):
            on_done(future.result())


def main(config: ExperimentConfig, policy_config: Any = None) -> dict[str, Any]:
    """Run (or resume) the experiment and write its results; returns the results record.

    Args:
        config: The experiment.
        policy_config: The tiny policy's recipe (`harness.tiny_policy.TinyPolicyConfig`);
            None for the default (tests pass a smaller one).
    """
    from tqdm.auto import tqdm

    config = config.resolved()
    started = time.perf_counter()
    context, start_eval = _start(config, policy_config)
    # the headline pair first, so that an interrupted run has reported what matters most
    specs = sorted(run_specs(config), key=_priority)
    log.info(
        "%d runs of %d steps (%d leaves or %d tokens per step) in %s",
        len(specs), config.steps, config.leaves_per_step, context.tokens_per_step, config.out_dir,
    )  # fmt: skip
    runs: dict[str, dict[str, Any]] = {}
    bar = tqdm(total=len(specs), desc="experiment runs", disable=not config.progress)

    def on_done(result: dict[str, Any]) -> None:
        spec: RunSpec = result["spec"]
        summary = _run_summary(result, config.eval_at[-1])
        cell = f"{spec.group}/{spec.series}/{spec.label}"
        summary |= {"group": spec.group, "series": spec.series, "label": spec.label,
                    "seed": spec.seed, "cell": cell, "lr_multiplier": spec.lr_multiplier,
                    "key": result["key"], "commit": result["commit"]}  # fmt: skip
        runs[spec.run_id] = summary
        bar.set_postfix_str(f"{spec.run_id}: EM {summary['em']:.3f}")
        bar.update(1)

    recorded = _recorded_runs(config)
    # a run trained here wins over its recorded copy (it has the health metrics)
    recorded = {k: v for k, v in recorded.items() if not (config.out_dir / k).exists()}
    _check_recorded_keys(config, context, specs, recorded)
    for spec in [s for s in specs if s.run_id in recorded]:
        runs[spec.run_id] = recorded[spec.run_id] | {"reused_from": str(config.reuse_from)}
        bar.update(1)
    _run_all([s for s in specs if s.run_id not in recorded], context, on_done)
    bar.close()
    # in the specs' order, not the order the workers finished in: sums over seeds add alike
    all_runs = {s.run_id: runs[s.run_id] for s in specs}
    rates = choose_rates(all_runs)
    # from here on, each method at its own chosen rate
    runs = {
        k: v
        for k, v in all_runs.items()
        if v["group"] != "main"
        or v.get("lr_multiplier", 1.0) == rates[f"{v['series']}/{v['label']}"]
    }
    cells = _aggregate(runs)
    start_em = float(start_eval["heldout"]["em"])
    paired_tokens = {
        m: d
        for m in config.methods
        if m != BASELINE and (d := _paired_tokens(runs, start_em, m)) is not None
    }
    tokens_to_grpo_final = {
        m: _tokens_to_grpo_final(runs, start_em, m) for m in config.methods if m != BASELINE
    }
    paired: dict[str, dict[str, Any]] = {}
    for series in ("leaves", "tokens"):
        for method in config.methods:
            if method != BASELINE and (d := _paired(runs, series, method)) is not None:
                paired.setdefault(series, {})[method] = d
    config.results_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "json": config.results_dir / f"experiment-{config.name}.json",
        "markdown": config.results_dir / f"experiment-{config.name}.md",
        "plot": config.results_dir / f"experiment-{config.name}.png",
    }
    _plot(runs, start_eval, files["plot"])
    main_leaves = {k.split("/")[-1]: v for k, v in cells.items() if k.startswith("main/leaves/")}
    result = {
        "schema_version": SCHEMA_VERSION,
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
        "machine": f"{os.cpu_count()} CPU ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}",
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "tokens_per_step": context.tokens_per_step,
        "train_questions": context.train_questions,
        "epochs": config.steps * config.pool_size / max(context.train_questions, 1),
        "start_eval": start_eval,
        "cells": cells,
        "paired": paired,
        "paired_tokens": paired_tokens,
        "tokens_to_grpo_final": tokens_to_grpo_final,
        "runs": all_runs,
        "wall_s": time.perf_counter() - started,
        "files": {k: str(v) for k, v in files.items()},
        "summary": _summary(runs, config) | {"lr_multiplier": rates},
        "lr_multipliers": {"chosen": rates, "validation": validation_curves(all_runs)}
        if len(config.lr_multipliers) > 1
        else {"chosen": rates},
        "accuracy": {m: c["em"] for m, c in main_leaves.items()},
        "f1": {m: c["f1"] for m, c in main_leaves.items()},
        "effective_ratio": {m: c["effective_ratio"]["mean"] for m, c in main_leaves.items()},
    }
    _write_json(files["json"], result)
    command = "python -m benchmarks.research.experiment " + " ".join(
        shlex.quote(a) for a in sys.argv[1:] if a != "--json"
    )
    body = _markdown(result, command.strip())
    # RESULTS.md is generated from the records (`make results`), never written here
    files["markdown"].write_text(body + "\n", encoding="utf-8")
    return result


def _check_recorded_keys(
    config: ExperimentConfig,
    context: _Context,
    specs: Sequence[RunSpec],
    recorded: Mapping[str, dict[str, Any]],
) -> None:
    """Refuse a recorded run whose key is not the one this config gives it today.

    Raises:
        ValueError: a run of `reuse_from` was recorded without a key (before keys) or under
            another one (other code, settings, start policy or libraries).
    """
    if not recorded:
        return
    from harness.tiny_policy import load_artifacts

    artifacts = load_artifacts(config.policy_run_dir)
    for spec in (s for s in specs if s.run_id in recorded):
        train_config = _train_config(spec, context, artifacts, config.steps, resume=False)
        want, held = run_key(train_config.to_json()), recorded[spec.run_id].get("key")
        if held != want:
            raise ValueError(
                f"--reuse-from {config.reuse_from}: run {spec.run_id} was recorded under key "
                f"{held}, not this config's {want}; train it here (leave its method out of "
                "--reuse-methods)"
            )


def _recorded_runs(config: ExperimentConfig) -> dict[str, dict[str, Any]]:
    """The runs of `reuse_methods` recorded in `reuse_from`, by run id (empty if none)."""
    if config.reuse_from is None or not config.reuse_methods:
        return {}
    data = _read_json(config.reuse_from)
    if data is None:
        raise FileNotFoundError(f"--reuse-from {config.reuse_from}: not a readable JSON file")
    out = {}
    steps = config.steps
    for run_id, summary in data["runs"].items():
        if summary["label"] not in config.reuse_methods or summary["seed"] not in config.seeds:
            continue
        at = summary["evals"].get(str(steps))
        if at is None or len(summary["effective_ratio_by_step"]) < steps:
            raise ValueError(f"--reuse-from: {run_id} was not evaluated at step {steps}")
        # read the record as if the run had stopped at `steps`
        ratios = summary["effective_ratio_by_step"][:steps]
        out[run_id] = summary | {
            "em": at["heldout"]["em"],
            "f1": at["heldout"]["f1"],
            "fresh_em": at["fresh_world"]["em"],
            "fresh_f1": at["fresh_world"]["f1"],
            "evals": {k: v for k, v in summary["evals"].items() if int(k) <= steps},
            "effective_ratio": sum(ratios) / len(ratios),
            "effective_ratio_by_step": ratios,
            "effective_ratio_first8": sum(ratios[:8]) / len(ratios[:8]),
            "leaves_by_step": summary["leaves_by_step"][:steps],
            "tokens_by_step": summary["tokens_by_step"][:steps],
            "total_leaves": summary["leaves_by_step"][steps - 1],
            "total_tokens": summary["tokens_by_step"][steps - 1],
        }
        if steps < len(summary["effective_ratio_by_step"]):
            # per-step means of the whole record: not comparable, so not shown
            whole_run = (
                *("mixed_anchors", "mixed_prefix_anchors", "brier", "auc", "auc_root"),
                *("signal_leaves", "rollout_accuracy", "total_tool_calls", "wall_s"),
            )
            out[run_id] |= dict.fromkeys(whole_run)
    return out


def _paired_ci(diffs: Sequence[float]) -> tuple[float | None, float | None]:
    """Mean and the lower end of its two-sided 95 % t interval, in EM points."""
    from scipy import stats

    if not diffs:
        return None, None
    mean = 100 * sum(diffs) / len(diffs)
    if len(diffs) < 2:
        return mean, None
    sem = 100 * stats.sem(diffs)
    return mean, mean - float(stats.t.ppf(0.975, len(diffs) - 1)) * sem


def _summary(runs: dict[str, dict[str, Any]], config: ExperimentConfig) -> dict[str, Any]:
    """The issue-20 summary: paired EM differences (points, 95 % t CI) and TRACE's health.

    A key is None where its runs are missing (e.g. no DAPO run in the token series).
    """

    def by_seed(series: str, label: str) -> dict[int, dict[str, Any]]:
        return {
            s["seed"]: s
            for s in runs.values()
            if s["group"] == "main" and s["series"] == series and s["label"] == label
        }

    def minus(series: str, method: str, baseline: str) -> tuple[float | None, float | None]:
        a, b = by_seed(series, method), by_seed(series, baseline)
        return _paired_ci([a[k]["em"] - b[k]["em"] for k in sorted(a.keys() & b.keys())])

    def mean_of(members: Sequence[dict[str, Any]], key: str) -> float | None:
        values = [m[key] for m in members if m.get(key) is not None and math.isfinite(m[key])]
        return sum(values) / len(values) if values else None

    out: dict[str, Any] = {}
    pairs = (
        ("trace_minus_grpo_leaves", "leaves", BASELINE),
        ("trace_minus_grpo_tokens", "tokens", BASELINE),
        ("trace_minus_dapo_tokens", "tokens", "dynamic_sampling"),
    )
    for name, series, baseline in pairs:
        out[name], out[f"{name}_ci_low"] = minus(series, "trace", baseline)
    trace = list(by_seed("leaves", "trace").values())
    out["grpo_effective_ratio_first8"] = mean_of(
        list(by_seed("leaves", BASELINE).values()), "effective_ratio_first8"
    )
    out["trace_effective_ratio"] = mean_of(trace, "effective_ratio")
    out["trace_flips_per_continuation"] = mean_of(trace, "flips_per_continuation")
    out["trace_top_tree_share"] = mean_of(trace, "top_tree_share")
    peaks = [m["max_leaves_per_tree"] for m in trace if m.get("max_leaves_per_tree") is not None]
    out["trace_max_leaves_per_tree"] = max(peaks) if peaks else None
    n2 = [s["em"] for s in runs.values() if s["group"] == "budget" and "-N2" in s["label"]]
    out["n2_min_seed_em"] = 100 * min(n2) if n2 else None
    out["seeds"] = sorted({s["seed"] for s in runs.values() if s["group"] == "main"})
    return out


def gpu_commands(config: ExperimentConfig) -> list[list[str]]:
    """The paper-setting comparison on GPUs: one launch-script command per method and seed.

    Every method gets the launch script's budget (PROMPTS x LEAVES_PER_PROMPT leaves per step)
    and its other flags unchanged; only the allocator, the seed and the run directory differ.
    """
    allocs = {
        "trace": "--alloc.name trace --alloc.trace.continuations-per-rollout 2 "
        "--alloc.trace.max-per-prompt 16",
        "uniform": "--alloc.name uniform --alloc.uniform.group-size 12",
        "dynamic_sampling": "--alloc.name dynamic_sampling --alloc.dynamic-sampling.group-size 12",
        "prompt_predictor": "--alloc.name prompt_predictor --alloc.prompt-predictor.group-size 12",
        "random_tree": "--alloc.name random_tree",
        "entropy_tree": "--alloc.name entropy_tree",
    }
    slug = config.model.split("/")[-1].lower()
    commands = []
    for seed in config.seeds:
        for method in config.methods:
            run = f"runs/experiment-gpu/{slug}-{config.dataset}-{method}-s{seed}"
            env = [
                f"MODEL={config.model}",
                f"DATA=data/{config.dataset}",
                f"RUN={run}",
                f"CKPT=ckpt/experiment-gpu/{slug}-{config.dataset}-{method}-s{seed}",
                f"ALLOC_ARGS={allocs[method]}",
            ]
            commands.append(
                ["env", *env, "bash", "scripts/train_qwen3_8b_hotpotqa.sh", "--seed", str(seed)]
            )
    return commands


def cli(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.research.experiment [--quick] [--json] [--workers 2] ...`."""
    config = tyro.cli(ExperimentConfig, args=argv, prog="python -m benchmarks.research.experiment")
    if config.backend == "openrlhf":
        commands = gpu_commands(config)
        for command in commands:
            print(shlex.join(command))
            if config.launch:
                subprocess.run(command, check=True)
        if config.json:
            print(json.dumps({"commands": [shlex.join(c) for c in commands]}))
        return 0
    result = main(config)
    from rich.console import Console
    from rich.markdown import Markdown

    Console(stderr=config.json).print(Markdown(Path(result["files"]["markdown"]).read_text()))
    if config.json:
        keys = ("accuracy", "f1", "effective_ratio", "tokens_per_step", "paired",
                "paired_tokens", "tokens_to_grpo_final", "files")  # fmt: skip
        print(json.dumps({k: result[k] for k in keys}, default=str))
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    raise SystemExit(cli())
