"""A Search-R1-compatible retrieval server (FastAPI + uvicorn) with micro-batching and limits.

Endpoints:

- `POST /retrieve`, Search-R1's exact protocol. Request
  `{"queries": [str], "topk": int | null, "return_scores": bool}`; response
  `{"result": [[{"document": {"id", "contents"}, "score": float}, ...], ...]}` with scores, or
  `{"result": [[{"id", "contents"}, ...], ...]}` without (`contents` is `"Title"\\ntext`).
  The same route also takes SkyRL-gym's request (`"query": str`) and GEM's (msgpack in,
  msgpack out, a flat `result`), told apart by content type and body shape, and answers each
  in kind (`retrieval.protocol`); every variant passes the same validation and limits.
- `GET /health`: `{"status": "ok", "index_id", "manifest", "limits", "batching", "stats"}`.

Every bad request, in any variant, gets a 4xx with a JSON `{"detail": "<what is wrong and the
limit>"}` and never a 500: 413 for a body over `max_body_bytes`, 422 for a body that is not
UTF-8 JSON or msgpack, for wrong field types, for an empty query list or an empty query, for
too many queries, a query over `max_query_chars` or a `topk` over `max_topk`. 503 (with
`Retry-After`) means the queue is full. 409 means the index itself cannot answer: a file of it
was changed under the server, or holds a row id past the corpus (`retrieval.index_files`); it
is logged in one line, and only a restart on a sound index clears it. The server binds
127.0.0.1 unless told otherwise.

`serve` guards the connections themselves (`retrieval.guard`): a cap on open connections (503
past it, logged), deadlines for a request's headers and body and for an idle keep-alive
connection, and a cap on header size (431).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import asdict

import uvicorn
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from retrieval.base import Retriever
from retrieval.batching import BatchingConfig, MicroBatcher, ServerBusy
from retrieval.errors import IndexFileError, InvalidRequest
from retrieval.guard import (
    ConnectionLimits,
    Throttled,
    check_descriptor_room,
    guarded_protocol,
)
from retrieval.manifest import IndexManifest
from retrieval.protocol import INDEX_ID_HEADER, ServerLimits, parse_request, render_response

__all__ = ["create_app", "serve"]

log = logging.getLogger(__name__)


async def _read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise HTTPException(413, f"body of {declared} bytes exceeds {max_bytes}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > max_bytes:  # a chunked body with no Content-Length
            raise HTTPException(413, f"body exceeds {max_bytes} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def create_app(
    retriever: Retriever,
    *,
    manifest: IndexManifest | None = None,
    limits: ServerLimits | None = None,
    batching: BatchingConfig | None = None,
    thread_setup: Callable[[], object] | None = None,
) -> FastAPI:
    """The ASGI app serving `retriever` over Search-R1's API.

    Args:
        retriever: any `Retriever`; it is called from one worker thread at a time.
        manifest: shown by `/health` (the index's manifest, if it has one).
        limits: request limits.
        batching: micro-batching settings.
        thread_setup: run once in the thread that searches (see `MicroBatcher`).

    Raises:
        ValueError: `batching.max_pending_queries` is below `limits.max_queries_per_request`.
    """
    limits = limits or ServerLimits()
    batching = batching or BatchingConfig()
    if batching.max_pending_queries < limits.max_queries_per_request:
        # a request the limits allow would then find the queue "full" forever: a 503 loop
        raise ValueError(
            f"batching.max_pending_queries={batching.max_pending_queries} is below "
            f"limits.max_queries_per_request={limits.max_queries_per_request}: the largest "
            "allowed request could never be queued; raise the first or lower the second"
        )
    batcher = MicroBatcher(retriever, batching, thread_setup=thread_setup)
    disconnects = Throttled(
        "%d client(s) disconnected before sending their whole request (at most one line per 10 s)",
        logger=log,
        level=logging.INFO,
    )

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = FastAPI(title="trace-rl retriever", lifespan=lifespan)

    @app.post("/retrieve")
    async def retrieve(request: Request) -> Response:
        try:
            body = await _read_body(request, limits.max_body_bytes)
        except ClientDisconnect:  # routine (a client timed out or was killed): one line, no trace
            # throttled as the guard's own lines: a body-trickling slowloris that the guard
            # evicts by the hundred a second would otherwise write a line for each
            disconnects.add()
            return Response(status_code=400)  # nobody reads it
        try:
            req = parse_request(body, limits, content_type=request.headers.get("content-type"))
        except InvalidRequest as err:
            raise HTTPException(err.status, err.detail) from None
        try:
            rows = await batcher.search(req.queries, req.topk)
        except ServerBusy as err:
            raise HTTPException(503, str(err), headers={"Retry-After": "1"}) from None
        except IndexFileError as err:  # the batcher logged it; a retry cannot help
            raise HTTPException(409, f"the index cannot answer: {err}") from None
        # off the event loop: a large answer takes a while to render, and other connections
        # must be served meanwhile
        content, media_type = await asyncio.to_thread(render_response, rows, req)
        if len(content) > limits.max_answer_bytes:
            raise HTTPException(
                413,
                f"the answer holds {len(content)} bytes, over the limit of "
                f"{limits.max_answer_bytes}; ask for fewer queries or a smaller topk",
            )
        # every answer names its index: a client notices a restart with another index
        headers = {INDEX_ID_HEADER: retriever.index_id}
        return Response(content=content, media_type=media_type, headers=headers)

    @app.get("/health")
    async def health() -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "index_id": retriever.index_id,
                "manifest": manifest.to_json() if manifest is not None else None,
                "limits": asdict(limits),
                "batching": asdict(batching),
                "stats": asdict(batcher.stats()),
            }
        )

    return app


class _AnnouncingServer(uvicorn.Server):
    """A uvicorn server that calls back once its socket accepts connections."""

    def __init__(self, config: uvicorn.Config, on_ready: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_ready = on_ready

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if not self.should_exit:
            self._on_ready()


def serve(
    app: FastAPI,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    on_ready: Callable[[str], None] | None = None,
    connections: ConnectionLimits | None = None,
) -> None:
    """Run `app` until interrupted.

    Args:
        app: from `create_app`.
        host: the interface to bind; 127.0.0.1 keeps the server local.
        port: the TCP port; 0 picks a free one.
        on_ready: called with the base URL (`http://host:port`, the real port) once the
            server accepts connections.
        connections: the connection guard's limits (`retrieval.guard`).

    Raises:
        ValueError: the port is not in 0..65535, or the descriptor limit leaves no room for
            `connections.max_open` sockets.
        OSError: the address cannot be bound.
    """
    connections = connections or ConnectionLimits()
    if not 0 <= port <= 65_535:
        raise ValueError(f"port {port} is not a TCP port (0..65535)")
    check_descriptor_room(connections)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    url_host = f"[{host}]" if family == socket.AF_INET6 else host
    url = f"http://{url_host}:{bound_port}"
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        http=guarded_protocol(connections),
        # typed int, but uvicorn passes it to call_later, which takes seconds as a float
        timeout_keep_alive=connections.idle_timeout_s,  # type: ignore[arg-type]
        # the guard answers 431 first; h11's own cap (a 400) only backs it up
        h11_max_incomplete_event_size=connections.max_header_bytes + 1_024,
        # after SIGTERM: stop accepting, let requests in flight finish this long, then exit
        # even if clients keep their connections open (uvicorn would wait for them forever)
        timeout_graceful_shutdown=connections.shutdown_grace_s,  # type: ignore[arg-type]
    )
    server = _AnnouncingServer(config, lambda: on_ready(url) if on_ready else None)
    if host not in ("127.0.0.1", "localhost", "::1"):
        log.warning("serving on %s: reachable from other machines", host)
    log.info("serving %s", url)
    server.run(sockets=[sock])
