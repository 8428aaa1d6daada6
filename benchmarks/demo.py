"""`tracerl demo` (what `make run` runs): the whole loop on the embedded default, on CPU.

1. **policy**: build the default synthetic world and its BM25 index, and build and warm-start
   the tiny policy (`harness.tiny_policy.init_model`; cached under `RUN_DIR/tiny_policy`, so a
   second run reuses it);
2. **before**: evaluate the warm-started policy on held-out questions with
   `benchmarks.evaluation.evaluate` (what `tracerl bench` runs), sampled at temperature 1;
3. **train**: RL with TRACE for a few minutes (`harness.trainer.train`; its run directory is
   `RUN_DIR/rl`, and a finished run with the same config is reused, a killed one resumed);
4. **after**: evaluate the trained policy on the same questions with the same seed;
5. **report**: print the before/after table and write `RUN_DIR/report/` (JSON, Markdown,
   trajectories, plot), the training curves (`RUN_DIR/rl/curves.png`) and `RUN_DIR/demo.json`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tyro

from benchmarks.evaluation import Report, evaluate_policy_dir
from benchmarks.report import write_reports
from envs.tasks import QATask

__all__ = ["DemoConfig", "demo", "run_demo"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """`tracerl demo`: warm-start the tiny policy, train it with TRACE, compare before/after."""

    run_dir: Path = Path("runs/demo")
    """Everything goes here; the warm-started policy is cached in RUN_DIR/tiny_policy."""
    steps: int = 24
    """RL steps (a few minutes on 2 cores)."""
    budget_per_step: int = 48
    """Leaves per step (TRACE allocates them over roots and turn prefixes)."""
    pool_size: int = 24
    """Candidate questions per step."""
    lr: float = 2e-4
    """Policy learning rate."""
    questions: Literal["all", "hard"] = "hard"
    """Train on `hard` questions only (3-4-hop bridges, comparisons, inference) or `all`."""
    eval_questions: int = 160
    """Held-out questions (test, then test_entities) evaluated before and after."""
    eval_temperature: float = 1.0
    """Sampled EM at the policy's own temperature (RL changes the sampled policy)."""
    seed: int = 0
    force: bool = False
    """Rebuild the warm-started policy and retrain, ignoring the caches."""
    progress: bool = True


def _held_out(artifacts: Any, world: Any, n: int) -> list[QATask]:
    ids = [*artifacts.split["test"], *artifacts.split["test_entities"]][:n]
    return [world.tasks[i] for i in ids]


def _evaluate(
    name: str,
    policy_dir: Path,
    tasks: list[QATask],
    env_factory: Any,
    config: DemoConfig,
    max_new_tokens: int,
) -> Report:
    # before and after draw from the same seeded sampling stream
    return evaluate_policy_dir(
        policy_dir,
        env_factory,
        tasks,
        name=name,
        temperature=config.eval_temperature,
        max_new_tokens=max_new_tokens,
        seed=config.seed,
        progress=config.progress,
    )


