"""A wall-clock end for one HTTP attempt, enforced on every socket operation httpcore makes.

httpx's timeouts bound each connect, read and write on its own: a server that sends its
headers or body one byte at a time never lets a read time out and can hold a caller for as
long as it likes. `attempt_ends_at(end)` sets, for the block, the `time.monotonic()` moment the
attempt must be over; the network backend installed by `install` cuts every connect, TLS
handshake, read and write to the time left and raises httpcore's timeout once none is left.
So an attempt ends at `end` (plus one scheduler tick) whatever the server does, in the
connect, the headers or the body, without a watchdog thread. Outside a block, httpx's own
timeouts apply unchanged.

`read_capped` / `aread_capped` bound the other side of an attempt, its size: they read a body
and stop as soon as it passes a byte cap, so a server cannot fill the caller's memory.
"""

from __future__ import annotations

import time
import typing
from collections.abc import AsyncIterable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import httpcore
import httpx

__all__ = ["aread_capped", "attempt_ends_at", "install", "install_transport", "read_capped"]

_END: ContextVar[float | None] = ContextVar("http_attempt_end", default=None)
_WRITE_PIECE = 65_536  # a write is cut into pieces so that a stalled reader cannot hold one


@contextmanager
def attempt_ends_at(end: float) -> Iterator[None]:
    """Every socket operation of httpx transports made by `install` ends by `end` in the block."""
    token = _END.set(end)
    try:
        yield
    finally:
        _END.reset(token)


def _left(timeout: float | None, error: type[Exception]) -> float | None:
    """`timeout` cut to the attempt's time left; `error` once none is left."""
    end = _END.get()
    if end is None:
        return timeout
    left = end - time.monotonic()
    if left <= 0:
        raise error("the request's wall-clock deadline passed")
    return left if timeout is None else min(timeout, left)


def _pieces(buffer: bytes) -> Iterable[bytes]:
    return (buffer[i : i + _WRITE_PIECE] for i in range(0, len(buffer), _WRITE_PIECE))


class _Stream(httpcore.NetworkStream):
    def __init__(self, inner: httpcore.NetworkStream) -> None:
        self._inner = inner

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for piece in _pieces(buffer):
            self._inner.write(piece, _left(timeout, httpcore.WriteTimeout))

    def close(self) -> None:
        self._inner.close()

    def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    def __init__(self, inner: httpcore.NetworkBackend) -> None:
        self._inner = inner

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_tcp(host, port, timeout, local_address, socket_options))

    def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.NetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _Stream(self._inner.connect_unix_socket(path, timeout, socket_options))

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


class _AsyncStream(httpcore.AsyncNetworkStream):
    def __init__(self, inner: httpcore.AsyncNetworkStream) -> None:
        self._inner = inner

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        return await self._inner.read(max_bytes, _left(timeout, httpcore.ReadTimeout))

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        for piece in _pieces(buffer):
            await self._inner.write(piece, _left(timeout, httpcore.WriteTimeout))

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def start_tls(
        self,
        ssl_context: typing.Any,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _AsyncStream(await self._inner.start_tls(ssl_context, server_hostname, timeout))

    def get_extra_info(self, info: str) -> typing.Any:
        return self._inner.get_extra_info(info)


class _AsyncBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        inner = await self._inner.connect_tcp(host, port, timeout, local_address, socket_options)
        return _AsyncStream(inner)

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[typing.Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        timeout = _left(timeout, httpcore.ConnectTimeout)
        return _AsyncStream(await self._inner.connect_unix_socket(path, timeout, socket_options))

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def install(client: httpx.Client | httpx.AsyncClient) -> None:
    """Route `client`'s transports (its default one and any proxy's) through the deadline.

    httpx exposes no network-backend option, so this swaps the backend of the connection pool
    each of its transports built (`install_transport`).
    """
    for transport in [client._transport, *(t for t in client._mounts.values() if t)]:
        install_transport(transport)


def install_transport(transport: httpx.BaseTransport | httpx.AsyncBaseTransport) -> None:
    """Route one httpx transport's connection pool through the deadline.

    httpcore's `ConnectionPool` and its proxy subclasses keep the backend in
    `_network_backend`; the trickle tests in `tests/retrieval/test_wall_clock.py` fail if that
    ever changes.

    Raises:
        RuntimeError: the transport has no connection pool to wrap (a mock transport).
    """
    wrapper = _AsyncBackend if isinstance(transport, httpx.AsyncBaseTransport) else _Backend
    pool = getattr(transport, "_pool", None)
    inner = getattr(pool, "_network_backend", None)
    if inner is None:
        raise RuntimeError(f"httpx's transport {transport!r} has no network backend to wrap")
    if not isinstance(inner, _Backend | _AsyncBackend):
        pool._network_backend = wrapper(inner)  # type: ignore[union-attr]


def read_capped(chunks: Iterable[bytes], cap: int, too_large: Exception) -> bytes:
    """The body from `chunks`; `too_large` as soon as it passes `cap` bytes."""
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)


async def aread_capped(chunks: AsyncIterable[bytes], cap: int, too_large: Exception) -> bytes:
    """`read_capped` for an async body."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > cap:
            raise too_large
        parts.append(chunk)
    return b"".join(parts)
