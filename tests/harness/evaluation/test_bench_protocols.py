"""`tracerl bench --protocol tools` and `--protocol react` against a scripted loopback server.

One scripted policy answers all three protocols: search the question, then answer with the
founder the first document names (else its title). The server speaks each protocol's format,
so the runs' EM must agree, and what went over the wire shows each protocol's shape.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envs import QATask, SearchQAEnv, TaskSet
from harness.evaluation.bench import bench
from harness.evaluation.tool_agents import ReActAgent, ToolCallAgent, parse_react, react_prompt
from harness.policies.base import SamplingParams
from harness.policies.openai_compat import EndpointConfig, OpenAICompatClient
from harness.rollout.agent import ConcurrentAgent
from harness.rollout.evaluation import evaluate
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever
from retrieval.corpus import write_corpus

DOCS = [
    Document(doc_id="d-acme", title="Acme", text="Acme was founded by Ann Vole in Velmora."),
    Document(doc_id="d-ann", title="Ann Vole", text="Ann Vole was born in Tarsk."),
    Document(doc_id="d-bolt", title="Bolt", text="Bolt was founded by Bo Li."),
]
TASKS = TaskSet(
    [
        QATask(task_id="acme", question="Who founded Acme?", golden_answers=("Ann Vole",)),
        QATask(task_id="bolt", question="Who founded Bolt?", golden_answers=("Bo Li",)),
        QATask(task_id="born", question="Where was Ann Vole born?", golden_answers=("Tarsk",)),
    ]
)


def scripted_answer(observation: str) -> str:
    """The policy's answer from the first document it was shown."""
    founder = re.search(r"founded by (\w+ \w+)", observation)
    if founder:
        return founder.group(1)
    return re.search(r"Title: ([^)]+)\)", observation).group(1)  # type: ignore[union-attr]


