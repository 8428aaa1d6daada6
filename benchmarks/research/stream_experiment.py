"""TRACE against GRPO in the main job's regime: RL on a stream of fresh worlds, judged on others.

Every run starts from the shipped warm start and trains as `make run` does (`benchmarks.research
.demo`: a freshly generated world per step, pools of 12 questions, rollouts at T = 1, no KL);
only the allocator, the budget's currency and the learning rate differ. The arms:

- `grpo` (`uniform`), `dapo` (`dynamic_sampling`, token currency only);
- `trace`: N = 1, Stage 2 conditioned on the tree's own bare outcomes with the flip floor, its
  flip chances calibrated online (the defaults of `trace_alloc.Trace` and `tracerl train`);
- `trace_n0`: Stage 1 only (N = 0);
- `trace_blind`: N = 1 with the prefix predictor alone, no floor and no calibration (Stage 2
  before the posterior: the control);
- `trace_mixed_only`: N = 1 on the tree's own rate alone (k = 0): continuations only in trees
  whose bare rollouts disagree, the cheapest control;
- `trace_random`: N = 1 on random prefixes (`stage2="uniform"`), scored but not placed by the
  flip prediction: its AUC on randomly placed continuations.

Three phases, each resumable (finished runs and evaluations are read back, a killed run resumes
from its checkpoint):

1. **learning rate**: each method of `lr_methods` at each of `lr_multipliers` x the demo's rate,
   on `lr_seeds`, scored on a *validation* set of unseen worlds (`validation_world_seeds`) that no
   test set uses; each method keeps its best multiplier (`lr_axis.best_multiplier`); methods
   outside `lr_methods` take their family's (`LR_FAMILY`);
2. **main**: every arm at its rate on every seed (the arms of `few_seed_arms` on `few_seeds`),
   evaluated along the way (`eval_at`) on the *test* set of unseen worlds (`test_world_seeds`,
   `test_questions` x `test_samples`), at the end also on the demo's fact-disjoint and decoy sets;
3. **summary**: differences paired over seeds with 95 % t intervals (EM in points), the tokens
   TRACE needs to reach GRPO's final EM, Stage 2's flips and their calibration, and movement
   (optimizer steps, |dtheta| per step, |theta_end - theta_start|) beside EM.

    python -m benchmarks.research.stream_experiment --json

writes `RESULTS_DIR/experiment-stream.json` (a top-level `summary`) and `experiment-stream.md`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging
import math
import os
import platform
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from datetime import UTC, datetime
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Literal

import numpy as np
import tyro

from benchmarks.meta import keyed_run
from benchmarks.research.lr_axis import best_multiplier, check_disjoint, curve_table

__all__ = ["ARMS", "StreamExperimentConfig", "StreamRun", "choose_rates", "main", "runs_of",
           "summarise"]  # fmt: skip

log = logging.getLogger(__name__)

ARMS: dict[str, dict[str, Any]] = {
    "grpo": {"name": "uniform"},
    "dapo": {"name": "dynamic_sampling"},
    "trace": {"name": "trace"},
    "trace_n0": {"name": "trace", "continuations_per_rollout": 0},
    "trace_blind": {"name": "trace", "prefix_prior": None, "min_flip_prob": 0.0},
    "trace_mixed_only": {"name": "trace", "prefix_prior": 0.0},
    "trace_random": {"name": "trace", "stage2": "uniform"},
}
"""Arm -> its allocator (`name`, then the fields that differ from the allocator's defaults)."""

UNCALIBRATED_ARMS = frozenset({"trace_blind"})
"""Arms whose flip chances are not calibrated online (Stage 2 as it was before)."""

LR_FAMILY = {"dapo": "grpo", "trace_n0": "trace", "trace_blind": "trace",
             "trace_mixed_only": "trace", "trace_random": "trace"}  # fmt: skip
"""An arm without a learning-rate scan of its own takes this arm's chosen multiplier."""

Series = Literal["tokens", "leaves"]


@dataclass(frozen=True, kw_only=True)
class StreamExperimentConfig:
    """`python -m benchmarks.research.stream_experiment`: TRACE vs GRPO on the world stream."""

    run_dir: Path = Path("runs/stream_experiment")
    """One directory per run (`main-tokens-trace-lr1-s0`, ...), the start policy's evaluations."""
    steps: int = 20
    """RL steps of every run (the demo takes 60 and gains most of its unseen-world points early:
    benchmarks/RESULTS.md, "The main job: `make run` from a fresh clone"; 20 fit this box's time
    for the grid)."""
    eval_at: tuple[int, ...] = (10, 20)
    """Steps after which the main runs of `curve_arms` are evaluated on the test set (the last
    is `steps`, where every main run is)."""
    curve_arms: tuple[str, ...] = ("trace", "grpo")
    """Token-series arms evaluated along the way (the tokens TRACE needs to reach GRPO)."""
    curve_samples: int = 1
    """Samples per test question at the evaluations before the last (the curve's points)."""
    arms: tuple[str, ...] = ("trace", "grpo", "trace_n0", "dapo")
    """Arms of the token series, each on every seed of `seeds` unless in `few_seed_arms`."""
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    few_seed_arms: tuple[str, ...] = ("dapo", "trace_n0")
    few_seeds: tuple[int, ...] = (0, 1, 2)
    leaf_arms: tuple[str, ...] = ("trace", "grpo")
    """Arms of the leaf series (the secondary currency)."""
    leaf_seeds: tuple[int, ...] = (0, 1)
    probe_arms: tuple[str, ...] = ("trace_random",)
    """Arms trained for their Stage-2 logs only (no evaluation): `trace_random` scores the flip
    prediction on randomly placed continuations."""
    probe_seeds: tuple[int, ...] = (0,)
    lr: float = 3e-4
    """The demo's learning rate; the scan multiplies it."""
    lr_multipliers: tuple[float, ...] = (0.5, 1.0)
    lr_methods: tuple[str, ...] = ("grpo", "trace")
    lr_seeds: tuple[int, ...] = (0, 1, 2)
    leaves_per_step: int = 48
    """The demo's budget; the token series spends its cost in the start policy's tokens."""
    pool_size: int = 12
    test_world_seeds: tuple[int, ...] = (6000, 6001, 6002, 6003)
    test_questions: int = 600
    test_samples: int = 2
    validation_world_seeds: tuple[int, ...] = (7000, 7001)
    validation_questions: int = 400
    validation_samples: int = 1
    fact_disjoint_samples: int = 1
    decoy_questions: int = 100
    eval_seed: int = 0
    """One sampling stream for every evaluation: policies are compared on the same draws."""
    workers: int = 2
    """Runs trained at once (processes, one torch thread each)."""
    phase: Literal["lr", "main", "all"] = "all"
    """`lr`: the learning-rate scan only; `main`: the scan must be done; `all`: both."""
    results_dir: Path = Path("benchmarks/results")
    name: str = "stream"
    """The output's name: `RESULTS_DIR/experiment-NAME.json` and `.md`."""
    bank: int = 0
    """0: the stream, a fresh world every step. K > 0: a bank of K worlds visited in turn, so
    every K steps is one epoch over the same questions (`TaskConfig.stream_bank`); the summary
    then adds the pilot's two conditions (`pilot_grpo_mixed_share`, from the second epoch on,
    and `pilot_grpo_gain_unseen`)."""
    json: bool = False
    """Print one JSON object (the summary) as the last line of stdout."""

    def __post_init__(self) -> None:
        unknown = sorted({*self.arms, *self.leaf_arms, *self.lr_methods, *self.probe_arms}
                         - set(ARMS))  # fmt: skip
        if unknown:
            raise ValueError(f"unknown arms {unknown}: choose from {sorted(ARMS)}")
        if (
            not self.eval_at
            or self.eval_at[-1] != self.steps
            or list(self.eval_at) != sorted(set(self.eval_at))
        ):
            raise ValueError(f"--eval-at {self.eval_at} must increase and end at --steps")
        check_disjoint(self.validation_world_seeds, {"the test worlds": self.test_world_seeds},
                       what="--validation-world-seeds")  # fmt: skip
        if "dapo" in self.leaf_arms:
            raise ValueError("dapo runs in the token currency only (at equal leaves it is GRPO)")
        if len(self.seeds) < 2:
            raise ValueError("--seeds needs two or more for a paired interval")
        if self.bank < 0 or (self.bank and self.steps <= self.bank):
            raise ValueError(
                f"--bank {self.bank}: 0, or a bank of fewer worlds than --steps {self.steps} "
                "(the pilot reads the epochs after the first)"
            )


@dataclass(frozen=True)
class StreamRun:
    """One training run of the experiment."""

    phase: Literal["lr", "main", "probe"]
    arm: str
    series: Series
    seed: int
    lr_multiplier: float

    @property
    def run_id(self) -> str:
        """Its directory name; a main run at the scanned rate is the scan's run."""
        return f"{self.series}-{self.arm}-lr{self.lr_multiplier:g}-s{self.seed}"


def runs_of(config: StreamExperimentConfig, chosen: Mapping[str, float]) -> list[StreamRun]:
    """The main phase's runs (headline pair first, seed by seed), then the probes."""
    runs: list[StreamRun] = []
    for seed in sorted({*config.seeds, *config.few_seeds}):
        for arm in config.arms:
            seeds = config.few_seeds if arm in config.few_seed_arms else config.seeds
            if seed in seeds:
                runs.append(StreamRun("main", arm, "tokens", seed, _rate(arm, chosen)))
    for seed in config.leaf_seeds:
        for arm in config.leaf_arms:
            runs.append(StreamRun("main", arm, "leaves", seed, _rate(arm, chosen)))
    for seed in config.probe_seeds:
        for arm in config.probe_arms:
            runs.append(StreamRun("probe", arm, "tokens", seed, _rate(arm, chosen)))
    return runs


def _rate(arm: str, chosen: Mapping[str, float]) -> float:
    return chosen.get(arm, chosen.get(LR_FAMILY.get(arm, arm), 1.0))


# --- the shared start: policy, evaluation sets, token budget ------------------------------------


@dataclass(frozen=True, kw_only=True)
class _Context:
    """What every run needs; built once, handed to the workers."""

    config: StreamExperimentConfig
    policy_run_dir: Path
    tokens_per_step: int


def _demo_config(config: StreamExperimentConfig, questions: int, samples: int) -> Any:
    from harness.evaluation import DemoConfig

    return DemoConfig(
        run_dir=config.run_dir,
        steps=config.steps,
        budget_per_step=config.leaves_per_step,
        pool_size=config.pool_size,
        lr=config.lr,
        unseen_questions=questions,
        unseen_samples=samples,
        fact_disjoint_samples=config.fact_disjoint_samples,
        decoy_questions=config.decoy_questions,
        curve_every=0,
        seed=config.eval_seed,
        progress=False,
    )


_SETS: dict[tuple[StreamExperimentConfig, str], dict[str, Any]] = {}
"""The evaluation sets a process has built (building the fact-disjoint set takes a while)."""


def _sets(config: StreamExperimentConfig, artifacts: Any, which: str) -> dict[str, Any]:
    if (config, which) not in _SETS:
        _SETS[config, which] = _build_sets(config, artifacts, which)
    return _SETS[config, which]


def _build_sets(config: StreamExperimentConfig, artifacts: Any, which: str) -> dict[str, Any]:
    """The evaluation sets of `which`: name -> questions and env (`HeldOut`).

    `validation`; `test` (the curve's points); `test_final` (the test set at full samples, plus
    the fact-disjoint and decoy sets).
    """
    from harness.evaluation import demo_test_sets

    if which == "validation":
        demo = _demo_config(config, config.validation_questions, config.validation_samples)
        sets = demo_test_sets(
            artifacts, demo, unseen_world_seeds=config.validation_world_seeds, names=("unseen",)
        )
        return {"validation": sets["unseen"]}
    samples = config.test_samples if which == "test_final" else config.curve_samples
    demo = _demo_config(config, config.test_questions, samples)
    names = ("unseen", "fact_disjoint", "decoy") if which == "test_final" else ("unseen",)
    sets = demo_test_sets(artifacts, demo, unseen_world_seeds=config.test_world_seeds, names=names)
    return {("test" if k == "unseen" else k): v for k, v in sets.items()}


def _evaluate(policy_dir: Path, sets: Mapping[str, Any], config: StreamExperimentConfig,
              artifacts: Any) -> dict[str, Any]:  # fmt: skip
    """EM, tokens per episode and per-question EM of a policy on each set (one seeded stream)."""
    from harness.evaluation import evaluate_policy_dir, per_question_mean

    out: dict[str, Any] = {}
    for name, questions in sets.items():
        report = evaluate_policy_dir(
            policy_dir,
            questions.make_env,
            questions.tasks,
            name=f"{policy_dir} ({name})",
            max_new_tokens=artifacts.config.eval.max_action_tokens,
            seed=config.eval_seed,
        )
        out[name] = {
            "em": report.overall.em,
            "tokens": report.overall.tokens,
            "n": report.overall.n,
            "per_question": per_question_mean(report.episodes),
        }
    return out


def _cached(path: Path, key: dict[str, Any], compute: Any) -> dict[str, Any]:
    if path.is_file():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("key") == key:
            return dict(cached["value"])
    value = compute()
    _write_json(path, {"key": key, "value": value})
    return dict(value)


def _eval_key(config: StreamExperimentConfig, which: str) -> dict[str, Any]:
    fields = {
        "validation": ("validation_world_seeds", "validation_questions", "validation_samples"),
        "test": ("test_world_seeds", "test_questions", "curve_samples"),
        "test_final": ("test_world_seeds", "test_questions", "test_samples",
                       "fact_disjoint_samples", "decoy_questions"),
    }[which]  # fmt: skip
    key = {f: getattr(config, f) for f in fields} | {"eval_seed": config.eval_seed, "set": which}
    return dict(json.loads(json.dumps(key)))


def _start(config: StreamExperimentConfig) -> tuple[_Context, dict[str, Any]]:
    """The warm start, its validation evaluation and the token budget per step."""
    from harness.tiny_policy import TinyPolicyConfig, init_model

    policy_run_dir = config.run_dir / "warm_start"
    artifacts = init_model(TinyPolicyConfig(), policy_run_dir, progress=False)
    _check_worlds(config, artifacts)
    start = _start_evals(config, artifacts, ("validation",))
    # the token series spends what the leaf budget costs the warm start on unseen worlds
    tokens = round(config.leaves_per_step * start["validation"]["validation"]["tokens"])
    return _Context(config=config, policy_run_dir=policy_run_dir, tokens_per_step=tokens), start


def _start_evals(
    config: StreamExperimentConfig, artifacts: Any, which: Sequence[str]
) -> dict[str, Any]:
    """The warm start's evaluations (cached beside the runs)."""
    return {
        w: _cached(
            config.run_dir / f"start-{w}.json",
            {"policy": artifacts.config_hash, **_eval_key(config, w)},
            lambda w=w: _evaluate(
                artifacts.policy_dir, _sets(config, artifacts, w), config, artifacts
            ),
        )
        for w in which
    }


def _check_worlds(config: StreamExperimentConfig, artifacts: Any) -> None:
    """Refuse test or validation worlds that the warm start or the stream has seen."""
    from harness.training import TaskConfig

    policy = artifacts.config
    demos = range(
        policy.demos.first_world_seed, policy.demos.first_world_seed + policy.demos.n_worlds
    )
    stream = TaskConfig().stream_first_seed
    seen = {
        "the warm start's world": [policy.world_seed],
        "its demonstration worlds": list(demos),
        "its dev world": [policy.eval.dev_world_seed],
        "the training stream": list(range(stream, stream + config.steps)),
    }
    check_disjoint(config.test_world_seeds, seen, what="--test-world-seeds")
    check_disjoint(config.validation_world_seeds, seen, what="--validation-world-seeds")


# --- one run ------------------------------------------------------------------------------------


def _train_config(run: StreamRun, context: _Context, artifacts: Any, steps: int) -> Any:
    from harness.evaluation import demo_train_config
    from harness.training import AllocConfig, BudgetConfig, OptimConfig

    config = context.config
    demo = demo_train_config(_demo_config(config, 1, 1), artifacts)
    per_step = config.leaves_per_step if run.series == "leaves" else context.tokens_per_step
    return dataclasses.replace(
        demo,
        run_dir=config.run_dir / run.run_id,
        steps=steps,
        seed=run.seed,
        checkpoint_every=5,
        keep_checkpoints=1,
        tensorboard=False,
        progress=False,
        torch_threads=1,
        alloc=AllocConfig.of(**ARMS[run.arm]),
        predictor=dataclasses.replace(demo.predictor, flip_calibration=0.0)
        if run.arm in UNCALIBRATED_ARMS
        else demo.predictor,
        budget=BudgetConfig(currency=run.series, per_step=per_step, pool_size=config.pool_size),
        task=dataclasses.replace(demo.task, stream_bank=config.bank),
        optim=OptimConfig(lr=config.lr * run.lr_multiplier),
        eval=dataclasses.replace(demo.eval, every=0),
    )


def _train_to(run: StreamRun, context: _Context, artifacts: Any, steps: int) -> dict[str, Any]:
    """Train `run` up to `steps` under its run key; returns its key, commits and fingerprint.

    `benchmarks.meta.keyed_run`: what is done under the same key is resumed, a run of another key
    is moved aside, never reused.
    """
    return keyed_run(_train_config(run, context, artifacts, steps))


def _do_run(run: StreamRun, context: _Context) -> dict[str, Any]:
    """Train and evaluate one run (in a worker process); returns its record."""
    import torch

    from harness.tiny_policy import load_artifacts
    from harness.training import read_metrics

    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    config = context.config
    artifacts = load_artifacts(context.policy_run_dir)
    run_dir = config.run_dir / run.run_id
    evals: dict[str, Any] = {}
    along = run.phase == "main" and run.series == "tokens" and run.arm in config.curve_arms
    points = config.eval_at if along else (config.steps,)
    keyed: dict[str, Any] = {}
    for at in points:
        keyed = _train_to(run, context, artifacts, at)
        # an evaluation is cached under its run's key: another run's is never read back
        key = {"run": dataclasses.asdict(run), "run_key": keyed["key"]}
        which = {"lr": ["validation"], "probe": []}.get(
            run.phase, ["test_final" if at == config.steps else "test"]
        )
        if (
            run.phase == "main"
            and at == config.steps
            and (run_dir / f"eval-validation-{at}.json").is_file()
        ):
            which.append("validation")  # a scan's run reused as a main run keeps its score
        for w in which:
            path = run_dir / f"eval-{w}-{at}.json"
            ekey = {**key, **_eval_key(config, w), "at": at}
            evals[f"{w}@{at}"] = _cached(
                path,
                ekey,
                lambda w=w: _evaluate(
                    run_dir / "policy", _sets(config, artifacts, w), config, artifacts
                ),
            )
    metrics = read_metrics(run_dir)
    summary = _read_json(run_dir / "summary.json")
    return {"run": dataclasses.asdict(run), "evals": evals,
            "steps": _run_metrics(metrics, summary), **keyed}  # fmt: skip


def _run_metrics(
    metrics: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]
) -> dict[str, Any]:
    """What a run's log says: tokens by step, Stage 2's scored continuations, movement."""
    rows = [r for r in metrics if "budget/total_tokens" in r]

    def values(key: str) -> list[float]:
        return [float(r[key]) for r in rows if isinstance(r.get(key), int | float)]

    pooled: dict[str, list[float]] = {"p_flip": [], "p_flip_raw": [], "flipped": [], "settled": []}
    for r in rows:
        for k in pooled:
            # runs logged before the calibration have no raw list: theirs equals p_flip
            key = f"stage2/{k}" if k != "p_flip_raw" or f"stage2/{k}" in r else "stage2/p_flip"
            pooled[k] += [float(x) for x in r.get(key, [])]
    norms = [n for n in values("policy/update_norm") if n > 0]
    return {
        "tokens_by_step": values("budget/total_tokens"),
        "leaves_by_step": values("budget/total_leaves"),
        "continuations": sum(values("stage2/continuations")),
        "flips": sum(values("stage2/flips")),
        "settled": sum(
            s * c
            for s, c in zip(
                values("stage2/settled_share"), values("stage2/continuations"), strict=False
            )
            if math.isfinite(s)
        ),
        "scored": pooled,
        "effective_ratio": _mean(values("rollout/effective_ratio")),
        "effective_ratio_by_step": values("rollout/effective_ratio"),
        "rollout_accuracy": _mean(values("rollout/accuracy")),
        "optimizer_steps": sum(values("policy/optimizer_steps")),
        "update_norm_mean": _mean(norms),
        "displacement": summary.get("movement", {}).get("policy/displacement"),
        "wall_s": sum(values("perf/step_s")),
    }


