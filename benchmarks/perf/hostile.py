"""Hostile peers for the reliability attacks: servers that misbehave, clients that hold sockets.

`HostileServer(mode)` listens on 127.0.0.1 and answers every request in one bad way (`MODES`):

- `hung`: reads the request and never answers;
- `trickle-headers`: starts a 200 and sends its headers one byte every `interval_s`, forever;
- `trickle-body`: sends headers promising a long body, then one byte every `interval_s`;
- `trickle-chunked`: a chunked body of one-byte chunks, one every `interval_s`;
- `endless-body`: a chunked body of 64 KiB chunks as fast as the client reads, forever;
- `redirect`: a `307` to another address, with an empty body;
- `null-contents`: a Search-R1 answer whose one hit has `"contents": null`.

Each connection gets its own thread; `close()` (or leaving the `with` block) stops them all.
`idle_sockets(url, n)` opens `n` connections that never send a byte, and `send_header_line`
sends one request whose header line is as long as asked, streamed, and reads the status.

Clients that starve a server (issue 32): `non_readers(url, body, n)` sends one request on each
of `n` connections and never reads the answer; `Slowloris(url, n)` keeps `n` sockets sending
header bytes one at a time, reconnecting whenever the server closes one; `NormalClients(url)`
are well-behaved clients whose latencies and failures are recorded.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Literal, get_args
from urllib.parse import urlsplit

import httpx

__all__ = [
    "MODES",
    "HostileServer",
    "Mode",
    "NormalClients",
    "Slowloris",
    "idle_sockets",
    "non_readers",
    "post_request",
    "send_header_line",
]

Mode = Literal[
    "hung",
    "trickle-headers",
    "trickle-body",
    "trickle-chunked",
    "endless-body",
    "redirect",
    "null-contents",
]
MODES: tuple[Mode, ...] = get_args(Mode)

_BLOCK = b"x" * 65_536


class HostileServer:
    """A server on 127.0.0.1 that answers every request the way `mode` says.

    Args:
        mode: one of `MODES`.
        interval_s: the pause between trickled bytes.
    """

    def __init__(self, mode: Mode, *, interval_s: float = 0.2) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.interval_s = interval_s
        self.bytes_sent = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._threads: list[threading.Thread] = []
        self._accepter = threading.Thread(target=self._accept, daemon=True)
        self._accepter.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, suppress(OSError):
            conn.settimeout(1.0)
            _read_request(conn, self._stop)
            getattr(self, "_" + self.mode.replace("-", "_"))(conn)

    def _send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.bytes_sent += len(data)

    def _drip(self, conn: socket.socket, piece: bytes) -> None:
        """Send `piece` every `interval_s` until stopped."""
        while not self._stop.wait(self.interval_s):
            self._send(conn, piece)

    def _hung(self, conn: socket.socket) -> None:
        self._stop.wait()

    def _trickle_headers(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\nx-pad: ")
        self._drip(conn, b"a")

    def _trickle_body(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n")
        self._drip(conn, b" ")

    def _trickle_chunked(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        self._drip(conn, b"1\r\n \r\n")

    def _endless_body(self, conn: socket.socket) -> None:
        self._send(conn, b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n" % len(_BLOCK) + _BLOCK + b"\r\n"
        while not self._stop.is_set():
            self._send(conn, chunk)

    def _redirect(self, conn: socket.socket) -> None:
        self._send(
            conn,
            b"HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:9/retrieve\r\n"
            b"content-length: 0\r\n\r\n",
        )

    def _null_contents(self, conn: socket.socket) -> None:
        body = json.dumps(
            {"result": [[{"document": {"id": "d0", "contents": None}, "score": 1.0}]]}
        ).encode()
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        self._send(conn, head % len(body) + body)

    def close(self) -> None:
        """Stop answering and end every connection's thread."""
        self._stop.set()
        self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def __enter__(self) -> HostileServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_request(conn: socket.socket, stop: threading.Event) -> None:
    """Read one request's headers and its Content-Length body."""
    data = b""
    while b"\r\n\r\n" not in data and not stop.is_set():
        try:
            piece = conn.recv(65_536)
        except TimeoutError:
            continue
        if not piece:
            return
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length and not stop.is_set():
        with suppress(TimeoutError):
            body += conn.recv(65_536)


