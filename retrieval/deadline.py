"""An overall deadline for the retrieval done inside a block, whatever wraps the retriever.

A caller that must bound one unit of work (an env step) opens `with deadline(10.0):` around it.
`HTTPRetriever` reads the innermost deadline and ends its retries there: every attempt's
timeouts and every backoff sleep are cut to the time left, and once none is left it raises
`RetrieverUnavailable`. The deadline lives in a `contextvars.ContextVar`, so it passes through
wrappers (`CachedRetriever`, user retrievers) without any change to the `Retriever` protocol,
and it is private to the thread or asyncio task that set it. Local indexes ignore it: they do
not wait on anything.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["deadline", "deadline_at"]

_END: ContextVar[float | None] = ContextVar("retrieval_deadline", default=None)


@contextmanager
def deadline(seconds: float | None) -> Iterator[None]:
    """Bound the remote retrieval inside the block to `seconds` in all (None: no bound).

    Nested blocks keep the earlier of the two ends.

    >>> with deadline(5.0):
    ...     0 < deadline_at() - time.monotonic() <= 5.0
    True
    >>> deadline_at() is None
    True
    """
    if seconds is None:
        yield
        return
    if seconds <= 0:
        raise ValueError(f"a deadline must be positive seconds or None, got {seconds}")
    end = time.monotonic() + seconds
    outer = _END.get()
    token = _END.set(end if outer is None else min(end, outer))
    try:
        yield
    finally:
        _END.reset(token)


def deadline_at() -> float | None:
    """The innermost deadline as a `time.monotonic()` value, or None outside any block."""
    return _END.get()
