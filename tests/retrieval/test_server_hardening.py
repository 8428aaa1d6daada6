"""The server under hostile input: random JSON bodies, disconnects, and queue limits.

Every answer to a body is a 2xx or a 4xx, never a 500; a client hanging up mid-body is one
log line, not a traceback; limits that would 503 a valid request forever are refused at start.
"""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fastapi.testclient import TestClient
from hypothesis import event, given
from hypothesis import strategies as st

from retrieval.batching import BatchingConfig
from retrieval.protocol import ServerLimits
from retrieval.server import create_app

LIMITS = ServerLimits(max_body_bytes=50_000, max_queries_per_request=8, max_query_chars=200)


@pytest.fixture(scope="module")
def client(toy_bm25):
    app = create_app(toy_bm25, limits=LIMITS)
    # a 500 must show as a status here, not as a raised exception
    with TestClient(app, raise_server_exceptions=False) as c:
        yield c


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(),  # NaN and the infinities too: Python's json writes and reads them
    st.text(max_size=40),
    st.text(st.sampled_from("\ud800\udfffa \ufdfaé"), max_size=10),  # surrogates, NFKC growth
)
_JSON = st.recursive(
    _SCALARS,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)
# bodies shaped like a request, each field right, wrong or missing
_REQUESTS = st.fixed_dictionaries(
    {},
    optional={
        "queries": st.one_of(st.lists(st.text(max_size=300), max_size=10), _JSON),
        "topk": st.one_of(st.integers(-5, 200), _JSON),
        "return_scores": st.one_of(st.booleans(), _JSON),
    },
).flatmap(lambda d: st.dictionaries(st.text(max_size=8), _JSON, max_size=2).map(d.__or__))


# well-formed requests, so that the search path is fuzzed too, not only the refusals
_VALID = st.fixed_dictionaries(
    {
        "queries": st.lists(st.text(max_size=60).filter(str.strip), min_size=1, max_size=8),
        "topk": st.integers(1, 100),
    },
    optional={"return_scores": st.booleans()},
)


@given(st.one_of(_VALID, _REQUESTS, _JSON))
def test_any_json_body_gets_a_2xx_or_a_4xx(client, payload):
    body = json.dumps(payload).encode()  # ASCII escapes carry lone surrogates through
    response = client.post("/retrieve", content=body, headers={"content-type": "application/json"})
    event(f"HTTP {response.status_code}")
    assert response.status_code < 500, (payload, response.text)
    if response.status_code >= 400:
        assert response.json()["detail"]


@pytest.mark.parametrize("depth", [500, 2_048, 100_000])
def test_deeply_nested_json_is_a_422(client, depth):
    response = client.post("/retrieve", content=b"[" * depth + b"]" * depth)
    assert response.status_code in (413, 422), response.text


def test_a_client_that_hangs_up_mid_body_is_one_log_line(toy_bm25, caplog):
    app = create_app(toy_bm25, limits=LIMITS)
    messages: list[dict] = []
    sent: list[dict] = []

    async def receive() -> dict:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/retrieve",
        "raw_path": b"/retrieve",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json"), (b"content-length", b"1000")],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }
    with caplog.at_level(logging.INFO):
        # 300 of them, as a body-trickling slowloris the guard evicts makes in about a second:
        # one line, not one each (issue 42: 280 lines a second before)
        for _ in range(300):
            messages[:] = [
                {"type": "http.request", "body": b'{"queries": [', "more_body": True},
                {"type": "http.disconnect"},
            ]
            asyncio.run(app(scope, receive, send))  # raised ClientDisconnect before issue 25
    records = [r for r in caplog.records if r.name.startswith("retrieval")]
    assert [r.getMessage() for r in records] == [
        "1 client(s) disconnected before sending their whole request (at most one line per 10 s)"
    ]
    assert all(r.exc_info is None for r in caplog.records)


def test_a_queue_smaller_than_the_largest_request_is_refused_at_start(toy_bm25):
    with pytest.raises(ValueError, match="max_pending_queries=4 is below"):
        create_app(
            toy_bm25,
            limits=ServerLimits(max_queries_per_request=8),
            batching=BatchingConfig(max_pending_queries=4),
        )
    create_app(  # equal is fine: the largest request fits an empty queue
        toy_bm25,
        limits=ServerLimits(max_queries_per_request=8),
        batching=BatchingConfig(max_pending_queries=8),
    )
