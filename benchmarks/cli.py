"""`tracerl bench` and `tracerl corpus`."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from benchmarks.corpus import build_corpus, build_index, write_corpus_dir
from benchmarks.errors import BenchmarkError
from benchmarks.qa_datasets import FormatName, LoadedDataset, load_file, load_named

__all__ = ["CorpusConfig", "DataArgs", "corpus"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DataArgs:
    """Which questions: registry names, local files, or both."""

    dataset: tuple[str, ...] = ()
    """Registry names (`hotpotqa`, `musique`, `2wikimultihopqa`, `nq`, ..., `synthetic`);
    loaded from the Hugging Face Hub through `datasets`, or from `--hub-path`."""
    data_file: tuple[Path, ...] = ()
    """Local dataset files in any supported format (detected from the content)."""
    format: FormatName | None = None
    """Force a file format instead of detecting it from the content."""
    name: str | None = None
    """Dataset name to report for `--data-file` tasks (default: from the format)."""
    split: str | None = None
    """Hub split to load instead of the registry's (test, else dev)."""
    hub_path: Path | None = None
    """A local copy of the hub repo (e.g. from `hf download`) to load `--dataset` from."""
    limit: int | None = None
    """Keep the first N questions of each dataset."""

    def __post_init__(self) -> None:
        if self.limit is not None and self.limit < 1:
            raise ValueError(f"--limit {self.limit}: must be >= 1")


def load_data(args: DataArgs, *, default: tuple[str, ...] = ()) -> list[LoadedDataset]:
    """Load what `args` names, files first, then registry names (`default` if neither)."""
    parts = [
        load_file(path, format=args.format, name=args.name, limit=args.limit)
        for path in args.data_file
    ]
    names = args.dataset or (() if parts else default)
    for name in names:
        if name == "synthetic":
            raise BenchmarkError("the synthetic world is not a file dataset; see `tracerl world`")
        parts.append(load_named(name, split=args.split, limit=args.limit, hub_path=args.hub_path))
    if not parts:
        raise BenchmarkError("no questions: pass --dataset NAME or --data-file PATH")
    return parts


# --- tracerl corpus ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class CorpusConfig(DataArgs):
    """Pool the paragraphs of QA datasets into a deduplicated corpus and index it.

    Writes OUT/corpus.jsonl ({"id", "contents"}), OUT/tasks.jsonl (the questions with the corpus
    ids of their supporting paragraphs, for `tracerl bench --data-file`), OUT/corpus_manifest.json
    and, unless --index none, a BM25 index in OUT/bm25 (for `tracerl bench --index`).
    """

    out: Path = Path("runs/corpus")
    """Output folder."""
    index: Literal["bm25", "none"] = "bm25"
    """Index to build over the corpus."""


def corpus(argv: list[str]) -> int:
    """`tracerl corpus`: build a corpus (and a BM25 index) from datasets' paragraphs."""
    config = tyro.cli(CorpusConfig, args=argv, prog="tracerl corpus")
    try:
        parts = load_data(config)
        build = build_corpus(parts)
    except BenchmarkError as err:
        log.error("%s", err)
        return 2
    paths = write_corpus_dir(build, config.out)
    print(
        f"corpus: {build.stats['n_documents']:,} unique documents from "
        f"{build.stats['n_paragraphs']:,} paragraphs of {build.stats['n_tasks']:,} questions "
        f"-> {paths['corpus']}"
    )
    print(f"tasks with supporting doc ids -> {paths['tasks']}")
    if config.index == "bm25":
        index_dir = config.out / "bm25"
        index_id = build_index(build.documents, index_dir, progress=True)
        print(f"BM25 index {index_id} -> {index_dir}")
        print(f"next: tracerl bench --data-file {paths['tasks']} --index {index_dir}")
    return 0