def _mean(xs: Sequence[float]) -> float | None:
    finite = [x for x in xs if math.isfinite(x)]
    return sum(finite) / len(finite) if finite else None


# --- summary ------------------------------------------------------------------------------------


def _em(record: Mapping[str, Any], key: str) -> float:
    """EM in points (0-100) of one evaluation entry, e.g. `test_final@30` / `test`."""
    evaluation, name = key.split("/")
    return 100.0 * float(record["evals"][evaluation][name]["em"])


def _curve_em(record: Mapping[str, Any], at: int, last: int) -> float | None:
    """Test EM in points after step `at` (the final evaluation at `last`); None if not run."""
    evaluation = f"{'test_final' if at == last else 'test'}@{at}"
    return _em(record, f"{evaluation}/test") if evaluation in record["evals"] else None


def _paired(a: Mapping[int, float], b: Mapping[int, float]) -> dict[str, Any] | None:
    """The difference a − b over the seeds both have, with a 95 % t interval (None: < 2)."""
    from harness.evaluation import t_interval

    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    diffs = [a[s] - b[s] for s in seeds]
    est = t_interval(diffs)
    return {"mean": est.mean, "low": est.low, "high": est.high, "n": est.n, "seeds": seeds,
            "per_seed": diffs}  # fmt: skip