def _address(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


@contextmanager
def idle_sockets(url: str, n: int) -> Iterator[list[socket.socket]]:
    """`n` open connections to `url` that never send a byte (closed on exit).

    A connection the server refuses or drops stays in the list, closed from its side.
    """
    sockets: list[socket.socket] = []
    try:
        for _ in range(n):
            sockets.append(socket.create_connection(_address(url), timeout=10))
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def send_header_line(url: str, n_bytes: int, *, timeout_s: float = 30.0) -> int | None:
    """Send `GET /health` with one header line of `n_bytes`, streamed; the status, or None.

    Sending stops as soon as the server answers or closes; None means no status came back.
    """
    with socket.create_connection(_address(url), timeout=timeout_s) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: ")
        deadline = time.monotonic() + timeout_s
        sent = 0
        sock.setblocking(False)
        while sent < n_bytes and time.monotonic() < deadline:
            with suppress(BlockingIOError):
                if sock.recv(1, socket.MSG_PEEK):
                    break  # the server answered before the header ended
            try:
                sent += sock.send(_BLOCK[: min(len(_BLOCK), n_bytes - sent)])
            except BlockingIOError:
                time.sleep(0.01)
            except OSError:
                break  # closed by the server
        if sent >= n_bytes:
            with suppress(OSError):
                sock.sendall(b"\r\n\r\n")
        sock.settimeout(max(0.1, deadline - time.monotonic()))
        try:
            first = sock.recv(64)
        except OSError:
            return None
    parts = first.split(b" ")
    return int(parts[1]) if first.startswith(b"HTTP/") and len(parts) > 1 else None


def post_request(url: str, body: bytes) -> bytes:
    """The raw bytes of `POST /retrieve` with a JSON `body`."""
    host, port = _address(url)
    head = (
        f"POST /retrieve HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


@contextmanager
def non_readers(url: str, body: bytes, n: int) -> Iterator[list[socket.socket]]:
    """`n` connections that each send one `POST /retrieve` and never read the answer.

    Each has a 4 KiB receive buffer, so the answer stays in the server's buffers.
    """
    sockets: list[socket.socket] = []
    request = post_request(url, body)
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4_096)
            sock.settimeout(10)
            sock.connect(_address(url))
            sock.sendall(request)
            sockets.append(sock)
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


class Slowloris:
    """`n` sockets that send request-header bytes one at a time, every `interval_s`, forever.

    Whenever the server answers or closes one, it is replaced at once by a new connection, so
    the attacker always holds `n` (past the server's cap, its new connections keep knocking).
    Runs in one thread from `start()` to `stop()` (or the `with` block).
    """

    def __init__(self, url: str, n: int, *, interval_s: float = 1.0) -> None:
        self._address = _address(url)
        self.n = n
        self.interval_s = interval_s
        self.reconnects = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="slowloris", daemon=True)

    def __enter__(self) -> Slowloris:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _connect(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(self._address, timeout=2)
        except OSError:
            return None
        sock.setblocking(False)
        with suppress(OSError):
            sock.send(b"GET /health HTTP/1.1\r\nhost: x\r\n")
        return sock

    def _run(self) -> None:
        sockets: list[socket.socket] = []
        while not self._stop.is_set():
            while len(sockets) < self.n and not self._stop.is_set():
                sock = self._connect()
                if sock is not None:
                    sockets.append(sock)
            readable, _, _ = select.select(sockets, [], [], 0)
            dropped = set(readable)  # an answer (503, 408) or EOF: the server let go
            for sock in sockets:
                if sock in dropped:
                    continue
                try:
                    sock.send(b"a")
                except OSError:
                    dropped.add(sock)
            for sock in dropped:
                sock.close()
            self.reconnects += len(dropped)
            sockets = [s for s in sockets if s not in dropped]
            self._stop.wait(self.interval_s if not dropped else 0.0)
        for sock in sockets:
            sock.close()


class NormalClients:
    """Well-behaved clients: each sends a small request every `period_s`, one at a time.

    Half open a new connection per request, half keep one alive. `results` holds one
    `(ok, seconds)` per request (ok: a 200 within `timeout_s`).
    """

    def __init__(
        self, url: str, *, n: int = 4, period_s: float = 0.05, timeout_s: float = 15.0
    ) -> None:
        self._url = url
        self._period_s = period_s
        self._timeout_s = timeout_s
        self.results: list[tuple[bool, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(i, i % 2 == 0), daemon=True) for i in range(n)
        ]

    def __enter__(self) -> NormalClients:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._timeout_s + 5)

    def _run(self, i: int, keep_alive: bool) -> None:
        body = {"queries": [f"city {i} capital of land {j}" for j in range(1)], "topk": 3}
        client = httpx.Client(timeout=self._timeout_s) if keep_alive else None
        try:
            while not self._stop.is_set():
                start = time.perf_counter()
                try:
                    if client is not None:
                        answer = client.post(self._url + "/retrieve", json=body)
                    else:
                        answer = httpx.post(
                            self._url + "/retrieve", json=body, timeout=self._timeout_s
                        )
                    ok = answer.status_code == 200
                except httpx.HTTPError:
                    ok = False
                with self._lock:
                    self.results.append((ok, time.perf_counter() - start))
                self._stop.wait(self._period_s)
        finally:
            if client is not None:
                client.close()