def run_demo(config: DemoConfig, policy_config: Any = None) -> dict[str, Any]:
    """Run the demo; returns the `demo.json` record (times, before/after EM, paths).

    Args:
        config: The demo's settings.
        policy_config: The tiny policy's recipe (`harness.tiny_policy.TinyPolicyConfig`);
            None for the default (tests pass a smaller one).

    Raises:
        FileExistsError: `RUN_DIR/rl` holds a run with another config (use `force`).
    """
    from harness.metrics_log import plot_run
    from harness.tiny_policy import TinyPolicyConfig, init_model
    from harness.trainer import (
        AllocConfig,
        BudgetConfig,
        OptimConfig,
        RolloutConfig,
        TaskConfig,
        TrainConfig,
        load_config,
        train,
    )

    times: dict[str, float] = {}
    start = time.perf_counter()
    artifacts = init_model(
        policy_config or TinyPolicyConfig(),
        config.run_dir,
        force=config.force,
        progress=config.progress,
    )
    times["policy_s"] = time.perf_counter() - start
    world = artifacts.world()
    retriever_env = artifacts.make_env(world)
    tasks = _held_out(artifacts, world, config.eval_questions)

    def env_factory() -> Any:
        return artifacts.config.env.make_env(world.tasks, retriever_env.retriever)

    t = time.perf_counter()
    max_new_tokens = artifacts.config.eval.max_action_tokens
    before = _evaluate(
        "warm start", artifacts.policy_dir, tasks, env_factory, config, max_new_tokens
    )
    times["eval_before_s"] = time.perf_counter() - t

    rl_dir = config.run_dir / "rl"
    train_config = TrainConfig(
        run_dir=rl_dir,
        policy=artifacts.policy_dir,
        steps=config.steps,
        seed=config.seed,
        checkpoint_every=max(1, config.steps // 4),
        progress=config.progress,
        task=TaskConfig(
            world_seed=artifacts.config.world_seed,
            world=artifacts.config.world,
            env=artifacts.config.env,
            questions=config.questions,
        ),
        alloc=AllocConfig(name="trace"),
        budget=BudgetConfig(per_step=config.budget_per_step, pool_size=config.pool_size),
        rollout=RolloutConfig(
            max_new_tokens=max_new_tokens, max_total_tokens=artifacts.config.model.max_positions
        ),
        optim=OptimConfig(lr=config.lr),
    )
    t = time.perf_counter()
    same_run = (rl_dir / "config.json").exists() and dataclasses.replace(
        load_config(rl_dir), resume=False
    ) == train_config
    finished = not config.force and same_run and (rl_dir / "summary.json").exists()
    if finished:
        log.info("reusing the finished RL run in %s", rl_dir)
    else:
        if rl_dir.exists() and (config.force or not same_run):
            if not config.force:
                raise FileExistsError(
                    f"{rl_dir} holds an RL run with another config; pass --force to retrain"
                )
            shutil.rmtree(rl_dir)
        resume = rl_dir.joinpath("checkpoints", "latest.json").exists()
        train(dataclasses.replace(train_config, resume=resume))
    times["train_s"] = time.perf_counter() - t
    trained_dir = rl_dir / "policy"

    t = time.perf_counter()
    after = _evaluate("after TRACE", trained_dir, tasks, env_factory, config, max_new_tokens)
    times["eval_after_s"] = time.perf_counter() - t

    report_dir = config.run_dir / "report"
    meta = {
        "command": "tracerl demo",
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "tiny_policy": {"config_hash": artifacts.config_hash, "reused": artifacts.reused},
        "machine": {"python": platform.python_version(), "processor": platform.processor()},
    }
    paths = write_reports([before, after], report_dir, meta=meta)
    curves = plot_run(rl_dir)
    times["total_s"] = time.perf_counter() - start
    record = {
        "before": before.overall.to_json(),
        "after": after.overall.to_json(),
        "n_questions": len(tasks),
        "times": times,
        "policy_reused": artifacts.reused,
        "rl_reused": finished,
        "paths": {k: str(v) for k, v in paths.items()} | {"curves": str(curves)},
    }
    (config.run_dir / "demo.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def _print_table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    table = Table(title=f"tracerl demo: {record['n_questions']} held-out questions, T=1")
    for column in ("policy", "EM", "F1", "answered", "valid", "searches", "tokens"):
        table.add_column(column, justify="left" if column == "policy" else "right")
    for name, key in (("warm start", "before"), ("after TRACE", "after")):
        m = record[key]
        table.add_row(
            name, f"{m['em']:.3f}", f"{m['f1']:.3f}", f"{m['answered']:.3f}",
            f"{m['valid_action_rate']:.3f}", f"{m['searches']:.2f}", f"{m['tokens']:.1f}",
        )  # fmt: skip
    console.print(table)
    t = record["times"]
    console.print(
        f"time: policy {t['policy_s']:.0f} s, eval {t['eval_before_s']:.0f}+{t['eval_after_s']:.0f}"
        f" s, RL {t['train_s']:.0f} s; total {t['total_s']:.0f} s"
    )
    console.print(f"report: {record['paths']['markdown']}; curves: {record['paths']['curves']}")


def demo(argv: list[str]) -> int:
    """`tracerl demo`: the main job (`make run`)."""
    config = tyro.cli(DemoConfig, args=argv, prog="tracerl demo")
    record = run_demo(config)
    _print_table(record)
    return 0