def _auc(scores: Sequence[float], labels: Sequence[float]) -> float | None:
    """Area under the ROC curve (ties count half); None without both classes."""
    from scipy.stats import rankdata

    y = np.asarray(labels, dtype=bool)
    if y.all() or not y.any():
        return None
    ranks = rankdata(np.asarray(scores, dtype=float))
    n1, n0 = int(y.sum()), int((~y).sum())
    return float((ranks[y].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def _stage2(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Flips, settled share, Brier (against a constant) and AUC, pooled over runs."""
    n = sum(r["steps"]["continuations"] for r in records)
    p = [x for r in records for x in r["steps"]["scored"]["p_flip"]]
    scored = [r["steps"]["scored"] for r in records]
    raw = [x for s in scored for x in s.get("p_flip_raw", s["p_flip"])]
    y = [x for r in records for x in r["steps"]["scored"]["flipped"]]
    rate = sum(y) / len(y) if y else None
    return {
        "continuations": n,
        "flips_per_continuation": sum(r["steps"]["flips"] for r in records) / n if n else None,
        "settled_tree_continuation_share": sum(r["steps"]["settled"] for r in records) / n
        if n
        else None,
        "flip_brier": float(np.mean((np.array(p) - np.array(y)) ** 2)) if y else None,
        "flip_brier_constant": rate * (1 - rate) if rate is not None else None,
        "flip_brier_uncalibrated": float(np.mean((np.array(raw) - np.array(y)) ** 2))
        if y
        else None,
        "mean_p_flip": float(np.mean(p)) if p else None,
        "flip_auc": _auc(p, y) if y else None,
        "n_scored": len(y),
    }


def _tokens_to_reach(curve: Sequence[tuple[float, float]], target: float) -> float | None:
    """Tokens at which a piecewise-linear EM curve first reaches `target` (None: never)."""
    for (x0, y0), (x1, y1) in itertools.pairwise(curve):
        if y0 >= target:
            return x0
        if y1 >= target:
            return x0 + (x1 - x0) * (target - y0) / (y1 - y0)
    return None


def summarise(
    records: Sequence[Mapping[str, Any]],
    start: Mapping[str, Any],
    config: StreamExperimentConfig,
    chosen: Mapping[str, float],
    lr_curve: Mapping[str, Mapping[float, Sequence[float]]],
) -> dict[str, Any]:
    """The experiment's `summary` (EM in points; differences paired over seeds)."""
    last = config.steps
    final = f"test_final@{last}/test"
    main = [r for r in records if r["run"]["phase"] == "main"]

    def by_seed(arm: str, series: str, key: str = final) -> dict[int, float]:
        return {r["run"]["seed"]: _em(r, key) for r in main
                if r["run"]["arm"] == arm and r["run"]["series"] == series}  # fmt: skip

    def minus(arm: str, other: str, series: str = "tokens") -> dict[str, Any] | None:
        return _paired(by_seed(arm, series), by_seed(other, series))

    start_em = 100.0 * float(start["test_final"]["test"]["em"])
    grpo = by_seed("grpo", "tokens")
    # TRACE's mean EM curve against tokens, and the tokens GRPO spent to reach its final EM
    curves: dict[str, list[tuple[float, float]]] = {}
    for arm in ("trace", "grpo"):
        members = [r for r in main if r["run"]["arm"] == arm and r["run"]["series"] == "tokens"]
        if not members:
            continue
        points = [(0.0, start_em)]
        for at in config.eval_at:
            key = f"{'test_final' if at == last else 'test'}@{at}/test"
            ems = [_em(r, key) for r in members]
            tokens = [r["steps"]["tokens_by_step"][at - 1] for r in members]
            points.append((float(np.mean(tokens)), float(np.mean(ems))))
        curves[arm] = points
    ratio = None
    if "trace" in curves and "grpo" in curves:
        reach = _tokens_to_reach(curves["trace"], curves["grpo"][-1][1])
        ratio = None if reach is None else reach / curves["grpo"][-1][0]
    trace_runs = [r for r in main if r["run"]["arm"] == "trace"]

    def cell(d: dict[str, Any] | None, field: str) -> float | None:
        return None if d is None else d[field]

    diffs = {
        "trace_minus_grpo_tokens": minus("trace", "grpo"),
        "trace_minus_grpo_leaves": minus("trace", "grpo", "leaves"),
        "trace_n1_minus_n0_tokens": minus("trace", "trace_n0"),
        "trace_minus_dapo_tokens": minus("trace", "dapo"),
        "trace_minus_blind_tokens": minus("trace", "trace_blind"),
        "trace_n0_minus_grpo_tokens": minus("trace_n0", "grpo"),
    }
    summary: dict[str, Any] = {}
    for name, d in diffs.items():
        summary[name] = cell(d, "mean")
        summary[f"{name}_ci_low"] = cell(d, "low")
        summary[f"{name}_ci_high"] = cell(d, "high")
    stage2 = _stage2(trace_runs)
    summary |= {
        "grpo_gain_unseen": float(np.mean(list(grpo.values()))) - start_em if grpo else None,
        "start_em_unseen": start_em,
        "tokens_to_grpo_final_ratio": ratio,
        "flips_per_continuation": stage2["flips_per_continuation"],
        "settled_tree_continuation_share": stage2["settled_tree_continuation_share"],
        "flip_brier": stage2["flip_brier"],
        "flip_brier_constant": stage2["flip_brier_constant"],
        "flip_brier_uncalibrated": stage2["flip_brier_uncalibrated"],
        "flip_auc": stage2["flip_auc"],
        "flip_auc_random_placement": _stage2(
            [r for r in records if r["run"]["arm"] == "trace_random"]
        )["flip_auc"],
        "lr_multiplier": {arm: _rate(arm, chosen) for arm in {*config.arms, *config.leaf_arms}},
        "seeds": {arm: sorted(by_seed(arm, "tokens")) for arm in config.arms},
        # one entry when every run trained on the same code (each run's key covers it)
        "code_digests": sorted({str(r.get("code")) for r in records}),
    }
    if config.bank:
        summary |= pilot(main, config.bank, summary["grpo_gain_unseen"])
    arms = sorted({(r["run"]["arm"], r["run"]["series"]) for r in main})
    table = {}
    for arm, series in arms:
        members = [r for r in main if r["run"]["arm"] == arm and r["run"]["series"] == series]

        def avg(values: Sequence[float | None]) -> float | None:
            finite = [v for v in values if v is not None]
            return float(np.mean(finite)) if finite else None

        table[f"{series}/{arm}"] = {
            "seeds": sorted(r["run"]["seed"] for r in members),
            "em_unseen": avg([_em(r, final) for r in members]),
            "em_fact_disjoint": avg([_em(r, f"test_final@{last}/fact_disjoint") for r in members]),
            "em_decoy": avg([_em(r, f"test_final@{last}/decoy") for r in members]),
            "em_curve": [avg([_curve_em(r, at, last) for r in members]) for at in config.eval_at],
            "total_tokens": avg([r["steps"]["tokens_by_step"][-1] for r in members]),
            "optimizer_steps": avg([r["steps"]["optimizer_steps"] for r in members]),
            "update_norm_mean": avg([r["steps"]["update_norm_mean"] for r in members]),
            "displacement": avg([r["steps"]["displacement"] for r in members]),
            "effective_ratio": avg([r["steps"]["effective_ratio"] for r in members]),
            "stage2": _stage2(members) if ARMS[arm]["name"] == "trace" else None,
        }
    random_runs = [r for r in records if r["run"]["arm"] == "trace_random"]
    return {
        "summary": summary,
        "differences": diffs,
        "arms": table,
        "curves": {k: [list(p) for p in v] for k, v in curves.items()},
        "random_placement": _stage2(random_runs) if random_runs else None,
        "lr_scan": {arm: {str(m): list(v) for m, v in c.items()} for arm, c in lr_curve.items()},
        "start": {
            k: {n: {"em": e["em"], "n": e["n"]} for n, e in v.items()} for k, v in start.items()
        },
    }


PILOT_MAX_MIXED = 0.40
"""The bank pilot's first condition: GRPO's groups mixed at most this often from epoch 2 on."""
PILOT_MIN_GAIN = 5.0
"""The second: GRPO's unseen-world EM still rising by at least this many points."""


def pilot(main: Sequence[Mapping[str, Any]], bank: int, gain: float | None) -> dict[str, Any]:
    """The bank pilot's conditions from GRPO's token runs (`bank` steps make one epoch).

    >>> run = {"run": {"arm": "grpo", "series": "tokens"},
    ...        "steps": {"effective_ratio_by_step": [0.9, 0.8, 0.4, 0.2]}}
    >>> out = pilot([run], 2, 6.0)
    >>> round(out["pilot_grpo_mixed_share"], 3), out["pilot_passes"]
    (0.3, True)
    >>> pilot([run], 2, 4.0)["pilot_passes"]  # EM rising by too little
    False
    >>> pilot([run], 1, 6.0)["pilot_passes"]  # from step 2 on: mixed 0.47 of the time
    False
    """
    grpo = [r for r in main if r["run"]["arm"] == "grpo" and r["run"]["series"] == "tokens"]
    later = [x for r in grpo for x in r["steps"]["effective_ratio_by_step"][bank:]]
    mixed = float(np.mean(later)) if later else None
    passes = (
        mixed is not None
        and gain is not None
        and mixed <= PILOT_MAX_MIXED
        and gain >= PILOT_MIN_GAIN
    )
    return {"pilot_grpo_mixed_share": mixed, "pilot_grpo_gain_unseen": gain,
            "pilot_passes": bool(passes)}  # fmt: skip


def choose_rates(
    scanned: Sequence[Mapping[str, Any]], steps: int
) -> tuple[dict[str, float], dict[str, dict[float, list[float]]]]:
    """Each scanned method's learning-rate multiplier, from its validation EM alone.

    Returns:
        The chosen multiplier per method (`lr_axis.best_multiplier`), and the validation curve
        (method -> multiplier -> EM points per seed) behind it.
    """
    curve: dict[str, dict[float, list[float]]] = {}
    for r in scanned:
        run = r["run"]
        em = _em(r, f"validation@{steps}/validation")
        curve.setdefault(run["arm"], {}).setdefault(float(run["lr_multiplier"]), []).append(em)
    return {arm: best_multiplier(c) for arm, c in curve.items()}, curve


# --- the command --------------------------------------------------------------------------------


def _run_all(runs: Sequence[StreamRun], context: _Context) -> list[dict[str, Any]]:
    """Every run, `workers` at a time (finished ones are read back inside the worker).

    Returns the records in the order of `runs`, whatever order the workers finish in, so the
    summary's sums over seeds add in one order.
    """
    workers = min(context.config.workers, len(runs)) or 1
    with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(_do_run, run, context): run for run in runs}
        for n, future in enumerate(as_completed(futures), 1):
            run = futures[future]
            future.result()  # a failed run stops the experiment here
            print(f"done {run.phase} {run.run_id} ({n}/{len(runs)})", flush=True)
        return [future.result() for future in futures]


def _markdown(result: Mapping[str, Any], command: str) -> str:
    s = result["summary"]

    def pts(x: float | None) -> str:
        return "–" if x is None else f"{x:+.1f}"

    lines = [
        f"# The stream experiment ({result['date']}, {result['machine']})",
        "",
        f"`{command}`",
        "",
        "| difference (unseen-world EM points, paired over seeds, 95 % t) | mean | interval |",
        "|---|---|---|",
    ]
    for name, d in result["differences"].items():
        if d is not None:
            lines.append(f"| {name} | {d['mean']:+.1f} | [{d['low']:+.1f}, {d['high']:+.1f}] "
                         f"(n = {d['n']}) |")  # fmt: skip
    lines += ["", "| arm | seeds | unseen EM (curve) | fact-disjoint | decoy | tokens | "
              "optimizer steps | mean ‖Δθ‖ | ‖θ_end − θ_start‖ | effective ratio |",
              "|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip

    def f(x: Any, digits: int = 1) -> str:
        return "–" if x is None else f"{x:.{digits}f}"

    for name, a in result["arms"].items():
        curve = " → ".join(f(x) for x in a["em_curve"])
        lines.append(
            f"| {name} | {len(a['seeds'])} | {curve} | {f(a['em_fact_disjoint'])} | "
            f"{f(a['em_decoy'])} | {f(a['total_tokens'], 0)} | {f(a['optimizer_steps'], 0)} | "
            f"{f(a['update_norm_mean'], 3)} | {f(a['displacement'], 3)} | "
            f"{f(a['effective_ratio'], 2)} |"
        )
    lines += [
        "",
        f"Start (warm start) unseen EM {s['start_em_unseen']:.1f}; GRPO's gain "
        f"{pts(s['grpo_gain_unseen'])}; TRACE's tokens to reach GRPO's final EM over GRPO's: "
        f"{f(s['tokens_to_grpo_final_ratio'], 2)}.",
        "",
        f"Stage 2 (trace): flips per continuation {f(s['flips_per_continuation'], 3)}, "
        f"settled-tree share {f(s['settled_tree_continuation_share'], 3)}, flip Brier "
        f"{f(s['flip_brier'], 3)} against {f(s['flip_brier_constant'], 3)} for a constant; "
        f"AUC {f(s['flip_auc'], 2)} on its own placements, "
        f"{f(s['flip_auc_random_placement'], 2)} on randomly placed continuations.",
        "",
        "Learning-rate scan (validation worlds):",
        "",
        curve_table(
            {arm: {float(m): v for m, v in c.items()} for arm, c in result["lr_scan"].items()},
            scale=1.0,  # already in points
        ),
    ]
    return "\n".join(lines) + "\n"


def main(config: StreamExperimentConfig) -> dict[str, Any]:
    """Run the phases `config.phase` asks for; returns the record (also written to disk)."""
    t0 = time.perf_counter()
    context, start = _start(config)
    print(f"warm start: validation EM {start['validation']['validation']['em']:.3f}; "
          f"{context.tokens_per_step} tokens a step in the token series", flush=True)  # fmt: skip
    scan = [StreamRun("lr", arm, "tokens", seed, m) for seed in config.lr_seeds
            for arm in config.lr_methods for m in config.lr_multipliers]  # fmt: skip
    chosen, lr_curve = choose_rates(_run_all(scan, context), config.steps)
    print(f"learning-rate multipliers chosen on validation: {chosen}", flush=True)
    records = [] if config.phase == "lr" else _run_all(runs_of(config, chosen), context)
    if records:  # the start's test evaluations, once the workers are done
        from harness.tiny_policy import load_artifacts

        artifacts = load_artifacts(context.policy_run_dir)
        start |= _start_evals(config, artifacts, ("test", "test_final"))
    command = "python -m benchmarks.research.stream_experiment " + " ".join(
        shlex.quote(a) for a in sys.argv[1:] if a != "--json"
    )
    result = {
        "name": config.name,
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "command": command,
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "lr_chosen": chosen,
        **(summarise(records, start, config, chosen, lr_curve) if records else {}),
        "runs": records,
        "wall_s": time.perf_counter() - t0,
    }
    if records:
        _write_json(config.results_dir / f"experiment-{config.name}.json", result)
        (config.results_dir / f"experiment-{config.name}.md").write_text(
            _markdown(result, command), encoding="utf-8"
        )
    return result


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return {}


def _write_json(path: Path, data: Any) -> None:
    """Atomically: a kill never leaves a torn record."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)


def cli(argv: Sequence[str] | None = None) -> int:
    """`python -m benchmarks.research.stream_experiment`."""
    config = tyro.cli(StreamExperimentConfig, args=argv,
                      prog="python -m benchmarks.research.stream_experiment")  # fmt: skip
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    import torch

    # the start's evaluations run here beside the workers: one thread, as they have
    torch.set_num_threads(1)
    result = main(config)
    if config.json:
        print(json.dumps(result.get("summary", {"lr_chosen": result["lr_chosen"]})))
    return 0


if __name__ == "__main__":
    sys.exit(cli())
