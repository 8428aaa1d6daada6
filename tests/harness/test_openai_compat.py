"""The OpenAI-compatible client against a scripted fake server on 127.0.0.1 (port 0)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from harness.errors import (
    ContextLengthExceeded,
    EndpointError,
    EndpointRejected,
    MalformedReply,
)
from harness.policies import (  # the package's public names
    EndpointConfig,
    OpenAICompatBackend,
    OpenAICompatClient,
    PolicyBackend,
    SamplingParams,
)


@dataclass
class FakeOpenAI:
    """A scripted OpenAI-compatible server.

    `script` holds the first replies in order (a status code, `"hang"`, or `"garbage"`); once
    it is empty, every request gets a completion built by `reply_for`.
    """

    script: list[Any] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    vllm: bool = True

    def app(self, release: threading.Event) -> FastAPI:
        app = FastAPI()

        async def handle(request: Request, chat: bool) -> Response:
            body = await request.json()
            self.requests.append(body)
            self.headers.append(dict(request.headers))
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.005)  # lets concurrent requests overlap
                step = self.script.pop(0) if self.script else None
                if step == "hang":
                    while not release.is_set():  # until the test tears the server down
                        await asyncio.sleep(0.01)
                    return JSONResponse({}, status_code=500)
                if step == "garbage":
                    return JSONResponse({"unexpected": True})
                if step == "no_choices" or body.get("prompt") == "broken":
                    return JSONResponse({"id": "cmpl-1", "choices": []})
                if step == "too_long":  # vLLM's wording
                    message = "This model's maximum context length is 512 tokens. However, ..."
                    return JSONResponse({"error": {"message": message}}, status_code=400)
                if isinstance(step, int):
                    headers = {"Retry-After": "0"} if step == 429 else {}
                    return JSONResponse({"error": f"scripted {step}"}, step, headers=headers)
                return JSONResponse(self.reply_for(body, chat))
            finally:
                self.in_flight -= 1

        @app.post("/v1/completions")
        async def completions(request: Request) -> Response:
            return await handle(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> Response:
            return await handle(request, chat=True)

        return app

    def reply_for(self, body: dict[str, Any], chat: bool) -> dict[str, Any]:
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        if isinstance(prompt, list):  # token ids: answer with the next two ids
            text, token_ids = "xy</answer>", [prompt[-1] + 1, prompt[-1] + 2]
        elif "long" in prompt:
            text, token_ids = "and so on", [7, 7, 7]
        else:
            text, token_ids = f"<search> {prompt} </search>", [5, 6, 7]
        finish = "length" if "long" in str(prompt) else "stop"
        if not self.vllm and text.endswith("</search>"):
            text = text[: -len("</search>")]  # OpenAI cuts the stop string off
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
        if self.vllm:
            choice["stop_reason"] = "</search>" if text.endswith("</search>") else None
            choice["token_ids"] = token_ids
        logprobs = [-0.5] * len(token_ids)
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if body.get("logprobs"):
                choice["logprobs"] = {"content": [{"logprob": lp} for lp in logprobs]}
        else:
            choice["text"] = text
            if body.get("logprobs") is not None:
                choice["logprobs"] = {"token_logprobs": logprobs, "tokens": []}
        usage = {"prompt_tokens": 11, "completion_tokens": len(token_ids)}
        return {"id": "cmpl-1", "object": "text_completion", "choices": [choice], "usage": usage}


class ServerThread:
    """uvicorn in a thread, on a socket bound to 127.0.0.1 port 0 before it starts."""

    def __init__(self, fake: FakeOpenAI) -> None:
        self.release = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)  # connections queue here until uvicorn accepts them
        config = uvicorn.Config(fake.app(self.release), log_level="error", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def __enter__(self) -> ServerThread:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@pytest.fixture
def fake() -> FakeOpenAI:
    return FakeOpenAI()


@pytest.fixture
def server(fake: FakeOpenAI) -> Iterator[ServerThread]:
    with ServerThread(fake) as running:
        yield running


def _client(url: str, **kwargs: Any) -> OpenAICompatClient:
    options = {"model": "fake-model", "backoff_s": 0.0, "max_backoff_s": 0.0, **kwargs}
    return OpenAICompatClient(EndpointConfig(base_url=url, **options))


GREEDY = SamplingParams(temperature=0.0, max_new_tokens=32, seed=3)


def test_complete_returns_one_completion_per_prompt_in_order(server, fake) -> None:
    prompts = [f"q{i}" for i in range(20)]
    out = _client(server.url, max_concurrency=4).complete(prompts, GREEDY)
    assert [c.text for c in out] == [f"<search> q{i} </search>" for i in range(20)]
    assert all(c.finish_reason == "stop" and c.stop == "</search>" for c in out)
    assert out[0].token_ids == (5, 6, 7) and out[0].logprobs == (-0.5, -0.5, -0.5)
    assert (out[0].n_prompt_tokens, out[0].n_completion_tokens) == (11, 3)
    assert 1 <= fake.max_in_flight <= 4
    body = fake.requests[0]
    assert body["stop"] == ["</search>", "</answer>"] and body["max_tokens"] == 32
    assert body["include_stop_str_in_output"] is True and body["return_token_ids"] is True
    # one seed per request, so identical prompts in a batch would still differ
    assert len({r["seed"] for r in fake.requests}) == 20


def test_token_id_prompts_and_the_policy_backend(server, fake) -> None:
    backend = OpenAICompatBackend(_client(server.url))
    assert isinstance(backend, PolicyBackend)
    out = backend.generate([[1, 2, 3], [9]], GREEDY)
    assert sorted(r["prompt"] for r in fake.requests) == [[1, 2, 3], [9]]
    assert [c.token_ids for c in out] == [(4, 5), (10, 11)]
    assert out[0].logprobs == (-0.5, -0.5) and out[0].finish_reason == "stop"
    with pytest.raises(ValueError, match="prefix 0 is empty"):
        backend.generate([[]], GREEDY)


def test_backend_needs_token_ids_from_the_server(server, fake) -> None:
    fake.vllm = False  # a server that ignores return_token_ids
    with pytest.raises(EndpointRejected, match="no token ids"):
        OpenAICompatBackend(_client(server.url)).generate([[1, 2]], GREEDY)
    with pytest.raises(ValueError, match="extensions='vllm'"):
        OpenAICompatBackend(_client(server.url, extensions="none"))


def test_finish_reasons(server, fake) -> None:
    out = _client(server.url).complete(["please go long"], GREEDY)
    assert out[0].finish_reason == "length" and out[0].stop is None


def test_plain_openai_mode_sends_only_standard_fields(server, fake) -> None:
    fake.vllm = False
    out = _client(server.url, extensions="none", api_key="sk-test").complete(["q"], GREEDY)
    body = fake.requests[0]
    assert not {"include_stop_str_in_output", "return_token_ids", "top_k"} & set(body)
    assert fake.headers[0]["authorization"] == "Bearer sk-test"
    # the API cut the stop string and did not say which: stop is unknown, never guessed
    assert out[0].text == "<search> q " and out[0].finish_reason == "stop" and out[0].stop is None
    assert out[0].token_ids is None


def test_chat_forwards_messages_and_reads_logprobs(server, fake) -> None:
    conversation = [{"role": "user", "content": "who?"}]
    out = _client(server.url).chat([conversation], GREEDY)
    assert fake.requests[0]["messages"] == conversation
    assert out[0].text == "<search> who? </search>" and out[0].logprobs == (-0.5,) * 3


def test_retries_connection_level_statuses_then_succeeds(server, fake) -> None:
    fake.script = [503, 429, 502]
    out = _client(server.url, max_retries=3).complete(["q"], GREEDY)
    assert out[0].text == "<search> q </search>"
    assert len(fake.requests) == 4


def test_gives_up_after_the_retry_budget_with_the_url_and_last_cause(server, fake) -> None:
    fake.script = [500, 500, 500]
    with pytest.raises(EndpointError) as info:
        _client(server.url, max_retries=2).complete(["q"], GREEDY)
    message = str(info.value)
    assert f"POST {server.url}/completions failed 3 times" in message
    assert "HTTP 500" in message and "scripted 500" in message
    assert len(fake.requests) == 3
    assert isinstance(info.value, ConnectionError)


def test_client_errors_are_not_retried(server, fake) -> None:
    fake.script = [400]
    with pytest.raises(EndpointRejected, match="HTTP 400"):
        _client(server.url, max_retries=3).complete(["q"], GREEDY)
    assert len(fake.requests) == 1


def test_context_overflow_is_typed_and_complete_each_keeps_the_rest(server, fake) -> None:
    fake.script = ["too_long"]
    with pytest.raises(ContextLengthExceeded, match="maximum context length"):
        _client(server.url).complete(["q"], GREEDY)
    fake.script = ["too_long", 400]
    client = _client(server.url, max_concurrency=1)  # one at a time: the script order holds
    out = client.complete_each(["a", "b", "c"], GREEDY)
    assert isinstance(out[0], ContextLengthExceeded)
    assert isinstance(out[1], EndpointRejected) and not isinstance(out[1], ContextLengthExceeded)
    assert out[2].text == "<search> c </search>"
    chat = client.chat_each([[{"role": "user", "content": "d"}]], GREEDY)
    assert chat[0].text == "<search> d </search>"


def test_a_reply_that_is_not_a_completion_is_rejected_after_the_retries(server, fake) -> None:
    fake.script = ["garbage", "garbage"]
    with pytest.raises(MalformedReply, match="not an OpenAI completion"):
        _client(server.url, max_retries=1).complete(["q"], GREEDY)
    assert len(fake.requests) == 2  # asked again once, then given up


def test_an_empty_choices_reply_is_asked_again_and_fails_only_its_prompt(server, fake) -> None:
    fake.script = ["no_choices"]
    client = _client(server.url, max_concurrency=1, max_retries=1)
    assert client.complete(["q"], GREEDY)[0].text == "<search> q </search>"  # second ask
    out = client.complete_each(["broken", "b"], GREEDY)  # "broken": no choices, every time
    assert isinstance(out[0], MalformedReply) and "choices" in str(out[0])
    assert out[1].text == "<search> b </search>"


def test_timeouts_are_retried_then_reported(server, fake) -> None:
    fake.script = ["hang", "hang"]
    with pytest.raises(EndpointError, match="ReadTimeout"):
        _client(server.url, timeout_s=0.2, max_retries=1).complete(["q"], GREEDY)
    assert len(fake.requests) == 2


def test_connection_refused_is_an_endpoint_error(refused_port: int) -> None:
    port = refused_port
    with pytest.raises(EndpointError, match=rf"127.0.0.1:{port}.*ConnectError"):
        _client(f"http://127.0.0.1:{port}", max_retries=1).complete(["q"], GREEDY)


def test_async_api_and_sync_api_inside_a_loop(server, fake) -> None:
    client = _client(server.url)

    async def main() -> list[str]:
        with pytest.raises(RuntimeError, match="await acomplete"):
            client.complete(["q"], GREEDY)
        out = await client.acomplete(["a", "b"], GREEDY)
        chat = await client.achat([[{"role": "user", "content": "c"}]], GREEDY)
        return [c.text for c in [*out, *chat]]

    assert asyncio.run(main()) == [
        "<search> a </search>",
        "<search> b </search>",
        "<search> c </search>",
    ]


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="http"):
        EndpointConfig(base_url="127.0.0.1:8000", model="m")
    with pytest.raises(ValueError, match="max_concurrency=0"):
        EndpointConfig(base_url="http://h", model="m", max_concurrency=0)
    assert EndpointConfig(base_url="http://h:1/", model="m").api_root == "http://h:1/v1"
    assert EndpointConfig(base_url="http://h:1/v1/", model="m").api_root == "http://h:1/v1"


@contextlib.contextmanager
def _trickler() -> Iterator[str]:
    """A server on 127.0.0.1 (port 0) that sends every reply one byte per 0.1 s, forever."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    stop = threading.Event()

    def serve(conn: socket.socket) -> None:
        with conn:
            conn.recv(65536)
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 1000000\r\n\r\n")
            while not stop.is_set():
                try:
                    conn.sendall(b"{")
                except OSError:
                    return
                time.sleep(0.1)

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        stop.set()
        sock.close()


def test_a_trickling_endpoint_is_cut_at_timeout_s_of_wall_clock() -> None:
    """httpx's read timeout never fires on a byte every 0.1 s; the wall clock does."""
    with _trickler() as url:
        client = _client(url, timeout_s=1.0, max_retries=0)
        start = time.monotonic()
        with pytest.raises(
            EndpointError, match=r"ReadTimeout: no whole reply within timeout_s=1 s"
        ):
            client.complete(["q"], GREEDY)
        assert time.monotonic() - start < 1.0 + 2.0
        start = time.monotonic()
        with pytest.raises(EndpointError, match=r"cannot reach .*within 1 s"):
            client.models()  # the one-attempt check before a run
        assert time.monotonic() - start < 1.0 + 2.0
        client = _client(url, timeout_s=1.0, max_retries=1)  # each attempt is cut the same way
        start = time.monotonic()
        with pytest.raises(EndpointError, match="failed 2 times"):
            client.complete(["q"], GREEDY)
        assert time.monotonic() - start < 2 * 1.0 + 2.0
