"""Typed errors of the retrieval package.

Each error also inherits the nearest builtin, so generic handlers (`except ConnectionError`)
still work.
"""

from __future__ import annotations

__all__ = [
    "EncoderError",
    "IndexBusyError",
    "IndexChangedError",
    "IndexFileError",
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


class IndexFileError(IndexFormatError):
    """A file of an index directory is missing, of the wrong size or content, or unexpected.

    `path` names the file; a server answers 409 with it, since retrying cannot help.
    """

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = str(path)


class IndexChangedError(IndexFileError):
    """A file of an open index was replaced or changed under it; reopen the index."""


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


class IndexBusyError(RetrievalError, BlockingIOError):
    """Another build holds the lock beside an index's directory: this one is refused at once.

    `pid` is the holder's process id (None when it could not be read).
    """

    def __init__(self, message: str, pid: int | None) -> None:
        super().__init__(message)
        self.pid = pid
