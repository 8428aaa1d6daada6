"""The main job (`tracerl demo`, `make run`): RL on fresh worlds, judged on worlds it never saw.

1. **policy**: the default synthetic world and the warm-started tiny policy
   (`harness.tiny_policy.init_model`: the shipped warm start, or one cached under
   `RUN_DIR/tiny_policy`, or a fresh build for another recipe);
2. **before**: evaluate it at temperature 1 on three held-out sets
   (`harness.training.task_sources`), with `harness.rollout.evaluation.evaluate` (what `tracerl
   bench` runs):
   - `unseen`: questions of worlds no policy ever trained on, each over its own index (the
     primary set: it measures searching and reading, not memory);
   - `fact_disjoint`: questions of the worlds the warm start trained on (its world and its
     demonstration worlds) none of whose hop facts occurs in that world's training questions'
     chains, in its world's mix of question kinds (familiar names, facts that must be read);
   - `decoy`: the warm start's training questions over another world's documents (no
     observation holds the answer: EM here is answering from memory, and must stay near 0);
3. **train**: RL with TRACE on a stream of freshly generated worlds, one per step
   (`harness.training.trainer.train` with `--task.source stream`; run directory `RUN_DIR/rl`; a
   finished run with the same config is reused, a killed one resumed), evaluating unseen-world
   questions every `curve_every` steps for the learning curve;
4. **after**: the same evaluations of the trained policy, same questions, same seed;
5. **report**: the before/after table with 95 % bootstrap intervals over questions (the
   difference is paired on the question), one sentence that leads with the unseen-world gain,
   and files: `RUN_DIR/report/` (JSON, Markdown, trajectories, plot), `RUN_DIR/rl/curves.png`,
   `RUN_DIR/rl/learning_curve.png` (unseen-world EM against step and against generated tokens)
   and `RUN_DIR/demo.json`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from harness.evaluation.report import write_reports
from harness.evaluation.stats import bootstrap_mean, paired_difference, per_question_mean
from harness.rollout.evaluation import Report, evaluate_policy_dir

if TYPE_CHECKING:
    from harness.training.task_sources import HeldOut

__all__ = [
    "TEST_SETS",
    "DemoConfig",
    "demo_test_sets",
    "demo_train_config",
    "evaluate_test_sets",
    "kind_em",
    "run_demo",
    "summary_sentence",
    "train_or_reuse",
]

log = logging.getLogger(__name__)

TEST_SETS = ("unseen", "fact_disjoint", "decoy")
"""`unseen`: worlds never trained on (primary); `fact_disjoint`: the warm start's worlds, facts
no training question chains; `decoy`: its training questions over another world's documents."""


