"""The CPU trainer: TRACE tree rollouts and OpenRLHF's PolicyLoss, in one process, one file.

Read it top to bottom, as CleanRL's `ppo.py`: `train` sets the run up (`set_up`, which builds
the run's parts from a `harness.training.config.TrainConfig`;
`harness.training.task_sources.build_tasks` is where the questions and the corpus come from: one
world, a stream of fresh worlds, or a task file), continues a checkpoint (`resume`), then loops over
the steps, whose phases run in order (`_step`):

1. **data**: take the next `pool_size` prompts of the train split (a seeded, resumable cursor),
   or, on a world stream, of the step's freshly generated world (its env replaces the last);
2. **rollout**: `TreeRolloutEngine.run_step` lets the allocator spend exactly the step's budget
   (leaves or generated tokens) on roots and turn prefixes (`trace_alloc.run_step`);
3. **predictor**: score Ṽψ on every root and prefix of the step's trees *before* it learns
   them (Brier, AUC), then fit it to V̂, the mean leaf reward under each node; then fit the
   flip calibrator on the step's Stage-2 flips;
4. **advantages**: `trace_alloc.tree_advantages` on the trees the allocator says to train on
   (phases 2-4 are `harness.training.tree_step.TreeStep`, which the OpenRLHF trainer runs too);
5. **update**: every leaf with signal is one sequence; OpenRLHF's `PolicyLoss` on its action
   tokens (observations masked), plus `compute_approx_kl` against the frozen start policy when
   `loss.kl_coef > 0`; one optimizer step per PPO epoch, none on a step without signal (logged
   as `policy/optimizer_steps`, with the update's size `policy/update_norm` = ‖Δθ‖);
6. **log and checkpoint**: one JSON record per step (`metrics.jsonl`, TensorBoard) and an
   atomic checkpoint every `checkpoint_every` steps, from which `resume=True` continues exactly;

and saves the trained policy.

Under `torchrun --nproc_per_node N` the same loop runs data-parallel: rollouts are sharded by
rank wave by wave, leaves are dealt to ranks, the loss is the global token mean, and only rank 0
writes files (`harness.training.distributed`).

A baseline is an allocator name (`alloc.name`) or a user's allocator (`train(config,
allocator=...)`, docs/extending.md), never another trainer: every method goes through the same
engine, budget, advantages and loss. `train(config)` returns a summary, so
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from envs import SearchQAConfig
from harness.errors import HarnessError, ResumeError
from harness.plugins import load_plugin, parse_kwargs
from harness.policies import SamplingParams, TransformersBackend
from harness.policies.base import PolicyBackend
from harness.policies.policy_protocol import PolicyProtocol, env_fields
from harness.rollout.engine import TreeRolloutEngine
from harness.rollout.episodes import EpisodeCodec
from harness.rollout.evaluation import PolicyEval, evaluate_backend
from harness.tiny_policy.pipeline import ARTIFACTS_FILE
from harness.training.checkpoint import (
    LoadedCheckpoint,
    latest_checkpoint,
    load_checkpoint,
    parameter_distance,
    policy_parameters,
    save_checkpoint,
)
from harness.training.config import CONFIG_FILE, OptimConfig, TrainConfig
from harness.training.distributed import (
    ONE_PROCESS,
    Ranks,
    ShardedExecutor,
    all_gather,
    check_same_across_ranks,
    deal,
    init_from_env,
    sum_across_ranks,
)
from harness.training.metrics_log import MetricsLog, read_metrics
from harness.training.openrlhf_compat import openrlhf_losses
from harness.training.optimizers import DeepSpeedOptimizer, make_optimizer
from harness.training.run_guard import FailureStreak, check_retriever, failure_cause
from harness.training.task_sources import Tasks, TaskSource, build_tasks, held_out, sample_pool
from harness.training.tree_step import TreeStep, allocator_rng
from trace_alloc import Allocator, StepResult
from trace_alloc.budget import Spend

__all__ = ["BackendFactory", "DataCursor", "Tasks", "TrainSummary", "build_tasks", "resume",
           "set_up", "train", "trainable_weights", "update_policy"]  # fmt: skip

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"

BackendFactory = Callable[[Any, Any], PolicyBackend]
"""Builds the rollout policy from the model being trained and its tokenizer (a `PolicyBackend`
class such as `TransformersBackend` is one): `train(config, backend=...)`."""


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
    movement: dict[str, float]
    """How far the policy moved: `policy/displacement` (‖θ_end − θ_start‖ against the start
    policy's weights as saved, so a resumed run measures the whole run) and
    `policy/optimizer_steps_total` (over every step of the run, from `metrics.jsonl`)."""

    def to_json(self) -> dict[str, Any]:
        """JSON-safe dict."""
        return {
            "run_dir": str(self.run_dir),
            "steps": self.steps,
            "policy_dir": str(self.policy_dir),
            "totals": self.totals,
            "final": self.final,
            "wall_s": self.wall_s,
            "movement": self.movement,
        }


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


# --- the run's parts ---------------------------------------------------------------------------


@dataclass(slots=True)
class Run:
    """The parts `set_up` builds and the loop drives; `checkpoint` is what `resume` reads."""

    config: TrainConfig
    ranks: Ranks
    tokenizer: Any
    model: Any
    """The policy being trained (partitioned under ZeRO-3)."""
    reference: Any | None
    """The frozen start policy for the KL term (None when `loss.kl_coef` is 0)."""
    rollout_model: Any
    """What generates: `model` itself, or a whole copy of it under ZeRO-3."""
    n_params: int
    pad_id: int
    tasks: Tasks
    codec: EpisodeCodec
    backend: PolicyBackend
    """What generates the rollouts, from `rollout_model`."""
    tree_step: TreeStep
    """The engine, allocator, budget, predictor and flip calibrator, and their state between
    steps (the phases both trainers share)."""
    optimizer: Any
    losses: Any
    """OpenRLHF's loss helpers (`harness.training.openrlhf_compat.OpenRLHFLosses`)."""
    policy_loss: Any
    checkpoint: LoadedCheckpoint | None
    """The checkpoint to continue from (its weights are already in `model`)."""

    @property
    def partitioned(self) -> bool:
        """ZeRO-3: the rollout copy must be refreshed from the gathered weights every step."""
        return self.rollout_model is not self.model

    @property
    def engine(self) -> TreeRolloutEngine:
        """The tree-rollout engine (`tree_step.engine`)."""
        return self.tree_step.engine


@dataclass(slots=True)
class Progress:
    """Where the run stands in its data (the allocator's state is `Run.tree_step`'s)."""

    step: int
    """The last finished step (0 before the first)."""
    cursor: DataCursor


# --- the run ---------------------------------------------------------------------------------


def train(
    config: TrainConfig,
    *,
    allocator: Allocator | None = None,
    task_source: TaskSource | None = None,
    backend: BackendFactory | None = None,
) -> TrainSummary:
    """Run (or resume) RL training with tree rollouts; see the module docstring.

    Args:
        config: Every setting. With `resume=True` the run continues from the latest checkpoint
            in `run_dir`; the caller passes the config to continue with (`tracerl train`
            rebuilds it from `run_dir/config.json` plus explicit flags).
        allocator: An allocator of your own (the `trace_alloc.Allocator` protocol), in place
            of `config.allocator` or `config.alloc` (docs/extending.md).
        task_source: A `TaskSource` of your own, in place of `config.task_source` or
            `config.task.source`.
        backend: Builds the rollout policy from the model being trained and its tokenizer
            (`backend(model, tokenizer)`, e.g. a `PolicyBackend` class of your own); default
            `TransformersBackend`.

    Returns:
        The summary (also in `run_dir/summary.json`).

    Raises:
        ResumeError: resume without a checkpoint, or a fresh run in a directory that has one.
        BackendUnavailable: OpenRLHF (for PolicyLoss) or DeepSpeed is missing.
    """
    wall_start = time.perf_counter()
    run = set_up(config, allocator=allocator, task_source=task_source, backend=backend)
    progress = resume(run)
    metrics_log = None
    if run.ranks.is_main:
        metrics_log = MetricsLog(
            config.run_dir,
            tensorboard=config.tensorboard,
            resume_step=progress.step if config.resume else None,
        )
    _log_size(run, progress)
    streak = FailureStreak(config.abort)

    last: dict[str, Any] = {}
    if config.eval.every and progress.step == 0 and metrics_log is not None:
        metrics_log.write(0, _evaluate(run, 0))
    bar = tqdm(
        total=config.steps,
        initial=progress.step,
        desc="train",
        disable=not (config.progress and run.ranks.is_main),
    )
    for step in range(progress.step + 1, config.steps + 1):
        record, result = _step(run, progress, step)  # phases 1-5

        # 6. log and checkpoint
        if config.eval.every and step % config.eval.every == 0 and run.ranks.is_main:
            record |= _evaluate(run, step)
        if metrics_log is not None:
            metrics_log.write(step, record)
        # every rank sees the same trees, so every rank aborts at the same step
        retriever = getattr(run.engine.env.unwrapped, "retriever", None)
        streak.observe(step, record, cause=failure_cause(retriever))
        last = {"step": step, **record}
        if config.save_trees_every and step % config.save_trees_every == 0 and run.ranks.is_main:
            _save_trees(config.run_dir, step, result)
        if step % config.checkpoint_every == 0 or step == config.steps:
            _save(run, progress)
        bar.update(1)
        bar.set_postfix(
            reward=f"{record['rollout/reward']:.2f}",
            eff=f"{record['rollout/effective_ratio']:.2f}",
            refresh=False,
        )
    bar.close()
    if metrics_log is not None:
        metrics_log.close()
    return _finish(run, progress, last, wall_start)


def set_up(
    config: TrainConfig,
    *,
    allocator: Allocator | None = None,
    task_source: TaskSource | None = None,
    backend: BackendFactory | None = None,
) -> Run:
    """Check the run directory, then build the run's parts: policy, tasks, engine, optimizer.

    The keyword arguments are `train`'s plug points.

    Raises:
        ResumeError: resume without a checkpoint, or a fresh run in a directory that has one.
        HarnessError: the policy was warm-started on another task, or no questions are left.
        PluginError: `config.allocator` or `config.task_source` cannot be loaded.
    """
    run_dir = config.run_dir
    checkpoint_path = latest_checkpoint(run_dir)
    if config.resume and checkpoint_path is None:
        raise ResumeError(f"--resume: {run_dir} has no checkpoint to resume from")
    if not config.resume and checkpoint_path is not None:
        raise ResumeError(f"{run_dir} already holds a run; pass --resume or use a new --run-dir")
    if allocator is None:  # before the run directory is touched: a bad plug loses nothing
        allocator = config.build_allocator(config.alloc)
    if task_source is None and config.task_source is not None:
        task_source = load_plugin(
            config.task_source,
            TaskSource,
            kwargs=parse_kwargs(config.task_source_kwargs, flag="--task-source-kwargs"),
            flag="--task-source",
        )
    _check_policy_task(config, own_tasks=task_source is not None)
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

    try:
        tokenizer = AutoTokenizer.from_pretrained(config.policy)
        model = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32)
    except (OSError, ValueError) as err:  # a missing folder, or a hub name that is no model
        reason = next((line for line in str(err).splitlines() if line.strip()), repr(err))
        raise HarnessError(
            f"--policy {config.policy}: not a transformers model directory, nor a model the "
            f"Hugging Face hub or its cache holds ({reason.strip()}); build one with "
            "`tracerl init-model`"
        ) from err
    model.config.use_cache = False  # training passes need no KV cache
    reference = None
    if config.loss.kl_coef > 0:
        reference = AutoModelForCausalLM.from_pretrained(config.policy, dtype=torch.float32).eval()
        reference.requires_grad_(False)

    # the questions, their corpus and index, the engine
    tasks = build_tasks(
        config.task, config.eval.sets if config.eval.every else (), train=task_source
    )
    empty = [name for name in tasks.eval if tasks.n_eval(name) == 0]
    if tasks.train.fixed_ids == () or empty:  # (a stream's are None: it draws per step)
        raise HarnessError(
            f"no questions to train on, or none in held-out set(s) {empty}, with "
            f"--task.questions {config.task.questions}"
        )
    # a stream swaps in each step's world; a fixed set keeps this one env for the whole run
    first = tasks.train.corpus(1)
    check_retriever(first.retriever)  # a wrong URL stops here, not after steps of nothing
    checkpoint = load_checkpoint(checkpoint_path) if config.resume and checkpoint_path else None
    if checkpoint is not None:  # before the optimizer wraps the model: ZeRO-3 then partitions it
        model.load_state_dict(checkpoint.model)
    # ZeRO-3 partitions the weights, so every forward of `model` becomes a collective, which
    # rollouts (a different amount of generation on each rank) cannot be: rollouts and
    # evaluation then use a whole copy, refreshed from the gathered weights before every step
    # (OpenRLHF's weight sync to its vLLM engines, in miniature)
    partitioned = config.optim.backend == "deepspeed" and config.optim.zero_stage == 3
    rollout_model = copy.deepcopy(model) if partitioned else model
    policy = (backend or TransformersBackend)(rollout_model, tokenizer)
    codec = EpisodeCodec(tokenizer)
    engine = TreeRolloutEngine(
        policy,
        first.make_env(config.task.env),
        codec,
        sampling=SamplingParams(
            max_new_tokens=config.rollout.max_new_tokens,
            temperature=config.rollout.temperature,
            top_p=config.rollout.top_p,
            top_k=config.rollout.top_k,
        ),
        max_total_tokens=config.rollout.max_total_tokens,
        # ranks sample with their own streams (the same one would repeat samples across ranks)
        seed=config.seed + 1_000_003 * ranks.rank,
        snapshot_prefix=f"r{ranks.rank}s" if ranks.world_size > 1 else "s",
    )
    optim = config.optim
    return Run(
        config=config,
        ranks=ranks,
        tokenizer=tokenizer,
        model=model,
        reference=reference,
        rollout_model=rollout_model,
        n_params=sum(p.numel() for p in {id(p): p for p in model.parameters()}.values()),
        pad_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0,
        tasks=tasks,
        codec=codec,
        backend=policy,
        tree_step=TreeStep(
            engine=engine,
            allocator=allocator,
            budget=config.budget.limit(),
            predictor=config.predictor.build(seed=config.seed),
            flip_calibrator=config.predictor.build_flip_calibrator(),
            advantage=config.loss.advantage,
            rng=allocator_rng(config.seed),
            tokens_per_leaf=config.budget.tokens_per_leaf_guess,
        ),
        optimizer=make_optimizer(
            model,
            backend=optim.backend,
            zero_stage=optim.zero_stage,
            lr=optim.lr,
            betas=optim.betas,
            weight_decay=optim.weight_decay,
            grad_clip=optim.grad_clip,
        ),
        losses=losses,
        policy_loss=losses.PolicyLoss(
            clip_eps_low=config.loss.clip_eps_low,
            clip_eps_high=config.loss.clip_eps_high,
            token_level_loss=config.loss.token_level_loss,
        ),
        checkpoint=checkpoint,
    )


