"""HTTPRetriever against a real `tracerl serve-retriever` process and a stdlib Search-R1 fake."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from retrieval import (
    CachedRetriever,
    HTTPRetriever,
    RequestRejected,
    RetrievalError,
    Retriever,
    RetrieverUnavailable,
    make_retriever,
)
from retrieval.protocol import render_result

QUERIES = ["capital of Italy", "river Paris", "Konrad Zuse", "mountains", "xylophone", "café"]


def test_results_equal_in_process_search(toy_server, toy_bm25):
    with HTTPRetriever(toy_server.url) as remote:
        assert isinstance(remote, Retriever)
        for k in (1, 3, 10):
            assert remote.search(QUERIES, k=k) == toy_bm25.search(QUERIES, k=k)


def test_index_id_comes_from_health(toy_server, toy_bm25):
    with HTTPRetriever(toy_server.url) as remote:
        assert remote.index_id == toy_bm25.index_id
        assert remote.health()["manifest"]["kind"] == "bm25"


def test_big_batches_are_split_and_reassembled_in_order(toy_server, toy_bm25):
    queries = [f"{q} {i}" for i in range(7) for q in QUERIES]
    with HTTPRetriever(toy_server.url, max_batch_queries=4) as remote:
        assert remote.search(queries, k=2) == toy_bm25.search(queries, k=2)


def test_async_search_equals_sync_search(toy_server, toy_bm25):
    async def run():
        remote = HTTPRetriever(toy_server.url, max_batch_queries=2)
        try:
            return await asyncio.gather(*(remote.asearch(QUERIES, k=3) for _ in range(8)))
        finally:
            await remote.aclose()

    want = toy_bm25.search(QUERIES, k=3)
    assert asyncio.run(run()) == [want] * 8


def test_empty_queries_get_no_hits_without_a_request(toy_server):
    with HTTPRetriever(toy_server.url) as remote:
        assert remote.search(["", "  ", "capital"], k=1)[:2] == [[], []]
        assert remote.search(["capital"], k=1)[0] == remote.search(["", "capital"], k=1)[1]
        assert remote.search([], k=1) == []


def test_a_rejected_request_raises_at_once_with_the_server_message(toy_server):
    with HTTPRetriever(toy_server.url, backoff_s=30.0) as remote:  # a retry would take 30 s
        with pytest.raises(RequestRejected, match=r"422.*limit is 4096"):
            remote.search(["q" * 100_000], k=1)
        with pytest.raises(RequestRejected, match=r"422.*between 1 and 100"):
            remote.search(["q"], k=1000)


def test_make_retriever_takes_a_url_or_a_directory(toy_server, toy_index_dir, toy_bm25):
    by_url = make_retriever(toy_server.url)
    by_dir = make_retriever(toy_index_dir)
    assert isinstance(by_url, CachedRetriever) and isinstance(by_dir, CachedRetriever)
    assert by_url.index_id == by_dir.index_id == toy_bm25.index_id
    assert by_url.search(QUERIES, k=3) == by_dir.search(QUERIES, k=3)
    assert isinstance(make_retriever(toy_server.url, cache=False), HTTPRetriever)
    with pytest.raises(RetrievalError, match="neither"):
        make_retriever("/no/such/index")


def test_an_unreachable_server_raises_unavailable_naming_url_and_cause(refused_port):
    url = f"http://127.0.0.1:{refused_port}"
    remote = HTTPRetriever(url, max_attempts=3, backoff_s=0.01, index_id="x")
    with pytest.raises(RetrieverUnavailable) as info:
        remote.search(["q"], k=1)
    message = str(info.value)
    assert f"POST {url}/retrieve failed 3 times" in message
    assert "ConnectError" in message
    assert isinstance(info.value, ConnectionError)
    with pytest.raises(RetrieverUnavailable):
        asyncio.run(remote.asearch(["q"], k=1))


# -- a foreign Search-R1 server (no /health) that fails before it answers -------------------


class _FakeSearchR1(BaseHTTPRequestHandler):
    """Search-R1's protocol, one canned hit per query; the first `n_failures` POSTs get a 503."""

    n_failures = 0
    n_posts = 0
    lock = threading.Lock()

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.lock:
            type(self).n_posts += 1
            failing = type(self).n_posts <= type(self).n_failures
        if failing:
            self._send(503, {"detail": "warming up"})
            return
        from retrieval import Hit

        rows = [
            [Hit(doc_id=str(i), title="T", text=q, score=1.0)]
            for i, q in enumerate(body["queries"])
        ]
        self._send(200, render_result(rows, return_scores=body["return_scores"]))

    def do_GET(self):
        self._send(404, {"detail": "Not Found"})

    def _send(self, status, payload):
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_search_r1():
    _FakeSearchR1.n_posts = 0
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeSearchR1)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_5xx_answers_are_retried_then_succeed(fake_search_r1):
    _, url = fake_search_r1
    _FakeSearchR1.n_failures = 2
    remote = HTTPRetriever(url, max_attempts=3, backoff_s=0.01)
    hits = remote.search(["who?"], k=3)
    assert hits[0][0].text == "who?" and hits[0][0].title == "T"
    assert _FakeSearchR1.n_posts == 3


