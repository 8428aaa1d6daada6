"""Issue 25: a server that cannot be held open: connection cap, header/body deadlines, 431.

One `tracerl serve-retriever` process with small limits (8 connections, 1 s for headers and
for a body) serves the module; each test attacks it with raw sockets.
"""

from __future__ import annotations

import json
import re
import socket
import time
from contextlib import suppress

import httpx
import pytest

from benchmarks.cli import main
from benchmarks.perf.hostile import idle_sockets, non_readers, send_header_line
from retrieval.guard import ConnectionLimits, check_descriptor_room

MAX_OPEN = 8
TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory, toy_index_dir, server_cls):
    log_path = tmp_path_factory.mktemp("guard") / "server.log"
    server = server_cls(
        toy_index_dir,
        log_path,
        "--connections.max-open", str(MAX_OPEN),
        "--connections.header-timeout-s", str(TIMEOUT_S),
        "--connections.body-timeout-s", str(TIMEOUT_S),
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


def _retrieve(url: str) -> int:
    return httpx.post(url + "/retrieve", json={"queries": ["paris"]}, timeout=10).status_code


def _read_status(sock: socket.socket, timeout_s: float) -> tuple[bytes, float]:
    """The first bytes the server sends (b"" if it closes), and when they came."""
    sock.settimeout(timeout_s)
    start = time.monotonic()
    try:
        data = sock.recv(64)
    except OSError:
        data = b""
    return data, time.monotonic() - start


def test_a_full_server_closes_its_longest_waiting_connection_to_serve_a_new_one(guarded):
    with idle_sockets(guarded.url, 2 * MAX_OPEN) as held:
        time.sleep(0.3)
        # the cap is full of sockets that send nothing: a client that sends its request at once
        # is served (it used to get a 503 for as long as the idle ones were held)
        assert [_retrieve(guarded.url) for _ in range(3)] == [200] * 3
        closed = [_read_status(s, 2 * TIMEOUT_S)[0] for s in held]
    assert all(not data or data.startswith((b"HTTP/1.1 503", b"HTTP/1.1 408")) for data in closed)
    assert sum(data.startswith(b"HTTP/1.1 503") for data in closed) >= MAX_OPEN
    log_text = guarded.log_path.read_text()
    assert "to make room" in log_text and "--connections.max-open" in log_text


def test_headers_over_the_cap_get_a_431(guarded):
    assert send_header_line(guarded.url, 50_000_000) == 431
    assert send_header_line(guarded.url, 8_000) == 200  # under the 16 KiB default


def test_headers_that_trickle_get_a_408_at_the_header_deadline(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-slow: ")
        start = time.monotonic()
        sock.settimeout(0.2)
        data = b""
        while not data and time.monotonic() - start < 5 * TIMEOUT_S:
            with suppress(OSError):
                sock.send(b"a")
            with suppress(TimeoutError):
                data = sock.recv(64)
    assert data.startswith(b"HTTP/1.1 408")
    assert time.monotonic() - start <= TIMEOUT_S + 0.5


def test_a_body_that_trickles_is_cut_at_the_body_deadline(guarded):
    with socket.create_connection(("127.0.0.1", guarded.port)) as sock:
        sock.sendall(
            b"POST /retrieve HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 1000\r\n\r\n{"
        )
        start = time.monotonic()
        closed = False
        while time.monotonic() - start < 5 * TIMEOUT_S:
            try:
                sock.send(b" ")
                sock.settimeout(0.2)
                closed = sock.recv(64) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
            if closed:
                break
    assert closed
    assert time.monotonic() - start <= TIMEOUT_S + 0.5


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--limits.max-topk", "0"], "--limits.max-topk must be >= 1"),
        (["--port", "70000"], "--port 70000 is not a TCP port"),
        (["--connections.max-open", "0"], "--connections.max-open must be >= 1"),
        (["--connections.body-timeout-s", "0"], "--connections.body-timeout-s must be"),
        (["--limits.default-topk", "200"], "--limits.default-topk 200 must be between"),
    ],
)
def test_limits_that_cannot_work_are_refused_at_start_up(toy_index_dir, capsys, flags, message):
    with pytest.raises(SystemExit) as stop:
        main(["serve-retriever", "--index", str(toy_index_dir), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert message in " ".join(err.split()) and "Traceback" not in err


def test_a_cap_over_the_hard_descriptor_limit_is_refused_naming_both_fixes():
    import resource

    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        pytest.skip("no hard descriptor limit on this machine")
    with pytest.raises(ValueError, match=r"lower --connections\.max-open or raise `ulimit -n`"):
        check_descriptor_room(ConnectionLimits(max_open=hard))


@pytest.fixture(scope="module")
def big_answers(tmp_path_factory, server_cls):
    """A server whose largest answer (4,096 hits of 5.6 KB) outgrows the kernel's buffers."""
    from retrieval import BM25Retriever, Document

    words = [f"w{i}" for i in range(50)]
    docs = [
        Document(
            doc_id=f"d{i}", title=f"T{i}", text=" ".join(words[(i + j) % 50] for j in range(800))
        )
        for i in range(64)
    ]
    directory = tmp_path_factory.mktemp("big") / "bm25"
    BM25Retriever.build(docs, stemmer=None, stopwords=None).save(directory)
    server = server_cls(
        directory,
        directory.parent / "server.log",
        "--connections.write-timeout-s", str(TIMEOUT_S),
        "--limits.max-answer-bytes", str(64 << 20),
    )  # fmt: skip
    server.start()
    yield server
    server.stop()


@pytest.mark.slow  # its own server: the start dominates (about 40 s on a loaded 2-core box)
def test_an_answer_left_unread_is_cut_at_the_write_deadline(big_answers):
    guarded = big_answers
    queries = [f"w{i % 50} w{(i + 7) % 50}" for i in range(512)]
    # about 23 MB of answer: more than the kernel's socket buffers take (a few MB on loopback)
    body = json.dumps({"queries": queries, "topk": 8}).encode()
    with non_readers(guarded.url, body, 1) as (sock,):
        time.sleep(TIMEOUT_S + 1.5)  # the answer sits in the server's buffer, unread
        sock.settimeout(5)
        received = b""
        with suppress(OSError):  # the server's abort resets the connection
            while chunk := sock.recv(65_536):
                received += chunk
    head, _, payload = received.partition(b"\r\n\r\n")
    found = re.search(rb"content-length: (\d+)", head, re.IGNORECASE)
    assert found is not None and len(payload) < int(found.group(1))  # the rest was dropped
    assert "does not read" in guarded.log_path.read_text()
    assert _retrieve(guarded.url) == 200