@dataclass(frozen=True, kw_only=True)
class DemoConfig:
    """`tracerl demo`: TRACE RL on fresh worlds; before/after on worlds the policy never saw."""

    run_dir: Path = Path("runs/demo")
    """Everything goes here; the warm-started policy is cached in RUN_DIR/tiny_policy."""
    steps: int = 60
    """RL steps, one freshly generated world each."""
    budget_per_step: int = 48
    """Leaves per step (TRACE allocates them over roots and turn prefixes)."""
    pool_size: int = 12
    """Candidate questions per step, drawn from the step's world: 4 leaves per candidate on
    average."""
    lr: float = 3e-4
    """Policy learning rate."""
    kl_coef: float = 0.0
    """Weight of the KL to the warm start (0: none, no reference model is kept)."""
    prefer_unmixed: bool = False
    """TRACE Stage 2 pools its continuations into the step's unmixed trees (the old
    placement); False places them in each prompt's own tree (`Trace.prefer_unmixed`)."""
    questions: Literal["all", "hard"] = "all"
    """Train on every kind, or on `hard` ones only (3-4-hop bridges, comparisons, inference)."""
    unseen_questions: int = 300
    """Questions of the unseen worlds (taken equally from each)."""
    unseen_samples: int = 2
    """T=1 samples per unseen-world question."""
    fact_disjoint_questions: int = 400
    """Fact-disjoint questions of the warm start's worlds, at most, taken equally from each
    world (the default takes the whole set: 133 for the shipped warm start)."""
    fact_disjoint_samples: int = 4
    """T=1 samples per fact-disjoint question."""
    decoy_questions: int = 100
    """Training questions asked over the decoy corpus."""
    decoy_samples: int = 1
    """T=1 samples per decoy question."""
    curve_every: int = 20
    """RL steps between the learning curve's unseen-world evaluations (0: no curve)."""
    curve_questions: int = 80
    """Unseen-world questions at each point of the learning curve: the first ones of the
    unseen set, as the table takes them (so equal counts give the table's figures)."""
    curve_samples: int = 1
    """T=1 samples per question at each point of the learning curve."""
    eval_temperature: float = 1.0
    """Sampled EM at the policy's own temperature (RL changes the sampled policy)."""
    seed: int = 0
    force: bool = False
    """Rebuild the warm-started policy from scratch and retrain, ignoring every cache."""
    progress: bool = True

    def __post_init__(self) -> None:
        # refused before anything is built: a bad value would otherwise surface minutes in
        counts = {
            "budget_per_step": self.budget_per_step,
            "pool_size": self.pool_size,
            "unseen_questions": self.unseen_questions,
            "unseen_samples": self.unseen_samples,
            "fact_disjoint_questions": self.fact_disjoint_questions,
            "fact_disjoint_samples": self.fact_disjoint_samples,
            "decoy_questions": self.decoy_questions,
            "decoy_samples": self.decoy_samples,
            "curve_questions": self.curve_questions,
            "curve_samples": self.curve_samples,
        }
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
        for name, value in {"steps": self.steps, "curve_every": self.curve_every}.items():
            if value < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, got {value}")
        if self.lr < 0 or self.kl_coef < 0:
            raise ValueError(f"--lr and --kl-coef must be 0 or more, got {self.lr}, {self.kl_coef}")
        if not self.eval_temperature > 0:
            raise ValueError(f"--eval-temperature must be positive, got {self.eval_temperature}")


def demo_test_sets(
    artifacts: Any,
    config: DemoConfig,
    *,
    unseen_world_seeds: Sequence[int] | None = None,
    names: Sequence[str] = TEST_SETS,
) -> dict[str, HeldOut]:
    """Each test set's questions (each repeated once per sample) and its env.

    A set of several corpora (one per world) takes its questions equally from each
    (`held_out`, as the training curve does), and its env routes each question to its own
    world's index. `unseen_world_seeds` replaces the unseen set's worlds
    (`TaskConfig.unseen_world_seeds`); `names` picks sets.
    """
    from harness.training.task_sources import eval_set, held_out

    task = _task_config(config, artifacts)
    if unseen_world_seeds is not None:
        task = dataclasses.replace(task, unseen_world_seeds=tuple(unseen_world_seeds))
    sizes = {
        "unseen": (config.unseen_questions, config.unseen_samples),
        "fact_disjoint": (config.fact_disjoint_questions, config.fact_disjoint_samples),
        "decoy": (config.decoy_questions, config.decoy_samples),
    }
    return {name: held_out(eval_set(task, name), *sizes[name], task.env) for name in names}


def kind_em(report: Report) -> dict[str, float]:
    """EM per question kind (bridge-2hop, bridge-3hop, bridge-4hop, comparison, ...)."""
    from harness.rollout.episodes import question_kind

    groups: dict[str, list[float]] = {}
    for r in report.episodes:
        groups.setdefault(question_kind(r.question_type, r.n_hops), []).append(r.em)
    return {k: sum(v) / len(v) for k, v in sorted(groups.items())}


def _compare(before: Report, after: Report, seed: int) -> dict[str, Any]:
    """Before, after and the paired difference, each with a 95 % interval over questions."""
    b, a = per_question_mean(before.episodes), per_question_mean(after.episodes)
    return {
        "n_questions": len(b),
        "n_samples": len(before.episodes) // max(1, len(b)),
        "before": bootstrap_mean(b.values(), seed=seed).to_json(),
        "after": bootstrap_mean(a.values(), seed=seed).to_json(),
        "gain": paired_difference(b, a, seed=seed).to_json(),
        "before_by_kind": kind_em(before),
        "after_by_kind": kind_em(after),
        "before_metrics": before.overall.to_json(),
        "after_metrics": after.overall.to_json(),
    }


