"""A task source of your own: your questions, over your documents, in every training step.

`HandWritten` trains on a few questions written here, answered from a BM25 index over a few
documents written here. It implements `harness.training.TaskSource`: `fixed_ids` (the questions a
data cursor walks over; None if every step brings its own set), `corpus(step)` (a `TaskCorpus`:
the step's questions and the retriever that answers their searches) and `seed(step)` (a world
seed to log, or None). docs/extending.md, "Adding a task source", walks through it.

Run from the repository root: `python -m examples.own_task_source` (2 steps of the shipped warm
start on CPU), or:

    tracerl train --task-source examples.own_task_source:HandWritten --steps 2 \\
        --run-dir runs/hand_written
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from envs import QATask, TaskSet
from harness.training import BudgetConfig, EvalConfig, TaskCorpus, TrainConfig, train
from retrieval import BM25Retriever, CachedRetriever, Document

WARM_START = Path(__file__).resolve().parents[1] / "harness" / "tiny_policy" / "warm_start"

DOCUMENTS = (
    ("ann", "Ann Vole", "Ann Vole is a painter. Ann Vole was born in Lyon."),
    ("bo", "Bo Reyes", "Bo Reyes is a chemist. Bo Reyes was born in Porto."),
    ("cy", "Cy Marsh", "Cy Marsh wrote the novel Tide Lines. Cy Marsh was born in Oslo."),
    ("tide", "Tide Lines", "Tide Lines is a novel by Cy Marsh, published in 1994."),
)
QUESTIONS = (
    ("ann-born", "Where was Ann Vole born?", ("Lyon",)),
    ("bo-born", "Where was Bo Reyes born?", ("Porto",)),
    ("tide-author-born", "Where was the author of Tide Lines born?", ("Oslo",)),
    ("tide-year", "In which year was Tide Lines published?", ("1994",)),
)


class HandWritten:
    """The questions and documents above, the same set every step."""

    def __init__(self, repeat: int = 1) -> None:
        """`repeat`: how many copies of each question (distinct ids), to fill larger pools."""
        docs = [Document(doc_id=i, title=title, text=text) for i, title, text in DOCUMENTS]
        tasks = TaskSet(
            QATask(task_id=f"{task_id}-{k}", question=question, golden_answers=answers)
            for k in range(repeat)
            for task_id, question, answers in QUESTIONS
        )
        self._corpus = TaskCorpus("hand-written", tasks, CachedRetriever(BM25Retriever.build(docs)))

    @property
    def fixed_ids(self) -> tuple[str, ...]:
        """Every question, in order: the trainer's data cursor walks over them, epoch by epoch."""
        return self._corpus.tasks.ids

    def corpus(self, step: int) -> TaskCorpus:
        """The same questions and index at every step."""
        return self._corpus

    def seed(self, step: int) -> None:
        """No generated world behind these questions."""
        return None


def main(run_dir: Path, *, steps: int = 2) -> dict[str, float]:
    """Train the warm start for `steps` steps on `HandWritten`; returns the last step's metrics."""
    config = TrainConfig(
        run_dir=run_dir,
        policy=WARM_START,
        steps=steps,
        budget=BudgetConfig(per_step=8, pool_size=2),
        eval=EvalConfig(every=0),
        tensorboard=False,
        progress=False,
    )
    return train(config, task_source=HandWritten()).final


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        final = main(Path(tmp) / "run")
    pool, reward = final["data/pool"], final["rollout/reward"]
    print(f"step {final['step']}: trained on {pool}, reward {reward:.3f}")
