"""Corpus files: the Search-R1 / FlashRAG JSONL format, and a content hash of a corpus.

One JSON object per line, `{"id": str, "contents": "\\"Title\\"\\ntext"}` (the form of
`PeterJinGo/wiki-18-corpus`); `{"id", "title", "text"}` lines are read too. Blank lines are
skipped. Document ids must be unique, because hits, caches and snapshots name documents by id.
"""

from __future__ import annotations

import hashlib
import json
import logging
import stat
from collections.abc import Iterable, Sequence
from pathlib import Path

from retrieval.base import Document
from retrieval.errors import IndexFormatError

__all__ = [
    "MAX_CORPUS_BYTES",
    "check_regular_file",
    "corpus_hash",
    "index_text",
    "read_corpus",
    "write_corpus",
]

log = logging.getLogger(__name__)

MAX_CORPUS_BYTES = 16 << 30
"""The largest corpus `read_corpus` reads into memory (wiki-18's 14 GB passes; a larger one is
served from its file by `retrieval.PrebuiltRetriever`, which never loads it)."""


def check_regular_file(path: Path, *, what: str, max_bytes: int) -> None:
    """Refuse, before opening it, a path that is not a regular file or is over `max_bytes`.

    Opening a FIFO blocks until a writer comes (forever, for a typo), and a device such as
    `/dev/zero` never ends; `stat` tells both apart from a file without blocking.

    Raises:
        IndexFormatError: naming `what`, the path and the problem.
    """
    try:
        info = path.stat()
    except OSError as err:
        raise IndexFormatError(f"cannot read {what} {path}: {err.strerror}") from err
    if not stat.S_ISREG(info.st_mode):
        raise IndexFormatError(
            f"{what} {path} is not a regular file (a directory, FIFO or device); give a file"
        )
    if info.st_size > max_bytes:
        raise IndexFormatError(
            f"{what} {path} holds {info.st_size:,} bytes, over the {max_bytes:,} read into memory"
        )


def read_corpus(path: str | Path) -> list[Document]:
    """Read a JSONL corpus file.

    Args:
        path: a file of `{"id", "contents"}` (or `{"id", "title", "text"}`) lines.

    Returns:
        The documents, in file order.

    Raises:
        IndexFormatError: the file is missing or unreadable, not a regular file, over
            `MAX_CORPUS_BYTES`, a line is not a JSON object with a string `id` and a string
            `contents` (or `text`), or an id repeats. The message names the file and the
            1-based line number.
    """
    path = Path(path)
    check_regular_file(path, what="corpus", max_bytes=MAX_CORPUS_BYTES)
    try:
        handle = path.open(encoding="utf-8")
    except OSError as err:
        raise IndexFormatError(f"cannot read corpus {path}: {err}") from err
    docs: list[Document] = []
    first_line: dict[str, int] = {}
    with handle:
        try:
            for line_no, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                doc = _parse_line(line, path, line_no)
                if doc.doc_id in first_line:
                    raise IndexFormatError(
                        f"{path}:{line_no}: duplicate document id {doc.doc_id!r} "
                        f"(first seen on line {first_line[doc.doc_id]}); ids must be unique"
                    )
                first_line[doc.doc_id] = line_no
                docs.append(doc)
        except UnicodeDecodeError as err:
            raise IndexFormatError(f"{path}: not valid UTF-8 ({err})") from err
    log.debug("read %d documents from %s", len(docs), path)
    return docs


def _parse_line(line: str, path: Path, line_no: int) -> Document:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise IndexFormatError(f"{path}:{line_no}: not valid JSON ({err.msg})") from err
    if not isinstance(record, dict):
        raise IndexFormatError(
            f"{path}:{line_no}: expected a JSON object, got {type(record).__name__}"
        )
    if not isinstance(record.get("id"), str):
        raise IndexFormatError(f'{path}:{line_no}: missing or non-string "id"')
    body = "contents" if "contents" in record else "text"
    if not isinstance(record.get(body), str):
        raise IndexFormatError(
            f'{path}:{line_no}: missing or non-string "contents" (or "text"); '
            'expected {"id": str, "contents": "\\"Title\\"\\ntext"}'
        )
    if "title" in record and not isinstance(record["title"], str):
        raise IndexFormatError(f'{path}:{line_no}: non-string "title"')
    return Document.from_json(record)


def write_corpus(docs: Iterable[Document], path: str | Path) -> None:
    """Write documents as a JSONL corpus, one `{"id", "contents"}` per line (UTF-8).

    Args:
        docs: the documents, written in order.
        path: the output file; its parent folder is created if needed.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for doc in docs:
            handle.write(json.dumps(doc.to_json(), ensure_ascii=False) + "\n")


def index_text(doc: Document) -> str:
    """The text an index sees for a document: its title, a newline, its text.

    >>> index_text(Document(doc_id="1", title="Paris", text="Capital of France."))
    'Paris\\nCapital of France.'
    """
    return f"{doc.title}\n{doc.text}"


def corpus_hash(docs: Sequence[Document]) -> str:
    """A SHA-256 hex digest of the documents' ids, titles and texts, in order.

    Two corpora hash equal exactly when they hold the same documents in the same order, so
    the hash identifies what an index was built from.

    >>> corpus_hash([Document(doc_id="1", title="A", text="a")])[:12]
    '67be51d05a03'
    """
    digest = hashlib.sha256()
    for doc in docs:
        # A JSON array per document: unambiguous field boundaries whatever the text holds.
        digest.update(json.dumps([doc.doc_id, doc.title, doc.text], ensure_ascii=False).encode())
        digest.update(b"\n")
    return digest.hexdigest()
