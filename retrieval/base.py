"""The retrieval contract: documents, hits, and the `Retriever` protocol.

Every retriever in this package (BM25, dense, HTTP, cached) and every user-supplied one meets
`Retriever`: a batch of queries in, one ranked list of `Hit`s per query out. Environments depend
only on this module, never on a concrete index.

Corpus files use the Search-R1 / FlashRAG JSONL format, one `{"id": str, "contents": str}` per
line, where `contents` is `"Title"\\ntext` (the title in double quotes on the first line).
"""

from __future__ import annotations

import operator
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "Document",
    "Encoder",
    "Hit",
    "Retriever",
    "check_k",
    "check_queries",
    "format_contents",
    "normalize_query",
    "parse_contents",
]


def format_contents(title: str, text: str) -> str:
    """Join a title and a text into Search-R1's `contents` string.

    >>> format_contents("Paris", "Paris is the capital of France.")
    '"Paris"\\nParis is the capital of France.'
    """
    return f'"{title}"\n{text}'


def parse_contents(contents: str) -> tuple[str, str]:
    """Split Search-R1's `contents` string into (title, text).

    The first line is the title, with one pair of surrounding double quotes removed if present.
    A string with no newline is all text and has an empty title.

    >>> parse_contents('"Paris"\\nParis is the capital of France.')
    ('Paris', 'Paris is the capital of France.')
    >>> parse_contents("no title here")
    ('', 'no title here')
    """
    if "\n" not in contents:
        return "", contents
    title, text = contents.split("\n", 1)
    if len(title) >= 2 and title[0] == '"' and title[-1] == '"':
        title = title[1:-1]
    return title, text


@dataclass(frozen=True, slots=True, kw_only=True)
class Document:
    """One passage of a corpus."""

    doc_id: str
    title: str
    text: str

    @property
    def contents(self) -> str:
        """The Search-R1 `contents` string, `"Title"\\ntext`."""
        return format_contents(self.title, self.text)

    def to_json(self) -> dict[str, str]:
        """The corpus-line form `{"id", "contents"}`."""
        return {"id": self.doc_id, "contents": self.contents}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Document:
        """Read a corpus line `{"id", "contents"}` (or `{"id", "title", "text"}`)."""
        if "contents" in record:
            title, text = parse_contents(str(record["contents"]))
        else:
            title, text = str(record.get("title", "")), str(record["text"])
        return cls(doc_id=str(record["id"]), title=title, text=text)


@dataclass(frozen=True, slots=True, kw_only=True)
class Hit:
    """One retrieved document with its score (higher is better)."""

    doc_id: str
    title: str
    text: str
    score: float

    @property
    def contents(self) -> str:
        """The Search-R1 `contents` string, `"Title"\\ntext`."""
        return format_contents(self.title, self.text)

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict, the form snapshots and caches store."""
        return {"id": self.doc_id, "title": self.title, "text": self.text, "score": self.score}

    @classmethod
    def from_json(cls, record: dict[str, Any]) -> Hit:
        """Inverse of `to_json`."""
        return cls(
            doc_id=str(record["id"]),
            title=str(record["title"]),
            text=str(record["text"]),
            score=float(record["score"]),
        )


@runtime_checkable
class Retriever(Protocol):
    """Anything that ranks documents for a batch of queries.

    Implementations must be deterministic for a fixed index: the same (query, k) gives the same
    hits in the same order. `index_id` identifies the index content (a hash), so that caches
    keyed on it never mix results from two different indexes.
    """

    @property
    def index_id(self) -> str:
        """A stable identifier of the index content; part of every cache key."""
        ...

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Return the top-`k` hits for each query, in the queries' order."""
        ...


@runtime_checkable
class Encoder(Protocol):
    """Turns texts into unit-length vectors for a dense index (`retrieval.SentenceEncoder`)."""

    @property
    def name(self) -> str:
        """How to load this encoder again: a model folder, or a known name."""
        ...

    @property
    def fingerprint(self) -> str:
        """A hash of the model's weights and configuration; part of a dense index's id."""
        ...

    @property
    def dim(self) -> int:
        """The embedding size."""
        ...

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embed texts as float32 rows of unit L2 norm, shape (len(texts), dim)."""
        ...


_WHITESPACE = re.compile(r"\s+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def normalize_query(query: str) -> str:
    """The canonical form of a query: its cache key, and what every retriever is sent.

    Every surrogate code point becomes U+FFFD (a lone surrogate is not text: UTF-8 cannot
    encode it, so no server could receive it), then Unicode NFKC (full-width letters and
    ligatures fold to plain ones), then lowercase, then every run of whitespace becomes one
    space, then leading and trailing spaces go. Punctuation is kept: it can matter to a
    retriever. NFKC can lengthen a text (U+FDFA becomes 18 characters), so a length limit
    applies to the result, never to the input (`envs.protocol.parse_action` does that).

    >>> normalize_query("  Who  FOUNDED\\tＡcme?\\n")
    'who founded acme?'
    >>> normalize_query("a\\ud800b")
    'a\\ufffdb'
    """
    text = _SURROGATE.sub("\ufffd", query)
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text).lower()).strip()


def check_queries(queries: Sequence[str], *, text: bool = True) -> list[str]:
    """Validate a batch of queries; return it as a list.

    Every retriever, local or remote, applies this same rule, so they refuse the same inputs.

    Args:
        queries: the batch.
        text: also refuse surrogate code points (False for a caller that normalises them away).

    Raises:
        TypeError: `queries` is a bare string (a common slip: it is a Sequence of characters),
            or holds a non-string.
        ValueError: a query holds a surrogate code point, which is not text (UTF-8 cannot
            encode it, so a server could never receive it); `retrieval.cache.normalize_query`
            replaces them.
    """
    if isinstance(queries, str):
        raise TypeError("queries must be a sequence of strings, not one string; wrap it: [query]")
    out = list(queries)
    for i, query in enumerate(out):
        if not isinstance(query, str):
            raise TypeError(f"queries[{i}] is a {type(query).__name__}, expected str")
        found = _SURROGATE.search(query) if text else None
        if found:
            raise ValueError(
                f"queries[{i}] holds the lone surrogate U+{ord(found.group()):04X} at "
                f"{found.start()}, which is not text; normalize_query() replaces it"
            )
    return out


def check_k(k: int) -> int:
    """Validate a top-k.

    Raises:
        ValueError: `k` is not a positive integer.
    """
    try:
        value = operator.index(k)  # int or numpy integer, never a float
    except TypeError:
        value = 0
    if isinstance(k, bool) or value < 1:
        raise ValueError(f"k must be a positive integer, got {k!r}")
    return value