def resume(run: Run) -> Progress:
    """Where the run starts: step 0 of a fresh run, or the state of `run.checkpoint` restored.

    Restores the optimizer, the predictor and every random stream (torch, Python, the
    allocator's, the engine's), so a resumed run takes exactly the steps an uninterrupted one
    would.

    Raises:
        ResumeError: the checkpoint was written by another number of ranks.
    """
    config = run.config
    progress = Progress(
        step=0,
        cursor=DataCursor(run.tasks.train.fixed_ids or (), config.seed),
    )
    checkpoint = run.checkpoint
    if checkpoint is None:
        return progress
    run.optimizer.load_state_dict(checkpoint.optimizer)
    tree_step = run.tree_step
    tree_step.load_predictor_state(checkpoint.predictor)
    torch.set_rng_state(checkpoint.torch_rng)
    s = checkpoint.state
    random.setstate(_python_rng_from_json(s["python_rng"]))
    tree_step.rng.bit_generator.state = s["alloc_rng"]
    run.engine.set_rng_state(_rank_engine_rng(s, run.ranks))
    progress.cursor.epoch = int(s["cursor"]["epoch"])
    progress.cursor.position = int(s["cursor"]["position"])
    tree_step.carry, tree_step.tokens_per_leaf = float(s["carry"]), float(s["tokens_per_leaf"])
    tree_step.spent = Spend(**s["totals"])
    progress.step = checkpoint.step
    log.info("resuming %s from step %d (%s)", config.run_dir, progress.step, checkpoint.path)
    return progress


