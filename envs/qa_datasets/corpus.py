"""Build a retrieval corpus from the paragraphs that multi-hop QA datasets ship with.

HotpotQA, 2Wiki, MuSiQue and PopQA give each question its supporting and distractor paragraphs.
Pooling them over a dataset gives a small, self-contained corpus (the shared dev samples hold
9,572 unique HotpotQA paragraphs and 4,543 MuSiQue ones) that a BM25 index covers in seconds,
so a benchmark can run without the 21M-passage wiki-18.

Deduplication keys on (title, text), never the title alone: MuSiQue titles repeat across
different paragraphs. A document's id is a hash of that key (`paragraph_doc_id`), so the same
paragraph gets the same id whichever datasets are pooled, and `attach_doc_ids` can mark any
task's supporting paragraphs with the ids of an index built here, which is what retrieval
recall is measured against.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from envs.qa_datasets.errors import NoParagraphsError
from envs.qa_datasets.loaders import LoadedDataset
from envs.tasks import QATask, TaskSet
from retrieval import BM25Retriever, Document, write_corpus
from retrieval.corpus import corpus_hash

__all__ = [
    "CORPUS_MANIFEST_NAME",
    "SCHEMA_VERSION",
    "CorpusBuild",
    "attach_doc_ids",
    "build_corpus",
    "build_index",
    "paragraph_doc_id",
    "write_corpus_dir",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
CORPUS_MANIFEST_NAME = "corpus_manifest.json"


def paragraph_doc_id(title: str, text: str) -> str:
    """The corpus id of a paragraph: a hash of its title and text.

    >>> paragraph_doc_id("Paris", "Paris is the capital of France.")
    'p-ee40b3cc8f182ed7'
    """
    key = json.dumps([title, text], ensure_ascii=False)
    return f"p-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def attach_doc_ids(tasks: TaskSet) -> TaskSet:
    """Give every paragraph its corpus id and every task its supporting paragraphs' ids.

    Tasks without paragraphs, or that already name supporting documents (the synthetic world
    does), are kept as they are.
    """
    out = []
    for task in tasks:
        if not task.paragraphs or task.supporting_doc_ids:
            out.append(task)
            continue
        paragraphs = tuple(
            replace(p, doc_id=paragraph_doc_id(p.title, p.text)) for p in task.paragraphs
        )
        supporting = tuple(
            dict.fromkeys(p.doc_id for p in paragraphs if p.is_supporting and p.doc_id is not None)
        )
        out.append(replace(task, paragraphs=paragraphs, supporting_doc_ids=supporting))
    return TaskSet(out)


@dataclass(frozen=True, slots=True, kw_only=True)
class CorpusBuild:
    """A deduplicated corpus and the tasks whose paragraphs it holds (with doc ids attached)."""

    documents: tuple[Document, ...]
    tasks: TaskSet
    datasets: tuple[LoadedDataset, ...]
    stats: dict[str, Any] = field(default_factory=dict)
    """Per dataset: records read, paragraphs, new unique documents; totals (unique tasks)."""

    @property
    def corpus_hash(self) -> str:
        """`retrieval.corpus.corpus_hash` of the documents."""
        return corpus_hash(self.documents)

    def manifest(self) -> dict[str, Any]:
        """The JSON written beside the corpus: what it was built from."""
        return {
            "schema_version": SCHEMA_VERSION,
            "corpus_hash": self.corpus_hash,
            "n_documents": len(self.documents),
            "doc_id_rule": "p- + sha256(json([title, text]))[:16]",
            "datasets": [d.to_json() for d in self.datasets],
            "stats": self.stats,
        }


def build_corpus(datasets: Sequence[LoadedDataset]) -> CorpusBuild:
    """Pool the paragraphs of one or more datasets into one deduplicated corpus.

    Documents are ordered by first appearance (dataset, then task, then paragraph order), so
    the same inputs always give the same corpus and corpus hash.

    Args:
        datasets: loaded datasets; each must carry paragraphs.

    Returns:
        The documents, the tasks with doc ids attached, and counts.

    Raises:
        NoParagraphsError: a dataset has no paragraphs at all (Bamboogle, NQ-open); the message
            says what to use instead.
    """
    if not datasets:
        raise NoParagraphsError("no datasets given; pass at least one --dataset or --data-file")
    documents: dict[str, Document] = {}
    tasks: list[QATask] = []
    stats: dict[str, Any] = {"by_dataset": {}}
    for data in datasets:
        n_paragraphs = sum(len(t.paragraphs) for t in data.tasks)
        if n_paragraphs == 0:
            raise NoParagraphsError(
                f"dataset {data.name!r} ({len(data.tasks)} questions) has no paragraphs, so "
                "there is nothing to build a corpus from: Bamboogle and NQ-open ship questions "
                "and answers only. Evaluate them against a Wikipedia corpus instead (e.g. "
                "Search-R1's wiki-18, `tracerl index build --corpus wiki-18.jsonl`), or against "
                "the paragraphs of another dataset."
            )
        before = len(documents)
        for task in attach_doc_ids(data.tasks):
            tasks.append(task)
            for p in task.paragraphs:
                assert p.doc_id is not None  # set by attach_doc_ids
                documents.setdefault(
                    p.doc_id, Document(doc_id=p.doc_id, title=p.title, text=p.text)
                )
        counts = stats["by_dataset"].setdefault(
            data.name, {"n_records": 0, "n_paragraphs": 0, "n_new_documents": 0}
        )  # several files of one dataset add up
        counts["n_records"] += len(data.tasks)
        counts["n_paragraphs"] += n_paragraphs
        counts["n_new_documents"] += len(documents) - before
        log.info(
            "%s: %d questions, %d paragraphs, %d new unique documents",
            data.name,
            len(data.tasks),
            n_paragraphs,
            len(documents) - before,
        )
    unique_tasks: dict[str, QATask] = {}
    for task in tasks:  # overlapping samples of one dataset: keep the first copy
        unique_tasks.setdefault(task.task_id, task)
    stats["n_tasks"] = len(unique_tasks)
    stats["n_paragraphs"] = sum(s["n_paragraphs"] for s in stats["by_dataset"].values())
    stats["n_documents"] = len(documents)
    return CorpusBuild(
        documents=tuple(documents.values()),
        tasks=TaskSet(unique_tasks.values()),
        datasets=tuple(datasets),
        stats=stats,
    )


def write_corpus_dir(build: CorpusBuild, directory: str | Path) -> dict[str, Path]:
    """Write `corpus.jsonl`, `tasks.jsonl` (doc ids attached) and `corpus_manifest.json`.

    Returns:
        The paths written, by role (`corpus`, `tasks`, `manifest`).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = {
        "corpus": directory / "corpus.jsonl",
        "tasks": directory / "tasks.jsonl",
        "manifest": directory / CORPUS_MANIFEST_NAME,
    }
    write_corpus(build.documents, paths["corpus"])
    with paths["tasks"].open("w", encoding="utf-8") as handle:
        for task in build.tasks:
            handle.write(json.dumps(task.to_json(), ensure_ascii=False) + "\n")
    paths["manifest"].write_text(
        json.dumps(build.manifest(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8"
    )
    return paths


def build_index(
    documents: Sequence[Document], directory: str | Path, *, progress: bool = False
) -> str:
    """Build and save a BM25 index over `documents` through the retrieval package.

    Args:
        documents: the corpus.
        directory: where the index goes (`tracerl bench --index DIR` reads it).
        progress: draw progress bars.

    Returns:
        The index id.
    """
    retriever = BM25Retriever.build(documents, progress=progress)
    retriever.save(directory)
    return retriever.index_id