def summary_sentence(record: dict[str, Any]) -> str:
    """One sentence a newcomer can read, led by what RL did on worlds it never saw."""

    def clause(c: dict[str, Any]) -> str:
        before, after, gain = c["before"]["mean"], c["after"]["mean"], c["gain"]
        significant = gain["low"] > 0 or gain["high"] < 0
        verb = "raised" if gain["mean"] > 0 else "lowered" if gain["mean"] < 0 else "left"
        note = "" if significant else ", not significant"
        return (
            f"{verb} {{where}} EM from {before:.3f} to {after:.3f} "
            f"({gain['mean']:+.3f}, 95 % CI [{gain['low']:+.3f}, {gain['high']:+.3f}]{note})"
        )

    sets = record["sets"]
    unseen, facts, decoy = sets["unseen"], sets["fact_disjoint"], sets["decoy"]
    minutes = record["times"]["train_s"] / 60
    return (
        f"TRACE RL on {record['rl_steps']} freshly generated worlds ({minutes:.1f} min) "
        f"{clause(unseen).format(where='unseen-world')}; it "
        f"{clause(facts).format(where='fact-disjoint')}, and behind a decoy corpus answered "
        f"{decoy['before']['mean']:.3f} -> {decoy['after']['mean']:.3f} from memory."
    )


def _task_config(config: DemoConfig, artifacts: Any) -> Any:
    """The RL run's task: a world stream, judged on the warm start's world's held-out sets."""
    from harness.training.config import TaskConfig

    demos = artifacts.config.demos  # the warm start's demonstration worlds: fact-disjoint too
    return TaskConfig(
        source="stream",
        world_seed=artifacts.config.world_seed,
        demo_world_seeds=tuple(
            range(demos.first_world_seed, demos.first_world_seed + demos.n_worlds)
        ),
        world=artifacts.config.world,
        env=artifacts.config.env,
        questions=config.questions,
    )


