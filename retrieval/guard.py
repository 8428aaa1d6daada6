"""The server's connection guard: open connections, header and body deadlines, header size.

uvicorn on its own closes an idle keep-alive connection but never a new connection that sends
nothing, nor one that sends its headers or body a byte at a time; it has no cap on open
connections (past the process's file-descriptor limit every new connection then fails, with
nothing logged) and, with httptools, no cap on header size. `guarded_protocol` returns uvicorn's
h11 protocol with those gaps closed:

- past `max_open` open connections, the connection that has waited longest for its request to
  arrive (headers or body still coming, or idle between requests) is answered `503` and closed
  to make room, so a flood of slow sockets cannot lock out clients that send their request at
  once; only when every connection is busy with a request is the new one refused (`503`,
  `Retry-After: 1`). Both are logged (at most one line every 10 s, with the count since);
- an answer the client does not read may wait in the server's buffer `write_timeout_s`, and
  all such answers together may hold `max_unsent_bytes` (past it the longest-stalled
  connection is cut), so clients that never read cannot pin the server's memory;
- on shutdown, a connection whose answer is stuck in the buffer is cut at once (the others
  finish within `shutdown_grace_s`, `serve`);
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

__all__ = ["ConnectionLimits", "Throttled", "check_descriptor_room", "guarded_protocol"]

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
    write_timeout_s: float = 10.0
    """seconds an answer may sit unread in the server's buffer before the connection is cut"""
    max_unsent_bytes: int = 64 << 20
    """answer bytes that clients not reading may hold in the server, all together; past it
    the connection stalled longest is cut"""
    shutdown_grace_s: float = 5.0
    """seconds in-flight requests get to finish after SIGTERM before the server exits"""

    def __post_init__(self) -> None:
        if self.max_open < 1 or self.max_header_bytes < 1_024 or self.max_unsent_bytes < 1:
            raise ValueError(
                f"--connections.max-open must be >= 1 (got {self.max_open}), "
                f"--connections.max-header-bytes >= 1024 (got {self.max_header_bytes}) and "
                f"--connections.max-unsent-bytes >= 1 (got {self.max_unsent_bytes})"
            )
        names = (
            "header_timeout_s",
            "body_timeout_s",
            "idle_timeout_s",
            "write_timeout_s",
            "shutdown_grace_s",
        )
        for name in names:
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


class Throttled:
    """Counts events (refused, evicted or cut connections); logs them at most once per 10 s.

    Args:
        template: the log line, formatted with the count since the last line and `add`'s args.
    """

    def __init__(
        self, template: str, *, logger: logging.Logger | None = None, level: int = logging.WARNING
    ) -> None:
        self._template = template
        self._log = logger or log
        self._level = level
        self.count = 0
        self._logged_at = -_LOG_EVERY_S
        self._unlogged = 0

    def add(self, *args: object) -> None:
        """Count one event; log the count since the last line if none came in 10 s."""
        self.count += 1
        self._unlogged += 1
        now = time.monotonic()
        if now - self._logged_at >= _LOG_EVERY_S:
            self._log.log(self._level, self._template, self._unlogged, *args)
            self._logged_at, self._unlogged = now, 0


class _GuardedProtocol(H11Protocol):
    limits: ClassVar[ConnectionLimits]
    refusals: ClassVar[Throttled]
    evictions: ClassVar[Throttled]
    cuts: ClassVar[Throttled]
    stalled: ClassVar[dict[_GuardedProtocol, float]]
    """connections whose answer waits unread in their buffer -> since when (loop time)"""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head = b""  # the bytes of a request's line and headers received so far
        self._timer: asyncio.TimerHandle | None = None
        self._timed_cycle: object = None  # the request whose body the timer waits for
        self._write_timer: asyncio.TimerHandle | None = None
        self._waiting_since = 0.0  # when this connection began waiting for its next request

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = self.loop.time()
        if len(self.connections) > self.limits.max_open and not self._make_room():
            self.refusals.add(len(self.connections), self.limits.max_open)
            detail = f"the server holds {self.limits.max_open} connections, its limit; retry"
            self._refuse(503, "Service Unavailable", detail, {"retry-after": "1"})
            return
        self._arm(self.limits.header_timeout_s, self._headers_late)

    def _waiting(self) -> bool:
        """Whether this connection is not being served.

        Its request is still arriving, or it is idle between requests.
        """
        return not self.transport.is_closing() and self.conn.their_state in (
            h11.IDLE,
            h11.SEND_BODY,
        )

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for its request; False if none is."""
        waiting = [
            c
            for c in self.connections
            if c is not self and isinstance(c, _GuardedProtocol) and c._waiting()
        ]
        if not waiting:
            return False
        victim = min(waiting, key=lambda c: c._waiting_since)
        self.evictions.add(len(self.connections), self.limits.max_open)
        if victim in self.stalled:
            victim._cut("it was the longest waiting when the server was full")
            return True
        detail = "closed to make room for a new connection: this one sent no request in time"
        victim._refuse(503, "Service Unavailable", detail, {"retry-after": "1"})
        return True

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._waiting_since = self.loop.time()

    def pause_writing(self) -> None:
        """The answer outgrew the transport's buffer mark: the client is not reading (yet)."""
        super().pause_writing()
        self.stalled[self] = self.loop.time()
        self._write_timer = self.loop.call_later(self.limits.write_timeout_s, self._write_late)
        total = sum(c.transport.get_write_buffer_size() for c in self.stalled)
        while total > self.limits.max_unsent_bytes and self.stalled:
            oldest = min(self.stalled, key=self.stalled.__getitem__)
            total -= oldest.transport.get_write_buffer_size()
            oldest._cut(f"unsent answers over {self.limits.max_unsent_bytes} bytes in total")

    def resume_writing(self) -> None:
        super().resume_writing()
        self._unstall()

    def _unstall(self) -> None:
        self.stalled.pop(self, None)
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_late(self) -> None:
        self._write_timer = None
        self._cut(f"its answer sat unread for {self.limits.write_timeout_s} s")

    def _cut(self, why: str) -> None:
        """Drop the connection and the answer buffered for it (`abort`, not a flushing close)."""
        self.cuts.add(why)
        self._unstall()
        self.transport.abort()

    def shutdown(self) -> None:
        if self in self.stalled:  # a flushing close would wait on a client that never reads
            self._cut("the server is shutting down")
            return
        super().shutdown()

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
        self._unstall()
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
    state = {
        "limits": limits,
        "refusals": Throttled(
            "refused %d connection(s) with 503: %d open, the limit is %d (--connections.max-open)"
        ),
        "evictions": Throttled(
            "closed %d slow connection(s) to make room: %d open, the limit is %d "
            "(--connections.max-open)"
        ),
        "cuts": Throttled("cut %d connection(s) whose client does not read its answer (last: %s)"),
        "stalled": {},
    }
    return type("GuardedProtocol", (_GuardedProtocol,), state)
