"""Loaders for multi-hop QA datasets in their native formats, from files or the Hugging Face Hub.

Every loader yields `envs.tasks.QATask` records (question, gold answers with aliases, type, hop
count, supporting and distractor paragraphs) inside a `LoadedDataset` that also says where the
tasks came from (file path and SHA-256, or hub repo/config/split) and a content hash of the
tasks, so that a report can name exactly what was evaluated.

Formats (`FORMATS`; `detect_format` picks one from a file's content, `--format` overrides):

- `hotpotqa`: the official JSON(L): `_id`, `context [[title, [sentences]]]`,
  `supporting_facts [[title, sent_idx]]`.
- `hotpotqa-hf`: the HF `hotpot_qa` schema: `id`, `context {title[], sentences[][]}`,
  `supporting_facts {title[], sent_id[]}`.
- `2wikimultihopqa`: official 2Wiki (HotpotQA-like, plus `evidences`), or its HF form.
- `musique`: `id` (`2hop__...`), `paragraphs [{title, paragraph_text, is_supporting}]`,
  `question_decomposition`, `answer`, `answer_aliases`; JSONL or a JSON array.
- `bamboogle`: CSV without header, `question,,,,answer,answer_2,` (or a `Question,Answer` header).
- `nq-open`: `{question, answer[]}` (NQ-open, TriviaQA-open).
- `popqa`: PopQA columns with `possible_answers` a JSON *string*; HippoRAG-2 adds `paragraphs`.
- `flashrag`: `{id, question, golden_answers, metadata?}` (FlashRAG, Search-R1), and
  `QATask.to_json` lines (`tracerl world`'s export).

This package is not called `datasets` on purpose: a script run from `envs/` puts that folder
first on `sys.path`, and a local `datasets` would then shadow Hugging Face's `datasets` for
every library that imports it (sentence-transformers does).
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import logging
import os
import re
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from envs.qa_datasets.errors import (
    DatasetFormatError,
    DatasetUnavailable,
    UnknownBenchmarkNameError,
)
from envs.tasks import Paragraph, QATask, TaskSet

__all__ = [
    "DATASETS",
    "FLASHRAG_REPO",
    "FORMATS",
    "DatasetSource",
    "DecompositionStep",
    "FormatName",
    "HubDataset",
    "LoadedDataset",
    "combine",
    "detect_format",
    "load_file",
    "load_hub",
    "load_named",
    "records_to_dataset",
]

log = logging.getLogger(__name__)

FLASHRAG_REPO = "RUC-NLPIR/FlashRAG_datasets"


# --- records -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class DecompositionStep:
    """One step of a dataset's own question decomposition (MuSiQue gives them)."""

    question: str
    """As the dataset writes it: MuSiQue uses `#1` for step 1's answer and `>>` for a relation."""
    answer: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetSource:
    """Where a dataset came from, for the reproducibility block of a report."""

    kind: str
    """`"file"`, `"hub"` or `"synthetic"`."""
    location: str
    """The file path, `repo[:config]@split`, or the synthetic world's seed and config."""
    format: str
    sha256: str | None = None
    """SHA-256 of the file's bytes (files only)."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {
            "kind": self.kind,
            "location": self.location,
            "format": self.format,
            "sha256": self.sha256,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class LoadedDataset:
    """Tasks plus what is needed to say where they came from."""

    name: str
    """The dataset name used in reports (`hotpotqa`, `musique`, ...)."""
    tasks: TaskSet
    sources: tuple[DatasetSource, ...]
    decompositions: Mapping[str, tuple[DecompositionStep, ...]] = field(default_factory=dict)
    """task_id -> the dataset's decomposition, where it has one (the scripted oracle uses it)."""

    @property
    def tasks_sha256(self) -> str:
        """SHA-256 of the tasks' canonical JSON: equal exactly when the evaluated tasks are."""
        digest = hashlib.sha256()
        for task in self.tasks:
            digest.update(json.dumps(task.to_json(), sort_keys=True, ensure_ascii=False).encode())
            digest.update(b"\n")
        return digest.hexdigest()

    def to_json(self) -> dict[str, Any]:
        """The provenance block of a report (tasks themselves are not repeated)."""
        return {
            "name": self.name,
            "n_tasks": len(self.tasks),
            "tasks_sha256": self.tasks_sha256,
            "sources": [s.to_json() for s in self.sources],
        }


