"""The retrieval wire formats, both sides, and the server's request limits.

Search-R1's (the reference). Request (`POST /retrieve`, JSON):
`{"queries": [str], "topk": int | null, "return_scores": bool}`. Response with scores:
`{"result": [[{"document": {"id", "contents"}, "score": float}, ...]]}`; without:
`{"result": [[{"id", "contents"}, ...]]}`, one inner list per query, best first, where
`contents` is `"Title"\\ntext`.

Two peers' variants of it, told apart by content type and body shape (`request_encoding`):

- SkyRL-gym's: JSON with `"query": str` (one query) in place of `"queries"`; the response is
  Search-R1's, with its one row (`{"result": [[...]]}`).
- GEM's (its mosec server): a msgpack map `{"query": str, "topk", "return_scores"}`, sent with
  no content type; the response is msgpack, `{"result": [{"document", "score"}, ...]}`, a flat
  list for the one query, where `score` is null unless asked for. A msgpack body with
  `"queries"` gets Search-R1's response shape, in msgpack.

Every variant goes through the same validation, so the same limits and 4xx rules apply. This
module has no web framework in it, so the rules are testable on bytes, and the client
(`HTTPRetriever(protocol=...)`) builds requests and parses answers with the same definitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

import msgspec

from retrieval.base import Hit, parse_contents
from retrieval.errors import InvalidRequest, RetrievalError

__all__ = [
    "INDEX_ID_HEADER",
    "PROTOCOLS",
    "Encoding",
    "Protocol",
    "RetrieveRequest",
    "ServerLimits",
    "encode_request",
    "parse_request",
    "parse_response",
    "parse_result",
    "render_response",
    "render_result",
    "request_encoding",
]

INDEX_ID_HEADER = "x-index-id"
"""The response header in which a trace-rl server names the index that answered."""

Encoding = Literal["json", "msgpack"]
Protocol = Literal["search-r1", "skyrl-gym", "gem"]
"""A client's dialect: Search-R1's batch JSON, SkyRL-gym's one-query JSON, GEM's msgpack."""
PROTOCOLS: tuple[Protocol, ...] = get_args(Protocol)

MSGPACK_TYPES = frozenset(
    {"application/msgpack", "application/x-msgpack", "application/vnd.msgpack"}
)
_MSGPACK_MEDIA_TYPE = "application/msgpack"
# the first byte of a msgpack map: fixmap (0x80-0x8f), map 16 (0xde), map 32 (0xdf). None of
# them can start a UTF-8 text, so a JSON body is never taken for msgpack.
_MSGPACK_MAP_START = frozenset(range(0x80, 0x90)) | {0xDE, 0xDF}


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLimits:
    """What one request may ask for; anything over a limit gets a 4xx naming it."""

    max_body_bytes: int = 1 << 20
    """request body size in bytes (413 above)"""
    max_queries_per_request: int = 512
    """queries in one request (422 above; clients split bigger batches)"""
    max_query_chars: int = 4096
    """characters in one query (422 above)"""
    max_topk: int = 100
    """the largest topk (422 above)"""
    max_hits_per_request: int = 4_096
    """queries x topk in one request (413 above): what one request may make the server find,
    render and hold; 512 queries at topk 8, so a small body can no longer buy a huge answer"""
    max_answer_bytes: int = 8 << 20
    """bytes of one answer (413 instead, after the search: long documents)"""
    default_topk: int = 3
    """topk when a request sends none or null (Search-R1's launch default)"""

    def __post_init__(self) -> None:
        names = (
            "max_body_bytes",
            "max_queries_per_request",
            "max_query_chars",
            "max_topk",
            "max_hits_per_request",
            "max_answer_bytes",
        )
        for name in names:
            if getattr(self, name) < 1:  # 0 would refuse every request
                flag = "--limits." + name.replace("_", "-")
                raise ValueError(f"{flag} must be >= 1, got {getattr(self, name)}")
        if self.max_hits_per_request < self.max_topk:
            raise ValueError(
                f"--limits.max-hits-per-request {self.max_hits_per_request} is below "
                f"--limits.max-topk {self.max_topk}: one query at the largest topk would be refused"
            )
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(
                f"--limits.default-topk {self.default_topk} must be between 1 and "
                f"--limits.max-topk {self.max_topk}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveRequest:
    """A validated `POST /retrieve` body, and the variant it came in (to answer in kind)."""

    queries: list[str]
    topk: int
    return_scores: bool
    encoding: Encoding = "json"
    """the body's encoding; the response uses the same"""
    single: bool = False
    """the body sent `"query": str` (SkyRL-gym, GEM) rather than `"queries": [str]`"""


def request_encoding(content_type: str | None, body: bytes) -> Encoding:
    """How a request body is encoded: a msgpack content type, or else its first byte, says.

    GEM sends msgpack with no content type, so a body that starts as a msgpack map is msgpack
    unless the content type says JSON. Anything else is JSON, as Search-R1's server assumes.

    >>> request_encoding(None, b"\\x81\\xa5query\\xa1q"), request_encoding(None, b'{"query": ""}')
    ('msgpack', 'json')
    """
    media_type = (content_type or "").split(";")[0].strip().lower()
    if media_type in MSGPACK_TYPES:
        return "msgpack"
    if media_type.endswith("json") or not body:
        return "json"
    return "msgpack" if body[0] in _MSGPACK_MAP_START else "json"


def parse_request(
    body: bytes, limits: ServerLimits, *, content_type: str | None = None
) -> RetrieveRequest:
    """Validate a raw `POST /retrieve` body in any variant (see the module docstring).

    Args:
        body: the raw body.
        limits: the server's limits.
        content_type: the request's Content-Type header, if any.

    Raises:
        InvalidRequest: with status 413 for a body over `max_body_bytes` or queries x topk over
            `max_hits_per_request`, else 422: not UTF-8,
            not JSON (or nested too deeply, or holding an integer too long to parse) or
            msgpack, not an object, wrong field types, no queries or both `queries` and
            `query`, an empty or blank query, an unpaired surrogate, or a count, length or topk
            over its limit. The message names the field and the limit.

    >>> parse_request(b'{"queries": ["who?"], "topk": 2}', ServerLimits())
    RetrieveRequest(queries=['who?'], topk=2, return_scores=False, encoding='json', single=False)
    >>> parse_request(b'{"query": "who?"}', ServerLimits()).single
    True
    """
    if len(body) > limits.max_body_bytes:
        raise InvalidRequest(413, f"body of {len(body)} bytes exceeds {limits.max_body_bytes}")
    if request_encoding(content_type, body) == "msgpack":
        return _validate(_decode_msgpack(body), limits, "msgpack")
    return _validate(_decode_json(body), limits, "json")


def _decode_msgpack(body: bytes) -> Any:
    try:
        return msgspec.msgpack.decode(body)
    except msgspec.DecodeError as err:
        raise InvalidRequest(422, f"body is not valid msgpack: {err}") from None
    except RecursionError:  # msgspec recurses per nesting level, as json does
        raise InvalidRequest(422, "body is msgpack nested too deeply") from None


def _decode_json(body: bytes) -> Any:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InvalidRequest(422, f"body is not valid UTF-8 (byte {err.start})") from None
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidRequest(422, f"body is not valid JSON: {err.msg} at char {err.pos}") from None
    except RecursionError:  # the decoder recurses per nesting level; ~1,000 '[' exhaust it
        raise InvalidRequest(422, "body is JSON nested too deeply") from None
    except ValueError as err:  # an integer of over 4,300 digits (Python's int-parsing limit)
        raise InvalidRequest(422, f"body is not acceptable JSON: {err}") from None
    return payload


def _validate(payload: Any, limits: ServerLimits, encoding: Encoding) -> RetrieveRequest:
    if not isinstance(payload, dict):
        kind = "JSON object" if encoding == "json" else "msgpack map"
        raise InvalidRequest(422, f'body must be a {kind} {{"queries": [str], "topk": int}}')
    single = "query" in payload
    if single and "queries" in payload:
        raise InvalidRequest(422, 'send "queries" (a list) or "query" (one string), not both')
    if single:
        _check_query('"query"', payload["query"], limits)
        queries = [payload["query"]]
    else:
        queries = _check_queries(payload.get("queries"), limits)
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise InvalidRequest(422, f'"topk" is {_json_type(topk)}, expected an integer or null')
    if not 1 <= topk <= limits.max_topk:
        raise InvalidRequest(422, f'"topk" is {topk}; it must be between 1 and {limits.max_topk}')
    if len(queries) * topk > limits.max_hits_per_request:
        raise InvalidRequest(
            413,
            f"{len(queries)} queries x topk {topk} = {len(queries) * topk} hits exceeds the "
            f"limit of {limits.max_hits_per_request} per request (split the batch)",
        )
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise InvalidRequest(
            422, f'"return_scores" is {_json_type(return_scores)}, expected true or false'
        )
    return RetrieveRequest(
        queries=queries,
        topk=topk,
        return_scores=return_scores,
        encoding=encoding,
        single=single,
    )


def _check_queries(queries: Any, limits: ServerLimits) -> list[str]:
    if not isinstance(queries, list):
        raise InvalidRequest(422, f'"queries" is {_json_type(queries)}, expected a list of strings')
    if not queries:
        raise InvalidRequest(422, '"queries" is empty; send at least one query')
    if len(queries) > limits.max_queries_per_request:
        raise InvalidRequest(
            422,
            f'"queries" holds {len(queries)} queries; the limit is '
            f"{limits.max_queries_per_request} per request (split the batch)",
        )
    for i, query in enumerate(queries):
        _check_query(f'"queries"[{i}]', query, limits)
    return queries


def _check_query(field: str, query: Any, limits: ServerLimits) -> None:
    if not isinstance(query, str):
        raise InvalidRequest(422, f"{field} is {_json_type(query)}, expected a string")
    if not query.strip():
        raise InvalidRequest(422, f"{field} is empty")
    if len(query) > limits.max_query_chars:
        raise InvalidRequest(
            422,
            f"{field} has {len(query)} characters; the limit is {limits.max_query_chars}",
        )
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell a lone surrogate ("\ud800"); text cannot
        raise InvalidRequest(422, f"{field} holds an unpaired surrogate") from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", bytes: "bytes"}
    return names.get(type(value), "a list" if isinstance(value, list) else "an object")


def _document(hit: Hit) -> dict[str, object]:
    return {"id": hit.doc_id, "contents": hit.contents}


def render_result(rows: list[list[Hit]], *, return_scores: bool) -> dict[str, Any]:
    """The Search-R1 response body for hits, with or without scores.

    >>> hit = Hit(doc_id="7", title="Paris", text="Capital.", score=1.5)
    >>> render_result([[hit]], return_scores=True)
    {'result': [[{'document': {'id': '7', 'contents': '"Paris"\\nCapital.'}, 'score': 1.5}]]}
    >>> render_result([[hit]], return_scores=False)
    {'result': [[{'id': '7', 'contents': '"Paris"\\nCapital.'}]]}
    """
    if return_scores:
        result = [[{"document": _document(h), "score": h.score} for h in hits] for hits in rows]
    else:
        result = [[_document(h) for h in hits] for hits in rows]
    return {"result": result}


def render_response(rows: list[list[Hit]], request: RetrieveRequest) -> tuple[bytes, str]:
    """The response body and its media type, in the variant `request` came in.

    >>> hit = Hit(doc_id="7", title="Paris", text="Capital.", score=1.5)
    >>> req = RetrieveRequest(queries=["q"], topk=1, return_scores=True, encoding="msgpack",
    ...                       single=True)
    >>> body, media_type = render_response([[hit]], req)
    >>> media_type, msgspec.msgpack.decode(body)["result"][0]["score"]
    ('application/msgpack', 1.5)
    """
    if request.encoding == "json":  # Search-R1's, and SkyRL-gym's (one row)
        result = render_result(rows, return_scores=request.return_scores)
        return json.dumps(result).encode(), "application/json"
    if request.single:  # GEM's mosec server: a flat list, score null unless asked for
        flat = [
            {"document": _document(h), "score": h.score if request.return_scores else None}
            for h in rows[0]
        ]
        return msgspec.msgpack.encode({"result": flat}), _MSGPACK_MEDIA_TYPE
    result = render_result(rows, return_scores=request.return_scores)
    return msgspec.msgpack.encode(result), _MSGPACK_MEDIA_TYPE


def encode_request(queries: list[str], topk: int, protocol: Protocol) -> tuple[bytes, str | None]:
    """A `POST /retrieve` body asking for scores, and its content type, as `protocol` sends it.

    SkyRL-gym and GEM send one query per request; GEM sends no content type.

    >>> encode_request(["who?"], 3, "skyrl-gym")
    (b'{"query": "who?", "topk": 3, "return_scores": true}', 'application/json')
    """
    if protocol == "search-r1":
        payload: dict[str, Any] = {"queries": queries, "topk": topk, "return_scores": True}
        return json.dumps(payload).encode(), "application/json"
    if len(queries) != 1:
        raise ValueError(f"a {protocol} request holds one query, got {len(queries)}")
    payload = {"query": queries[0], "topk": topk, "return_scores": True}
    if protocol == "skyrl-gym":
        return json.dumps(payload).encode(), "application/json"
    return msgspec.msgpack.encode(payload), None


def parse_response(
    content: bytes, n_queries: int, protocol: Protocol, *, source: str
) -> list[list[Hit]]:
    """Read a response with scores, sent by a server that speaks `protocol`, into hits.

    Raises:
        RetrievalError: the body is not that protocol's response with scores.
    """
    try:
        body = msgspec.msgpack.decode(content) if protocol == "gem" else json.loads(content)
    except (msgspec.DecodeError, ValueError) as err:
        raise RetrievalError(f"{source} returned a body that is not {protocol}'s ({err})") from err
    if protocol == "gem":  # one query's flat list
        flat = body.get("result") if isinstance(body, dict) else None
        body = {"result": [flat] if isinstance(flat, list) else None}
    return parse_result(body, n_queries, source=source)


def parse_result(body: Any, n_queries: int, *, source: str) -> list[list[Hit]]:
    """Read a Search-R1 response with scores back into hits.

    Args:
        body: the decoded JSON response.
        n_queries: how many queries were sent (one row each).
        source: the request, for error messages (`"POST http://…/retrieve"`).

    Raises:
        RetrievalError: the body is not a Search-R1 response with scores of `n_queries` rows.
    """
    rows = body.get("result") if isinstance(body, dict) else None
    if not isinstance(rows, list) or len(rows) != n_queries:
        raise RetrievalError(
            f"{source} did not return a 'result' list of {n_queries} rows, as Search-R1 does"
        )
    try:
        return [[_hit(item) for item in row] for row in rows]
    except (KeyError, TypeError, ValueError) as err:
        raise RetrievalError(
            f"{source} returned a malformed hit ({err!r}); expected "
            '{"document": {"id", "contents"}, "score": float}'
        ) from err


def _hit(item: dict[str, Any]) -> Hit:
    document = item["document"]
    contents = document["contents"]
    if not isinstance(contents, str):  # str() would turn a null into the text "None"
        raise TypeError(f"'contents' is {_json_type(contents)}, expected a string")
    title, text = parse_contents(contents)
    return Hit(doc_id=str(document["id"]), title=title, text=text, score=float(item["score"]))