class ScriptedServer:
    """Chat (text and tool calls) and completions (ReAct) for the one scripted policy."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []

    def chat(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        question = next(m["content"] for m in messages if m["role"] == "user")
        question = question.split("Question: ")[-1].strip().rstrip("?")
        if "tools" in body:
            results = [m for m in messages if m["role"] == "tool"]
            if not results:  # two searches and one malformed call, in one turn
                calls = [
                    ("c-1", "search", json.dumps({"query": question})),
                    ("c-2", "search", json.dumps({"query": question + " history"})),
                    ("c-3", "search", "{not json"),
                ]
                tool_calls = [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, n, a in calls
                ]
                return {"role": "assistant", "content": None, "tool_calls": tool_calls}
            return {"role": "assistant", "content": scripted_answer(results[0]["content"])}
        transcript = "".join(m["content"] for m in messages)
        if "<information>" not in transcript:
            return {"role": "assistant", "content": f"<search> {question} </search>"}
        answer = scripted_answer(transcript.split("<information>")[1])
        return {"role": "assistant", "content": f"<answer> {answer} </answer>"}

    def complete(self, body: dict[str, Any]) -> str:
        transcript = body["prompt"]
        question = transcript.split("Question: ")[-1].split("\n")[0].rstrip("?")
        if "Observation 1:" not in transcript.split("Question: ")[-1]:
            return f" I should look it up.\nAction 1: Search[{question}]\nObservation"
        observation = transcript.split("Question: ")[-1].split("Observation 1:")[1]
        return f" Found it.\nAction 2: Finish[{scripted_answer(observation)}]\nObservation"

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            choice = {"index": 0, "finish_reason": "stop", "message": self.chat(body)}
            return JSONResponse({"choices": [choice], "usage": {"completion_tokens": 7}})

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            choice = {"index": 0, "finish_reason": "stop", "text": self.complete(body)}
            return JSONResponse({"choices": [choice], "usage": {"completion_tokens": 9}})

        return app


@pytest.fixture
def server() -> Iterator[tuple[str, ScriptedServer]]:
    stub = ScriptedServer()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))  # the port comes from the OS
    sock.listen(64)
    uv = uvicorn.Server(uvicorn.Config(stub.app(), log_level="error", lifespan="off"))
    thread = threading.Thread(target=uv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", stub
    finally:
        uv.should_exit = True
        thread.join(timeout=30)
        sock.close()


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t.to_json()) + "\n" for t in TASKS))
    corpus = tmp_path / "corpus.jsonl"
    write_corpus(DOCS, corpus)
    return tasks, corpus


def _bench(url: str, files: tuple[Path, Path], out: Path, *extra: str) -> dict[str, Any]:
    tasks, corpus = files
    args = ["--agent", "openai", "--model", "stub", "--base-url", url, "--api", "chat",
            "--data-file", str(tasks), "--corpus", str(corpus), "--top-k", "1",
            "--prompt-template", "Question: {question}\n", "--out", str(out), "--no-progress",
            *extra]  # fmt: skip
    assert bench(args) == 0
    report: dict[str, Any] = json.loads((out / "report.json").read_text())["reports"][0]
    return report


def test_tools_protocol_sends_tools_answers_by_call_id_and_scores_as_the_text_protocol(
    server: tuple[str, ScriptedServer], files: tuple[Path, Path], tmp_path: Path
) -> None:
    url, stub = server
    text = _bench(url, files, tmp_path / "text")
    n_text = len(stub.requests)
    tools = _bench(url, files, tmp_path / "tools", "--protocol", "tools")
    assert text["overall"]["em"] == tools["overall"]["em"] == pytest.approx(2 / 3)
    sent = stub.requests[n_text:]
    assert all(
        [t["function"]["name"] for t in body["tools"]] == ["search"] and "stop" not in body
        for body in sent
    )
    assert sent[0]["tools"][0]["function"]["parameters"]["required"] == ["query"]
    last = sent[-1]["messages"]
    assert [m["role"] for m in last] == ["system", "user", "assistant", "tool", "tool", "tool"]
    assert [m["tool_call_id"] for m in last[3:]] == ["c-1", "c-2", "c-3"]
    assert last[3]["content"].startswith("<information>Doc 1(Title: ")
    assert last[5]["content"].startswith("My previous action is invalid (search: the arguments")
    episodes = [
        json.loads(line)
        for line in (tmp_path / "tools" / "trajectories.jsonl").read_text().splitlines()
    ]
    for episode in episodes:
        assert episode["n_tool_calls"] == 2  # each call of the turn was a search of its own
        kinds = [t["kind"] for t in episode["turns"]]
        assert kinds == ["search", "search", "invalid", "answer"]
    assert tools["meta"]["agent"]["protocol"] == "tools"


def test_react_protocol_scores_as_the_text_protocol(
    server: tuple[str, ScriptedServer], files: tuple[Path, Path], tmp_path: Path
) -> None:
    url, stub = server
    react = _bench(url, files, tmp_path / "react", "--protocol", "react", "--api", "completions")
    assert react["overall"]["em"] == pytest.approx(2 / 3)
    prompts = [body["prompt"] for body in stub.requests]
    seen = "Action 1: Search[Where was Ann Vole born]\nObservation 1: Doc 1(Title: Ann Vole) "
    assert sum(seen in prompt for prompt in prompts) == 1  # the stop string is not repeated
    assert all(body["stop"] == ["\nObservation"] for body in stub.requests)


def test_local_agents_refuse_the_endpoint_protocols(tmp_path: Path, caplog) -> None:
    assert bench(["--agent", "transformers", "--model", str(tmp_path), "--protocol", "tools",
                  "--out", str(tmp_path / "o"), "--no-progress"]) != 0  # fmt: skip
    assert "--protocol tools talks to an OpenAI-compatible endpoint" in caplog.text


def test_parse_react_takes_the_first_action_and_its_bracket() -> None:
    first = parse_react("Thought: hm.\nAction 1: Finish[Paris] Search[x]")
    assert first is not None and first.name == "answer"
    call = parse_react("Action 1: Search[ Acme [founder ]\n")
    assert call is not None and call.arguments == {"query": "Acme [founder"}
    assert parse_react("Action 1: Search[unclosed") is None
    assert parse_react("search[lower case is not an action]") is None
    prompt = react_prompt("Who founded Acme")
    assert "(1) Search[query], which can search" in prompt
    assert "(2) Finish[answer]" in prompt and prompt.endswith(
        "Question: Who founded Acme\nThought 1:"
    )


def test_a_react_episode_without_an_action_is_invalid_then_answers() -> None:
    replies = iter([" I am unsure.", " Now I know.\nAction 2: Finish[Ann Vole]"])
    seen: list[str] = []

    def reply(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content)["prompt"])
        choice = {"index": 0, "finish_reason": "stop", "text": next(replies)}
        return httpx.Response(200, json={"choices": [choice]})

    client = OpenAICompatClient(
        EndpointConfig(base_url="http://stub/v1", model="m"), transport=httpx.MockTransport(reply)
    )
    agent = ReActAgent("react", client, SamplingParams(temperature=0.0))
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(agent, lambda: SearchQAEnv(TASKS, retriever), TASKS[:1], batch_size=1)
    episode = report.episodes[0]
    assert [t.kind for t in episode.turns] == ["invalid", "answer"] and episode.em == 1.0
    assert "Observation 1: Invalid action." in seen[1]
    assert seen[1].endswith("\nThought 2:")


def test_a_tool_flag_offers_the_tool_next_to_search(
    server: tuple[str, ScriptedServer], files: tuple[Path, Path], tmp_path: Path
) -> None:
    url, stub = server
    calc = "envs.tools:CalculatorTool"
    report = _bench(url, files, tmp_path / "calc", "--protocol", "tools", "--tool", calc)
    assert [t["function"]["name"] for t in stub.requests[0]["tools"]] == ["search", "calc"]
    assert report["meta"]["agent"]["tools"] == ["search", "calc"]
    run = json.loads((tmp_path / "calc" / "report.json").read_text())["meta"]
    assert run["env"]["tools"] == [calc] and "--tool envs.tools:CalculatorTool" in run["command"]


def test_tool_calls_are_parsed_and_a_malformed_list_ends_only_its_episode() -> None:
    def reply(request: httpx.Request) -> httpx.Response:
        messages = json.loads(request.content)["messages"]
        if "Bolt" in messages[1]["content"]:  # tool_calls that are not a list
            message: dict[str, Any] = {"role": "assistant", "tool_calls": "search please"}
        elif any(m["role"] == "tool" for m in messages):
            message = {"role": "assistant", "content": "<think>Easy.</think> Ann Vole"}
        else:  # arguments as an object, not JSON text, and no id: both are accepted
            call = {
                "type": "function",
                "function": {"name": "search", "arguments": {"query": "Acme"}},
            }
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "finish_reason": "tool_calls", "message": message}
        return httpx.Response(200, json={"choices": [choice]})

    config = EndpointConfig(base_url="http://stub/v1", model="m", max_retries=0, backoff_s=0.0)
    client = OpenAICompatClient(config, transport=httpx.MockTransport(reply))
    agent = ToolCallAgent("tools", client, SamplingParams(temperature=0.0))
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(agent, lambda: SearchQAEnv(TASKS, retriever), TASKS[:2], batch_size=2)
    acme, bolt = report.episodes
    assert acme.em == 1.0 and acme.answer == "Ann Vole"  # the <think> block is dropped
    assert acme.turns[0].action == 'search({"query": "Acme"})'
    assert bolt.end == "error" and bolt.turns == ()


def _scripted_transport(stub: ScriptedServer, slow: str = "") -> httpx.MockTransport:
    """The scripted server in process; requests naming `slow` take 0.3 s."""

    async def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        stub.requests.append(body)
        if slow and slow in json.dumps(body):
            await asyncio.sleep(0.3)
        if request.url.path.endswith("/chat/completions"):
            choice = {"index": 0, "finish_reason": "stop", "message": stub.chat(body)}
        else:
            choice = {"index": 0, "finish_reason": "stop", "text": stub.complete(body)}
        usage = {"prompt_tokens": 11, "completion_tokens": 7}
        return httpx.Response(200, json={"choices": [choice], "usage": usage})

    return httpx.MockTransport(reply)


_AGENTS: dict[str, Callable[[OpenAICompatClient], ToolCallAgent | ReActAgent]] = {
    "tools": lambda client: ToolCallAgent("tools", client, SamplingParams(seed=3)),
    "react": lambda client: ReActAgent("react", client, SamplingParams(seed=3)),
}


def _tasks(n: int) -> list[QATask]:
    return [
        QATask(task_id=f"{name}-{i}", question=f"Who founded {name}?", golden_answers=(answer,))
        for i in range(n)
        for name, answer in (("Acme", "Ann Vole"), ("Bolt", "Bo Li"))
    ]


@pytest.mark.parametrize("protocol", sorted(_AGENTS))
def test_tool_agents_are_scheduled_continuously(protocol: str) -> None:
    """A slow episode holds up only itself; each reply's cost reaches its turn."""
    stub = ScriptedServer()
    config = EndpointConfig(base_url="http://stub/v1", model="m", max_concurrency=2)
    agent = _AGENTS[protocol](
        OpenAICompatClient(config, transport=_scripted_transport(stub, "slowly"))
    )
    assert isinstance(agent, ConcurrentAgent)
    slow = QATask(task_id="slow", question="Who founded Acme slowly?", golden_answers=("Ann Vole",))
    tasks = TaskSet([slow, *_tasks(3)])
    retriever = BM25Retriever.build(DOCS)
    finished: list[str] = []
    report = evaluate(
        agent,
        lambda: SearchQAEnv(tasks, retriever, top_k=1),
        tasks,
        batch_size=2,
        on_episode=lambda record: finished.append(record.task_id),
    )
    assert report.overall.em == 1.0 and report.overall.n == 7
    # in lockstep the other slot would wait for each slow turn: the slow one would end second
    assert finished[-1] == "slow"
    first = report.episodes[0].turns[0]
    assert first.n_prompt_tokens == 11 and first.latency_s is not None and first.latency_s > 0


@pytest.mark.parametrize("protocol", sorted(_AGENTS))
def test_tool_agents_seed_each_request_by_question_and_turn(protocol: str) -> None:
    """Every request has a seed of its own, and the same ones whatever the batch size."""
    retriever = BM25Retriever.build(DOCS)
    tasks = TaskSet(_tasks(2))
    seeds = []
    for batch_size in (1, 4):
        stub = ScriptedServer()
        client = OpenAICompatClient(
            EndpointConfig(base_url="http://stub/v1", model="m"),
            transport=_scripted_transport(stub),
        )
        evaluate(
            _AGENTS[protocol](client),
            lambda: SearchQAEnv(tasks, retriever, top_k=1),
            tasks,
            batch_size=batch_size,
        )
        seeds.append(sorted(body["seed"] for body in stub.requests))
    assert len(seeds[0]) == 8 and len(set(seeds[0])) == 8  # 4 questions, 2 requests each
    assert seeds[0] == seeds[1]