def _step(run: Run, progress: Progress, step: int) -> tuple[dict[str, Any], StepResult]:
    """Phases 1-5 of one step; returns its metrics record and its trees."""
    config, ranks, engine = run.config, run.ranks, run.engine
    t_step = time.perf_counter()

    # 1. data: the next prompts of a fixed source, or a pool of this step's fresh world
    source = run.tasks.train
    if source.fixed_ids is None:
        corpus = source.corpus(step)
        engine.env = corpus.make_env(config.task.env)
        pool = sample_pool(corpus, config.budget.pool_size, seed=config.seed, step=step)
    else:
        pool = progress.cursor.take(config.budget.pool_size)

    # 2-4. rollout, predictor and flip calibrator, advantages: the phases both trainers share
    # (`TreeStep`); across the ranks, wave by wave, when there are several, so that every rank
    # ends with the same trees
    run.rollout_model.eval()
    tree_step = run.tree_step
    sharded = ShardedExecutor(engine, ranks) if ranks.world_size > 1 else None
    out = tree_step.run(pool, execute=sharded)
    progress.step = step
    result, record = out.result, dict(out.metrics)
    if ranks.world_size > 1:  # the rollout shards: how evenly the ranks shared the step
        record["perf/rollouts_by_rank"] = all_gather(out.stats.n_rollouts, ranks)
    check_same_across_ranks(tree_step.predictor.state_dict(), ranks, "predictor")
    leaves = [a.to_tokens(out.kept[a.tree_index]) for a in out.leaves]

    # 5. policy update
    t_update = time.perf_counter()
    lr = _lr(step, config.optim)
    record |= update_policy(
        run.optimizer,
        run.reference,
        run.policy_loss,
        run.losses,
        leaves,
        config,
        pad_id=run.pad_id,
        lr=lr,
        ranks=ranks,
    )
    if run.partitioned:  # the rollout copy takes this step's weights: the evaluation reads them
        run.rollout_model.load_state_dict(run.optimizer.model_state_dict())
    now = time.perf_counter()
    record |= {
        "perf/update_s": now - t_update,
        "perf/step_s": now - t_step,
        "policy/lr": lr,
        "data/epoch": progress.cursor.epoch,
        "data/world_seed": source.seed(step),
        "data/pool": pool,
        "data/trained": [result.trees[i].prompt_id for i in result.train_indices],
    }
    return record, result


