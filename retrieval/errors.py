"""Typed errors of the retrieval package.

Each error also inherits the nearest builtin, so generic handlers (`except ConnectionError`)
still work.
"""

from __future__ import annotations

__all__ = [
    "IndexFormatError",
    "IndexMismatchError",
    "RetrievalError",
    "RetrieverUnavailable",
]


class RetrievalError(Exception):
    """Base class of every retrieval error."""


class RetrieverUnavailable(RetrievalError, ConnectionError):
    """A retriever (usually a server) did not answer within its retry budget."""


class IndexMismatchError(RetrievalError, ValueError):
    """An index on disk does not match what the caller expects (kind, corpus hash, encoder)."""


class IndexFormatError(RetrievalError, ValueError):
    """An index directory or corpus file is missing, malformed or of an unknown version."""
