"""Search-R1's retrieval wire format, both sides, and the server's request limits.

Request (`POST /retrieve`): `{"queries": [str], "topk": int | null, "return_scores": bool}`.
Response with scores: `{"result": [[{"document": {"id", "contents"}, "score": float}, ...]]}`;
without: `{"result": [[{"id", "contents"}, ...]]}`, one inner list per query, best first, where
`contents` is `"Title"\\ntext`. This module has no web framework in it, so the validation
rules are testable on bytes and the client parses answers with the same definitions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from retrieval.base import Hit, parse_contents
from retrieval.errors import InvalidRequest, RetrievalError

__all__ = ["RetrieveRequest", "ServerLimits", "parse_request", "parse_result", "render_result"]


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
    default_topk: int = 3
    """topk when a request sends none or null (Search-R1's launch default)"""


@dataclass(frozen=True, slots=True, kw_only=True)
class RetrieveRequest:
    """A validated `POST /retrieve` body."""

    queries: list[str]
    topk: int
    return_scores: bool


def parse_request(body: bytes, limits: ServerLimits) -> RetrieveRequest:
    """Validate a raw `POST /retrieve` body.

    Raises:
        InvalidRequest: with status 413 for a body over `max_body_bytes`, else 422: not UTF-8,
            not JSON (or nested too deeply, or holding an integer too long to parse), not an
            object, wrong field types, no queries, an empty or blank query,
            an unpaired surrogate, or a count, length or topk over its limit. The message
            names the field and the limit.

    >>> parse_request(b'{"queries": ["who?"], "topk": 2}', ServerLimits())
    RetrieveRequest(queries=['who?'], topk=2, return_scores=False)
    """
    if len(body) > limits.max_body_bytes:
        raise InvalidRequest(413, f"body of {len(body)} bytes exceeds {limits.max_body_bytes}")
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
    if not isinstance(payload, dict):
        raise InvalidRequest(422, 'body must be a JSON object {"queries": [str], "topk": int}')
    queries = payload.get("queries")
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
        _check_query(i, query, limits)
    topk = payload.get("topk")
    if topk is None:
        topk = limits.default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise InvalidRequest(422, f'"topk" is {_json_type(topk)}, expected an integer or null')
    if not 1 <= topk <= limits.max_topk:
        raise InvalidRequest(422, f'"topk" is {topk}; it must be between 1 and {limits.max_topk}')
    return_scores = payload.get("return_scores", False)
    if not isinstance(return_scores, bool):
        raise InvalidRequest(
            422, f'"return_scores" is {_json_type(return_scores)}, expected true or false'
        )
    return RetrieveRequest(queries=queries, topk=topk, return_scores=return_scores)


def _check_query(i: int, query: Any, limits: ServerLimits) -> None:
    if not isinstance(query, str):
        raise InvalidRequest(422, f'"queries"[{i}] is {_json_type(query)}, expected a string')
    if not query.strip():
        raise InvalidRequest(422, f'"queries"[{i}] is empty')
    if len(query) > limits.max_query_chars:
        raise InvalidRequest(
            422,
            f'"queries"[{i}] has {len(query)} characters; the limit is {limits.max_query_chars}',
        )
    try:
        query.encode("utf-8")
    except UnicodeEncodeError:  # JSON can spell a lone surrogate ("\ud800"); text cannot
        raise InvalidRequest(422, f'"queries"[{i}] holds an unpaired surrogate') from None


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string"}
    return names.get(type(value), "a list" if isinstance(value, list) else "an object")


def _document(hit: Hit) -> dict[str, str]:
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
    title, text = parse_contents(str(document["contents"]))
    return Hit(doc_id=str(document["id"]), title=title, text=text, score=float(item["score"]))