def _evaluate(run: Run, step: int) -> dict[str, float]:
    """Sampled EM on the first `eval.n_questions` questions of each held-out set.

    The first set is logged as `eval/em` (and `eval/mixed`, ...), every set as `eval/NAME/em`.
    Questions and sampling are the demo table's (`held_out`, `evaluate_backend`): the policy
    saved at this step, evaluated on the same questions with the same seed, scores the same.
    """
    config = run.config
    run.rollout_model.eval()
    record: dict[str, float] = {}
    for i, (name, corpora) in enumerate(run.tasks.eval.items()):
        questions = held_out(
            corpora, config.eval.n_questions, config.eval.n_samples, config.task.env
        )
        temperature, start = config.eval.temperature_for(config.rollout), time.perf_counter()
        report = evaluate_backend(
            run.backend,
            run.tokenizer,
            questions.make_env,
            questions.tasks,
            name=f"step {step} ({name})",
            max_context_tokens=config.rollout.max_total_tokens,
            temperature=temperature,
            max_new_tokens=config.rollout.max_new_tokens,
            seed=config.seed if config.eval.seed is None else config.eval.seed,
            batch_size=config.eval.batch_size,
        )
        summary = PolicyEval.of_report(
            report, temperature=temperature, wall_s=time.perf_counter() - start
        )
        if i == 0:
            record |= {
                "eval/em": summary.em,
                "eval/mixed": summary.mixed,
                "eval/searches_per_episode": summary.searches_per_episode,
                "eval/answered": summary.answered,
                "eval/tokens_per_episode": report.overall.tokens,
            }
        record[f"eval/{name}/em"] = summary.em
    return record