def demo_train_config(config: DemoConfig, artifacts: Any) -> Any:
    """The demo's RL run (`harness.training.config.TrainConfig`): TRACE on the world stream."""
    from harness.training.config import (
        AllocConfig,
        BudgetConfig,
        EvalConfig,
        LossConfig,
        OptimConfig,
        RolloutConfig,
        TrainConfig,
    )
    from trace_alloc import Trace

    return TrainConfig(
        run_dir=config.run_dir / "rl",
        policy=artifacts.policy_dir,
        steps=config.steps,
        seed=config.seed,
        checkpoint_every=max(1, config.steps // 4),
        progress=config.progress,
        task=_task_config(config, artifacts),
        alloc=AllocConfig(name="trace", trace=Trace(prefer_unmixed=config.prefer_unmixed)),
        budget=BudgetConfig(per_step=config.budget_per_step, pool_size=config.pool_size),
        rollout=RolloutConfig(
            max_new_tokens=artifacts.config.eval.max_action_tokens,
            max_total_tokens=artifacts.config.model.max_positions,
        ),
        loss=LossConfig(kl_coef=config.kl_coef),
        optim=OptimConfig(lr=config.lr),
        eval=EvalConfig(
            every=config.curve_every,
            sets=("unseen",),
            n_questions=config.curve_questions,
            n_samples=config.curve_samples,
            temperature=config.eval_temperature,
            seed=config.seed,
        ),
    )


def evaluate_test_sets(
    policy_dir: Path,
    test_sets: dict[str, HeldOut],
    *,
    name: str,
    config: DemoConfig,
    max_new_tokens: int,
) -> dict[str, Report]:
    """One report per test set (`demo_test_sets`) of the policy in `policy_dir`.

    Every policy draws from the same seeded sampling stream (`config.seed`), so two reports
    of the same set are paired on the question.
    """
    return {
        test_set: evaluate_policy_dir(
            policy_dir,
            questions.make_env,
            questions.tasks,
            name=f"{name} ({test_set})",
            temperature=config.eval_temperature,
            max_new_tokens=max_new_tokens,
            seed=config.seed,
            progress=config.progress,
        )
        for test_set, questions in test_sets.items()
    }


def train_or_reuse(train_config: Any, *, force: bool = False) -> tuple[bool, float]:
    """Run `harness.training.train(train_config)`, unless its run directory holds it finished.

    A killed run with the same config is resumed from its last checkpoint.

    Returns:
        Whether a finished run was reused, and the RL wall time (the reused run's own).

    Raises:
        FileExistsError: the run directory holds a run with another config (and not `force`,
            which deletes it and retrains).
    """
    from harness.training.config import load_config
    from harness.training.trainer import train

    rl_dir = train_config.run_dir
    start = time.perf_counter()
    same_run = (rl_dir / "config.json").exists() and dataclasses.replace(
        load_config(rl_dir), resume=False
    ) == train_config
    if not force and same_run and (rl_dir / "summary.json").exists():
        log.info("reusing the finished RL run in %s", rl_dir)
        return True, float(json.loads((rl_dir / "summary.json").read_text())["wall_s"])
    if rl_dir.exists() and (force or not same_run):
        if not force:
            raise FileExistsError(
                f"{rl_dir} holds an RL run with another config; pass --force to retrain"
            )
        shutil.rmtree(rl_dir)
    resume = rl_dir.joinpath("checkpoints", "latest.json").exists()
    train(dataclasses.replace(train_config, resume=resume))
    return False, time.perf_counter() - start


def run_demo(config: DemoConfig, policy_config: Any = None) -> dict[str, Any]:
    """Run the demo; returns the `demo.json` record (times, before/after EM with intervals).

    Args:
        config: The demo's settings.
        policy_config: The tiny policy's recipe (`harness.tiny_policy.TinyPolicyConfig`);
            None for the default (tests pass a smaller one).

    Raises:
        FileExistsError: `RUN_DIR/rl` holds a run with another config (use `force`).
    """
    from harness.tiny_policy import TinyPolicyConfig, init_model
    from harness.training.metrics_log import plot_learning_curve, plot_run

    times: dict[str, float] = {}
    start = time.perf_counter()
    artifacts = init_model(
        policy_config or TinyPolicyConfig(),
        config.run_dir,
        force=config.force,
        progress=config.progress,
    )
    times["policy_s"] = time.perf_counter() - start
    test_sets = demo_test_sets(artifacts, config)
    max_new_tokens = artifacts.config.eval.max_action_tokens

    def evaluate(name: str, policy_dir: Path) -> dict[str, Report]:
        return evaluate_test_sets(
            policy_dir, test_sets, name=name, config=config, max_new_tokens=max_new_tokens
        )

    t = time.perf_counter()
    before = evaluate("warm start", artifacts.policy_dir)
    times["eval_before_s"] = time.perf_counter() - t

    train_config = demo_train_config(config, artifacts)
    rl_dir = train_config.run_dir
    finished, times["train_s"] = train_or_reuse(train_config, force=config.force)

    t = time.perf_counter()
    after = evaluate("after TRACE", rl_dir / "policy")
    times["eval_after_s"] = time.perf_counter() - t

    meta = {
        "command": "tracerl demo",
        "config": json.loads(json.dumps(dataclasses.asdict(config), default=str)),
        "tiny_policy": {
            "config_hash": artifacts.config_hash,
            "reused": artifacts.reused,
            "shipped": artifacts.shipped,
        },
        "machine": {"python": platform.python_version(), "processor": platform.processor()},
    }
    reports = [r for name in TEST_SETS for r in (before[name], after[name])]
    paths = write_reports(reports, config.run_dir / "report", meta=meta)
    curves = {"curves": plot_run(rl_dir)}
    if config.curve_every:
        curves["learning_curve"] = plot_learning_curve(rl_dir)
    times["total_s"] = time.perf_counter() - start
    summary = json.loads((rl_dir / "summary.json").read_text())
    record: dict[str, Any] = {
        "sets": {name: _compare(before[name], after[name], config.seed) for name in TEST_SETS},
        "rl_steps": config.steps,
        "rl_totals": summary["totals"],
        "times": times,
        "policy_reused": artifacts.reused,
        "policy_shipped": artifacts.shipped,
        "rl_reused": finished,
        "paths": {k: str(v) for k, v in (paths | curves).items()},
    }
    record["summary"] = summary_sentence(record)
    (config.run_dir / "demo.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record
