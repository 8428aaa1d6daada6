"""Two seeded runs of the demo's RL, one with another hash seed beside a CPU hog: identical?

Each run is its own process (`python -m benchmarks.perf.determinism --child ...`): the demo's
TRACE run on the world stream from the shipped warm start, `steps` steps, one torch thread. The
first runs with `PYTHONHASHSEED=1`, the second with `PYTHONHASHSEED=2` while a busy-looping
process competes for the CPU, so hash-randomised iteration order, timing and scheduling all
differ between them. The report compares every logged metric of every step (timings aside, NaN
equal to NaN), the final policy weights, the predictor's arrays and the allocator's and engine's
generator states, bit for bit, and names the first difference.

    python -m benchmarks.perf.determinism --steps 60 --json
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro

__all__ = ["DeterminismConfig", "compare_runs", "main", "run_pair"]

TIMING_PREFIXES = ("perf/",)
"""Logged keys that measure wall time, not the computation: left out of the comparison."""

HOG = "while True:\n    pass\n"


@dataclass(frozen=True, kw_only=True)
class DeterminismConfig:
    """`python -m benchmarks.perf.determinism`: are two same-seed runs bit-identical?"""

    steps: int = 60
    """RL steps of each run (the demo takes 60)."""
    seed: int = 0
    out: Path = Path("runs/determinism")
    """The two runs go to `out/a` and `out/b` (replaced if there)."""
    hog: bool = True
    """Run the second beside a busy-looping process."""
    json: bool = False
    """Print one JSON object (the report) as the last line of stdout."""


def _train_child(run_dir: Path, steps: int, seed: int) -> None:
    """One run: the demo's RL from the shipped warm start (what `make run` trains)."""
    from harness.evaluation import DemoConfig, demo_train_config
    from harness.tiny_policy import init_model
    from harness.training import train

    artifacts = init_model(run_dir=run_dir / "start")
    demo = DemoConfig(run_dir=run_dir, steps=steps, seed=seed, curve_every=0, progress=False)
    config = dataclasses.replace(
        demo_train_config(demo, artifacts),
        run_dir=run_dir / "rl",
        torch_threads=1,
        tensorboard=False,
        checkpoint_every=steps,
    )
    train(config)


def run_pair(config: DeterminismConfig) -> dict[str, Any]:
    """Run the two processes (the second beside the hog) and compare them.

    Raises:
        RuntimeError: a run's process failed (its output's tail is in the message).
    """
    import shutil

    dirs = [config.out / "a", config.out / "b"]
    walls = []
    for i, run_dir in enumerate(dirs):
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
        hog = None
        if i == 1 and config.hog:
            hog = subprocess.Popen([sys.executable, "-c", HOG])
        env = {**os.environ, "PYTHONHASHSEED": str(i + 1), "HF_HUB_OFFLINE": "1"}
        command = [sys.executable, "-m", "benchmarks.perf.determinism", "--child",
                   str(run_dir), str(config.steps), str(config.seed)]  # fmt: skip
        start = time.perf_counter()
        try:
            done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        finally:
            if hog is not None:
                hog.kill()
                hog.wait()
        walls.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise RuntimeError(f"run {run_dir} failed:\n{(done.stdout + done.stderr)[-3000:]}")
    return {**compare_runs(dirs[0] / "rl", dirs[1] / "rl"), "steps": config.steps,
            "seed": config.seed, "hog": config.hog, "wall_s": walls}  # fmt: skip


def _same(a: Any, b: Any) -> bool:
    """Equal, with NaN equal to NaN (at any depth of lists)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def metric_differences(
    a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]]
) -> list[tuple[int, str]]:
    """(step, key) of every logged value that differs, timings aside, in step order."""
    out: list[tuple[int, str]] = []
    for ra, rb in zip(a, b, strict=False):
        for key in sorted(set(ra) | set(rb)):
            if key.startswith(TIMING_PREFIXES):
                continue
            if key not in ra or key not in rb or not _same(ra[key], rb[key]):
                out.append((int(ra.get("step", 0)), key))
    if len(a) != len(b):
        out.append((min(len(a), len(b)) + 1, "<steps logged>"))
    return out


def compare_runs(a: Path, b: Path) -> dict[str, Any]:
    """Compare two finished runs' metrics, final weights, predictor and generator states.

    Raises:
        ValueError: a run has no checkpoint to compare.
    """
    import torch

    from harness.training import latest_checkpoint, load_checkpoint, read_metrics

    diffs = metric_differences(read_metrics(a), read_metrics(b))
    paths = [latest_checkpoint(a), latest_checkpoint(b)]
    missing = [str(run) for run, path in zip((a, b), paths, strict=True) if path is None]
    if missing:
        raise ValueError(f"no checkpoint to compare in {missing}")
    ca, cb = (load_checkpoint(p) for p in paths if p is not None)
    weights = sorted(
        k
        for k in ca.model | cb.model
        if k not in ca.model or k not in cb.model or not torch.equal(ca.model[k], cb.model[k])
    )
    predictor = sorted(
        k
        for k in ca.predictor | cb.predictor
        if k not in ca.predictor
        or k not in cb.predictor
        or not np.array_equal(ca.predictor[k], cb.predictor[k])
    )
    streams = sorted(
        k for k in ("alloc_rng", "engine_rng", "python_rng") if ca.state[k] != cb.state[k]
    )
    identical = not (diffs or weights or predictor or streams)
    return {
        "identical": identical,
        "steps_compared": len(read_metrics(a)),
        "metric_differences": len(diffs),
        "first_difference": list(diffs[0]) if diffs else None,
        "weights_differ": weights[:5],
        "predictor_differs": predictor[:5],
        "streams_differ": streams,
    }


def main(config: DeterminismConfig) -> dict[str, Any]:
    """Run the pair and print a one-line verdict (and the JSON report with `--json`)."""
    report = run_pair(config)
    verdict = "identical" if report["identical"] else f"DIFFER at {report['first_difference']}"
    print(f"{config.steps} steps, seed {config.seed}: {verdict}", file=sys.stderr)
    if config.json:
        print(json.dumps(report))
    return report


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        _train_child(Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]))
    else:
        sys.exit(0 if main(tyro.cli(DeterminismConfig))["identical"] else 1)
