"""RL on a stream of fresh worlds against RL on one world, at equal steps, judged on unseen worlds.

Both arms start from the demo's warm start and run the demo's RL (`harness.evaluation.demo`:
TRACE, 48 leaves a step over pools of 12, lr 3e-4, no KL) for the same steps and seeds:

- `stream`: `--task.source stream`, a freshly generated world per step (what `make run` does);
- `world`: `--task.source world`, the training split of the warm start's own world 0 (the
  demo before issue 21; the trainer requires a tiny policy's own world for this source).

Each trained policy, and the warm start, is evaluated at T=1 from the same seeded sampling
stream on the demo's unseen-world and fact-disjoint questions (`demo.demo_test_sets`), so every
evaluation is paired on the question. The comparison is paired over seeds: per seed, stream EM
minus world EM, with a 95 % Student t interval over the seeds (`t_interval`). Finished runs
and their evaluations are reused, a killed run resumed.

    python -m benchmarks.research.stream_vs_world --json

The last line of `--json` output is one JSON object: per set, `warm_start_em`, each arm's EM
per seed and its gain over the warm start, and `stream_minus_world` (mean, low, high, n seeds).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tyro

from harness.evaluation import (
    DemoConfig,
    Report,
    demo_test_sets,
    demo_train_config,
    evaluate_test_sets,
    kind_em,
    per_question_mean,
    t_interval,
    train_or_reuse,
)

__all__ = ["ARMS", "StreamVsWorldArgs", "compare", "main"]

ARMS: tuple[Literal["stream", "world"], ...] = ("stream", "world")
SETS = ("unseen", "fact_disjoint")


@dataclass(frozen=True, kw_only=True)
class StreamVsWorldArgs:
    """RL on the world stream against RL on one world: same warm start, steps and seeds."""

    run_dir: Path = Path("runs/stream_vs_world")
    """One run directory per arm and seed (`stream-seed0`, ...), the warm start's evaluation."""
    seeds: tuple[int, ...] = (0, 1, 2)
    """RL seeds (pool draws, sampling); at least two for the interval."""
    steps: int = DemoConfig.steps
    """RL steps of every run (the demo's by default)."""
    unseen_questions: int = DemoConfig.unseen_questions
    unseen_samples: int = DemoConfig.unseen_samples
    fact_disjoint_questions: int = DemoConfig.fact_disjoint_questions
    """At most (the default: the demo's whole set)."""
    fact_disjoint_samples: int = 1
    """T=1 samples per fact-disjoint question."""
    json: bool = False
    """Print the result as one JSON object on the last line."""

    def __post_init__(self) -> None:
        if len(set(self.seeds)) < 2:
            raise ValueError(f"--seeds needs two or more distinct seeds, got {self.seeds}")
        counts = ("unseen_questions", "unseen_samples", "fact_disjoint_questions")
        for name in ("steps", *counts, "fact_disjoint_samples"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")


def _demo_config(args: StreamVsWorldArgs, seed: int = 0) -> DemoConfig:
    # the sampling seed of every evaluation is the demo's (0): evaluations are paired
    return DemoConfig(
        run_dir=args.run_dir,
        steps=args.steps,
        seed=seed,
        curve_every=0,
        unseen_questions=args.unseen_questions,
        unseen_samples=args.unseen_samples,
        fact_disjoint_questions=args.fact_disjoint_questions,
        fact_disjoint_samples=args.fact_disjoint_samples,
        progress=False,
    )


def _train_config_of(args: StreamVsWorldArgs, artifacts: Any, arm: str, seed: int) -> Any:
    config = demo_train_config(_demo_config(args, seed), artifacts)
    task = dataclasses.replace(config.task, source=arm)
    return dataclasses.replace(config, run_dir=args.run_dir / f"{arm}-seed{seed}", task=task)


def _evaluation(
    path: Path, policy_dir: Path, test_sets: dict[str, Any], args: StreamVsWorldArgs, artifacts: Any
) -> dict[str, Any]:
    """Per-question EM and EM by kind of each test set of the policy in `policy_dir`.

    Cached in `path` under the evaluation's settings: a changed setting evaluates again.
    """
    fields = ("steps", "unseen_questions", "unseen_samples", "fact_disjoint_questions")
    key = {"policy": str(policy_dir)} | {f: getattr(args, f) for f in fields}
    key["fact_disjoint_samples"] = args.fact_disjoint_samples
    if path.is_file() and (cached := json.loads(path.read_text()))["key"] == key:
        return dict(cached["sets"])
    reports: dict[str, Report] = evaluate_test_sets(
        policy_dir,
        test_sets,
        name=str(policy_dir),
        config=_demo_config(args),
        max_new_tokens=artifacts.config.eval.max_action_tokens,
    )
    sets = {
        name: {"per_question": per_question_mean(r.episodes), "by_kind": kind_em(r)}
        for name, r in reports.items()
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"key": key, "sets": sets}, indent=1), encoding="utf-8")
    return sets


