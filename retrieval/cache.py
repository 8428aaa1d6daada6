"""A deterministic, thread-safe result cache in front of any `Retriever`.

The key of a cached result is `(normalize_query(query), k, inner.index_id)`, and the inner
retriever is always asked the *normalised* query, so every spelling that normalises alike gets
the very same hits, whichever spelling was seen first. Environments keep their own per-episode
results in their snapshots; this cache is the shared cross-episode layer that spares the index
repeated work across episodes, forks and threads.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from retrieval.base import Hit, Retriever, check_k, check_queries, normalize_query
from retrieval.errors import RetrievalError

__all__ = ["CacheStats", "CachedRetriever", "normalize_query"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheStats:
    """Counters of a `CachedRetriever` at one moment."""

    n_hits: int
    """Queries answered from the cache."""
    n_misses: int
    """Queries sent to the inner retriever."""
    n_entries: int
    """Results held now."""


class CachedRetriever:
    """Wraps a retriever with a bounded LRU cache of its results; meets `Retriever`.

    Results are exactly `inner.search([normalize_query(q)], k)`; `index_id` is the inner one,
    so a key never mixes two indexes. In front of a remote retriever, an answer made of cached
    entries alone is served only once the server has confirmed its index id
    (`HTTPRetriever.check_index_id`: one `/health` request, unless its `index_check_s` allows
    a window), so a server restarted onto another index empties the cache before the next
    answer. Safe to share between threads and environment forks:
    the cache is guarded by a lock, the stored hits are frozen, and every call returns fresh
    lists. Evicting an entry changes nothing but speed, because the inner retriever is
    deterministic.

    Args:
        inner: the retriever to cache.
        max_entries: how many (query, k) results to keep; the least recently used go first.
            None keeps everything.

    >>> from retrieval.base import Document
    >>> from retrieval.bm25 import BM25Retriever
    >>> inner = BM25Retriever.build([Document(doc_id="d1", title="Paris", text="France")])
    >>> cached = CachedRetriever(inner)
    >>> cached.search(["PARIS "], k=1) == inner.search(["paris"], k=1)
    True
    >>> cached.stats()
    CacheStats(n_hits=0, n_misses=1, n_entries=1)
    """

    def __init__(self, inner: Retriever, *, max_entries: int | None = 100_000) -> None:
        if max_entries is not None and max_entries < 1:
            raise ValueError(f"max_entries must be positive or None, got {max_entries}")
        self._inner = inner
        # a remote retriever (`HTTPRetriever`) can ask its server which index it serves now:
        # done before an answer made of cached entries alone, which no server confirmed
        check = getattr(inner, "check_index_id", None)
        self._check_index_id: Callable[[], str] | None = check if callable(check) else None
        # asked for on first use, not here: a server that is down at construction may be up
        # by the first search, and `make_retriever(url)` must not fail before then
        self._index_id: str | None = None
        """the inner index id the entries were cached under"""
        self._max_entries = max_entries
        self._entries: OrderedDict[tuple[str, int], tuple[Hit, ...]] = OrderedDict()
        self._lock = threading.Lock()
        self._n_hits = 0
        self._n_misses = 0

    @property
    def index_id(self) -> str:
        """The inner retriever's index id; when it changed, the cache is emptied first.

        A remote retriever learns a new id from its server's answers (`HTTPRetriever`): the
        hits cached under the old one are then another index's, never served again.

        Raises:
            RetrievalError: whatever the inner retriever's `index_id` raises (a remote one
                raises `RetrieverUnavailable` while its server is down on first use).
        """
        index_id = self._inner.index_id
        with self._lock:
            if index_id != self._index_id:
                if self._index_id is not None:
                    log.warning(
                        "index id changed from %s to %s: dropped %d cached results",
                        self._index_id,
                        index_id,
                        len(self._entries),
                    )
                self._entries.clear()
                self._index_id = index_id
        return index_id

    @property
    def inner(self) -> Retriever:
        """The wrapped retriever."""
        return self._inner

    def stats(self) -> CacheStats:
        """A snapshot of the hit/miss counters and the cache size."""
        with self._lock:
            return CacheStats(
                n_hits=self._n_hits, n_misses=self._n_misses, n_entries=len(self._entries)
            )

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The inner retriever's hits for each normalised query, from the cache when held.

        Misses are sent to the inner retriever in one batch, each distinct key once.

        Raises:
            TypeError: `queries` is a string or holds a non-string.
            ValueError: `k` is not a positive integer.
            RetrievalError: whatever the inner retriever raises; nothing is cached then.
        """
        keys = [normalize_query(q) for q in check_queries(queries, text=False)]
        k = check_k(k)
        if not keys:
            return []
        found = self._search(keys, k)
        if found is None:  # the index changed while the misses were fetched: once more
            found = self._search(keys, k)
        if found is None:
            raise RetrievalError("the index changed twice during one search; retry it")
        return [list(found[key]) for key in keys]

    def _search(self, keys: list[str], k: int) -> dict[str, tuple[Hit, ...]] | None:
        """Hits per key from the cache and the inner retriever, all under one index id.

        Returns:
            None if the inner index id changed while the misses were fetched: the cached hits
            were the old index's, so nothing is mixed or stored (the cache is emptied).
        """
        epoch = self.index_id
        found: dict[str, tuple[Hit, ...]] = {}
        with self._lock:
            for key in keys:
                entry = self._entries.get((key, k))
                if entry is not None:
                    self._entries.move_to_end((key, k))
                    found[key] = entry
        missing = list(dict.fromkeys(key for key in keys if key not in found))
        if not missing and self._check_index_id is not None:
            # nothing to fetch, so no answer header names the index: ask the server whether
            # it still serves the one these entries came from (a restart onto another index
            # empties the cache here, before any of them is served)
            self._check_index_id()
            if self.index_id != epoch:
                return None
        if missing:
            fresh = self._inner.search(missing, k)
            if len(fresh) != len(missing):
                raise RetrievalError(
                    f"inner retriever returned {len(fresh)} result lists for {len(missing)} queries"
                )
            if self.index_id != epoch:
                return None
            with self._lock:
                for key, hits in zip(missing, fresh, strict=True):
                    found[key] = self._entries[(key, k)] = tuple(hits)
                    self._entries.move_to_end((key, k))
                if self._max_entries is not None:
                    while len(self._entries) > self._max_entries:
                        self._entries.popitem(last=False)
        with self._lock:
            self._n_misses += len(missing)
            self._n_hits += len(keys) - len(missing)
        return found