def test_persistent_5xx_answers_exhaust_the_retries(fake_search_r1):
    _, url = fake_search_r1
    _FakeSearchR1.n_failures = 100
    remote = HTTPRetriever(url, max_attempts=4, backoff_s=0.01)
    with pytest.raises(RetrieverUnavailable, match=r"failed 4 times.*HTTP 503: warming up"):
        remote.search(["who?"], k=3)
    assert _FakeSearchR1.n_posts == 4


def test_a_server_without_health_gets_an_index_id_from_its_url(fake_search_r1):
    _, url = fake_search_r1
    _FakeSearchR1.n_failures = 0
    a, b = HTTPRetriever(url), HTTPRetriever(url + "/")
    assert a.index_id == b.index_id
    assert a.index_id.startswith("http-")
    assert HTTPRetriever(url, index_id="wiki18-e5").index_id == "wiki18-e5"


def test_constructor_validates_its_arguments():
    with pytest.raises(ValueError, match="http"):
        HTTPRetriever("localhost:8000")
    with pytest.raises(ValueError, match=">= 1"):
        HTTPRetriever("http://x", max_attempts=0)


def test_a_deadline_ends_the_retries_of_a_hung_server_sync_and_async():
    from retrieval.deadline import deadline

    with socket.socket() as hung:  # listens but never accepts: connects succeed, no answer
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        own = HTTPRetriever(url, index_id="x", deadline_s=0.3, breaker_s=0)  # both calls wait
        with pytest.raises(RetrieverUnavailable, match="before its deadline ran out"):
            own.search(["q"], k=1)
        with pytest.raises(RetrieverUnavailable, match="before its deadline ran out"):
            asyncio.run(own.asearch(["q"], k=1))
        block = HTTPRetriever(url, index_id="x")  # no deadline of its own: the block's applies
        with deadline(0.3), pytest.raises(RetrieverUnavailable, match="deadline ran out"):
            CachedRetriever(block).search(["q"], k=1)
        for r in (own, block):
            r.close()


def test_a_client_follows_a_server_restarted_with_another_index(
    toy_bm25, toy_docs, listening_socket, app_server_cls
):
    from retrieval import BM25Retriever
    from retrieval.server import create_app

    other = BM25Retriever.build(toy_docs[4:])  # another index, served on the same URL
    url = f"http://127.0.0.1:{listening_socket.getsockname()[1]}"
    http = HTTPRetriever(url)
    cached = CachedRetriever(http)
    queries = ["capital of Italy", "mountains"]
    with app_server_cls(create_app(toy_bm25), listening_socket):
        assert cached.index_id == toy_bm25.index_id
        assert cached.search(queries, 2) == toy_bm25.search(queries, 2)
        assert cached.search(queries, 2) == toy_bm25.search(queries, 2)  # from the cache
    with app_server_cls(create_app(other), listening_socket):  # restarted, same address
        # every query is cached from the old index: the cache still asks the server which
        # index it serves, and empties itself before answering
        assert cached.search(queries, 2) == other.search(queries, 2)
        assert http.index_id == cached.index_id == other.index_id
        assert cached.stats().n_entries == 2  # the new index's, fetched again
        cached.search(["Konrad Zuse"], 2)  # a miss: the answer names the index too
        assert cached.search(queries, 2) == other.search(queries, 2)
    http.close()


def test_a_cache_answer_waits_for_the_server_to_confirm_its_index(
    toy_bm25, listening_socket, app_server_cls
):
    from retrieval.server import create_app

    url = f"http://127.0.0.1:{listening_socket.getsockname()[1]}"
    strict = HTTPRetriever(url, max_attempts=1, breaker_s=0)
    window = HTTPRetriever(url, max_attempts=1, breaker_s=0, index_check_s=3600)
    with app_server_cls(create_app(toy_bm25), listening_socket):
        for http in (strict, window):
            CachedRetriever(http).search(["capital of Italy"], 2)
        caches = [CachedRetriever(strict), CachedRetriever(window)]
        for cache in caches:
            cache.search(["capital of Italy"], 2)
    listening_socket.close()  # no server now: nothing can confirm the cached entries
    with pytest.raises(RetrieverUnavailable):
        caches[0].search(["capital of Italy"], 2)
    # within its window, the other serves its entries without asking
    assert caches[1].search(["capital of Italy"], 2) == toy_bm25.search(["capital of Italy"], 2)
    for http in (strict, window):
        http.close()


def test_a_hung_server_costs_one_deadline_then_the_breaker_fails_calls_at_once():
    with socket.socket() as hung:  # listens but never answers
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        retriever = HTTPRetriever(url, index_id="x", deadline_s=0.4, breaker_s=0.8)
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match="deadline ran out"):
            retriever.search(["q"], k=1)
        assert time.monotonic() - start >= 0.35  # the first call waits its deadline
        for call in (
            lambda: retriever.search(["q"], k=1),
            lambda: asyncio.run(retriever.asearch(["q"], k=1)),
        ):
            start = time.monotonic()
            with pytest.raises(RetrieverUnavailable, match=r"circuit breaker.*deadline ran out"):
                call()
            assert time.monotonic() - start < 0.1  # then later calls fail at once, with the cause
        time.sleep(0.8)  # the circuit half-opens: the next call asks the server again
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match=r"^POST"):
            retriever.search(["q"], k=1)
        assert time.monotonic() - start >= 0.35
        retriever.close()
