"""An httpx client for OpenAI-compatible endpoints, and a `PolicyBackend` on top of it.

It speaks `/v1/completions` (a text prompt, or a token-id prompt, which vLLM accepts) and
`/v1/chat/completions`, so it covers `vllm serve MODEL` (or
`python -m vllm.entrypoints.openai.api_server`) as well as hosted APIs.

- **Concurrency:** a batch of prompts is sent as concurrent requests, at most
  `max_concurrency` in flight. The synchronous API keeps one `httpx.AsyncClient` (keep-alive
  connections) on an event loop in a thread of its own for the client's whole life, and
  `submit_complete` / `submit_chat` hand back a future per request, so a caller can send a
  request the moment it has one and collect replies as each arrives (continuous scheduling);
  `close()` ends it.
- **Bounds:** `timeout_s` is the wall-clock limit of one attempt, whatever the server does
  (a server that trickles its reply a byte at a time is cut there: `retrieval.wall_clock`), and
  a reply over `max_reply_bytes` is refused (`ReplyTooLarge`, not asked again).
- **Failures:** connection errors, timeouts, 408, 429 and 5xx are retried `max_retries` times
  with exponential backoff (honouring `Retry-After`), then raise `EndpointError` naming the URL
  and the last cause; any other 4xx, or a reply that is not the API's, raises
  `EndpointRejected` at once (retrying a bad request cannot help), `ContextLengthExceeded`
  when the prompt outgrew the model's context. `complete_each` / `chat_each` return such a
  refusal in the request's place instead, so one long episode does not end a whole batch.
- **Stop strings:** the OpenAI API cuts the stop string off the text. With
  `extensions="vllm"` (the default) the client asks vLLM to keep it
  (`include_stop_str_in_output`), to say which one matched (`stop_reason`) and to return the
  generated token ids (`return_token_ids`), which `OpenAICompatBackend` needs to be
  token-in/token-out. With `extensions="none"` (hosted APIs, which reject unknown fields) only
  standard fields are sent and `TextCompletion.stop` is None when the API does not say.

Both a synchronous API (`complete`, `chat`) and an asynchronous one (`acomplete`, `achat`) are
offered; the synchronous one runs its own event loop, so call the async one from inside a
running loop (a notebook, an async server).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import json
import logging
import re
import ssl
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import httpx

from harness.errors import (
    ContextLengthExceeded,
    EndpointError,
    EndpointRejected,
    MalformedReply,
    ReplyTooLarge,
)
from harness.policies.base import Completion, SamplingParams
from retrieval.wall_clock import aread_capped, attempt_ends_at, install_transport

__all__ = [
    "EndpointConfig",
    "Message",
    "OpenAICompatBackend",
    "OpenAICompatClient",
    "ReplyFuture",
    "TextCompletion",
    "ToolCallReply",
]

log = logging.getLogger(__name__)

Message = Mapping[str, Any]
"""A chat message, `{"role": "user" | "assistant" | "system", "content": str}`; an assistant's
may carry `tool_calls`, and a `"tool"` message answers one by its `tool_call_id`."""

FinishReason = Literal["stop", "length", "eos"]

_RETRY_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
# vLLM: "This model's maximum context length is 512 tokens"; OpenAI: the same words, and the
# code "context_length_exceeded"
_CONTEXT_ERROR = re.compile(r"maximum context length|context_length_exceeded", re.IGNORECASE)


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointConfig:
    """Where an OpenAI-compatible endpoint is and how to talk to it."""

    base_url: str
    """The API root, e.g. `http://127.0.0.1:8000/v1` (a missing `/v1` is added)."""
    model: str
    """The served model name (`vllm serve` uses the model path unless `--served-model-name`)."""
    api_key: str | None = None
    """Sent as `Authorization: Bearer ...` when set."""
    timeout_s: float = 120.0
    """Wall-clock limit of one attempt (connect, send, wait, read), however slowly the server
    sends; a turn of a long reasoning model can take a while."""
    max_retries: int = 3
    """Retries after the first attempt, for connection errors, timeouts, 408, 429 and 5xx."""
    backoff_s: float = 0.5
    """First retry delay; doubles each retry, capped at `max_backoff_s`."""
    max_backoff_s: float = 8.0
    max_concurrency: int = 16
    """Requests in flight at once per call."""
    extensions: Literal["vllm", "none"] = "vllm"
    """`vllm`: also send vLLM's fields (keep stop strings, return token ids, top_k, keep
    special tokens); `none`: the standard OpenAI fields only."""
    max_reply_bytes: int = 4_000_000
    """The largest reply body read; a larger one is refused (`ReplyTooLarge`). One turn of
    512 tokens with its token ids and log-probs is about 30 kB."""

    def __post_init__(self) -> None:
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url={self.base_url!r}: must start with http:// or https://")
        if (
            self.max_retries < 0
            or self.max_concurrency < 1
            or self.timeout_s <= 0
            or self.max_reply_bytes < 1
        ):
            raise ValueError(
                f"max_retries={self.max_retries} (>= 0), max_concurrency={self.max_concurrency} "
                f"(>= 1), timeout_s={self.timeout_s} (> 0), max_reply_bytes="
                f"{self.max_reply_bytes} (>= 1): out of range"
            )

    @property
    def api_root(self) -> str:
        """`base_url` without a trailing slash, ending in `/v1`."""
        root = self.base_url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallReply:
    """One entry of a chat reply's `tool_calls`: a function the model calls."""

    call_id: str
    """The call's id (echoed back by the `tool` message that answers it)."""
    name: str
    arguments: str
    """The arguments as the JSON text the model wrote (it may be malformed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TextCompletion:
    """One generated continuation, as an HTTP endpoint returns it."""

    text: str
    finish_reason: FinishReason
    """stop: a stop string (or, without vLLM's `stop_reason`, possibly EOS); length: max
    tokens; eos: the model's end token."""
    stop: str | None = None
    """The stop string that ended the text, when the server says (vLLM) or it is in the text."""
    token_ids: tuple[int, ...] | None = None
    """Generated token ids (vLLM's `return_token_ids`); None when the server gives none."""
    logprobs: tuple[float, ...] | None = None
    """Per generated token, when requested and offered."""
    n_prompt_tokens: int | None = None
    """From the reply's `usage`."""
    n_completion_tokens: int | None = None
    latency_s: float | None = None
    """Seconds from sending the request to its whole reply, retries included (not the wait
    for a free slot)."""
    tool_calls: tuple[ToolCallReply, ...] = ()
    """A chat reply's native tool calls (when the request offered `tools`)."""


_T = TypeVar("_T")

ReplyFuture = concurrent.futures.Future
"""What `submit_complete` / `submit_chat` return: resolves to a `TextCompletion`, or to the
`EndpointRejected` the endpoint answered with; raises `EndpointError` after the retries."""

_Parse = Callable[[dict[str, Any], SamplingParams], TextCompletion]


_POOL_SIZE = 8
"""Connections per pool of `_PooledTransport`: httpcore scans every connection of its pool
(and counts them again for each idle one) on every request start and end, O(pool size^2),
which at 64 connections in one pool capped a run at a seventh of the endpoint's limit."""


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """One SSL context for every pool: building one loads the CA store (80 ms here)."""
    return httpx.create_ssl_context()


class _Released(httpx.AsyncByteStream):
    """A response body that calls `release` once, when it is closed."""

    def __init__(self, inner: httpx.AsyncByteStream, release: Callable[[], None]) -> None:
        self._inner = inner
        self._release: Callable[[], None] | None = release

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            yield chunk

    async def aclose(self) -> None:
        try:
            await self._inner.aclose()
        finally:
            release, self._release = self._release, None
            if release is not None:
                release()


class _PooledTransport(httpx.AsyncBaseTransport):
    """Keep-alive pools of `_POOL_SIZE` connections behind one httpx client.

    Each request goes to the pool with the fewest requests in flight (counted until its body
    is closed), so with `max_concurrency` requests in flight no pool waits while another has
    room, and each request costs a scan of a small pool instead of all connections. Every
    pool's sockets are bounded by the wall clock (`retrieval.wall_clock`).
    """

    def __init__(self, max_connections: int) -> None:
        n_pools = -(-max_connections // _POOL_SIZE)
        size = min(max_connections, _POOL_SIZE)
        limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
        ssl = _ssl_context()
        self._pools = [httpx.AsyncHTTPTransport(verify=ssl, limits=limits) for _ in range(n_pools)]
        for pool in self._pools:
            install_transport(pool)
        self._in_flight = [0] * n_pools

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send `request` on the least busy pool."""
        i = min(range(len(self._pools)), key=self._in_flight.__getitem__)
        self._in_flight[i] += 1

        def release() -> None:
            self._in_flight[i] -= 1

        try:
            response = await self._pools[i].handle_async_request(request)
        except BaseException:
            release()
            raise
        assert isinstance(response.stream, httpx.AsyncByteStream)
        response.stream = _Released(response.stream, release)
        return response

    async def aclose(self) -> None:
        """Close every pool."""
        for pool in self._pools:
            await pool.aclose()


class _Session:
    """One `httpx.AsyncClient` on an event loop in a daemon thread, for a client's whole life.

    Every synchronous request goes through it, so connections are kept alive across turns and
    a request can be sent while others are in flight (one pool, one SSL context, one gate).
    """

    def __init__(self, make_http: Callable[[], httpx.AsyncClient], max_concurrency: int) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="openai-compat", daemon=True
        )
        self._thread.start()
        self._max_concurrency = max_concurrency
        self.http, self.gate = self.run(self._open(make_http)).result()

    async def _open(
        self, make_http: Callable[[], httpx.AsyncClient]
    ) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        return make_http(), asyncio.Semaphore(self._max_concurrency)  # bound to this loop

    def run(self, coro: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Schedule `coro` on the session's loop."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def close(self) -> None:
        """Cancel what is in flight, close the connections, stop the thread."""

        async def shut() -> None:
            current = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not current]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.http.aclose()

        self.run(shut()).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


class OpenAICompatClient:
    """Batched, concurrent, retrying calls to an OpenAI-compatible endpoint.

    Args:
        config: the endpoint.
        transport: an httpx transport to use instead of the network (tests, proxies); the
            wall-clock bound then is the transport's business.

    Example:
        >>> client = OpenAICompatClient(EndpointConfig(base_url="http://127.0.0.1:8000/v1",
        ...                                            model="Qwen/Qwen3-8B"))  # doctest: +SKIP
        >>> client.complete(["<think>"], SamplingParams(temperature=0))[0].text  # doctest: +SKIP
    """

    def __init__(
        self, config: EndpointConfig, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.config = config
        self._transport = transport
        self._warned_retry = False
        self._session: _Session | None = None
        self._session_lock = threading.Lock()

    # --- public API ------------------------------------------------------------------------

    def models(self) -> list[str] | None:
        """`GET /v1/models`: the served model ids, or None if the endpoint has no such route.

        One attempt, over within 10 s of wall-clock time (or `timeout_s` if shorter): it runs
        before a benchmark, to fail at once on a dead endpoint or a wrong model name instead
        of after every request's retries.

        Raises:
            EndpointError: the endpoint does not answer.
            EndpointRejected: it answers 401/403 (a bad key) or a reply that is not a model list.
        """
        return _run_sync(self._amodels())

    async def _amodels(self) -> list[str] | None:
        url = self.config.api_root + "/models"
        timeout = min(self.config.timeout_s, 10.0)
        try:
            async with self._http(timeout) as http:
                with attempt_ends_at(time.monotonic() + timeout):
                    response = await http.get(url)
        except httpx.TimeoutException as err:
            raise EndpointError(
                f"cannot reach {self.config.api_root} ({type(err).__name__}: no whole reply "
                f"within {timeout:g} s); is the server up? Start one with `vllm serve MODEL`"
            ) from err
        except httpx.TransportError as err:
            raise EndpointError(
                f"cannot reach {self.config.api_root} ({type(err).__name__}: {err or 'no reply'}); "
                "is the server up? Start one with `vllm serve MODEL`"
            ) from err
        if response.status_code in (404, 405):
            return None
        if response.status_code in (401, 403):
            raise EndpointRejected(
                f"GET {url} was refused with HTTP {response.status_code}: check --api-key "
                "(or $OPENAI_API_KEY)"
            )
        try:
            data = response.json()["data"]
            return [str(m["id"]) for m in data]
        except (ValueError, KeyError, TypeError) as err:
            raise EndpointRejected(
                f"GET {url} answered HTTP {response.status_code} without a model list: "
                f"{response.text[:200]!r}"
            ) from err

    def complete(
        self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams
    ) -> list[TextCompletion]:
        """`/v1/completions` for each prompt (text, or token ids), one completion each.

        Raises:
            EndpointError: a request still failed after the retries.
            EndpointRejected: the endpoint refused a request or sent a malformed reply.
            RuntimeError: called from inside a running event loop (use `acomplete`).
        """
        return _all_completions(self.complete_each(prompts, sampling), capture=False)

    def chat(
        self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams
    ) -> list[TextCompletion]:
        """`/v1/chat/completions` for each conversation, one reply each.

        Raises:
            EndpointError: a request still failed after the retries.
            EndpointRejected: the endpoint refused a request or sent a malformed reply.
            RuntimeError: called from inside a running event loop (use `achat`).
        """
        return _all_completions(self.chat_each(conversations, sampling), capture=False)

    def complete_each(
        self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams
    ) -> list[TextCompletion | EndpointRejected]:
        """`complete`, but a request the endpoint refuses gives its error in its place.

        An agent uses this so that one prompt that outgrew the model's context
        (`ContextLengthExceeded`) ends one episode, not the whole batch.

        Raises:
            EndpointError: a request still failed after the retries.
        """
        _no_running_loop()
        bodies = [self._completion_body(p, sampling, i) for i, p in enumerate(prompts)]
        return _gather([self._submit("/completions", b, sampling, _parse_completion_choice)
                        for b in bodies])  # fmt: skip

    def chat_each(
        self,
        conversations: Sequence[Sequence[Message]],
        sampling: SamplingParams,
        *,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> list[TextCompletion | EndpointRejected]:
        """`chat`, but a request the endpoint refuses gives its error in its place.

        `tools` (OpenAI function schemas) are offered with every request; the replies'
        `tool_calls` come back in `TextCompletion.tool_calls`.

        Raises:
            EndpointError: a request still failed after the retries.
        """
        _no_running_loop()
        bodies = [self._chat_body(m, sampling, i, tools=tools) for i, m in enumerate(conversations)]
        return _gather([self._submit("/chat/completions", b, sampling, _parse_chat_choice)
                        for b in bodies])  # fmt: skip

    def submit_complete(
        self, prompt: str | Sequence[int], sampling: SamplingParams
    ) -> ReplyFuture[TextCompletion | EndpointRejected]:
        """Send one `/v1/completions` request now; its reply arrives in the future returned.

        The request waits for a free slot (`max_concurrency`) on the client's one connection
        pool; a retried request holds only its own future.
        """
        body = self._completion_body(prompt, sampling, 0)
        return self._submit("/completions", body, sampling, _parse_completion_choice)

    def submit_chat(
        self,
        messages: Sequence[Message],
        sampling: SamplingParams,
        *,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> ReplyFuture[TextCompletion | EndpointRejected]:
        """`submit_complete` for one `/v1/chat/completions` conversation (offering `tools`)."""
        body = self._chat_body(messages, sampling, 0, tools=tools)
        return self._submit("/chat/completions", body, sampling, _parse_chat_choice)

    def close(self) -> None:
        """Cancel the requests in flight and close the connections (a later call reopens)."""
        with self._session_lock:
            session, self._session = self._session, None
        if session is not None:
            session.close()

    async def acomplete(
        self, prompts: Sequence[str | Sequence[int]], sampling: SamplingParams
    ) -> list[TextCompletion]:
        """Async `complete` (a client of its own per call, on the caller's loop)."""
        bodies = [self._completion_body(p, sampling, i) for i, p in enumerate(prompts)]
        return await self._post_all("/completions", bodies, sampling, _parse_completion_choice)

    async def achat(
        self, conversations: Sequence[Sequence[Message]], sampling: SamplingParams
    ) -> list[TextCompletion]:
        """Async `chat`."""
        bodies = [self._chat_body(m, sampling, i) for i, m in enumerate(conversations)]
        return await self._post_all("/chat/completions", bodies, sampling, _parse_chat_choice)

    # --- requests --------------------------------------------------------------------------

    def _common_body(self, sampling: SamplingParams, index: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model,
            "max_tokens": sampling.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "n": 1,
        }
        if sampling.stop:
            body["stop"] = list(sampling.stop)
        if sampling.seed is not None:
            # one seed per request, so identical prompts in a batch still differ (as VLLMBackend)
            body["seed"] = (sampling.seed * 1_000_003 + index) % 2**63
        if self.config.extensions == "vllm":
            body["include_stop_str_in_output"] = True
            body["return_token_ids"] = True
            body["skip_special_tokens"] = False  # the tiny policy's tags are special tokens
            if sampling.top_k > 0:
                body["top_k"] = sampling.top_k
        return body

    def _completion_body(
        self, prompt: str | Sequence[int], sampling: SamplingParams, index: int
    ) -> dict[str, Any]:
        body = self._common_body(sampling, index)
        body["prompt"] = prompt if isinstance(prompt, str) else [int(t) for t in prompt]
        if sampling.logprobs:
            body["logprobs"] = 0 if self.config.extensions == "vllm" else 1  # sampled token only
        return body

    def _chat_body(
        self,
        messages: Sequence[Message],
        sampling: SamplingParams,
        index: int,
        *,
        tools: Sequence[Mapping[str, Any]] = (),
    ) -> dict[str, Any]:
        body = self._common_body(sampling, index)
        body["messages"] = [dict(m) for m in messages]
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if sampling.logprobs:
            body["logprobs"] = True
        return body

    def _http(self, timeout: float) -> httpx.AsyncClient:
        """An httpx client whose every attempt `attempt_ends_at` can cut by the wall clock."""
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        # every slot keeps its connection between turns (httpx keeps only 20 by default)
        transport = self._transport or _PooledTransport(self.config.max_concurrency)
        return httpx.AsyncClient(timeout=timeout, headers=headers, transport=transport)

    def _submit(
        self, path: str, body: dict[str, Any], sampling: SamplingParams, parse: _Parse
    ) -> ReplyFuture[TextCompletion | EndpointRejected]:
        with self._session_lock:
            if self._session is None:
                self._session = _Session(
                    lambda: self._http(self.config.timeout_s), self.config.max_concurrency
                )
            session = self._session
        url = self.config.api_root + path
        return session.run(self._one(session.http, session.gate, url, body, sampling, parse))

    async def _one(
        self,
        http: httpx.AsyncClient,
        gate: asyncio.Semaphore,
        url: str,
        body: dict[str, Any],
        sampling: SamplingParams,
        parse: _Parse,
    ) -> TextCompletion | EndpointRejected:
        try:
            return await self._post_and_parse(http, gate, url, body, sampling, parse)
        except EndpointRejected as err:
            return err

    async def _post_all(
        self, path: str, bodies: list[dict[str, Any]], sampling: SamplingParams, parse: _Parse
    ) -> list[TextCompletion]:
        if not bodies:
            return []
        url = self.config.api_root + path
        gate = asyncio.Semaphore(self.config.max_concurrency)
        async with self._http(self.config.timeout_s) as http:
            return list(
                await asyncio.gather(
                    *(self._post_and_parse(http, gate, url, b, sampling, parse) for b in bodies)
                )
            )

    async def _post_and_parse(
        self,
        http: httpx.AsyncClient,
        gate: asyncio.Semaphore,
        url: str,
        body: dict[str, Any],
        sampling: SamplingParams,
        parse: _Parse,
    ) -> TextCompletion:
        """One request's completion; a malformed 200 reply is asked again, `max_retries` times.

        Raises:
            MalformedReply: every reply was malformed (the caller fails that episode only).
            ReplyTooLarge: the reply passed `max_reply_bytes` (not asked again).
        """
        for attempt in range(self.config.max_retries + 1):
            try:
                async with gate:
                    start = time.monotonic()
                    reply = await self._post_with_retries(http, url, body)
                    completion = _parse_reply(reply, url, sampling, parse)
                    return dataclasses.replace(completion, latency_s=time.monotonic() - start)
            except ReplyTooLarge:
                raise
            except MalformedReply as err:
                if attempt == self.config.max_retries:
                    raise
                log.warning("%s; asking again (%d/%d)", err, attempt + 1, self.config.max_retries)
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _post_with_retries(
        self, http: httpx.AsyncClient, url: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """POST with bounded retries; the only place in the harness that retries HTTP.

        Each attempt ends within `timeout_s` of wall-clock time (`retrieval.wall_clock`), and
        reads at most `max_reply_bytes` of the reply.
        """
        attempts = self.config.max_retries + 1
        last: str = ""
        cap = self.config.max_reply_bytes
        too_large = ReplyTooLarge(
            f"POST {url} sent a reply of over {cap:,} bytes, the client's cap "
            "(max_reply_bytes); the server is broken, or raise the cap"
        )
        for attempt in range(attempts):
            delay = min(self.config.backoff_s * 2**attempt, self.config.max_backoff_s)
            end = time.monotonic() + self.config.timeout_s
            try:
                with attempt_ends_at(end):
                    async with http.stream(
                        "POST",
                        url,
                        json=body,
                        timeout=httpx.Timeout(self.config.timeout_s, pool=self.config.timeout_s),
                    ) as response:
                        declared = response.headers.get("content-length", "")
                        if declared.isdigit() and int(declared) > cap:
                            raise too_large
                        content = await aread_capped(response.aiter_bytes(), cap, too_large)
            except httpx.TimeoutException as err:  # a slow server, or the wall clock ran out
                last = (
                    f"{type(err).__name__}: no whole reply within timeout_s="
                    f"{self.config.timeout_s:g} s of wall-clock time"
                )
            except httpx.TransportError as err:  # connect, protocol
                last = f"{type(err).__name__}: {err}"
            else:
                if response.status_code == 200:
                    try:
                        reply = json.loads(content)
                    except ValueError as err:
                        raise MalformedReply(
                            f"POST {url}: the reply is not JSON ({content[:200]!r})"
                        ) from err
                    if not isinstance(reply, dict):
                        raise MalformedReply(f"POST {url}: the reply is not a JSON object")
                    return reply
                text = content.decode("utf-8", "replace")
                detail = text[:300]
                if response.status_code not in _RETRY_STATUSES:
                    refused = f"POST {url} was refused with HTTP {response.status_code}: {detail}"
                    if _CONTEXT_ERROR.search(text):
                        raise ContextLengthExceeded(refused)
                    raise EndpointRejected(refused)
                last = f"HTTP {response.status_code}: {detail}"
                delay = _retry_after(response, default=delay, cap=self.config.max_backoff_s)
            if attempt + 1 < attempts:
                # the first retry warns; the rest (every request of a batch retries) log at
                # debug, so a dying endpoint gives one warning and then one error
                level = logging.DEBUG if self._warned_retry else logging.WARNING
                self._warned_retry = True
                log.log(
                    level,
                    "POST %s failed (%s); retry %d/%d in %.2f s",
                    url,
                    last,
                    attempt + 1,
                    self.config.max_retries,
                    delay,
                )
                await asyncio.sleep(delay)
        raise EndpointError(
            f"POST {url} failed {attempts} times (last: {last}). Is the server up and serving "
            f"model {self.config.model!r}? Start one with `vllm serve MODEL`, or raise the "
            "timeout (timeout_s) or the retries (max_retries)."
        )


def _gather(
    futures: list[ReplyFuture[TextCompletion | EndpointRejected]],
) -> list[TextCompletion | EndpointRejected]:
    """Every future's result, in order; on the first error the rest are cancelled."""
    try:
        return [f.result() for f in futures]
    except BaseException:
        for f in futures:
            f.cancel()
        raise


def _all_completions(
    results: list[TextCompletion | EndpointRejected], *, capture: bool
) -> list[TextCompletion]:
    """`results` as completions; the first refusal is raised unless `capture`."""
    out = []
    for result in results:
        if isinstance(result, EndpointRejected):
            if not capture:
                raise result
            continue
        out.append(result)
    return out


def _retry_after(response: httpx.Response, *, default: float, cap: float) -> float:
    """The server's `Retry-After` (seconds), capped; `default` if it sends none we can read."""
    value = response.headers.get("retry-after")
    try:
        return min(max(float(value), 0.0), cap) if value is not None else default
    except ValueError:
        return default


def _no_running_loop() -> None:
    """Refuse a synchronous call from inside a running loop: it would block that loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    raise RuntimeError(
        "OpenAICompatClient.complete/chat was called inside a running event loop; "
        "await acomplete/achat instead"
    )


def _run_sync(coro: Awaitable[_T]) -> _T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)  # type: ignore[arg-type]
    coro.close()  # type: ignore[attr-defined]  # never awaited: do not leak a warning
    raise RuntimeError(
        "OpenAICompatClient.complete/chat was called inside a running event loop; "
        "await acomplete/achat instead"
    )


# --- replies -----------------------------------------------------------------------------------


def _parse_reply(
    reply: dict[str, Any],
    url: str,
    sampling: SamplingParams,
    parse: _Parse,
) -> TextCompletion:
    """The reply's first choice with its usage; anything off-schema is a `MalformedReply`.

    Wrong-typed fields (a `message` that is a string, a `usage` that is a list) count as
    malformed too: they end their episode, not the run.
    """
    try:
        choice = reply["choices"][0]
        return _with_usage(parse(choice, sampling), reply.get("usage") or {})
    except (KeyError, IndexError, TypeError, ValueError, AttributeError) as err:
        raise MalformedReply(
            f"POST {url}: the reply is not an OpenAI completion ({err!r}): {str(reply)[:300]}"
        ) from err


def _with_usage(completion: TextCompletion, usage: Mapping[str, Any]) -> TextCompletion:
    prompt, generated = usage.get("prompt_tokens"), usage.get("completion_tokens")
    return dataclasses.replace(
        completion,
        n_prompt_tokens=int(prompt) if prompt is not None else None,
        n_completion_tokens=int(generated) if generated is not None else None,
    )


def _finish(
    choice: Mapping[str, Any], text: str, sampling: SamplingParams
) -> tuple[FinishReason, str | None]:
    """Map OpenAI's finish_reason (+ vLLM's stop_reason) onto ours, and name the stop string."""
    reason = choice.get("finish_reason")
    if reason == "length":
        return "length", None
    stop_reason = choice.get("stop_reason")
    if isinstance(stop_reason, str):
        return "stop", stop_reason
    ending = next((s for s in sampling.stop if text.endswith(s)), None)
    if ending is not None:
        return "stop", ending
    if "stop_reason" in choice:  # vLLM says: no stop string, no stop token id -> EOS
        return "eos", None
    return "stop", None  # plain OpenAI: a stop string (cut off) or EOS; it does not say


def _parse_completion_choice(choice: dict[str, Any], sampling: SamplingParams) -> TextCompletion:
    text = str(choice["text"])
    finish, stop = _finish(choice, text, sampling)
    logprobs = None
    if choice.get("logprobs"):
        logprobs = tuple(float(x) for x in choice["logprobs"]["token_logprobs"])
    token_ids = choice.get("token_ids")
    return TextCompletion(
        text=text,
        finish_reason=finish,
        stop=stop,
        token_ids=tuple(int(t) for t in token_ids) if token_ids is not None else None,
        logprobs=logprobs,
    )


def _parse_tool_calls(entries: Any) -> tuple[ToolCallReply, ...]:
    """A message's `tool_calls` (None: none); arguments sent as an object become JSON text.

    Raises:
        TypeError: `tool_calls` is not a list of objects with a `function` object.
    """
    if entries is None:
        return ()
    if not isinstance(entries, list):
        raise TypeError(f"tool_calls is a {type(entries).__name__}, not a list")
    calls = []
    for i, entry in enumerate(entries):
        function = entry.get("function") if isinstance(entry, dict) else None
        if not isinstance(function, dict):
            raise TypeError(f"tool_calls[{i}] has no function object")
        arguments = function.get("arguments", "")
        calls.append(
            ToolCallReply(
                call_id=str(entry.get("id") or f"call_{i}"),
                name=str(function.get("name", "")),
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    return tuple(calls)


def _parse_chat_choice(choice: dict[str, Any], sampling: SamplingParams) -> TextCompletion:
    text = str(choice["message"].get("content") or "")
    finish, stop = _finish(choice, text, sampling)
    logprobs = None
    if choice.get("logprobs") and choice["logprobs"].get("content") is not None:
        logprobs = tuple(float(item["logprob"]) for item in choice["logprobs"]["content"])
    token_ids = choice.get("token_ids")
    return TextCompletion(
        text=text,
        finish_reason=finish,
        stop=stop,
        token_ids=tuple(int(t) for t in token_ids) if token_ids is not None else None,
        logprobs=logprobs,
        tool_calls=_parse_tool_calls(choice["message"].get("tool_calls")),
    )


# --- PolicyBackend -----------------------------------------------------------------------------


class OpenAICompatBackend:
    """A token-in/token-out `PolicyBackend` over a vLLM OpenAI-compatible server.

    Prefixes go to `/v1/completions` as token-id prompts, and the generated token ids come back
    through vLLM's `return_token_ids`, so the tree-rollout engine can append observation tokens
    without re-tokenising. Hosted APIs do not return token ids and cannot serve this path.

    Args:
        client: the client; its config must use `extensions="vllm"`.

    Raises:
        ValueError: the client does not use vLLM's extensions.
    """

    def __init__(self, client: OpenAICompatClient) -> None:
        if client.config.extensions != "vllm":
            raise ValueError(
                "OpenAICompatBackend needs generated token ids, which only vLLM's "
                "`return_token_ids` provides: use EndpointConfig(extensions='vllm')"
            )
        self.client = client

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once.

        Raises:
            ValueError: a prefix is empty.
            EndpointError: a request still failed after the retries.
            EndpointRejected: the server returned no token ids (not vLLM, or vLLM < 0.10.2),
                or log-probs that do not match the tokens.
        """
        for i, prefix in enumerate(prefixes):
            if len(prefix) == 0:
                raise ValueError(f"prefix {i} is empty: a prefix needs at least one token")
        results = self.client.complete(prefixes, sampling)
        return [self._completion(r, sampling) for r in results]

    def _completion(self, result: TextCompletion, sampling: SamplingParams) -> Completion:
        url = self.client.config.api_root
        if result.token_ids is None:
            raise EndpointRejected(
                f"{url} returned no token ids; the token-in/token-out backend needs a vLLM "
                "server (>= 0.10.2) that honours `return_token_ids`"
            )
        logprobs: tuple[float, ...] = ()
        if sampling.logprobs:
            logprobs = result.logprobs or ()
            if len(logprobs) != len(result.token_ids):
                raise EndpointRejected(
                    f"{url} returned {len(logprobs)} log-probs for {len(result.token_ids)} tokens"
                )
        return Completion(
            token_ids=result.token_ids,
            text=result.text,
            logprobs=logprobs,
            finish_reason=result.finish_reason,
        )