def _save(run: Run, progress: Progress) -> None:
    """Checkpoint the step just finished (collectives under several ranks; rank 0 writes)."""
    ranks, tree_step = run.ranks, run.tree_step
    # collectives under several ranks (ZeRO-3 weights, ZeRO partitions, rng streams)
    weights, optimizer_state = run.optimizer.model_state_dict(), run.optimizer.state_dict()
    engine_rngs = all_gather(run.engine.rng_state(), ranks)
    state = {
        "python_rng": _python_rng_to_json(random.getstate()),
        "alloc_rng": tree_step.rng.bit_generator.state,
        "engine_rng": engine_rngs[0],
        "cursor": {"epoch": progress.cursor.epoch, "position": progress.cursor.position},
        "carry": tree_step.carry,
        "tokens_per_leaf": tree_step.tokens_per_leaf,
        "totals": dataclasses.asdict(tree_step.spent),
    }
    if ranks.world_size > 1:
        state["engine_rng_by_rank"] = engine_rngs
    if ranks.is_main:
        save_checkpoint(
            run.config.run_dir,
            progress.step,
            model=weights,
            optimizer=optimizer_state,
            predictor=tree_step.predictor_state(),
            state=state,
            keep=run.config.keep_checkpoints,
        )


def _finish(run: Run, progress: Progress, last: dict[str, Any], wall_start: float) -> TrainSummary:
    """Save the trained policy and the run's summary (`wall_start`: when `train` began)."""
    run_dir, totals = run.config.run_dir, run.tree_step.spent
    policy_dir = run_dir / "policy"
    weights = run.optimizer.model_state_dict()  # a collective under ZeRO-3
    if run.ranks.is_main:
        run.model.save_pretrained(policy_dir, state_dict=weights)
        run.tokenizer.save_pretrained(policy_dir)
        task = run.config.task
        synthetic = task.source != "file"  # a file's questions carry no world
        PolicyProtocol.of(
            task.env,
            world_seed=task.world_seed if synthetic else None,
            world=task.world if synthetic else None,
        ).write(policy_dir)
    # against the start policy as saved, not a copy taken at start: a resumed run has none
    displacement = parameter_distance(policy_parameters(run.config.policy), weights)
    steps_total = 0
    if run.ranks.is_main:  # metrics.jsonl holds every step once, cut back on resume
        steps_total = sum(int(r.get("policy/optimizer_steps", 0)) for r in read_metrics(run_dir))
    steps_total = all_gather(steps_total, run.ranks)[0]
    summary = TrainSummary(
        run_dir=run_dir,
        steps=run.config.steps,
        policy_dir=policy_dir,
        totals={
            "leaves": totals.n_leaves,
            "tokens": totals.n_tokens,
            "tool_calls": totals.n_tool_calls,
        },
        final=last,
        wall_s=time.perf_counter() - wall_start,
        movement={
            "policy/displacement": displacement,
            "policy/optimizer_steps_total": float(steps_total),
        },
    )
    if run.ranks.is_main:
        (run_dir / SUMMARY_FILE).write_text(
            json.dumps(summary.to_json(), indent=2), encoding="utf-8"
        )
    return summary


