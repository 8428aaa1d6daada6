"""Question-answering tasks: the `QATask` record every dataset loader yields, and `TaskSet`.

A task is what an environment episode is about: a question, its gold answers (with aliases), and
what is known about how to answer it (type, hop count, supporting paragraphs). Loaders for real
datasets live in `envs.qa_datasets.loaders`; the synthetic world in `envs.synthetic` produces the
same record, so environments, evaluation and training never care where a task came from.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

__all__ = ["Paragraph", "QATask", "TaskSet", "as_gold_answers"]

SCHEMA_VERSION = 1


def as_gold_answers(value: str | Iterable[Any]) -> tuple[str, ...]:
    """Gold answers as a tuple of strings; a bare string is one answer, never its letters.

    FlashRAG wraps a string gold in a list the same way, so a data file may give either form.

    >>> as_gold_answers("Paris"), as_gold_answers(["Paris", "City of Light"])
    (('Paris',), ('Paris', 'City of Light'))
    """
    if isinstance(value, str):
        return (value,)
    return tuple(str(a) for a in value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Paragraph:
    """A paragraph attached to a task: supporting evidence or a distractor."""

    title: str
    text: str
    is_supporting: bool = False
    doc_id: str | None = None
    """The paragraph's id in a corpus, once one has been built (None before)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "title": self.title,
            "text": self.text,
            "is_supporting": self.is_supporting,
            "doc_id": self.doc_id,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Paragraph:
        """Inverse of `to_json`."""
        return cls(
            title=str(record["title"]),
            text=str(record["text"]),
            is_supporting=bool(record.get("is_supporting", False)),
            doc_id=record.get("doc_id"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class QATask:
    """One question with its gold answers.

    Attributes:
        task_id: Unique within its task set.
        question: The question text, as the dataset gives it.
        golden_answers: Every accepted answer (aliases included); EM matches any of them. A bare
            string is stored as one answer.
        question_type: The dataset's type label ("bridge", "comparison", "2hop", ...), or "".
        n_hops: Reasoning hops where the dataset states them, else None.
        supporting_doc_ids: Corpus ids of the supporting paragraphs, where known.
        paragraphs: Supporting and distractor paragraphs where the dataset has them.
        dataset: The dataset name ("hotpotqa", "synthetic", ...).
    """

    task_id: str
    question: str
    golden_answers: tuple[str, ...]
    question_type: str = ""
    n_hops: int | None = None
    supporting_doc_ids: tuple[str, ...] = ()
    paragraphs: tuple[Paragraph, ...] = ()
    dataset: str = ""

    def __post_init__(self) -> None:
        # frozen: the one-time coercion of a bare string goes through object.__setattr__
        object.__setattr__(self, "golden_answers", as_gold_answers(self.golden_answers))
        if not self.golden_answers:
            raise ValueError(f"task {self.task_id!r} has no golden answers")

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict, FlashRAG-compatible (`id`, `question`, `golden_answers`) plus ours."""
        return {
            "id": self.task_id,
            "question": self.question,
            "golden_answers": list(self.golden_answers),
            "question_type": self.question_type,
            "n_hops": self.n_hops,
            "supporting_doc_ids": list(self.supporting_doc_ids),
            "paragraphs": [p.to_json() for p in self.paragraphs],
            "dataset": self.dataset,
        }

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> QATask:
        """Read `to_json`'s form, or a bare FlashRAG `{"id", "question", "golden_answers"}`."""
        return cls(
            task_id=str(record["id"]),
            question=str(record["question"]),
            golden_answers=as_gold_answers(record["golden_answers"]),
            question_type=str(record.get("question_type", "") or ""),
            n_hops=record.get("n_hops"),
            supporting_doc_ids=tuple(record.get("supporting_doc_ids", ())),
            paragraphs=tuple(Paragraph.from_json(p) for p in record.get("paragraphs", ())),
            dataset=str(record.get("dataset", "") or ""),
        )


class TaskSet(Sequence[QATask]):
    """An ordered, read-only collection of tasks with lookup by id.

    Environments hold one and share it with every fork.

    >>> ts = TaskSet([QATask(task_id="q1", question="Who?", golden_answers=("Ann",))])
    >>> ts["q1"].golden_answers, len(ts), ts[0].task_id
    (('Ann',), 1, 'q1')
    """

    def __init__(self, tasks: Iterable[QATask]) -> None:
        self._tasks: tuple[QATask, ...] = tuple(tasks)
        self._by_id: dict[str, QATask] = {}
        for task in self._tasks:
            if task.task_id in self._by_id:
                raise ValueError(f"duplicate task id {task.task_id!r}")
            self._by_id[task.task_id] = task

    @overload
    def __getitem__(self, key: int) -> QATask: ...
    @overload
    def __getitem__(self, key: str) -> QATask: ...
    @overload
    def __getitem__(self, key: slice) -> TaskSet: ...
    def __getitem__(self, key: int | str | slice) -> QATask | TaskSet:
        if isinstance(key, str):
            try:
                return self._by_id[key]
            except KeyError:
                raise KeyError(f"no task with id {key!r} in this task set") from None
        if isinstance(key, slice):
            return TaskSet(self._tasks[key])
        return self._tasks[key]

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[QATask]:
        return iter(self._tasks)

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str):
            return key in self._by_id
        return key in self._tasks

    @property
    def ids(self) -> tuple[str, ...]:
        """Task ids in order."""
        return tuple(t.task_id for t in self._tasks)
