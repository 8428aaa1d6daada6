"""The manifest of an index directory: what an index is, what it was built from, and how.

Every index directory holds a `manifest.json`:

```json
{"schema_version": 1, "kind": "bm25", "index_id": "bm25-…", "corpus_hash": "…",
 "n_documents": 9572, "encoder": null, "params": {"stemmer": "english", …},
 "created_at": "2025-11-29T14:26:00+00:00",
 "files": {"corpus.jsonl": {"size": 5012345, "sha256": "…"}, "bm25s/params.index.json": …}}
```

`kind` says which class loads the directory (`retrieval.load_index` dispatches on it),
`corpus_hash` is `retrieval.corpus.corpus_hash` of the `corpus.jsonl` beside it, and
`index_id` is the content hash that every cache key carries. `files` is the size and SHA-256
of every other file in the directory (`retrieval.index_files`); `read_manifest` refuses a
directory whose files are missing, of another size or not in it, and a table that lacks a file
its kind needs (`REQUIRED_FILES`: a BM25 index without `corpus.jsonl` cannot open, so a table
without it describes a broken build). A manifest written before the table existed (no `files`)
still opens, with a warning that its files are unchecked; `tracerl index verify` refuses it,
since it has nothing to check against.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, get_args

from retrieval.errors import IndexFileError, IndexFormatError, IndexMismatchError
from retrieval.index_files import (
    FileEntry,
    check_sizes,
    file_table,
    table_from_json,
    table_to_json,
    verify_hashes,
)

__all__ = [
    "CORPUS_NAME",
    "MANIFEST_NAME",
    "REQUIRED_FILES",
    "SCHEMA_VERSION",
    "IndexKind",
    "IndexManifest",
    "make_index_id",
    "read_manifest",
]

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"
CORPUS_NAME = "corpus.jsonl"
IndexKind = Literal["bm25", "dense"]
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "bm25": (
        CORPUS_NAME,
        "bm25s/data.csc.index.npy",
        "bm25s/indices.csc.index.npy",
        "bm25s/indptr.csc.index.npy",
        "bm25s/params.index.json",
        "bm25s/vocab.index.json",
    ),
    "dense": (CORPUS_NAME, "index.faiss"),
}
"""The files an index of each kind cannot open without: its manifest's table must list them."""


def make_index_id(kind: str, corpus_hash: str, params: dict[str, Any]) -> str:
    """The content hash of an index: its kind, its corpus and its build parameters.

    >>> make_index_id("bm25", "ab" * 32, {"stemmer": None})
    'bm25-ec68f4f90669b0ab'
    """
    payload = json.dumps([kind, corpus_hash, params], sort_keys=True, ensure_ascii=False)
    return f"{kind}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


