"""The server's connection guard: open connections, header and body deadlines, header size.

uvicorn on its own closes an idle keep-alive connection but never a new connection that sends
nothing, nor one that sends its headers or body a byte at a time; it has no cap on open
connections (past the process's file-descriptor limit every new connection then fails, with
nothing logged) and, with httptools, no cap on header size. `guarded_protocol` returns uvicorn's
h11 protocol with those gaps closed:

- past `max_open` open connections, a new one is answered `503` (`Retry-After: 1`) and closed
  at once, and a line is logged (at most one every 10 s, with the count refused since);
- a connection must deliver a request's line and headers within `header_timeout_s` of its first
  byte (of being opened, for a new connection), else it gets `408` and is closed;
- a request's body must arrive within `body_timeout_s` of its headers, else the connection is
  closed (the app then sees the client disconnect);
- headers of over `max_header_bytes` get `431` and the connection is closed, having buffered at
  most that many bytes plus one read;
- an idle keep-alive connection is closed after `idle_timeout_s` (uvicorn's own timer).
"""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["ConnectionLimits", "check_descriptor_room", "guarded_protocol"]

log = logging.getLogger(__name__)

_SPARE_DESCRIPTORS = 64  # the listening socket, index files, logs, the encoder's files
_LOG_EVERY_S = 10.0


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionLimits:
    """What one client connection may hold; docs/retrieval.md ("Limits") says why these."""

    max_open: int = 512
    """open connections; one more gets a 503 and is closed (keep it under `ulimit -n`)"""
    max_header_bytes: int = 16_384
    """request line and headers, in bytes (431 above)"""
    header_timeout_s: float = 10.0
    """seconds for a request's line and headers to arrive (408 after)"""
    body_timeout_s: float = 30.0
    """seconds for a request's body to arrive after its headers (closed after)"""
    idle_timeout_s: float = 30.0
    """seconds a keep-alive connection may wait for its next request"""

    def __post_init__(self) -> None:
        if self.max_open < 1 or self.max_header_bytes < 1_024:
            raise ValueError(
                f"--connections.max-open must be >= 1 (got {self.max_open}) and "
                f"--connections.max-header-bytes >= 1024 (got {self.max_header_bytes})"
            )
        for name in ("header_timeout_s", "body_timeout_s", "idle_timeout_s"):
            value = getattr(self, name)
            if not 0 < value < float("inf"):
                flag = "--connections." + name.replace("_", "-")
                raise ValueError(f"{flag} must be a positive number of seconds, got {value}")


def check_descriptor_room(limits: ConnectionLimits) -> None:
    """Make room for `max_open` sockets under the process's descriptor limit, or refuse.

    Raises the soft limit towards the hard one if needed.

    Raises:
        ValueError: the hard limit leaves no room; names both fixes.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = limits.max_open + _SPARE_DESCRIPTORS
    if soft == resource.RLIM_INFINITY or need <= soft:
        return
    if hard == resource.RLIM_INFINITY or need <= hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return
    raise ValueError(
        f"--connections.max-open {limits.max_open} needs {need} file descriptors, over this "
        f"process's limit of {hard}: lower --connections.max-open or raise `ulimit -n`"
    )


def _response(status: int, reason: str, detail: str, extra: dict[str, str] | None = None) -> bytes:
    body = json.dumps({"detail": detail}).encode()
    headers = {
        "content-type": "application/json",
        "content-length": str(len(body)),
        "connection": "close",
        **(extra or {}),
    }
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return f"HTTP/1.1 {status} {reason}\r\n{head}\r\n".encode() + body


class _Refusals:
    """Counts refused connections and logs them at most once per `_LOG_EVERY_S`."""

    def __init__(self) -> None:
        self.count = 0
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0

    def add(self, open_now: int, limit: int) -> None:
        self.count += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            log.warning(
                "refused %d connection(s) with 503: %d open, the limit is %d "
                "(--connections.max-open)",
                self._unlogged,
                open_now,
                limit,
            )
            self._logged_at, self._unlogged = now, 0


class _GuardedProtocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]
    refusals: ClassVar[_Refusals]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = b""  # the bytes of a request's line and headers received so far
        self._timer: asyncio.TimerHandle | None = None
        self._timed_cycle: object = None  # the request whose body the timer waits for

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_open:
            self.refusals.add(len(self.connections), self.limits.max_open)
            detail = f"the server holds {self.limits.max_open} connections, its limit; retry"
            self._refuse(503, "Service Unavailable", detail, {"retry-after": "1"})
            return
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def data_received(self, data: bytes) -> None:
        if self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # waiting for a request's line and headers
            if self._timer is None:  # the first byte after a keep-alive wait
                self._arm(self.limits.header_timeout_s, self._headers_late)
            head = self._head + data
            end = head.find(b"\r\n\r\n")
            if (end if end >= 0 else len(head)) > self.limits.max_header_bytes:
                self._refuse(
                    431,
                    "Request Header Fields Too Large",
                    f"request line and headers exceed {self.limits.max_header_bytes} bytes",
                )
                return
            self._head = head if end < 0 else b""
        super().data_received(data)
        self._follow_cycle()

    def _follow_cycle(self) -> None:
        """Swap the header deadline for the body's once headers are in; drop it at the end."""
        cycle = self.cycle
        if cycle is None or self.conn.their_state is h11.IDLE:
            return
        if cycle is not self._timed_cycle:  # a new request's headers just arrived
            self._timed_cycle = cycle
            self._head = b""
            self._disarm()
            if cycle.more_body:
                self._arm(self.limits.body_timeout_s, self._body_late)
        elif not cycle.more_body:
            self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, delay: float, callback: Any) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _headers_late(self) -> None:
        self._timer = None
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            detail = f"no complete request headers within {self.limits.header_timeout_s} s"
            self._refuse(408, "Request Timeout", detail)

    def _body_late(self) -> None:
        self._timer = None
        if self.cycle is not None and self.cycle.more_body and not self.transport.is_closing():
            log.info("closed a connection whose body took over %s s", self.limits.body_timeout_s)
            self.transport.close()

    def _refuse(
        self, status: int, reason: str, detail: str, extra: dict[str, str] | None = None
    ) -> None:
        self._disarm()
        self._head = b""
        self.transport.write(_response(status, reason, detail, extra))
        self.transport.close()


def guarded_protocol(limits: ConnectionLimits) -> type[H11Protocol]:
    """The h11 protocol class of uvicorn with `limits` enforced (`uvicorn.Config(http=...)`)."""
    return type("GuardedProtocol", (_GuardedProtocol,), {"limits": limits, "refusals": _Refusals()})
