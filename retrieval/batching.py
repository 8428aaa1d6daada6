"""Server-side micro-batching: concurrent requests share one retriever call.

A dense retriever spends most of a request in the encoder's forward pass, whose cost grows far
slower than its batch; a synchronous server that serves one request at a time wastes that (the
complaint of Search-R1 and ReCall users). `MicroBatcher` queues requests, and one worker takes
everything queued (waiting at most `max_wait_s` after the first request, up to
`max_batch_queries` queries), searches each distinct query once per `k` in a worker thread, and
hands every request its own rows. While a batch runs, the next one fills, so batches grow with
load and add no delay when the server is idle.

Fair shares: a request takes at most `slice_queries` of a batch's queries, and its other
queries wait for later batches, in turn with everyone else's. A request of 512 queries thus
goes through in slices, and a small request (one slice or less) that arrives meanwhile goes in
the next batch, with other small ones only: its wait is bounded by one batch of slices, not by
the largest request queued before it. Large requests still get every other batch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from retrieval.base import Hit, Retriever
from retrieval.errors import IndexFileError, RetrievalError

__all__ = ["BatcherStats", "BatchingConfig", "MicroBatcher", "ServerBusy"]

log = logging.getLogger(__name__)


class ServerBusy(RetrievalError):
    """More queries are queued than the server accepts; the client should retry later."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchingConfig:
    """How concurrent requests are merged into retriever calls."""

    max_batch_queries: int = 512
    """queries per retriever call; 1 turns batching off"""
    max_wait_ms: float = 2.0
    """how long the first request of a batch waits for company when the server is idle"""
    max_pending_queries: int = 16_384
    """queued queries beyond which new requests are refused (HTTP 503)"""
    slice_queries: int = 16
    """the most queries of one request in one batch; the rest go in later batches, taking
    turns with other requests (a large request cannot hold up small ones). Batches of many
    small requests still grow to `max_batch_queries`."""

    def __post_init__(self) -> None:
        sizes = (self.max_batch_queries, self.max_pending_queries, self.slice_queries)
        if min(sizes) < 1 or self.max_wait_ms < 0:
            raise ValueError(f"batching limits must be positive (max_wait_ms may be 0): {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class BatcherStats:
    """Counters of a `MicroBatcher`."""

    n_requests: int
    n_batches: int
    n_queries: int
    """Queries received, duplicates included."""
    n_searched: int
    """Distinct (query, k) pairs sent to the retriever: `n_queries - n_searched` searches were
    saved by answering a batch's repeated queries once (GRPO's samples of one prompt often open
    with the same search)."""
    largest_batch: int
    """The most queries one batch held."""


@dataclass(slots=True)
class _Pending:
    queries: list[str]
    k: int
    future: asyncio.Future[list[list[Hit]]] = field(repr=False)
    rows: list[list[Hit]] = field(default_factory=list, repr=False)
    """the hits of `queries[: len(rows)]`, found so far"""
    taken: int = 0
    """queries handed to batches so far (no longer counted as pending)"""


class MicroBatcher:
    """Batches concurrent `search` calls into few `retriever.search` calls.

    Use inside a running event loop: `await start()`, then `await search(...)` from any number
    of tasks, then `await stop()`.

    Args:
        retriever: the index to search; it runs in one worker thread, one batch at a time.
        config: batch size, wait and queue limits.
        thread_setup: called once in that worker thread before its first search, for settings
            that hold per thread (faiss's OpenMP thread count).
    """

    def __init__(
        self,
        retriever: Retriever,
        config: BatchingConfig | None = None,
        *,
        thread_setup: Callable[[], object] | None = None,
    ) -> None:
        config = config or BatchingConfig()
        self._retriever = retriever
        self._thread_setup = thread_setup
        self._executor: ThreadPoolExecutor | None = None
        self._max_batch_queries = config.max_batch_queries
        self._max_wait_s = config.max_wait_ms / 1000
        self._max_pending_queries = config.max_pending_queries
        self._slice = config.slice_queries
        self._queue: asyncio.Queue[_Pending] = asyncio.Queue()
        self._n_pending_queries = 0
        self._worker: asyncio.Task[None] | None = None
        self._active: list[_Pending] = []  # taken from the queue, queries left to search
        self._last_small_only = False
        self._n_requests = self._n_batches = self._n_searched = self._largest_batch = 0
        self._n_queries = 0

    async def start(self) -> None:
        """Start the worker task and its search thread."""
        if self._worker is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="retrieval-search", initializer=self._thread_setup
            )
            self._worker = asyncio.create_task(self._run(), name="retrieval-batcher")

    async def stop(self) -> None:
        """Stop the worker; queued requests fail with `RetrievalError`."""
        if self._worker is not None:
            self._worker.cancel()
            await asyncio.gather(self._worker, return_exceptions=True)
            self._worker = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        leftovers, self._active = self._active, []
        while not self._queue.empty():
            leftovers.append(self._queue.get_nowait())
        for item in leftovers:
            if not item.future.done():
                item.future.set_exception(RetrievalError("the server is shutting down"))

    def stats(self) -> BatcherStats:
        """The counters so far."""
        return BatcherStats(
            n_requests=self._n_requests,
            n_batches=self._n_batches,
            n_queries=self._n_queries,
            n_searched=self._n_searched,
            largest_batch=self._largest_batch,
        )

    async def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Queue one request and wait for its hits.

        Raises:
            ServerBusy: the queue already holds `max_pending_queries` queries.
            RetrievalError: the worker is not running, or the retriever failed.
        """
        if self._worker is None:
            raise RetrievalError("MicroBatcher.start() was not awaited")
        if self._n_pending_queries + len(queries) > self._max_pending_queries:
            raise ServerBusy(
                f"{self._n_pending_queries} queries already queued (limit "
                f"{self._max_pending_queries}); retry shortly"
            )
        future: asyncio.Future[list[list[Hit]]] = asyncio.get_running_loop().create_future()
        self._n_pending_queries += len(queries)
        self._n_requests += 1
        self._queue.put_nowait(_Pending(list(queries), k, future))
        return await future

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._active:
                self._active.append(await self._queue.get())
            # wait a little for company (only when no earlier request still has slices left)
            deadline = loop.time() + (0.0 if len(self._active) > 1 else self._max_wait_s)
            while self._slices_total() < self._max_batch_queries:
                if self._queue.empty():
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    try:
                        self._active.append(await asyncio.wait_for(self._queue.get(), remaining))
                    except TimeoutError:
                        break
                else:
                    self._active.append(self._queue.get_nowait())
            batch = self._take_batch()
            n_queries = sum(stop - start for _, start, stop in batch)
            self._n_pending_queries -= n_queries
            self._n_batches += 1
            self._largest_batch = max(self._largest_batch, n_queries)
            await self._serve(batch)
            still = []
            for item in self._active:
                if not item.future.done():
                    still.append(item)
                else:  # answered, failed or abandoned: what it did not take is not pending
                    self._n_pending_queries -= len(item.queries) - item.taken
            self._active = still

    def _slices_total(self) -> int:
        """Queries the active requests would put in the next batch."""
        return sum(min(self._slice, len(i.queries) - i.taken) for i in self._active)

    def _take_batch(self) -> list[tuple[_Pending, int, int]]:
        """The next batch: new small requests alone, or one slice of each active request.

        A request that fits in one slice and has not started goes first, in a batch of such
        requests only; the batch after it holds a slice of every request, oldest first (so
        large requests advance at least every other batch). A request alone is searched in
        slices too: a small one that arrives while a slice runs waits for that slice only.
        """
        share = self._slice
        small = [i for i in self._active if i.taken == 0 and len(i.queries) <= share]
        small_only = bool(small) and not self._last_small_only and len(small) < len(self._active)
        self._last_small_only = small_only
        batch: list[tuple[_Pending, int, int]] = []
        room = self._max_batch_queries
        for item in small if small_only else self._active:
            if room <= 0:
                break
            if item.future.done():  # a client that hung up: its queries are not searched
                continue
            start = item.taken
            stop = min(len(item.queries), start + share, start + room)
            batch.append((item, start, stop))
            item.taken = stop
            room -= stop - start
        return batch

    async def _serve(self, batch: list[tuple[_Pending, int, int]]) -> None:
        by_k: dict[int, list[tuple[_Pending, int, int]]] = {}
        for part in batch:
            by_k.setdefault(part[0].k, []).append(part)
        for k, parts in by_k.items():
            distinct = list(dict.fromkeys(q for item, a, b in parts for q in item.queries[a:b]))
            try:
                rows = await asyncio.get_running_loop().run_in_executor(
                    self._executor, self._retriever.search, distinct, k
                )
            except IndexFileError as err:  # a damaged or changed index: one line, no trace
                log.error("refused a batch of %d queries: %s", len(distinct), err)
                self._fail(parts, err)
                continue
            except Exception as err:  # handed to each waiting request, which reports it
                log.exception("retriever failed on a batch of %d queries", len(distinct))
                self._fail(parts, err)
                continue
            self._n_searched += len(distinct)
            self._n_queries += sum(b - a for _, a, b in parts)
            by_query = dict(zip(distinct, rows, strict=True))
            for item, a, b in parts:
                if item.future.done():  # a client that hung up leaves a cancelled future
                    continue
                item.rows += [list(by_query[q]) for q in item.queries[a:b]]
                if len(item.rows) == len(item.queries):
                    item.future.set_result(item.rows)

    @staticmethod
    def _fail(parts: list[tuple[_Pending, int, int]], err: Exception) -> None:
        for item, _, _ in parts:
            if not item.future.done():
                item.future.set_exception(err)
