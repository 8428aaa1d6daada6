"""What `make run` shows, measured: RL's gain on worlds it never saw, with its interval, and time.

By default it clones the repository's committed HEAD into a fresh directory and times
`make run` there, as a new user would run it (the virtual environment's install included),
then reads the demo's record (`runs/demo/demo.json`). `--no-clone` runs the demo's default
configuration in this process instead, in a fresh run directory (no install: then
`make_run_seconds` is null and `demo_seconds` is the demo alone).

    python -m benchmarks.research.demo_gain --json

The last line of `--json` output is one JSON object with `make_run_seconds`,
`warm_start_unseen_em`, `rl_gain_unseen_em` (and `rl_gain_unseen_ci_low` / `_ci_high`),
`rl_gain_fact_disjoint_em` (and its interval), `decoy_em_before`, `decoy_em_after`,
`unseen_questions`, `unseen_samples` (and the same counts for the other sets), `rl_steps`,
`rl_seconds` and `demo_seconds`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

__all__ = ["DemoGainArgs", "figures", "main"]

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, kw_only=True)
class DemoGainArgs:
    """Measure the demo's unseen-world gain, its other held-out sets and its wall time."""

    clone: bool = True
    """Time `make run` on a fresh clone of HEAD (install included); `--no-clone` runs the demo
    in this process instead."""
    work_dir: Path | None = None
    """Where the clone or the run directory goes (default: a new temporary directory, kept)."""
    json: bool = False
    """Print the figures as one JSON object on the last line."""


def figures(record: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's keys from a `demo.json` record."""
    sets = record["sets"]
    unseen, facts, decoy = sets["unseen"], sets["fact_disjoint"], sets["decoy"]
    kinds = unseen["before_by_kind"]
    return {
        "warm_start_unseen_em": unseen["before"]["mean"],
        "after_unseen_em": unseen["after"]["mean"],
        "rl_gain_unseen_em": unseen["gain"]["mean"],
        "rl_gain_unseen_ci_low": unseen["gain"]["low"],
        "rl_gain_unseen_ci_high": unseen["gain"]["high"],
        "warm_start_unseen_em_by_kind": kinds,
        "after_unseen_em_by_kind": unseen["after_by_kind"],
        "warm_start_fact_disjoint_em": facts["before"]["mean"],
        "rl_gain_fact_disjoint_em": facts["gain"]["mean"],
        "rl_gain_fact_disjoint_ci_low": facts["gain"]["low"],
        "rl_gain_fact_disjoint_ci_high": facts["gain"]["high"],
        "decoy_em_before": decoy["before"]["mean"],
        "decoy_em_after": decoy["after"]["mean"],
        "unseen_questions": unseen["n_questions"],
        "unseen_samples": unseen["n_samples"],
        "fact_disjoint_questions": facts["n_questions"],
        "fact_disjoint_samples": facts["n_samples"],
        "decoy_questions": decoy["n_questions"],
        "decoy_samples": decoy["n_samples"],
        "rl_steps": record["rl_steps"],
        "rl_seconds": record["times"]["train_s"],
        "demo_seconds": record["times"]["total_s"],
        "summary": record["summary"],
    }


def _run_clone(work_dir: Path) -> tuple[dict[str, Any], float]:
    clone = work_dir / "trace-rl"
    subprocess.run(["git", "clone", "-q", str(REPO_ROOT), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    start = time.perf_counter()
    subprocess.run(["make", "run"], cwd=clone, env=env, check=True)
    seconds = time.perf_counter() - start
    return json.loads((clone / "runs" / "demo" / "demo.json").read_text()), seconds


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a summary (and the JSON line with `--json`)."""
    args = tyro.cli(DemoGainArgs, args=argv, prog="python -m benchmarks.research.demo_gain")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="demo_gain-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    if args.clone:
        record, make_run_seconds = _run_clone(work_dir)
    else:
        from harness.evaluation import DemoConfig, run_demo

        record = run_demo(DemoConfig(run_dir=work_dir / "demo", progress=False))
        make_run_seconds = None
    result = figures(record) | {"make_run_seconds": make_run_seconds, "work_dir": str(work_dir)}
    print(result["summary"])
    print(
        f"unseen worlds ({result['unseen_questions']} x {result['unseen_samples']}): "
        f"{result['warm_start_unseen_em']:.3f} -> {result['after_unseen_em']:.3f}, gain "
        f"{result['rl_gain_unseen_em']:+.3f} [{result['rl_gain_unseen_ci_low']:+.3f}, "
        f"{result['rl_gain_unseen_ci_high']:+.3f}]"
    )
    print(
        f"fact-disjoint gain {result['rl_gain_fact_disjoint_em']:+.3f} "
        f"[{result['rl_gain_fact_disjoint_ci_low']:+.3f}, "
        f"{result['rl_gain_fact_disjoint_ci_high']:+.3f}]; decoy EM "
        f"{result['decoy_em_before']:.3f} -> {result['decoy_em_after']:.3f}"
    )
    if make_run_seconds is not None:
        print(f"make_run_seconds: {make_run_seconds:.0f}")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
