"""`HTTPRetriever`: a client for any Search-R1-protocol retrieval server, sync and async.

It speaks `POST {url}/retrieve` with `{"queries", "topk", "return_scores": true}`, so it works
with `tracerl serve-retriever` and with Search-R1's own servers (e.g. a wiki-18 e5 server).
`protocol="skyrl-gym"` or `"gem"` speaks those peers' variants instead (one query per request;
GEM's in msgpack; see `retrieval.protocol`), so trace-rl's envs run against their servers too.

Retry policy (the one place retries live, STYLE §2.4): a connection error, a timeout, a 5xx or
a 429 is retried up to `max_attempts` attempts in all, sleeping
`min(max_backoff_s, backoff_s · 2^attempt)` scaled by a random factor in [0.5, 1] between
attempts; then `RetrieverUnavailable` names the URL, the attempt count and the last cause.
An overall deadline bounds one call on top of that: the earlier of `deadline_s` (per call)
and an enclosing `retrieval.deadline` block (an env step opens one). Every attempt's timeouts
and every sleep are cut to the time left, and no attempt starts once it has run out.
A 4xx other than 429 is the caller's mistake and raises `RequestRejected` at once, with the
server's message. Large batches are split into requests of at most `max_batch_queries`
queries (sent concurrently by `asearch`). A query that is empty after stripping gets no hits
without a request, as the local indexes give none.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import httpx

from retrieval.base import Hit, check_k, check_queries
from retrieval.deadline import deadline_at
from retrieval.errors import RequestRejected, RetrievalError, RetrieverUnavailable
from retrieval.protocol import PROTOCOLS, Protocol, encode_request, parse_response

__all__ = ["HTTPRetriever"]

log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})


class _Retryable(Exception):
    """One failed attempt that another attempt might fix."""


class HTTPRetriever:
    """A `Retriever` backed by a remote Search-R1-protocol server.

    Args:
        url: the server's base URL, e.g. `http://127.0.0.1:8000`.
        timeout_s: the read/write timeout of one request.
        connect_timeout_s: the connect timeout of one request.
        max_attempts: attempts per request, the first included.
        backoff_s: the first retry's base sleep; it doubles per attempt.
        max_backoff_s: the cap on one sleep.
        max_batch_queries: the most queries per request; bigger batches are split.
        max_connections: the connection pool size.
        index_id: the index id to report; None asks the server's `/health` once (and, for a
            server without `/health`, derives one from the URL).
        deadline_s: the overall time one `search` call may take, all attempts and sleeps
            included; None leaves it to `max_attempts` and the timeouts (and to an enclosing
            `retrieval.deadline` block, which applies either way).
        protocol: the server's dialect: `"search-r1"` (batches; `tracerl serve-retriever`
            and Search-R1's servers), `"skyrl-gym"` (SkyRL's server: one query per JSON
            request) or `"gem"` (GEM's mosec server: one query per msgpack request).

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
        max_connections: int = 64,
        index_id: str | None = None,
        deadline_s: float | None = None,
        protocol: Protocol = "search-r1",
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {url!r}")
        if protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if max_attempts < 1 or max_batch_queries < 1 or max_connections < 1:
            raise ValueError("max_attempts, max_batch_queries and max_connections must be >= 1")
        if deadline_s is not None and deadline_s <= 0:
            raise ValueError(f"deadline_s must be positive or None, got {deadline_s}")
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
        # the peers' servers take one query per request
        self._max_batch_queries = max_batch_queries if protocol == "search-r1" else 1
        self._index_id = index_id
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
    def index_id(self) -> str:
        """The server's index id, from `/health` on first use (then remembered).

        Raises:
            RetrieverUnavailable: the server cannot be reached within the retry budget.
        """
        with self._lock:
            if self._index_id is None:
                self._index_id = self._fetch_index_id()
            return self._index_id

    def _fetch_index_id(self) -> str:
        try:
            health = self.health()
        except RequestRejected:  # a Search-R1 server has no /health
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
        return index_id

    def health(self) -> dict[str, Any]:
        """GET `/health`: the server's status and index manifest.

        Raises:
            RetrieverUnavailable: after the retry budget.
            RequestRejected: the server has no `/health` (4xx).
            RetrievalError: the answer is not JSON.
        """
        content = self._with_retries("GET", "/health", None, self._end())
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
        for start in range(0, len(sent), self._max_batch_queries):
            chunk = sent[start : start + self._max_batch_queries]
            content = self._with_retries(
                "POST", "/retrieve", encode_request(chunk, k, self._protocol), end
            )
            rows += parse_response(content, len(chunk), self._protocol, source=self._source)
        return self._place(queries, rows)

    def _with_retries(self, method: str, path: str, body: _Body | None, end: float | None) -> bytes:
        last: BaseException | None = None
        for attempt in range(self._max_attempts):
            if attempt:
                time.sleep(self._sleep_s(attempt, end))
            timeout = self._attempt_timeout(end)
            if timeout is None:
                raise self._unavailable(method, path, last, attempt)
            try:
                response = self._sync_client().request(
                    method, self._url + path, timeout=timeout, **_request_kwargs(body)
                )
                return self._decode(method, path, response)
            except (_Retryable, httpx.TransportError) as err:
                last = err
                log.debug("%s %s%s attempt %d failed: %r", method, self._url, path, attempt, err)
        raise self._unavailable(method, path, last, self._max_attempts)

    def _sync_client(self) -> httpx.Client:
        with self._client_lock:
            self._forget_parent_pools()
            if self._client is None:
                self._client = httpx.Client(timeout=self._timeout, limits=self._limits)
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
            sent[i : i + self._max_batch_queries]
            for i in range(0, len(sent), self._max_batch_queries)
        ]
        responses = await asyncio.gather(
            *(
                self._awith_retries("/retrieve", encode_request(c, k, self._protocol), end)
                for c in chunks
            )
        )
        rows = [
            row
            for chunk, content in zip(chunks, responses, strict=True)
            for row in parse_response(content, len(chunk), self._protocol, source=self._source)
        ]
        return self._place(queries, rows)

    async def _awith_retries(self, path: str, body: _Body, end: float | None) -> bytes:
        last: BaseException | None = None
        for attempt in range(self._max_attempts):
            if attempt:
                await asyncio.sleep(self._sleep_s(attempt, end))
            timeout = self._attempt_timeout(end)
            if timeout is None:
                raise self._unavailable("POST", path, last, attempt)
            try:
                response = await self._async_client().post(
                    self._url + path, timeout=timeout, **_request_kwargs(body)
                )
                return self._decode("POST", path, response)
            except (_Retryable, httpx.TransportError) as err:
                last = err
                log.debug("POST %s%s attempt %d failed: %r", self._url, path, attempt, err)
        raise self._unavailable("POST", path, last, self._max_attempts)

    def _async_client(self) -> httpx.AsyncClient:
        with self._client_lock:
            self._forget_parent_pools()
            if self._aclient is None:
                self._aclient = httpx.AsyncClient(timeout=self._timeout, limits=self._limits)
            return self._aclient

    # -- shared ----------------------------------------------------------------------------

    def _end(self) -> float | None:
        """When this call must be over (`time.monotonic()`): its own and the block's deadline."""
        ends = [deadline_at()]
        if self._deadline_s is not None:
            ends.append(time.monotonic() + self._deadline_s)
        return min((e for e in ends if e is not None), default=None)

    def _attempt_timeout(self, end: float | None) -> httpx.Timeout | None:
        """One attempt's timeouts, cut to the time left; None once none is left."""
        if end is None:
            return self._timeout
        left = end - time.monotonic()
        if left <= 0:
            return None
        return httpx.Timeout(min(self._timeout_s, left), connect=min(self._connect_timeout_s, left))

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

    def _decode(self, method: str, path: str, response: httpx.Response) -> bytes:
        if response.status_code in _RETRY_STATUS:
            raise _Retryable(f"HTTP {response.status_code}: {_detail(response)}")
        if response.status_code >= 400:
            raise RequestRejected(
                f"{method} {self._url}{path} was rejected with HTTP {response.status_code}: "
                f"{_detail(response)}"
            )
        return response.content

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


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:200]
    if isinstance(body, dict) and "detail" in body:
        return str(body["detail"])
    return str(body)[:200]
