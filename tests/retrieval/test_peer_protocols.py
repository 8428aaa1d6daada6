"""The server and client speak each peer's retrieval dialect: Search-R1, SkyRL-gym and GEM.

The peers' requests and parsers come from `retrieval.peers`, written from the peers' own
clients (not from `retrieval.protocol`), so these tests check the server against the peers'
formats rather than against itself.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import msgspec
import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st

from retrieval import HTTPRetriever, IndexFormatError, RetrievalError, make_retriever
from retrieval.errors import InvalidRequest
from retrieval.peers import (
    gem_documents,
    gem_request,
    passages_text,
    search_r1_documents,
    search_r1_request,
    skyrl_documents,
    skyrl_request,
)
from retrieval.protocol import ServerLimits, parse_request, render_result
from retrieval.server import create_app

LIMITS = ServerLimits(max_body_bytes=20_000, max_queries_per_request=4, max_query_chars=100)
QUERY = "capital of Italy"


@pytest.fixture(scope="module")
def client(toy_bm25):
    with TestClient(create_app(toy_bm25, limits=LIMITS)) as c:
        yield c


def _post(client, request):
    body, headers = request
    return client.post("/retrieve", content=body, headers=headers)


def _want(toy_bm25, k=3):
    return json.loads(json.dumps(render_result(toy_bm25.search([QUERY], k=k), return_scores=True)))


def test_search_r1_request_and_response_are_unchanged(client, toy_bm25):
    response = _post(client, search_r1_request([QUERY, "river"], 3))
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    want = render_result(toy_bm25.search([QUERY, "river"], k=3), return_scores=True)
    assert response.content == json.dumps(want).encode()  # byte for byte, as before
    assert len(search_r1_documents(response.content)) == 2


def test_skyrl_gym_sends_one_query_string_and_reads_one_row(client, toy_bm25):
    response = _post(client, skyrl_request(QUERY, 3))
    assert response.status_code == 200, response.text  # was 422 "queries is null"
    assert response.headers["content-type"] == "application/json"
    rows = skyrl_documents(response.content)
    assert {"result": rows} == _want(toy_bm25)
    # SkyRL formats each row's documents as "Doc i: contents"
    assert rows[0][0]["document"]["contents"].startswith('"Rome"')


def test_gem_sends_msgpack_without_content_type_and_reads_a_flat_msgpack_list(client, toy_bm25):
    body, headers = gem_request(QUERY, 3)
    assert "content-type" not in {h.lower() for h in headers}
    response = _post(client, (body, headers))
    assert response.status_code == 200, response.text  # was 422 "not valid UTF-8"
    assert response.headers["content-type"] == "application/msgpack"
    docs = gem_documents(response.content)
    assert docs == _want(toy_bm25)["result"][0]
    assert passages_text(docs).startswith('Doc 1(Title: "Rome") Rome is the capital city')


def test_gem_without_scores_gets_null_scores_as_gem_s_server_sends(client, toy_bm25):
    body = msgspec.msgpack.encode({"query": QUERY, "topk": 2, "return_scores": False})
    docs = gem_documents(client.post("/retrieve", content=body).content)
    assert [d["score"] for d in docs] == [None, None]
    assert [d["document"]["id"] for d in docs] == [h.doc_id for h in toy_bm25.search([QUERY], 2)[0]]


def test_the_content_type_decides_over_the_body(client):
    msgpack_body, _ = gem_request(QUERY, 3)
    r = client.post("/retrieve", content=msgpack_body, headers={"content-type": "application/json"})
    assert r.status_code == 422 and "not valid UTF-8" in r.json()["detail"]
    r = client.post(
        "/retrieve", content=b'{"query": "a"}', headers={"content-type": "application/msgpack"}
    )
    assert r.status_code == 422 and "not valid msgpack" in r.json()["detail"]
    # a msgpack body sent as msgpack with Search-R1's batch gets Search-R1's nested result
    batch = msgspec.msgpack.encode({"queries": [QUERY, "river"], "topk": 1})
    r = client.post("/retrieve", content=batch, headers={"content-type": "application/x-msgpack"})
    assert [len(row) for row in msgspec.msgpack.decode(r.content)["result"]] == [1, 1]


_BAD = [
    ({"query": ""}, 422, '"query" is empty'),
    ({"query": "  "}, 422, '"query" is empty'),
    ({"query": 3}, 422, '"query" is a number'),
    ({"query": ["a"]}, 422, '"query" is a list'),
    ({"query": "x" * 101}, 422, '"query" has 101 characters; the limit is 100'),
    ({"query": "a", "queries": ["a"]}, 422, "not both"),
    ({"query": "a", "topk": 0}, 422, "between 1 and 100"),
    ({"query": "a", "topk": 101}, 422, "between 1 and 100"),
    ({"query": "a", "topk": "3"}, 422, '"topk" is a string'),
    ({"query": "a", "return_scores": 1}, 422, '"return_scores" is a number'),
    ({"queries": ["a"] * 5}, 422, "holds 5 queries; the limit is 4"),
    ({"query": "x" * 30_000}, 413, "exceeds 20000"),
]


@pytest.mark.parametrize(("payload", "status", "needle"), _BAD)
@pytest.mark.parametrize("encoding", ["json", "msgpack"])
def test_every_variant_has_the_same_limits_and_4xx_rules(client, payload, status, needle, encoding):
    encode = json.dumps if encoding == "json" else msgspec.msgpack.encode
    body = encode(payload)
    response = client.post("/retrieve", content=body if isinstance(body, bytes) else body.encode())
    assert response.status_code == status
    assert needle in response.json()["detail"]  # errors are JSON for every variant


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"\x81\xa5query", "not valid msgpack"),  # a map cut short
        (b"\x81\xa5query\xc1", "not valid msgpack"),  # a reserved byte
        (b"\x81\xa5query\xa1q\x00", "not valid msgpack"),  # trailing bytes
        (b"\x91\xa1q", "msgpack map"),  # an array, not a map
        (b"\x81\xa5query\xc4\x01q", '"query" is bytes'),  # bin, not str
        (b"\x81\xa1q" + b"\x91" * 10_000 + b"\xc0", "nested too deeply"),  # was a 500
    ],
)
def test_malformed_msgpack_gets_a_422(client, body, needle):
    response = client.post(
        "/retrieve", content=body, headers={"content-type": "application/msgpack"}
    )
    assert response.status_code == 422
    assert needle in response.json()["detail"]


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)


@given(
    payload=st.dictionaries(
        st.sampled_from(["query", "queries", "topk", "return_scores", "x"]), _VALUES
    )
)
def test_no_msgpack_body_gets_anything_but_a_request_or_a_4xx(payload):
    # the server turns InvalidRequest into its 4xx; any other exception would be a 500
    try:
        request = parse_request(msgspec.msgpack.encode(payload), LIMITS)
    except InvalidRequest as err:
        assert err.status in (413, 422)
    else:
        assert request.encoding == "msgpack" and request.queries


# -- HTTPRetriever(protocol=...) against servers that speak only one peer's dialect ------------


class _PeerServer(BaseHTTPRequestHandler):
    """A server as SkyRL's (JSON, one query) or GEM's mosec one (msgpack, flat) answers."""

    protocol_name = "skyrl-gym"
    seen: ClassVar[list[tuple[str | None, object]]] = []

    def do_POST(self):
        raw = self.rfile.read(int(self.headers["content-length"]))
        gem = self.protocol_name == "gem"
        payload = msgspec.msgpack.decode(raw) if gem else json.loads(raw)
        type(self).seen.append((self.headers.get("content-type"), payload))
        query = payload["query"]  # a Search-R1 batch would fail here, as on the peers' servers
        docs = [
            {
                "document": {"id": f"{query}-{i}", "contents": f'"{query}"\nhit {i}'},
                "score": 1.0 - i,
            }
            for i in range(payload["topk"])
        ]
        body = (
            msgspec.msgpack.encode({"result": docs})
            if gem
            else json.dumps({"result": [docs]}).encode()
        )
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.send_response(404)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(params=["skyrl-gym", "gem"])
def peer_server(request):
    handler = type("Handler", (_PeerServer,), {"protocol_name": request.param, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield request.param, handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_http_retriever_speaks_a_peer_server_s_dialect(peer_server):
    protocol, handler, url = peer_server
    remote = HTTPRetriever(url, protocol=protocol, index_id="peer")
    rows = remote.search(["who?", "", "where?"], k=2)
    assert [[h.doc_id for h in row] for row in rows] == [
        ["who?-0", "who?-1"],
        [],
        ["where?-0", "where?-1"],
    ]
    assert rows[0][0].title == "who?" and rows[0][0].text == "hit 0" and rows[0][1].score == 0.0
    content_type = None if protocol == "gem" else "application/json"
    assert handler.seen == [
        (content_type, {"query": q, "topk": 2, "return_scores": True}) for q in ("who?", "where?")
    ]
    import asyncio

    assert asyncio.run(remote.asearch(["who?", "where?"], k=2)) == [rows[0], rows[2]]


def test_a_protocol_prefixed_url_makes_a_retriever_an_env_can_search_with(peer_server):
    from envs import SearchQAEnv
    from envs.tasks import QATask

    protocol, _, url = peer_server
    remote = make_retriever(f"{protocol}+{url}", cache=False)
    assert repr(remote) == f"HTTPRetriever({url!r}, protocol={protocol!r})"
    task = QATask(task_id="q", question="Who?", golden_answers="Ann")
    env = SearchQAEnv([task], make_retriever(f"{protocol}+{url}"), top_k=2)
    env.reset(seed=0)
    observation, *_ = env.step("<search> who </search>")
    assert "hit 0" in observation and "hit 1" in observation
    with pytest.raises(IndexFormatError, match="skyrl-gym\\+ or gem\\+"):
        make_retriever("mosec+http://x")


def test_http_retriever_protocols_all_work_against_tracerl_serve_retriever(toy_server, toy_bm25):
    want = toy_bm25.search(["capital of Italy", "river"], k=3)
    for protocol in ("search-r1", "skyrl-gym", "gem"):
        with HTTPRetriever(toy_server.url, protocol=protocol) as remote:
            assert remote.search(["capital of Italy", "river"], k=3) == want, protocol


def test_a_wrong_protocol_is_refused_or_reported():
    with pytest.raises(ValueError, match="protocol must be one of search-r1, skyrl-gym, gem"):
        HTTPRetriever("http://x", protocol="mosec")  # type: ignore[arg-type]


def test_a_gem_client_reading_a_json_answer_raises_retrieval_error(fake_json_server):
    remote = HTTPRetriever(fake_json_server, protocol="gem", index_id="x", max_attempts=1)
    with pytest.raises(RetrievalError, match="not gem's"):
        remote.search(["q"], k=1)


@pytest.fixture
def fake_json_server():
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            self.rfile.read(int(self.headers["content-length"]))
            body = b'{"result": [[]]}'
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