def _log_size(run: Run, progress: Progress) -> None:
    """The run's size, before the first step (nanoGPT)."""
    config, fixed = run.config, run.tasks.train.fixed_ids
    log.info(
        "policy %s: %s parameters | train questions: %s | held-out questions: %s | allocator %s | "
        "budget %s "
        "per step over a pool of %d prompts | steps %d-%d | total budget %s %s | rank %d of %d",
        config.policy,
        f"{run.n_params:,}",
        "a fresh world per step" if fixed is None else len(fixed),
        ", ".join(f"{name} {run.tasks.n_eval(name)}" for name in run.tasks.eval) or "no",
        repr(run.tree_step.allocator),
        f"{config.budget.per_step:,} {config.budget.currency}",
        config.budget.pool_size,
        progress.step + 1,
        config.steps,
        f"{config.budget.per_step * (config.steps - progress.step):,}",
        config.budget.currency,
        run.ranks.rank,
        run.ranks.world_size,
    )


# --- one step's pieces -----------------------------------------------------------------------


def _lr(step: int, optim: OptimConfig) -> float:
    """Linear warm-up to `optim.lr`, then constant."""
    if optim.warmup_steps <= 0:
        return optim.lr
    return optim.lr * min(1.0, step / optim.warmup_steps)


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
    on its dealt share (`harness.training.distributed.deal`), normalised by the global token count,
    and the metrics are summed over the ranks, so N ranks report and step as one process would.
    """
    nan = float("nan")
    if not leaves:  # no contrast this step: nothing to learn from, no optimizer step
        return {"loss/policy": nan, "policy/n_train_leaves": 0, "policy/n_train_tokens": 0,
                "policy/optimizer_steps": 0, "policy/update_norm": 0.0}  # fmt: skip
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
    before = trainable_weights(optimizer)  # whole on every rank, so every rank logs one norm
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
    update_norm = parameter_distance(before, trainable_weights(optimizer))
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
        "policy/optimizer_steps": epochs,
        "policy/update_norm": update_norm,
    }


def trainable_weights(optimizer: Any) -> dict[str, torch.Tensor]:
    """The trainable parameters' values, copied out whole (a collective under ZeRO-3).

    Tied weights appear once (`named_parameters`), so a distance counts each parameter once.
    """
    deepspeed = isinstance(optimizer, DeepSpeedOptimizer)
    module = optimizer.engine.module if deepspeed else optimizer.model
    state = optimizer.model_state_dict()
    # `TorchOptimizer` hands out the live tensors: copy, or the update would move "before" too
    return {n: state[n].detach().clone() for n, p in module.named_parameters() if p.requires_grad}


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


def _check_policy_task(config: TrainConfig, *, own_tasks: bool = False) -> None:
    """A policy from `tracerl init-model` must meet the world and env it was warm-started on.

    The held-out worlds and a world stream must also miss the worlds the warm start was shown
    or selected on, so that every world they name is new to the policy.

    Raises:
        HarnessError: the policy's `tiny_policy.json` names another world or env, or a world
            stream or a held-out set would use one of its warm-start worlds.
    """
    path = Path(config.policy) / ARTIFACTS_FILE
    if not path.is_file():
        return  # any other transformers model: the task flags are the user's call
    recorded = json.loads(path.read_text(encoding="utf-8"))["config"]
    # the env settings a policy plays by (its reward or retrieval deadline may differ)
    recorded["env"] = env_fields(SearchQAConfig(**recorded["env"]))
    ours = config.task
    expected: dict[str, Any] = {"env": env_fields(ours.env)}
    # a file's or a user's task source's questions are the user's call; the env must match
    if ours.source != "file" and not own_tasks:
        expected |= {
            "world_seed": ours.world_seed,
            "world": json.loads(json.dumps(dataclasses.asdict(ours.world))),
        }
    for key, value in expected.items():
        if recorded[key] != value:
            raise HarnessError(
                f"{config.policy} was warm-started with {key}={recorded[key]!r}, but this run "
                f"has {key}={value!r}: pass the matching --task flags"
            )
    first, n_worlds = int(recorded["demos"]["first_world_seed"]), int(recorded["demos"]["n_worlds"])
    warm = {*range(first, first + n_worlds), int(recorded["eval"]["dev_world_seed"])}
    held = sorted(warm & {ours.decoy_world_seed, *ours.unseen_world_seeds})
    if held:
        raise HarnessError(
            f"held-out world(s) {held} are worlds {config.policy} was warm-started or selected "
            "on: pick others with --task.unseen-world-seeds / --task.decoy-world-seed"
        )
    shared = ours.stream_overlap(config.steps, warm) if ours.source == "stream" else []
    if shared:
        raise HarnessError(
            f"the world stream's seeds {ours.stream_first_seed}.."
            f"{ours.stream_first_seed + config.steps - 1} include world(s) {shared} that "
            f"{config.policy} was warm-started or selected on: move --task.stream-first-seed"
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
