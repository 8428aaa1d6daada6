"""Issue 25: one wall-clock deadline on every retrieval call, whatever the server does.

Each test points `HTTPRetriever` at a hostile fake server (`benchmarks.perf.hostile`) that
trickles its headers or body, sends an endless body, redirects, or sends `"contents": null`.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from benchmarks.perf.hostile import HostileServer
from retrieval import HTTPRetriever, RequestRejected, RetrievalError, RetrieverUnavailable
from retrieval.deadline import deadline

DEADLINE_S = 1.0
SLACK_S = 0.5  # the scheduler on a loaded 2-core machine


def _timed_search(url: str, *, use_async: bool, **kwargs) -> tuple[float, BaseException]:
    remote = HTTPRetriever(url, index_id="hostile", **kwargs)
    start = time.monotonic()
    try:
        if use_async:

            async def go() -> None:
                with deadline(DEADLINE_S):
                    await remote.asearch(["q"], 3)
                await remote.aclose()

            asyncio.run(go())
        else:
            with deadline(DEADLINE_S):
                remote.search(["q"], 3)
    except Exception as err:  # the test asserts its type
        return time.monotonic() - start, err
    finally:
        remote.close()
    raise AssertionError("a search against a hostile server succeeded")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("mode", ["trickle-headers", "trickle-body", "trickle-chunked", "hung"])
def test_a_trickling_or_hung_server_costs_a_call_its_deadline_and_no_more(mode, use_async):
    with HostileServer(mode, interval_s=0.1) as server:
        took, err = _timed_search(server.url, use_async=use_async)
        assert server.bytes_sent > 0 or mode == "hung"  # it did trickle, within every read timeout
    assert isinstance(err, RetrieverUnavailable), err
    assert "deadline ran out" in str(err)
    assert DEADLINE_S - 0.05 <= took <= DEADLINE_S + SLACK_S


def test_without_a_deadline_timeout_s_bounds_an_attempt_by_the_wall_clock():
    with HostileServer("trickle-headers", interval_s=0.1) as server:
        remote = HTTPRetriever(server.url, index_id="x", timeout_s=1.0, max_attempts=2)
        start = time.monotonic()
        with pytest.raises(RetrieverUnavailable, match="failed 2 times"):
            remote.search(["q"], 3)
        remote.close()
    assert time.monotonic() - start <= 2 * 1.0 + 0.4 + SLACK_S  # two attempts and one backoff


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_an_endless_body_is_refused_at_the_size_its_request_can_need(use_async):
    with HostileServer("endless-body") as server:
        took, err = _timed_search(server.url, use_async=use_async, max_doc_bytes=1_000)
    assert isinstance(err, RetrievalError) and not isinstance(err, RetrieverUnavailable), err
    assert "over 68536 bytes" in str(err)  # 1 query x k=3 x 1,000 bytes + 64 KiB
    assert took < DEADLINE_S  # refused at the cap, not at the deadline


def test_a_declared_length_over_the_cap_is_refused_before_reading():
    with HostileServer("trickle-body", interval_s=0.1) as server:  # declares 100,000 bytes
        took, err = _timed_search(server.url, use_async=False, max_doc_bytes=1_000)
    assert isinstance(err, RetrievalError) and "more than its request can need" in str(err)
    assert took < 0.5


def test_a_redirect_is_refused_with_where_it_points():
    with HostileServer("redirect") as server:
        _, err = _timed_search(server.url, use_async=False)
    assert isinstance(err, RequestRejected)
    assert "HTTP 307" in str(err) and "http://127.0.0.1:9/retrieve" in str(err)


def test_null_contents_are_a_malformed_hit_not_the_text_none():
    with HostileServer("null-contents") as server:
        _, err = _timed_search(server.url, use_async=False)
    assert isinstance(err, RetrievalError) and "'contents' is null" in str(err)


@pytest.mark.parametrize("url", ["http://[::1", "http://host:99999999", "http://:80"])
def test_an_unparseable_url_is_a_value_error_at_construction(url):
    with pytest.raises(ValueError, match="not a valid URL"):
        HTTPRetriever(url)