@dataclass(frozen=True, slots=True, kw_only=True)
class IndexManifest:
    """What an index directory holds; written as `manifest.json`."""

    kind: str
    """`"bm25"` or `"dense"`."""
    corpus_hash: str
    """`retrieval.corpus.corpus_hash` of the indexed documents."""
    n_documents: int
    params: dict[str, Any] = field(default_factory=dict)
    """The build parameters (tokenizer and BM25 constants, or encoder options and faiss type)."""
    encoder: str | None = None
    """The dense encoder (a model directory or name); None for BM25."""
    created_at: str = ""
    """ISO-8601 UTC time of the build; informative only, never part of `index_id`."""
    schema_version: int = SCHEMA_VERSION
    files: dict[str, FileEntry] | None = None
    """size and SHA-256 of every other file of the directory, filled by `write`; None for a
    manifest written before this table existed (never part of `index_id`: a deterministic
    build of the same corpus and params writes the same files)"""

    @property
    def index_id(self) -> str:
        """The content hash of kind, corpus and params (`make_index_id`)."""
        return make_index_id(self.kind, self.corpus_hash, self.params)

    def to_json(self) -> dict[str, Any]:
        """The JSON object stored in `manifest.json`."""
        return {
            "schema_version": self.schema_version,
            "kind": self.kind,
            "index_id": self.index_id,
            "corpus_hash": self.corpus_hash,
            "n_documents": self.n_documents,
            "encoder": self.encoder,
            "params": self.params,
            "created_at": self.created_at,
            **({} if self.files is None else {"files": table_to_json(self.files)}),
        }

    @classmethod
    def from_json(cls, record: Any, *, source: str = "manifest") -> IndexManifest:
        """Validate and read a manifest object.

        Raises:
            IndexFormatError: a field is missing or has the wrong type, the schema version is
                not this code's, the kind is unknown, or the stored `index_id` disagrees with
                the one its fields hash to (a hand-edited manifest).
        """
        if not isinstance(record, dict):
            raise IndexFormatError(f"{source}: expected a JSON object")
        version = record.get("schema_version")
        if version != SCHEMA_VERSION:
            raise IndexFormatError(
                f"{source}: schema_version {version!r}, but this trace-rl reads version "
                f"{SCHEMA_VERSION}; rebuild the index with `tracerl index build`"
            )
        expected = {
            "kind": str,
            "corpus_hash": str,
            "n_documents": int,
            "params": dict,
            "created_at": str,
            "index_id": str,
        }
        for name, kind in expected.items():
            if not isinstance(record.get(name), kind):
                raise IndexFormatError(f"{source}: field {name!r} missing or not a {kind.__name__}")
        if record["kind"] not in get_args(IndexKind):
            raise IndexFormatError(
                f"{source}: unknown index kind {record['kind']!r}; "
                f"expected one of {list(get_args(IndexKind))}"
            )
        encoder = record.get("encoder")
        if encoder is not None and not isinstance(encoder, str):
            raise IndexFormatError(f"{source}: field 'encoder' must be a string or null")
        manifest = cls(
            kind=record["kind"],
            corpus_hash=record["corpus_hash"],
            n_documents=record["n_documents"],
            params=record["params"],
            encoder=encoder,
            created_at=record["created_at"],
            files=None
            if "files" not in record
            else table_from_json(record["files"], source=source),
        )
        if manifest.index_id != record["index_id"]:
            raise IndexMismatchError(
                f"{source}: index_id {record['index_id']!r} does not match its fields "
                f"(they hash to {manifest.index_id!r}); the manifest was edited or corrupted"
            )
        return manifest

    def write(self, directory: str | Path) -> IndexManifest:
        """Write `manifest.json` into `directory`, last, with the table of the files there.

        Returns:
            This manifest with its `files` table.
        """
        table = file_table(directory, exclude={MANIFEST_NAME})
        for name in REQUIRED_FILES.get(self.kind, ()):
            if name not in table:  # bm25s recreates its own folder in a vanished directory
                raise IndexFileError(
                    Path(directory) / name,
                    f"was not written, and a {self.kind} index needs it: the build directory "
                    "was changed by another process during the build; nothing was saved, build "
                    "again",
                )
        done = dataclasses.replace(self, files=table)
        path = Path(directory) / MANIFEST_NAME
        path.write_text(json.dumps(done.to_json(), indent=2, ensure_ascii=False) + "\n")
        return done

    def check_files(self, directory: str | Path, *, hashes: bool = False) -> None:
        """Compare the directory's files with the table: sizes and names, and `hashes` too.

        Raises:
            IndexFileError: naming the missing, resized, changed or extra file, or a file the
                index's kind needs that the table does not list.
            IndexFormatError: `hashes` is asked of a manifest with no table (nothing to
                check the files against).
        """
        if self.files is None:
            if hashes:
                raise IndexFormatError(
                    f"cannot verify {directory}: its {MANIFEST_NAME} has no file table (it was "
                    "written before manifests listed their files), so there is nothing to check "
                    "its files against; rebuild it (`tracerl index build --overwrite`)"
                )
            log.warning(
                "%s was written before index manifests listed their files: its files are not "
                "checked; rebuild it (`tracerl index build --overwrite`) to get the checks",
                directory,
            )
            return
        for name in REQUIRED_FILES.get(self.kind, ()):
            if name not in self.files:
                raise IndexFileError(
                    Path(directory) / name,
                    f"is not in the manifest's file table, and a {self.kind} index cannot open "
                    "without it: the build was interrupted or raced another; rebuild the index",
                )
        check_sizes(directory, self.files, exclude={MANIFEST_NAME})
        if hashes:
            verify_hashes(directory, self.files)

    def expect(self, *, kind: str | None = None, corpus_hash: str | None = None) -> None:
        """Check that this manifest is what a caller expects.

        Raises:
            IndexMismatchError: naming the field that differs and both values.
        """
        if kind is not None and self.kind != kind:
            raise IndexMismatchError(
                f"index is of kind {self.kind!r}, expected {kind!r}; "
                "use retrieval.load_index(dir) to load any kind"
            )
        if corpus_hash is not None and self.corpus_hash != corpus_hash:
            raise IndexMismatchError(
                f"index was built from corpus {self.corpus_hash[:12]}…, expected "
                f"{corpus_hash[:12]}…; rebuild it with `tracerl index build`"
            )


def now_utc() -> str:
    """The current UTC time as ISO-8601 seconds, for `IndexManifest.created_at`."""
    return datetime.now(UTC).isoformat(timespec="seconds")


def read_manifest(directory: str | Path) -> IndexManifest:
    """Read and validate `directory/manifest.json`, and check its files' sizes against it.

    Raises:
        IndexFormatError: the directory or manifest is missing or malformed.
        IndexFileError: a file is missing, of another size, or not in the manifest.
        IndexMismatchError: the stored index_id disagrees with the manifest's fields.
    """
    path = Path(directory) / MANIFEST_NAME
    if not Path(directory).is_dir():
        if Path(directory).exists():
            raise IndexFormatError(f"{directory} is not a directory: an index is a directory")
        raise IndexFormatError(f"index directory {directory} does not exist")
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as err:
        raise IndexFormatError(
            f"{path} not found: {directory} is not an index directory "
            "(build one with `tracerl index build --corpus C.jsonl --kind bm25 --out DIR`)"
        ) from err
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise IndexFormatError(f"{path}: unreadable manifest ({err})") from err
    manifest = IndexManifest.from_json(record, source=str(path))
    manifest.check_files(directory)
    return manifest
