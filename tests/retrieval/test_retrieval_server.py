"""The FastAPI app in-process: Search-R1 responses, /health, and 4xx (never 500) on bad input."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from retrieval.batching import BatchingConfig
from retrieval.protocol import ServerLimits, render_result
from retrieval.server import create_app

LIMITS = ServerLimits(max_body_bytes=50_000, max_queries_per_request=8, max_query_chars=200)


@pytest.fixture(scope="module")
def client(toy_bm25):
    app = create_app(toy_bm25, manifest=toy_bm25.manifest, limits=LIMITS)
    with TestClient(app) as c:  # the context runs the lifespan, which starts the batcher
        yield c


def test_retrieve_speaks_search_r1_with_and_without_scores(client, toy_bm25):
    queries = ["capital of Italy", "river", "xylophone"]
    for scores in (True, False):
        response = client.post(
            "/retrieve", json={"queries": queries, "topk": 2, "return_scores": scores}
        )
        assert response.status_code == 200
        want = render_result(toy_bm25.search(queries, k=2), return_scores=scores)
        assert response.json() == json.loads(json.dumps(want))
    body = client.post("/retrieve", json={"queries": ["capital"], "topk": 1}).json()
    assert set(body["result"][0][0]) == {"id", "contents"}  # Search-R1's default: no scores


def test_topk_defaults_to_three(client):
    body = client.post("/retrieve", json={"queries": ["capital Paris Rome Berlin"]}).json()
    assert len(body["result"][0]) == LIMITS.default_topk


def test_health_reports_the_manifest_and_limits(client, toy_bm25):
    body = client.get("/health").json()
    assert body["status"] == "ok"
    assert body["index_id"] == toy_bm25.index_id
    assert body["manifest"] == toy_bm25.manifest.to_json()
    assert body["limits"]["max_query_chars"] == 200
    assert body["batching"] == {
        "max_batch_queries": BatchingConfig().max_batch_queries,
        "max_wait_ms": BatchingConfig().max_wait_ms,
        "max_pending_queries": BatchingConfig().max_pending_queries,
        "slice_queries": BatchingConfig().slice_queries,
    }
    assert body["stats"]["n_requests"] >= 0


@pytest.mark.parametrize(
    ("content", "status", "needle"),
    [
        (json.dumps({"queries": []}), 422, "empty"),
        (json.dumps({"queries": [""]}), 422, "empty"),
        (json.dumps({"queries": ["q" * 100_000]}), 413, "exceeds"),  # 100 kB: over the body limit
        (json.dumps({"queries": ["q" * 1_000]}), 422, "limit is 200"),
        (b'{"queries": ["caf\xe9"]}', 422, "UTF-8"),
        (b"\x80\x81\x82", 422, "UTF-8"),
        ("{not json", 422, "JSON"),
        (json.dumps({"queries": "capital"}), 422, "list of strings"),
        (json.dumps({"queries": [1, 2]}), 422, "expected a string"),
        (json.dumps({"queries": ["a"], "topk": "5"}), 422, "topk"),
        (json.dumps({"queries": ["a"], "return_scores": 1}), 422, "return_scores"),
        (json.dumps({"queries": ["a"] * 9}), 422, "limit is 8"),
        ('{"queries": ["\\udc80"]}', 422, "surrogate"),
    ],
)
def test_bad_input_gets_a_clear_4xx(client, content, status, needle):
    response = client.post(
        "/retrieve", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == status
    assert needle in response.json()["detail"]


@given(st.binary(max_size=200))
def test_no_body_ever_causes_a_500(client, body):
    response = client.post("/retrieve", content=body)
    assert response.status_code in (200, 413, 422)


def test_a_chunked_body_over_the_limit_is_refused(client):
    def chunks():
        for _ in range(20):
            yield b"x" * 5_000

    response = client.post("/retrieve", content=chunks())  # no Content-Length
    assert response.status_code == 413
