"""The Search-R1 wire format: request validation and response rendering/parsing."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval import Hit, InvalidRequest, RetrievalError
from retrieval.protocol import ServerLimits, parse_request, parse_result, render_result

LIMITS = ServerLimits(max_body_bytes=200_000, max_queries_per_request=4, max_query_chars=50)


def _body(obj) -> bytes:
    return json.dumps(obj).encode()


def test_a_search_r1_request_parses():
    req = parse_request(_body({"queries": ["a", "b"], "topk": 3, "return_scores": True}), LIMITS)
    assert (req.queries, req.topk, req.return_scores) == (["a", "b"], 3, True)
    req = parse_request(_body({"queries": ["a"], "topk": None}), LIMITS)
    assert (req.topk, req.return_scores) == (LIMITS.default_topk, False)
    # fields Search-R1 clients may add are ignored
    assert parse_request(_body({"queries": ["a"], "extra": 1}), LIMITS).queries == ["a"]


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"\xff\xfe{}", 422, "not valid UTF-8"),
        (b'{"queries": ["caf\xe9"]}', 422, "not valid UTF-8"),
        (b"{oops", 422, "not valid JSON"),
        (b"", 422, "not valid JSON"),
        (_body(["a"]), 422, "JSON object"),
        (_body(None), 422, "JSON object"),
        (_body({}), 422, '"queries" is null'),
        (_body({"queries": "a"}), 422, '"queries" is a string'),
        (_body({"queries": []}), 422, '"queries" is empty'),
        (_body({"queries": ["a", ""]}), 422, '"queries"[1] is empty'),
        (_body({"queries": ["  \n"]}), 422, '"queries"[0] is empty'),
        (_body({"queries": ["a", 3]}), 422, '"queries"[1] is a number'),
        (_body({"queries": [None]}), 422, '"queries"[0] is null'),
        (_body({"queries": [["a"]]}), 422, '"queries"[0] is a list'),
        (_body({"queries": ["x" * 51]}), 422, "has 51 characters; the limit is 50"),
        (_body({"queries": ["x" * 100_000]}), 422, "the limit is 50"),
        (_body({"queries": ["a"] * 5}), 422, "holds 5 queries; the limit is 4"),
        (_body({"queries": ["a"], "topk": "3"}), 422, '"topk" is a string'),
        (_body({"queries": ["a"], "topk": 2.5}), 422, '"topk" is a number'),
        (_body({"queries": ["a"], "topk": True}), 422, '"topk" is a boolean'),
        (_body({"queries": ["a"], "topk": 0}), 422, "between 1 and 100"),
        (_body({"queries": ["a"], "topk": 101}), 422, "between 1 and 100"),
        (_body({"queries": ["a"], "return_scores": "yes"}), 422, '"return_scores" is a string'),
        (b'{"queries": ["\\ud800"]}', 422, "unpaired surrogate"),
        (b"[" * 2048, 422, "nested too deeply"),  # was a RecursionError, a 500
        (b'{"queries": ["a"], "topk": ' + b"1" * 5000 + b"}", 422, "4300 digits"),
        (_body({"queries": ["a" * 300_000]}), 413, "exceeds 200000"),
    ],
)
def test_bad_requests_get_a_4xx_that_names_the_problem(body, status, needle):
    with pytest.raises(InvalidRequest) as info:
        parse_request(body, LIMITS)
    assert info.value.status == status
    assert needle in info.value.detail


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(st.binary(max_size=300))
def test_any_bytes_either_parse_or_raise_invalid_request(body):
    try:
        parse_request(body, LIMITS)
    except InvalidRequest as err:
        assert err.status in (413, 422)


@given(
    st.fixed_dictionaries(
        {"queries": st.one_of(json_values, st.lists(json_values))},
        optional={"topk": json_values, "return_scores": json_values},
    )
)
def test_any_json_object_either_parses_or_raises_invalid_request(payload):
    try:
        req = parse_request(json.dumps(payload).encode(), LIMITS)
    except InvalidRequest as err:
        assert err.status == 422 and err.detail
    else:
        assert all(isinstance(q, str) and q.strip() for q in req.queries)
        assert 1 <= req.topk <= LIMITS.max_topk


titles = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\n\r"))
hits = st.builds(
    Hit,
    doc_id=st.text(),
    title=titles,
    text=st.text(st.characters(blacklist_categories=("Cs",))),
    score=st.floats(allow_nan=False, allow_infinity=False),
)


@given(st.lists(st.lists(hits, max_size=4), max_size=4))
def test_rendered_results_parse_back_to_the_same_hits(rows):
    body = json.loads(json.dumps(render_result(rows, return_scores=True)))
    assert parse_result(body, len(rows), source="test") == rows


def test_results_without_scores_are_bare_documents():
    hit = Hit(doc_id="7", title="Paris", text="Capital of France.", score=2.0)
    assert render_result([[hit], []], return_scores=False) == {
        "result": [[{"id": "7", "contents": '"Paris"\nCapital of France.'}], []]
    }


@pytest.mark.parametrize(
    "body",
    [
        None,
        {"result": "x"},
        {"result": [[]]},  # one row for two queries
        {"result": [[{"document": {"id": "1"}, "score": 1.0}], []]},
        {"result": [[{"id": "1", "contents": "x"}], []]},  # no scores
        {"result": [[{"document": {"id": "1", "contents": "x"}, "score": "high"}], []]},
    ],
)
def test_malformed_responses_raise_a_retrieval_error(body):
    with pytest.raises(RetrievalError, match="source"):
        parse_result(body, 2, source="source")


def test_queries_times_topk_over_the_limit_is_a_413_naming_it():
    # 512 short queries at topk 100: a 12 KB body used to buy a 12 MB answer
    body = json.dumps({"queries": [f"q{i}" for i in range(512)], "topk": 100}).encode()
    with pytest.raises(InvalidRequest, match=r"51200 hits exceeds the limit of 4096") as caught:
        parse_request(body, ServerLimits())
    assert caught.value.status == 413
    ok = json.dumps({"queries": [f"q{i}" for i in range(512)], "topk": 8}).encode()
    assert parse_request(ok, ServerLimits()).topk == 8
    with pytest.raises(ValueError, match=r"max-hits-per-request 50 is below --limits\.max-topk"):
        ServerLimits(max_hits_per_request=50)


def test_an_answer_over_its_byte_limit_is_a_413(toy_bm25):
    from fastapi.testclient import TestClient

    from retrieval.server import create_app

    limits = ServerLimits(max_answer_bytes=200)
    with TestClient(create_app(toy_bm25, limits=limits)) as client:
        answer = client.post("/retrieve", json={"queries": ["capital of Italy"], "topk": 5})
        small = client.post("/retrieve", json={"queries": ["xylophone"], "topk": 1})
    assert answer.status_code == 413 and "over the limit of 200" in answer.json()["detail"]
    assert small.status_code == 200
    assert small.headers["x-index-id"] == toy_bm25.index_id


def test_the_client_splits_batches_under_the_hit_limit():
    from retrieval import HTTPRetriever

    client = HTTPRetriever("http://127.0.0.1:9", max_hits_per_request=4_096)
    assert [client._batch_size(k) for k in (3, 16, 100)] == [256, 256, 40]