def _em(per_question: dict[str, float]) -> float:
    return sum(per_question.values()) / len(per_question)


def compare(
    warm: dict[str, Any], runs: dict[str, dict[int, dict[str, Any]]], seeds: tuple[int, ...]
) -> dict[str, Any]:
    """Each arm's EM by seed, its gain over the warm start, and stream minus world.

    Per test set; the difference is paired over seeds, with a 95 % t interval.
    """
    out: dict[str, Any] = {}
    for name in SETS:
        arms = {arm: [_em(runs[arm][s][name]["per_question"]) for s in seeds] for arm in ARMS}
        start = _em(warm[name]["per_question"])
        diffs = [a - b for a, b in zip(arms["stream"], arms["world"], strict=True)]
        out[name] = {
            "warm_start_em": start,
            "em_by_seed": arms,
            "gain_by_seed": {arm: [v - start for v in em] for arm, em in arms.items()},
            "mean_em": {arm: sum(em) / len(em) for arm, em in arms.items()},
            "stream_minus_world": t_interval(diffs).to_json(),
            "by_kind": {
                "warm_start": warm[name]["by_kind"],
                **{arm: [runs[arm][s][name]["by_kind"] for s in seeds] for arm in ARMS},
            },
            "n_questions": len(warm[name]["per_question"]),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    """Train both arms for every seed (or reuse them), evaluate, print the comparison."""
    args = tyro.cli(
        StreamVsWorldArgs, args=argv, prog="python -m benchmarks.research.stream_vs_world"
    )
    from harness.tiny_policy import TinyPolicyConfig, init_model

    start = time.perf_counter()
    artifacts = init_model(TinyPolicyConfig(), args.run_dir, progress=False)
    every_set = demo_test_sets(artifacts, _demo_config(args))
    test_sets = {name: every_set[name] for name in SETS}
    warm = _evaluation(
        args.run_dir / "warm_start_eval.json", artifacts.policy_dir, test_sets, args, artifacts
    )
    runs: dict[str, dict[int, dict[str, Any]]] = {arm: {} for arm in ARMS}
    train_s: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for seed in args.seeds:
        for arm in ARMS:
            config = _train_config_of(args, artifacts, arm, seed)
            _, seconds = train_or_reuse(config)
            train_s[arm].append(seconds)
            runs[arm][seed] = _evaluation(
                config.run_dir / "eval.json", config.run_dir / "policy", test_sets, args, artifacts
            )
            print(f"{arm} seed {seed}: trained in {seconds:.0f} s", flush=True)
    result: dict[str, Any] = {
        "sets": compare(warm, runs, args.seeds),
        "seeds": list(args.seeds),
        "steps": args.steps,
        "samples": {"unseen": args.unseen_samples, "fact_disjoint": args.fact_disjoint_samples},
        "train_s": train_s,
        "wall_s": time.perf_counter() - start,
    }
    for name, r in result["sets"].items():
        d = r["stream_minus_world"]
        print(
            f"{name} ({r['n_questions']} questions): warm start {r['warm_start_em']:.3f}; "
            f"stream {r['mean_em']['stream']:.3f}, one world {r['mean_em']['world']:.3f}; "
            f"stream - world {d['mean']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] over "
            f"{d['n']} seeds"
        )
    (args.run_dir / "result.json").write_text(json.dumps(result, indent=1), encoding="utf-8")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
