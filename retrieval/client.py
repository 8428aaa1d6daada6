"""`HTTPRetriever`: a client for any Search-R1-protocol retrieval server, sync and async.

It speaks `POST {url}/retrieve` with `{"queries", "topk", "return_scores": true}`, so it works
with `tracerl serve-retriever` and with Search-R1's own servers (e.g. a wiki-18 e5 server).
`protocol="skyrl-gym"` or `"gem"` speaks those peers' variants instead (one query per request;
GEM's in msgpack; see `retrieval.protocol`), so trace-rl's envs run against their servers too.

Retry policy (the one place retries live, STYLE §2.4): a connection error, a timeout, a 5xx or
a 429 is retried up to `max_attempts` attempts in all, sleeping
`min(max_backoff_s, backoff_s · 2^attempt)` scaled by a random factor in [0.5, 1] between
attempts; then `RetrieverUnavailable` names the URL, the attempt count and the last cause.
A circuit breaker stops a dead or hung server from costing every later call its deadline: once
a call ends in `RetrieverUnavailable`, the calls of the next `breaker_s` seconds fail at once
with that cause (then one call tries again; a success closes the circuit).
An overall deadline bounds one call on top of that: the earlier of `deadline_s` (per call)
and an enclosing `retrieval.deadline` block (an env step opens one). Each attempt ends by
`timeout_s` of wall-clock time and by the call's deadline, whatever the server does: every
connect, read and write is cut to the time left (`retrieval.wall_clock`), so a server that
trickles its headers or body one byte at a time cannot stretch a call; every sleep is cut too,
and no attempt starts once the deadline has passed.
A response larger than its request can need (queries × k × `max_doc_bytes`, plus 64 KiB) is
refused as `RetrievalError` as soon as it passes that size, so an endless body costs no more
memory than that. A redirect (3xx) is refused with the address it points to, and so is any
4xx other than 429 (the caller's mistake): `RequestRejected` at once, with the server's
message. Large batches are split into requests of at most `max_batch_queries`
queries (sent concurrently by `asearch`). A query that is empty after stripping gets no hits
without a request, as the local indexes give none.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import random
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx

from retrieval.base import Hit, check_k, check_queries
from retrieval.deadline import deadline_at
from retrieval.errors import RequestRejected, RetrievalError, RetrieverUnavailable
from retrieval.protocol import (
    INDEX_ID_HEADER,
    PROTOCOLS,
    Protocol,
    encode_request,
    parse_response,
)
from retrieval.wall_clock import aread_capped, attempt_ends_at, install, read_capped

__all__ = ["HTTPRetriever"]

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_MARGIN_BYTES = 65_536  # the response's envelope and an error's message
_HEALTH_MAX_BYTES = 1 << 20  # /health: status, limits and the index manifest


class _Retryable(Exception):
    """One failed attempt that another attempt might fix."""


class HTTPRetriever:
    """A `Retriever` backed by a remote Search-R1-protocol server.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout_s: the most one attempt may take, wall clock: connect, send, wait and read.
        connect_timeout_s: the most the connect of one attempt may take.
        max_attempts: attempts per request, the first included.
        backoff_s: the first retry's base sleep; it doubles per attempt.
        max_backoff_s: the cap on one sleep.
        max_batch_queries: the most queries per request; bigger batches are split.
        max_hits_per_request: the most queries x k per request (the server's
            `ServerLimits.max_hits_per_request`); batches are split to stay under it.
        max_connections: the connection pool size.
        index_id: the index id to report; None asks the server's `/health` on first use (and,
            for a server without `/health`, derives one from the URL), then follows the id a
            trace-rl server sends with every answer (`X-Index-Id`): a server restarted on the
            same URL with another index changes this retriever's id, so caches keyed on it
            drop the old index's hits.
        deadline_s: the overall time one `search` call may take, all attempts and sleeps
            included; None leaves it to `max_attempts` and the timeouts (and to an enclosing
            `retrieval.deadline` block, which applies either way).
        protocol: the server's dialect: `"search-r1"` (batches; `tracerl serve-retriever`
            and Search-R1's servers), `"skyrl-gym"` (SkyRL's server: one query per JSON
            request) or `"gem"` (GEM's mosec server: one query per msgpack request).
        max_doc_bytes: the most bytes one hit may take in a response, its JSON included; a
            response to `q` queries at `k` is refused past `q * k * max_doc_bytes + 64 KiB`.
        breaker_s: after a call finds the server unavailable, how long later `search` calls
            fail at once with the same cause instead of waiting their own deadline (0: never).
        index_check_s: how stale the index id may be when a cache in front of this client
            (`CachedRetriever`) answers from its entries alone: `check_index_id` asks `/health`
            again once this long has passed since the server last named its index. 0 (the
            default) asks before every answer served wholly from a cache, so a server restarted
            onto another index never has the old index's hits served under it; a positive
            value trades that window for a request saved per cached answer.

    >>> r = HTTPRetriever("http://127.0.0.1:8000", index_id="bm25-0123456789abcdef")
    >>> r.search(["", "   "], k=3)  # empty queries never reach the server
    [[], []]
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 5.0,
        max_attempts: int = 4,
        backoff_s: float = 0.2,
        max_backoff_s: float = 5.0,
        max_batch_queries: int = 256,
        max_hits_per_request: int = 4_096,
        max_connections: int = 64,
        index_id: str | None = None,
        deadline_s: float | None = None,
        protocol: Protocol = "search-r1",
        max_doc_bytes: int = 65_536,
        breaker_s: float = 30.0,
        index_check_s: float = 0.0,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        try:
            host, _ = httpx.URL(url).host, urlsplit(url).port  # .port checks the range
        except (httpx.InvalidURL, ValueError) as err:
            raise ValueError(f"url {url!r} is not a valid URL: {err}") from None
        if not host:
            raise ValueError(f"url {url!r} is not a valid URL: it names no host")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        sizes = (max_attempts, max_batch_queries, max_hits_per_request, max_connections)
        if min(*sizes, max_doc_bytes) < 1:
            raise ValueError(
                "max_attempts, max_batch_queries, max_hits_per_request, max_connections and "
                "max_doc_bytes must be >= 1"
            )
        if not (timeout_s > 0 and connect_timeout_s > 0):
            raise ValueError(
                f"timeout_s and connect_timeout_s must be > 0, got {timeout_s}, {connect_timeout_s}"
            )
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive or None, got {deadline_s}")
        if breaker_s < 0:
            raise ValueError(f"breaker_s must be >= 0, got {breaker_s}")
        if not index_check_s >= 0:
            raise ValueError(f"index_check_s must be >= 0, got {index_check_s}")
        self._url = url.rstrip("/")
        self._source = f"POST {self._url}/retrieve"
        self._timeout_s = timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._deadline_s = deadline_s
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        self._max_attempts = max_attempts
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._protocol: Protocol = protocol
        self._max_doc_bytes = max_doc_bytes
        self._breaker_s = breaker_s
        self._open_until = 0.0  # time.monotonic() before which calls fail at once
        self._last_failure = ""  # why the last call found the server unavailable
        # the peers' servers take one query per request
        self._max_batch_queries = max_batch_queries if protocol == "search-r1" else 1
        self._max_hits_per_request = max_hits_per_request
        self._index_id = index_id
        self._pinned = index_id is not None  # a caller's id is kept whatever the server says
        self._index_check_s = index_check_s
        self._named_at = -math.inf  # time.monotonic() when the server last named its index
        self._has_health = True  # False for a server without /health: nothing to ask
        self._lock = threading.Lock()  # guards the lazy index id
        self._client_lock = threading.Lock()  # guards the lazy connection pools
        self._jitter = random.Random()  # private: jitter only spreads retries, never results
        self._pid = os.getpid()
        self._client: httpx.Client | None = None
        self._aclient: httpx.AsyncClient | None = None

    @property
    def url(self) -> str:
        """The server's base URL."""
        return self._url

    @property
    def last_failure(self) -> str:
        """Why the last search found the server unavailable; '' once a search succeeds."""
        return self._last_failure

    @property
    def index_id(self) -> str:
        """The server's index id: from `/health` on first use, then from each answer's header.

        Raises:
            RetrieverUnavailable: the server cannot be reached within the retry budget.
        """
        with self._lock:
            if self._index_id is None:
                self._index_id = self._fetch_index_id()
            return self._index_id

    def check_index_id(self) -> str:
        """Ask the server which index it serves now, follow it, and return it.

        What a cache calls before it answers from its entries alone (`CachedRetriever`): a
        server restarted on the same URL with another index shows its new id here, and the
        cache empties itself before anything is served. Asks `/health` unless the server
        named its index within the last `index_check_s` seconds (0: always); a pinned id
        (`index_id=`) and a server without `/health` are never asked.

        Raises:
            RetrieverUnavailable: the server cannot be reached within the retry budget (or
                the circuit breaker is open): nothing can be confirmed, so nothing is served.
        """
        if self._pinned or not self._has_health:
            return self.index_id
        if time.monotonic() - self._named_at < self._index_check_s:
            return self.index_id
        with self._breaker(True):
            served = self._fetch_index_id()
        self._take_index_id(served)
        return served

    def _fetch_index_id(self) -> str:
        try:
            health = self.health()
        except RequestRejected:  # a Search-R1 server has no /health
            self._has_health = False
            fallback = f"http-{hashlib.sha256(self._url.encode()).hexdigest()[:16]}"
            log.warning(
                "%s has no /health; using index id %s derived from the URL. Caches keyed on it "
                "assume the server's index never changes.",
                self._url,
                fallback,
            )
            return fallback
        index_id = health.get("index_id") if isinstance(health, dict) else None
        if not isinstance(index_id, str):
            raise RetrievalError(f"GET {self._url}/health returned no string 'index_id'")
        self._named_at = time.monotonic()
        return index_id

    def _follow_index_id(self, response: httpx.Response) -> None:
        """Take the index id a trace-rl server names in its answer, if it changed."""
        served = response.headers.get(INDEX_ID_HEADER)
        if served is None or self._pinned:
            return
        self._named_at = time.monotonic()
        self._take_index_id(served)

    def _take_index_id(self, served: str) -> None:
        """Adopt `served` as the index id, saying so when it replaces another."""
        if self._pinned:
            return
        with self._lock:
            if served != self._index_id:
                if self._index_id is not None:
                    log.warning(
                        "%s now serves index %s (was %s): the server was restarted with another "
                        "index; results cached under the old id are dropped",
                        self._url,
                        served,
                        self._index_id,
                    )
                self._index_id = served

    def health(self) -> dict[str, Any]:
        """GET `/health`: the server's status and index manifest.

        Raises:
            RetrieverUnavailable: after the retry budget.
            RequestRejected: the server has no `/health` (4xx).
            RetrievalError: the answer is not JSON.
        """
        content = self._with_retries("GET", "/health", None, self._end(), _HEALTH_MAX_BYTES)
        try:
            status: dict[str, Any] = json.loads(content)
        except ValueError as err:
            raise RetrievalError(f"GET {self._url}/health returned non-JSON ({err})") from err
        return status

    # -- sync ------------------------------------------------------------------------------

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The server's top-`k` hits for each query, in the queries' order.

        Raises:
            TypeError: `queries` is a string or holds a non-string.
            ValueError: `k` is not a positive integer.
            RetrieverUnavailable: the server did not answer within the retry budget.
            RequestRejected: the server refused the request (a 4xx; e.g. a query too long).
            RetrievalError: the server's answer is not the protocol's response format.
        """
        queries, k = check_queries(queries), check_k(k)
        end = self._end()
        sent = [q for q in queries if q.strip()]
        rows: list[list[Hit]] = []
        step = self._batch_size(k)
        with self._breaker(bool(sent)):
            for start in range(0, len(sent), step):
                chunk = sent[start : start + step]
                body = encode_request(chunk, k, self._protocol)
                content = self._with_retries("POST", "/retrieve", body, end, self._cap(chunk, k))
                rows += parse_response(content, len(chunk), self._protocol, source=self._source)
        return self._place(queries, rows)

    def _with_retries(
        self, method: str, path: str, body: _Body | None, end: float | None, cap: int
    ) -> bytes:
        last: BaseException | None = None
        for attempt in range(self._max_attempts):
            if attempt:
                time.sleep(self._sleep_s(attempt, end))
            attempt_end = self._attempt_end(end)
            if attempt_end is None:
                raise self._unavailable(method, path, last, attempt)
            try:
                with (
                    attempt_ends_at(attempt_end),
                    self._sync_client().stream(
                        method,
                        self._url + path,
                        timeout=self._pool_wait(attempt_end),
                        **_request_kwargs(body),
                    ) as response,
                ):
                    self._check_length(method, path, response, cap)
                    content = read_capped(response.iter_bytes(), cap, self._too_large(path, cap))
                self._follow_index_id(response)
                return self._decode(method, path, response, content)
            except (_Retryable, httpx.TransportError) as err:
                last = err
                log.debug("%s %s%s attempt %d failed: %r", method, self._url, path, attempt, err)
        raise self._unavailable(method, path, last, self._max_attempts)

    def _sync_client(self) -> httpx.Client:
        with self._client_lock:
            self._forget_parent_pools()
            if self._client is None:
                self._client = httpx.Client(
                    timeout=self._timeout, limits=self._limits, headers=_HEADERS
                )
                install(self._client)
            return self._client

    def _forget_parent_pools(self) -> None:
        # A forked process must not share the parent's sockets: start fresh pools there.
        if self._pid != os.getpid():
            self._client, self._aclient, self._pid = None, None, os.getpid()

    # -- async -----------------------------------------------------------------------------

    async def asearch(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """`search` for asyncio callers; split requests go out concurrently.

        The async connection pool belongs to the event loop of the first call; use one loop.

        Raises:
            Same as `search`.
        """
        queries, k = check_queries(queries), check_k(k)
        end = self._end()
        sent = [q for q in queries if q.strip()]
        chunks = [
            sent[i : i + self._batch_size(k)] for i in range(0, len(sent), self._batch_size(k))
        ]
        with self._breaker(bool(sent)):
            responses = await asyncio.gather(
                *(
                    self._awith_retries(
                        "/retrieve", encode_request(c, k, self._protocol), end, self._cap(c, k)
                    )
                    for c in chunks
                )
            )
        rows = [
            row
            for chunk, content in zip(chunks, responses, strict=True)
            for row in parse_response(content, len(chunk), self._protocol, source=self._source)
        ]
        return self._place(queries, rows)

    async def _awith_retries(self, path: str, body: _Body, end: float | None, cap: int) -> bytes:
        last: BaseException | None = None
        for attempt in range(self._max_attempts):
            if attempt:
                await asyncio.sleep(self._sleep_s(attempt, end))
            attempt_end = self._attempt_end(end)
            if attempt_end is None:
                raise self._unavailable("POST", path, last, attempt)
            try:
                with attempt_ends_at(attempt_end):
                    async with self._async_client().stream(
                        "POST",
                        self._url + path,
                        timeout=self._pool_wait(attempt_end),
                        **_request_kwargs(body),
                    ) as response:
                        self._check_length("POST", path, response, cap)
                        content = await aread_capped(
                            response.aiter_bytes(), cap, self._too_large(path, cap)
                        )
                self._follow_index_id(response)
                return self._decode("POST", path, response, content)
            except (_Retryable, httpx.TransportError) as err:
                last = err
                log.debug("POST %s%s attempt %d failed: %r", self._url, path, attempt, err)
        raise self._unavailable("POST", path, last, self._max_attempts)

    def _batch_size(self, k: int) -> int:
        """Queries per request at `k` hits each: under both the query and the hit limits."""
        return max(1, min(self._max_batch_queries, self._max_hits_per_request // k))

    def _async_client(self) -> httpx.AsyncClient:
        with self._client_lock:
            self._forget_parent_pools()
            if self._aclient is None:
                self._aclient = httpx.AsyncClient(
                    timeout=self._timeout, limits=self._limits, headers=_HEADERS
                )
                install(self._aclient)
            return self._aclient

    # -- shared ----------------------------------------------------------------------------

    @contextlib.contextmanager
    def _breaker(self, sends: bool) -> Iterator[None]:
        """Fail at once while the circuit is open; open it when the body finds no server."""
        if not sends:
            yield
            return
        left = self._open_until - time.monotonic()
        if left > 0:
            raise RetrieverUnavailable(
                f"{self._url} is skipped for {left:.0f} s more (circuit breaker, breaker_s="
                f"{self._breaker_s:g}): {self._last_failure}"
            )
        try:
            yield
        except RetrieverUnavailable as err:
            self._last_failure = str(err)
            self._open_until = time.monotonic() + self._breaker_s
            raise
        self._open_until, self._last_failure = 0.0, ""

    def _end(self) -> float | None:
        """When this call must be over (`time.monotonic()`): its own and the block's deadline."""
        ends = [deadline_at()]
        if self._deadline_s is not None:
            ends.append(time.monotonic() + self._deadline_s)
        return min((e for e in ends if e is not None), default=None)

    def _attempt_end(self, end: float | None) -> float | None:
        """When the next attempt must be over (`time.monotonic()`); None once `end` has passed."""
        now = time.monotonic()
        if end is not None and end <= now:
            return None
        return now + self._timeout_s if end is None else min(end, now + self._timeout_s)

    def _pool_wait(self, attempt_end: float) -> httpx.Timeout:
        """The timeouts of one attempt; waiting for a free pooled connection is cut to its end.

        Socket operations are cut by `retrieval.wall_clock`; the wait for a connection from a
        full pool is httpcore's own, so it is cut here.
        """
        pool = max(0.001, attempt_end - time.monotonic())
        return httpx.Timeout(self._timeout_s, connect=self._connect_timeout_s, pool=pool)

    def _cap(self, queries: list[str], k: int) -> int:
        """The most bytes a response to `queries` at `k` may take."""
        return len(queries) * k * self._max_doc_bytes + _MARGIN_BYTES

    def _too_large(self, path: str, cap: int) -> RetrievalError:
        return RetrievalError(
            f"{self._url}{path} sent a response of over {cap} bytes, more than its request can "
            f"need (queries x k x max_doc_bytes={self._max_doc_bytes}, plus {_MARGIN_BYTES}); "
            "the server is broken, or raise HTTPRetriever's max_doc_bytes"
        )

    def _check_length(self, method: str, path: str, response: httpx.Response, cap: int) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise self._too_large(path, cap)

    def _sleep_s(self, attempt: int, end: float | None) -> float:
        base = min(self._max_backoff_s, self._backoff_s * 2 ** (attempt - 1))
        sleep = float(base * (0.5 + 0.5 * self._jitter.random()))
        return sleep if end is None else max(0.0, min(sleep, end - time.monotonic()))

    def _unavailable(
        self, method: str, path: str, last: BaseException | None, attempts: int
    ) -> Exception:
        if attempts < self._max_attempts:
            return RetrieverUnavailable(
                f"{method} {self._url}{path} failed {attempts} times before its deadline ran "
                f"out (last: {last!r}). Start a server with `tracerl serve-retriever --index "
                "DIR`, or allow more time (HTTPRetriever's deadline_s, the env's "
                "retrieval_deadline_s)."
            )
        return RetrieverUnavailable(
            f"{method} {self._url}{path} failed {attempts} times (last: {last!r}). "
            "Start a server with `tracerl serve-retriever --index DIR`, or raise the client's "
            "timeout_s / max_attempts."
        )

    def _decode(self, method: str, path: str, response: httpx.Response, content: bytes) -> bytes:
        status = response.status_code
        if status in _RETRY_STATUS:
            raise _Retryable(f"HTTP {status}: {_detail(content)}")
        if 300 <= status < 400:  # followed, a redirect could lead anywhere; the user decides
            where = response.headers.get("location", "nowhere")
            raise RequestRejected(
                f"{method} {self._url}{path} answered HTTP {status}, a redirect to {where}; "
                "redirects are not followed: give the client the address the server names"
            )
        if status >= 400:
            raise RequestRejected(
                f"{method} {self._url}{path} was rejected with HTTP {status}: {_detail(content)}"
            )
        return content

    @staticmethod
    def _place(queries: list[str], rows: list[list[Hit]]) -> list[list[Hit]]:
        filled = iter(rows)
        return [next(filled) if q.strip() else [] for q in queries]

    def close(self) -> None:
        """Close the sync connection pool (the async one closes with `aclose`)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    async def aclose(self) -> None:
        """Close both connection pools."""
        self.close()
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient = None

    def __enter__(self) -> HTTPRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        if self._protocol == "search-r1":
            return f"HTTPRetriever({self._url!r})"
        return f"HTTPRetriever({self._url!r}, protocol={self._protocol!r})"


_Body = tuple[bytes, str | None]
"""A request body and its content type (None: send none, as GEM's client does)."""


def _request_kwargs(body: _Body | None) -> dict[str, Any]:
    if body is None:
        return {}
    content, content_type = body
    return {"content": content, "headers": {"content-type": content_type} if content_type else {}}


_HEADERS = {"accept-encoding": "identity"}
"""Ask for no compression: the size cap then counts what the server sends."""


def _detail(content: bytes) -> str:
    try:
        body = json.loads(content)
    except ValueError:
        return content[:200].decode("utf-8", "replace")
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])[:500]
    return str(body)[:200]
