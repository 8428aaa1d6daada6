"""Typed errors of the retrieval package.

Each error also inherits the nearest builtin, so generic handlers (`except ConnectionError`)
still work.
"""

from __future__ import annotations

__all__ = [
    "EncoderError",
    "IndexFormatError",
    "IndexMismatchError",
    "InvalidRequest",
    "RequestRejected",
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


class RequestRejected(RetrievalError, ValueError):
    """A retrieval server refused a request as invalid (a 4xx); retrying cannot help."""


class EncoderError(RetrievalError, ImportError):
    """The dense encoder cannot be loaded: a package is missing or the model folder is bad."""


class InvalidRequest(RetrievalError, ValueError):
    """A `/retrieve` body breaks the protocol or a server limit (the server answers `status`)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
