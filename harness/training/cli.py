"""The training room's commands: `tracerl init-model`, `train`, `plot` and `doctor`.

Each takes the argv after its name and returns an exit code; the `tracerl` command table (the
front door, a floor up) resolves them by name, and routes `train --backend openrlhf` to
`harness.openrlhf.launcher` instead of `train` here.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import tyro

from harness.training.doctor import Target

__all__ = ["DoctorConfig", "PlotConfig", "doctor", "init_model", "plot", "train"]

log = logging.getLogger("tracerl")


def train(argv: list[str]) -> int:
    """`tracerl train` (`--backend transformers`, the default): CPU RL with tree rollouts.

    `--resume` continues the run in `--run-dir` from its latest checkpoint with the config saved
    there; flags given on the command line override it (e.g. a larger `--steps`).
    """
    from harness.training.config import TrainConfig, load_config, tool_flags
    from harness.training.trainer import train as run_training

    argv = tool_flags(argv)  # `--tool MODULE:CLASS`, repeatable: the env's tools next to search
    config = tyro.cli(TrainConfig, args=argv, prog="tracerl train")
    if config.resume:
        saved = dataclasses.replace(load_config(config.run_dir), resume=True)
        config = tyro.cli(TrainConfig, args=argv, prog="tracerl train", default=saved)
    summary = run_training(config)
    final = summary.final
    log.info(
        "finished step %d in %.0f s: reward %.3f, effective ratio %.2f; policy in %s",
        summary.steps,
        summary.wall_s,
        final.get("rollout/reward", float("nan")),
        final.get("rollout/effective_ratio", float("nan")),
        summary.policy_dir,
    )
    return 0


@dataclasses.dataclass(frozen=True)
class PlotConfig:
    """`tracerl plot RUN_DIR`: draw a training run's curves into a PNG."""

    run_dir: tyro.conf.Positional[Path]
    """A `tracerl train` run directory."""
    out: Path | None = None
    """Image path; unset: RUN_DIR/curves.png."""


def plot(argv: list[str]) -> int:
    """`tracerl plot RUN_DIR`: the curves of a training run (matplotlib PNG)."""
    from harness.training.metrics_log import plot_run

    config = tyro.cli(PlotConfig, args=argv, prog="tracerl plot")
    path = plot_run(config.run_dir, config.out)
    print(path)
    return 0


@dataclasses.dataclass(frozen=True)
class DoctorConfig:
    """`tracerl doctor`: check this machine, its toolchain and a run's layout (docs/openrlhf.md)."""

    target: tyro.conf.OmitArgPrefixes[Target] = dataclasses.field(default_factory=Target)
    json: bool = False
    """Print one JSON object instead of lines."""


def doctor(argv: list[str]) -> int:
    """`tracerl doctor`: one line per check, each failure with its fix; exit 1 on a failure."""
    from harness.training.doctor import Probes, format_report, run_checks

    config = tyro.cli(DoctorConfig, args=argv, prog="tracerl doctor")
    checks = run_checks(Probes.local(), config.target)
    failed = any(c.status == "fail" for c in checks)
    if config.json:
        rows = [dataclasses.asdict(c) for c in checks]
        print(json.dumps({"ok": not failed, "checks": rows}, indent=2))
    else:
        print(format_report(checks))
    return 1 if failed else 0


def init_model(argv: list[str]) -> int:
    """`tracerl init-model`: train the tokenizer and warm-start the tiny policy (cached)."""
    import tyro
    from rich.console import Console

    from harness.tiny_policy import InitModelArgs, summary_table
    from harness.tiny_policy import init_model as build_policy

    args = tyro.cli(InitModelArgs, args=argv, prog="tracerl init-model")
    artifacts = build_policy(args.policy, args.run_dir, force=args.force, progress=args.progress)
    Console().print(summary_table(artifacts))
    return 0