# --- field helpers -----------------------------------------------------------------------------


def _sentence_separator(paragraphs: Sequence[Sequence[str]]) -> str:
    """How a record's sentences join: as-is when they carry their own spacing, else with a space.

    HotpotQA sentences keep their leading space (`" He was..."`), so `"".join` gives the
    original text byte for byte; 2Wiki's have none and need `" ".join`. One choice per record,
    because a HotpotQA sentence that opens with a quote has no leading space of its own.

    >>> _sentence_separator([["A b.", " C d."]]), _sentence_separator([["A b.", "C d."]])
    ('', ' ')
    """
    own_spacing = any(s[:1].isspace() for sents in paragraphs for s in sents[1:])
    return "" if own_spacing else " "


def _answers(*values: Any) -> tuple[str, ...]:
    """Flatten answer fields into unique, stripped, non-empty strings, in order.

    >>> _answers("Paris", ["paris ", "Paris", ""], None)
    ('Paris', 'paris')
    """
    out: list[str] = []
    for value in values:
        items = value if isinstance(value, list | tuple) else [value]
        for item in items:
            if item is None:
                continue
            text = str(item).strip()
            if text and text not in out:
                out.append(text)
    return tuple(out)


def _json_list(value: Any, what: str) -> list[Any]:
    """PopQA stores lists as JSON strings (`'["a", "b"]'`); accept either form."""
    if isinstance(value, list):
        return value
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except json.JSONDecodeError as err:
            raise DatasetFormatError(f"{what} is not a JSON list: {value[:80]!r}") from err
        if isinstance(parsed, list):
            return parsed
    raise DatasetFormatError(f"{what} must be a list or a JSON-encoded list, got {value!r:.80}")


def _supporting_titles(facts: Any) -> set[str]:
    if not facts:
        return set()
    if isinstance(facts, Mapping):  # HF schema: {"title": [...], "sent_id": [...]}
        return {str(t) for t in facts.get("title", [])}
    return {str(fact[0]) for fact in facts}  # official: [[title, sent_idx], ...]


def _context_paragraphs(context: Any, facts: Any) -> tuple[Paragraph, ...]:
    """HotpotQA / 2Wiki context: official `[[title, sents]]` or HF `{title[], sentences[][]}`."""
    supporting = _supporting_titles(facts)
    if isinstance(context, Mapping):
        sentences = context.get("sentences", context.get("content"))
        if sentences is None:
            raise DatasetFormatError("context has no 'sentences' (or 'content') list")
        pairs = list(zip(context["title"], sentences, strict=True))
    else:
        pairs = [(item[0], item[1]) for item in context]
    sep = _sentence_separator([sents for _, sents in pairs])
    return tuple(
        Paragraph(title=str(title), text=sep.join(sents), is_supporting=title in supporting)
        for title, sents in pairs
    )


def _listed_paragraphs(items: Iterable[Mapping[str, Any]]) -> tuple[Paragraph, ...]:
    """MuSiQue (`paragraph_text`), HippoRAG-2 PopQA and `QATask.to_json` (`text`) paragraphs."""
    return tuple(
        Paragraph(
            title=str(p.get("title", "")),
            text=str(p["paragraph_text"] if "paragraph_text" in p else p["text"]),
            is_supporting=bool(p.get("is_supporting", False)),
            doc_id=None if p.get("doc_id") is None else str(p["doc_id"]),
        )
        for p in items
    )


_HOPS_PREFIX = re.compile(r"^(\d+)hop")


