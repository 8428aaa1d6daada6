"""Retrieval for search agents: the `Retriever` contract, BM25 and dense indexes, HTTP, caching."""

from retrieval.base import Document, Hit, Retriever, format_contents, parse_contents
from retrieval.errors import (
    IndexFormatError,
    IndexMismatchError,
    RetrievalError,
    RetrieverUnavailable,
)

__all__ = [
    "Document",
    "Hit",
    "IndexFormatError",
    "IndexMismatchError",
    "RetrievalError",
    "Retriever",
    "RetrieverUnavailable",
    "format_contents",
    "parse_contents",
]
