"""A user's own allocator and task source, defined here, outside the package, train 2 steps.

From Python (`train(config, allocator=..., task_source=...)`) and from the command line
(`tracerl train --allocator MODULE:CLASS --allocator-kwargs JSON --task-source MODULE:CLASS`),
as docs/extending.md shows. The allocator spends a fixed number of leaves per prompt, fewer than
the budget, so the spend proves it was the one asked; the questions are this module's own.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from envs import QATask, TaskSet
from harness.errors import PluginError
from harness.policies import Completion, SamplingParams, TransformersBackend
from harness.training import (
    BudgetConfig,
    EvalConfig,
    TaskCorpus,
    TrainConfig,
    read_metrics,
    train,
)
from harness.training.cli import train as train_command
from retrieval import BM25Retriever, Document
from trace_alloc import AllocPlan, AllocView, Predictor, RolloutRequest, RolloutTree

ROOT = Path(__file__).resolve().parents[1]
WARM_START = ROOT / "harness" / "tiny_policy" / "warm_start"

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class TwoEach:
    """`per_prompt` fresh rollouts for each of the first two prompts, once; trains on all."""

    name: ClassVar[str] = "two_each"
    uses_predictor: ClassVar[bool] = False
    per_prompt: int = 2

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        if view.started:
            return AllocPlan()
        return AllocPlan(
            requests=tuple(
                RolloutRequest(tree_index=i, node_id=0, n=self.per_prompt)
                for i in range(min(2, len(view.trees)))
            ),
            stage="two_each",
        )

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        return list(range(len(trees)))


class Capitals:
    """Three questions over three documents of this module's own."""

    IDS = ("lyon", "porto", "oslo")

    def __init__(self) -> None:
        people = {"lyon": "Ann Vole", "porto": "Bo Reyes", "oslo": "Cy Marsh"}
        docs = [
            Document(doc_id=city, title=name, text=f"{name} was born in {city.title()}.")
            for city, name in people.items()
        ]
        tasks = TaskSet(
            QATask(task_id=city, question=f"Where was {name} born?", golden_answers=(city.title(),))
            for city, name in people.items()
        )
        self._corpus = TaskCorpus("capitals", tasks, BM25Retriever.build(docs))

    @property
    def fixed_ids(self) -> tuple[str, ...]:
        return self._corpus.tasks.ids

    def corpus(self, step: int) -> TaskCorpus:
        return self._corpus

    def seed(self, step: int) -> None:
        return None


def _config(run_dir: Path) -> TrainConfig:
    return TrainConfig(
        run_dir=run_dir,
        policy=WARM_START,
        steps=2,
        budget=BudgetConfig(per_step=16, pool_size=3),
        eval=EvalConfig(every=0),
        tensorboard=False,
        progress=False,
    )


def _check_two_steps(run_dir: Path, per_prompt: int) -> None:
    records = read_metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["budget/leaves"] == 2 * per_prompt  # our allocator, not the budget's 16
        assert set(record["data/pool"]) <= set(Capitals.IDS)  # our questions
        assert set(record["data/trained"]) == set(record["data/pool"])  # our train_indices
    assert (run_dir / "policy" / "config.json").is_file()  # the trained policy was saved


class Counting(TransformersBackend):
    """The default backend, counting the prefixes it continued."""

    continued = 0

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        Counting.continued += len(prefixes)
        return super().generate(prefixes, sampling)


def test_a_users_allocator_task_source_and_backend_train_from_python(tmp_path):
    summary = train(
        _config(tmp_path / "run"),
        allocator=TwoEach(per_prompt=3),
        task_source=Capitals(),
        backend=Counting,
    )
    assert summary.steps == 2
    _check_two_steps(tmp_path / "run", per_prompt=3)
    assert Counting.continued >= 2 * 2 * 3  # every leaf's first turn, at least, was ours


def test_a_users_allocator_and_task_source_train_from_the_command_line(tmp_path):
    run_dir = tmp_path / "run"
    argv = [
        *("--run-dir", str(run_dir), "--policy", str(WARM_START), "--steps", "2"),
        *("--budget.per-step", "16", "--budget.pool-size", "3", "--eval.every", "0"),
        *("--no-tensorboard", "--no-progress"),
        *("--allocator", f"{__name__}:TwoEach", "--allocator-kwargs", '{"per_prompt": 1}'),
        *("--task-source", f"{__name__}:Capitals"),
    ]
    assert train_command(argv) == 0
    _check_two_steps(run_dir, per_prompt=1)
    saved = json.loads((run_dir / "config.json").read_text())
    assert saved["allocator"] == f"{__name__}:TwoEach"  # a resumed run rebuilds the same
    assert json.loads(saved["allocator_kwargs"]) == {"per_prompt": 1}


def test_a_bad_plug_fails_before_the_run_directory_is_made(tmp_path):
    run_dir = tmp_path / "run"
    with pytest.raises(PluginError, match="has no attribute 'Nope'"):
        train_command(["--run-dir", str(run_dir), "--allocator", f"{__name__}:Nope"])
    with pytest.raises(PluginError, match="does not follow the TaskSource protocol"):
        train_command(["--run-dir", str(run_dir), "--task-source", f"{__name__}:TwoEach"])
    assert not run_dir.exists()