def _musique_type(task_id: str) -> tuple[str, int | None]:
    """MuSiQue ids start with the reasoning graph's shape: `2hop`, `3hop1`, `4hop3`, ...

    >>> _musique_type("3hop1__9285_5188_23307"), _musique_type("custom")
    (('3hop1', 3), ('', None))
    """
    match = _HOPS_PREFIX.match(task_id)
    if not match:
        return "", None
    return task_id.split("__", 1)[0], int(match.group(1))


# --- converters: one native record -> (QATask, decomposition) ---------------------------------

Parsed = tuple[QATask, tuple[DecompositionStep, ...]]
Converter = Callable[[Mapping[str, Any], int, str], Parsed]


def _from_hotpot_like(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    """HotpotQA (official or HF) and 2WikiMultihopQA: same context/supporting-facts shape."""
    task_id = record.get("_id", record.get("id"))
    if task_id is None:
        raise DatasetFormatError("record has neither '_id' nor 'id'")
    facts = record.get("supporting_facts")
    titles = _supporting_titles(facts)
    return (
        QATask(
            task_id=str(task_id),
            question=str(record["question"]),
            golden_answers=_answers(record["answer"]),
            question_type=str(record.get("type", "") or ""),
            # Hops = distinct supporting articles: 2 for HotpotQA, 2 or 4 for 2Wiki.
            n_hops=len(titles) or None,
            paragraphs=_context_paragraphs(record.get("context") or [], facts),
            dataset=name,
        ),
        (),
    )


def _from_musique(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    task_id = str(record["id"])
    question_type, n_hops = _musique_type(task_id)
    steps = tuple(
        DecompositionStep(question=str(step["question"]), answer=str(step["answer"]))
        for step in record.get("question_decomposition") or ()
    )
    return (
        QATask(
            task_id=task_id,
            question=str(record["question"]),
            golden_answers=_answers(record["answer"], record.get("answer_aliases")),
            question_type=question_type,
            n_hops=n_hops or (len(steps) or None),
            paragraphs=_listed_paragraphs(record.get("paragraphs") or ()),
            dataset=name,
        ),
        steps,
    )


def _from_popqa(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    answers = _json_list(record["possible_answers"], "possible_answers")
    return (
        QATask(
            task_id=str(record.get("id", f"{name}-{index}")),
            question=str(record["question"]),
            golden_answers=_answers(answers),
            question_type=str(record.get("prop", "") or ""),  # the Wikidata relation
            n_hops=1,  # one (subject, relation, object) triple per question
            paragraphs=_listed_paragraphs(record.get("paragraphs") or ()),
            dataset=name,
        ),
        (),
    )


def _from_nq_open(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    answers = record["answer"] if "answer" in record else record["answers"]
    return (
        QATask(
            task_id=str(record.get("id", f"{name}-{index}")),
            question=str(record["question"]),
            golden_answers=_answers(answers),
            dataset=name,
        ),
        (),
    )


def _from_bamboogle(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    # Rows come from `_read_csv` as {"question", "answers"}.
    return (
        QATask(
            task_id=f"{name}-{index}",
            question=str(record["question"]),
            golden_answers=_answers(record["answers"]),
            n_hops=2,  # every Bamboogle question is a 2-hop composition (Press et al. 2022)
            dataset=name,
        ),
        (),
    )


def _from_flashrag(record: Mapping[str, Any], index: int, name: str) -> Parsed:
    """FlashRAG / Search-R1 rows, and `QATask.to_json` lines (the `tracerl world` export).

    FlashRAG keeps the source dataset's own fields under `metadata`; where they include
    HotpotQA-style `context` or MuSiQue-style `paragraphs`, those become the paragraphs.
    """
    meta = record.get("metadata") or {}
    if not isinstance(meta, Mapping):
        meta = {}
    if "paragraphs" in record:
        paragraphs = _listed_paragraphs(record["paragraphs"])
    elif meta.get("paragraphs"):
        paragraphs = _listed_paragraphs(meta["paragraphs"])
    elif meta.get("context"):
        paragraphs = _context_paragraphs(meta["context"], meta.get("supporting_facts"))
    else:
        paragraphs = ()
    task_id = str(record.get("id", f"{name}-{index}"))
    question_type = str(record.get("question_type") or meta.get("type") or "")
    n_hops = record.get("n_hops") or len(_supporting_titles(meta.get("supporting_facts"))) or None
    if n_hops is None and _HOPS_PREFIX.match(task_id):
        question_type, n_hops = _musique_type(task_id)
    dataset = str(record.get("dataset") or record.get("data_source") or name)
    decomposition = record.get("decomposition")  # the synthetic world's export
    steps: tuple[DecompositionStep, ...] = ()
    if isinstance(decomposition, Mapping):
        steps = tuple(
            DecompositionStep(question=str(s["query"]), answer=str(s["answer"]))
            for s in decomposition.get("steps", ())
        )
    return (
        QATask(
            task_id=task_id,
            question=str(record["question"]),
            golden_answers=_answers(record["golden_answers"]),
            question_type=question_type,
            n_hops=int(n_hops) if n_hops is not None else None,
            supporting_doc_ids=tuple(str(d) for d in record.get("supporting_doc_ids") or ()),
            paragraphs=paragraphs,
            dataset=dataset,
        ),
        steps,
    )


@dataclass(frozen=True, slots=True)
class _Format:
    convert: Converter
    dataset: str
    """Default dataset name of tasks in this format."""
    description: str


FormatName = Literal[
    "hotpotqa",
    "hotpotqa-hf",
    "2wikimultihopqa",
    "musique",
    "bamboogle",
    "nq-open",
    "popqa",
    "flashrag",
]

FORMATS: dict[str, _Format] = {
    "hotpotqa": _Format(_from_hotpot_like, "hotpotqa", "HotpotQA official JSON/JSONL"),
    "hotpotqa-hf": _Format(_from_hotpot_like, "hotpotqa", "HotpotQA in the HF hotpot_qa schema"),
    "2wikimultihopqa": _Format(_from_hotpot_like, "2wikimultihopqa", "2WikiMultihopQA"),
    "musique": _Format(_from_musique, "musique", "MuSiQue JSONL or JSON array"),
    "bamboogle": _Format(_from_bamboogle, "bamboogle", "Bamboogle CSV (no header)"),
    "nq-open": _Format(_from_nq_open, "nq", "NQ-open / TriviaQA-open {question, answer[]}"),
    "popqa": _Format(_from_popqa, "popqa", "PopQA (HippoRAG-2 JSON, TSV or HF)"),
    "flashrag": _Format(_from_flashrag, "flashrag", "FlashRAG / Search-R1 {id, question, ...}"),
}
"""Format name -> converter. Names are what `--format` accepts."""
assert set(FORMATS) == set(get_args(FormatName))

_TWOWIKI_TYPES = {"compositional", "inference", "bridge_comparison"}


def _format_of_record(record: Mapping[str, Any]) -> str | None:
    """Guess a format from one record's keys; None when nothing fits."""
    keys = set(record)
    if "golden_answers" in keys:
        return "flashrag"
    if "question_decomposition" in keys or ("paragraphs" in keys and "answer_aliases" in keys):
        return "musique"
    if "possible_answers" in keys:
        return "popqa"
    if "context" in keys and "answer" in keys:
        if "evidences" in keys or "entity_ids" in keys or record.get("type") in _TWOWIKI_TYPES:
            return "2wikimultihopqa"
        return "hotpotqa-hf" if isinstance(record["context"], Mapping) else "hotpotqa"
    if "question" in keys and ("answer" in keys or "answers" in keys):
        return "nq-open"
    return None


def _check_format(fmt: str) -> _Format:
    if fmt not in FORMATS:
        raise UnknownBenchmarkNameError(_unknown(fmt, FORMATS, "format"))
    return FORMATS[fmt]


def _unknown(name: str, valid: Iterable[str], what: str) -> str:
    valid = list(valid)
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {what} {name!r}.{hint} Valid: {', '.join(valid)}."


# --- reading files -----------------------------------------------------------------------------


def _read_csv(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Bamboogle rows as {"question", "answers"}; header-less (the original sheet) or headed."""
    with path.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows:
        return
    header = [cell.strip().lower() for cell in rows[0]]
    if header and header[0] == "question":  # e.g. the HF mirror: Question,Answer
        answer_cols = [i for i, cell in enumerate(header) if cell.startswith("answer")]
        body = enumerate(rows[1:], start=2)
    else:  # original export: question,'','','',answer,answer_2,''
        answer_cols = [4, 5]
        body = enumerate(rows, start=1)
    for line_no, row in body:
        if not any(cell.strip() for cell in row):
            continue
        if len(row) <= max(answer_cols, default=0):
            raise DatasetFormatError(
                f"{path}:{line_no}: {len(row)} columns; Bamboogle rows have the question in "
                f"column 1 and answers in columns {[c + 1 for c in answer_cols]}"
            )
        yield f"{path}:{line_no}", {"question": row[0], "answers": [row[c] for c in answer_cols]}


def _read_tsv(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    with path.open(encoding="utf-8", newline="") as handle:
        for line_no, row in enumerate(csv.DictReader(handle, delimiter="\t"), start=2):
            yield f"{path}:{line_no}", dict(row)


def _read_parquet(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    import pyarrow.parquet as pq  # comes with `datasets`

    for row_no, row in enumerate(pq.read_table(path).to_pylist()):
        yield f"{path}[row {row_no}]", row


def _read_json(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """A JSON array of objects, or JSON Lines (blank lines skipped)."""
    with path.open(encoding="utf-8") as handle:
        head = handle.read(4096).lstrip()
    if head.startswith("["):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise DatasetFormatError(f"{path}: not valid JSON ({err})") from err
        for i, record in enumerate(data):
            yield f"{path}[{i}]", record
        return
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield f"{path}:{line_no}", json.loads(line)
            except json.JSONDecodeError as err:
                raise DatasetFormatError(
                    f"{path}:{line_no}: not a JSON object per line ({err.msg}); expected JSON "
                    "Lines or a JSON array"
                ) from err


def _read_records(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _read_csv(path)
    if suffix == ".tsv":
        return _read_tsv(path)
    if suffix == ".parquet":
        return _read_parquet(path)
    return _read_json(path)


def detect_format(path: str | Path) -> str:
    """Name the format of a dataset file from its content (first record) and extension.

    Raises:
        DatasetFormatError: the file is empty or no known format fits its first record.
    """
    path = Path(path)
    if path.suffix.lower() == ".csv":
        return "bamboogle"
    for where, record in _read_records(path):
        if not isinstance(record, Mapping):
            raise DatasetFormatError(
                f"{where}: expected a JSON object, got {type(record).__name__}"
            )
        fmt = _format_of_record(record)
        if fmt is None:
            raise DatasetFormatError(
                f"{where}: cannot tell the format from the keys {sorted(record)}; pass --format "
                f"(one of {', '.join(FORMATS)})"
            )
        return fmt
    raise DatasetFormatError(f"{path}: no records")


def _file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# --- building datasets -------------------------------------------------------------------------


def records_to_dataset(
    records: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    fmt: str,
    name: str | None,
    sources: Sequence[DatasetSource],
    limit: int | None = None,
) -> LoadedDataset:
    """Convert native records (each with a location for error messages) into a `LoadedDataset`.

    Raises:
        DatasetFormatError: a record lacks a field its format needs, has no answer, or repeats
            an id; the message names the record's location.
    """
    spec = _check_format(fmt)
    name = name or spec.dataset
    tasks: list[QATask] = []
    decompositions: dict[str, tuple[DecompositionStep, ...]] = {}
    first_seen: dict[str, str] = {}
    for index, (where, record) in enumerate(records):
        if limit is not None and index >= limit:
            break
        if not isinstance(record, Mapping):
            raise DatasetFormatError(f"{where}: expected an object, got {type(record).__name__}")
        try:
            task, steps = spec.convert(record, index, name)
        except KeyError as err:
            raise DatasetFormatError(
                f"{where}: missing field {err.args[0]!r} for format {fmt!r} "
                f"(record keys: {sorted(record)})"
            ) from err
        except (TypeError, ValueError, IndexError) as err:
            if isinstance(err, DatasetFormatError):
                raise DatasetFormatError(f"{where}: {err}") from err
            raise DatasetFormatError(f"{where}: malformed {fmt!r} record ({err})") from err
        if task.task_id in first_seen:
            raise DatasetFormatError(
                f"{where}: duplicate id {task.task_id!r} (first at {first_seen[task.task_id]})"
            )
        first_seen[task.task_id] = where
        tasks.append(task)
        if steps:
            decompositions[task.task_id] = steps
    return LoadedDataset(
        name=name, tasks=TaskSet(tasks), sources=tuple(sources), decompositions=decompositions
    )


_SPLIT_NAMES = frozenset({"train", "dev", "test", "val", "validation"})
_READABLE = frozenset({".jsonl", ".json", ".csv", ".tsv", ".parquet"})


def load_file(
    path: str | Path,
    *,
    format: str | None = None,
    name: str | None = None,
    limit: int | None = None,
) -> LoadedDataset:
    """Load a local dataset file in any of `FORMATS`.

    Args:
        path: a JSON, JSONL, CSV, TSV or Parquet file.
        format: one of `FORMATS`; None detects it from the content.
        name: the dataset name in reports; None takes, for FlashRAG rows, their own
            `dataset`/`data_source` field, else the folder of a FlashRAG_datasets layout
            (`hotpotqa/dev.jsonl` is `hotpotqa`), else the format's name (`hotpotqa`, ...).
        limit: keep only the first `limit` records.

    Returns:
        The tasks, with the file's SHA-256 as provenance.

    Raises:
        DatasetFormatError: the file is missing, unreadable, or not in the format.
        UnknownBenchmarkNameError: `format` is not a known format.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in _READABLE)[:5]
        hint = f" (it holds {', '.join(inside)})" if inside else ""
        raise DatasetFormatError(
            f"dataset file {path} is a folder{hint}; pass the files in it, e.g. {path}/*.jsonl"
        )
    if not path.is_file():
        raise DatasetFormatError(f"dataset file {path} does not exist")
    fmt = format or detect_format(path)
    _check_format(fmt)
    if name is None and fmt == "flashrag" and path.stem in _SPLIT_NAMES:
        name = path.parent.name  # FlashRAG_datasets layout: <name>/<split>.jsonl
    log.info("loading %s as %s", path, fmt)
    source = DatasetSource(kind="file", location=str(path), format=fmt, sha256=_file_sha256(path))
    try:
        return records_to_dataset(
            _read_records(path), fmt=fmt, name=name, sources=[source], limit=limit
        )
    except UnicodeDecodeError as err:
        raise DatasetFormatError(f"{path}: not valid UTF-8 ({err})") from err


@dataclass(frozen=True, slots=True, kw_only=True)
class HubDataset:
    """A dataset name's place on the Hugging Face Hub."""

    repo: str
    config: str | None
    split: str
    format: str
    description: str


def _flashrag(config: str, split: str, what: str) -> HubDataset:
    return HubDataset(
        repo=FLASHRAG_REPO, config=config, split=split, format="flashrag", description=what
    )


# The Search-R1 protocol evaluates on FlashRAG's copies (test split, else dev), so the plain
# names point there; `-distractor`/`-open` names load the original releases with paragraphs.
DATASETS: dict[str, HubDataset] = {
    "nq": _flashrag("nq", "test", "Natural Questions (FlashRAG test = NQ-open dev, 3,610)"),
    "triviaqa": _flashrag("triviaqa", "test", "TriviaQA (FlashRAG test, 11,313)"),
    "popqa": _flashrag("popqa", "test", "PopQA (FlashRAG test, 14,267)"),
    "hotpotqa": _flashrag("hotpotqa", "dev", "HotpotQA (FlashRAG dev, 7,405)"),
    "2wikimultihopqa": _flashrag("2wikimultihopqa", "dev", "2WikiMultihopQA (FlashRAG dev)"),
    "musique": _flashrag("musique", "dev", "MuSiQue-Ans (FlashRAG dev, 2,417)"),
    "bamboogle": _flashrag("bamboogle", "test", "Bamboogle (FlashRAG test, 125)"),
    "hotpotqa-distractor": HubDataset(
        repo="hotpotqa/hotpot_qa",
        config="distractor",
        split="validation",
        format="hotpotqa-hf",
        description="HotpotQA dev, distractor setting, with its 10 paragraphs per question",
    ),
    "nq-open": HubDataset(
        repo="google-research-datasets/nq_open",
        config="nq_open",
        split="validation",
        format="nq-open",
        description="NQ-open dev (3,610), the original release",
    ),
}
"""Dataset name -> hub location. `synthetic` (the embedded world) is handled by the CLI."""

ALIASES: dict[str, str] = {"2wiki": "2wikimultihopqa", "hotpot": "hotpotqa", "tqa": "triviaqa"}


def _hub_error_hint(repo: str, config: str | None, split: str) -> str:
    where = f"{repo}" + (f" (config {config!r})" if config else "") + f", split {split!r}"
    return (
        f"could not load {where} from the Hugging Face Hub. If this machine is offline "
        "(HF_HUB_OFFLINE=1 or no network), download the data elsewhere, e.g. "
        f"`hf download --repo-type dataset {repo} --local-dir DIR`, then either pass the file with "
        "`tracerl bench --data-file PATH` (formats: "
        f"{', '.join(FORMATS)}) or point `--hub-path` at the downloaded folder."
    )


def _check_hub_reachable(repo: str, config: str | None, split: str) -> None:
    """Fail in seconds when the hub cannot be reached, rather than after `datasets`' retries.

    Offline without HF_HUB_OFFLINE, `datasets` spends many seconds in connection retries before
    it gives up; one TCP connect with a short timeout tells the same at once.

    Raises:
        DatasetUnavailable: the hub's host does not accept a connection.
    """
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return  # `datasets` itself fails at once, with the cache's answer
    if any(os.environ.get(v) for v in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return  # the hub is reached through a proxy; a direct connect proves nothing
    endpoint = urlsplit(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=_HUB_CONNECT_TIMEOUT_S).close()
    except OSError as err:
        raise DatasetUnavailable(
            f"{_hub_error_hint(repo, config, split)} Cause: cannot connect to {host}:{port} ({err})"
        ) from err


_HUB_CONNECT_TIMEOUT_S = 3.0  # a reachable hub answers a TCP connect in well under a second


def load_hub(
    repo: str,
    *,
    config: str | None = None,
    split: str,
    format: str | None = None,
    name: str | None = None,
    limit: int | None = None,
    cache_dir: str | Path | None = None,
) -> LoadedDataset:
    """Load a dataset with `datasets.load_dataset`: a hub repo, or a local folder laid out like one.

    Args:
        repo: a hub repo id (`RUC-NLPIR/FlashRAG_datasets`) or a local folder with data files
            (and optionally a README.md whose YAML lists the configs).
        config: the config name (`hotpotqa`, `distractor`), or None for the default one.
        split: the split (`dev`, `test`, `validation`).
        format: one of `FORMATS`; None detects it from the first record.
        name: the dataset name in reports (default: the format's).
        limit: keep only the first `limit` records.
        cache_dir: the `datasets` cache folder (default: `datasets`' own).

    Raises:
        DatasetUnavailable: the hub cannot be reached (offline) or has no such repo; the
            message says how to use local files instead.
        UnknownBenchmarkNameError: the repo has no such config or split.
        DatasetFormatError: the records are not in the format.
    """
    if not Path(repo).is_dir():
        _check_hub_reachable(repo, config, split)
    import datasets  # heavy; only this path needs it

    try:
        data = datasets.load_dataset(
            repo, config, split=split, cache_dir=None if cache_dir is None else str(cache_dir)
        )
    except (ConnectionError, FileNotFoundError) as err:
        raise DatasetUnavailable(f"{_hub_error_hint(repo, config, split)} Cause: {err}") from err
    except ValueError as err:  # unknown config or split; `datasets` lists the valid ones
        raise UnknownBenchmarkNameError(f"{repo}: {err}") from err
    location = f"{repo}" + (f":{config}" if config else "") + f"@{split}"
    if limit is not None:
        data = data.select(range(min(limit, len(data))))
    records = [(f"{location}[{i}]", row) for i, row in enumerate(data)]
    if format is None:
        if not records:
            raise DatasetFormatError(f"{location}: no records")
        format = _format_of_record(records[0][1])
        if format is None:
            raise DatasetFormatError(
                f"{location}: cannot tell the format from the columns {data.column_names}; "
                f"pass a format (one of {', '.join(FORMATS)})"
            )
    source = DatasetSource(kind="hub", location=location, format=format)
    return records_to_dataset(records, fmt=format, name=name, sources=[source])


def load_named(
    name: str,
    *,
    split: str | None = None,
    limit: int | None = None,
    hub_path: str | Path | None = None,
    cache_dir: str | Path | None = None,
) -> LoadedDataset:
    """Load a dataset by its registry name (`DATASETS`), from the hub or a local copy of it.

    Args:
        name: a key of `DATASETS` (or an alias such as `2wiki`).
        split: override the registry's split.
        limit: keep only the first `limit` records.
        hub_path: a local folder to use in place of the hub repo (a downloaded snapshot).
        cache_dir: the `datasets` cache folder.

    Raises:
        UnknownBenchmarkNameError: the name is not registered (with the closest names).
        DatasetUnavailable: offline and no `hub_path`.
    """
    key = ALIASES.get(name, name)
    if key not in DATASETS:
        raise UnknownBenchmarkNameError(_unknown(name, [*DATASETS, "synthetic"], "dataset"))
    spec = DATASETS[key]
    return load_hub(
        str(hub_path) if hub_path is not None else spec.repo,
        config=spec.config,
        split=split or spec.split,
        format=spec.format,
        name=key,
        limit=limit,
        cache_dir=cache_dir,
    )


def combine(parts: Sequence[LoadedDataset]) -> LoadedDataset:
    """Concatenate datasets; a task id seen twice with the same question is kept once.

    The shared HotpotQA samples overlap (18 ids between two files), so combining them must not
    fail on, or double-count, the overlap.

    Raises:
        DatasetFormatError: one id names two different questions.
    """
    if len(parts) == 1:
        return parts[0]
    tasks: dict[str, QATask] = {}
    decompositions: dict[str, tuple[DecompositionStep, ...]] = {}
    n_dropped = 0
    for part in parts:
        for task in part.tasks:
            seen = tasks.get(task.task_id)
            if seen is None:
                tasks[task.task_id] = task
            elif seen.question == task.question:
                n_dropped += 1
            else:
                raise DatasetFormatError(
                    f"task id {task.task_id!r} names two different questions: "
                    f"{seen.question!r} and {task.question!r}"
                )
        decompositions.update(part.decompositions)
    if n_dropped:
        log.info("combined datasets: %d duplicate tasks kept once", n_dropped)
    names = list(dict.fromkeys(p.name for p in parts))
    return LoadedDataset(
        name="+".join(names),
        tasks=TaskSet(tasks.values()),
        sources=tuple(s for p in parts for s in p.sources),
        decompositions={k: v for k, v in decompositions.items() if k in tasks},
    )
