"""The peers' search clients, as they are: what Search-R1, SkyRL-gym and GEM send and read.

Each request and parser below is written from the peer's own client code, not from
`retrieval.protocol`, so checks built on them test the server against the peers rather than
against itself (tests/retrieval/test_peer_protocols.py, and `benchmarks.perf.interop`, which also
runs the peers' real packages through `skyrl_episode` and `gem_episode`).

- Search-R1 ships no package: `search_r1_request` / `search_r1_documents` / `passages_text` are
  its `_batch_search` and `_passages2string` (`generation.py`).
- SkyRL-gym 0.4.0 (`skyrl_gym.envs.search`) and GEM 0.1.0 (`gem.tools.search_tool`): their
  request formats, and one scripted episode through their real, unchanged environment classes
  (imported only when called; `pip install --no-deps skyrl-gym==0.4.0 gem-llm==0.1.0`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

__all__ = [
    "Request",
    "Script",
    "gem_documents",
    "gem_episode",
    "gem_request",
    "passages_text",
    "search_r1_documents",
    "search_r1_request",
    "skyrl_documents",
    "skyrl_episode",
    "skyrl_request",
]

Request = tuple[bytes, dict[str, str]]
"""A request body and its headers, as a peer's client sends them."""


# --- the peers' wire formats, written here from their clients -------------------------------


def search_r1_request(queries: Sequence[str], topk: int) -> Request:
    """Search-R1's `_batch_search`: `requests.post(url, json=payload)`."""
    payload = {"queries": list(queries), "topk": topk, "return_scores": True}
    return json.dumps(payload).encode(), {"Content-Type": "application/json"}


def search_r1_documents(content: bytes) -> list[list[dict[str, Any]]]:
    """Search-R1 reads `response.json()["result"]`: a `{"document", "score"}` list per query."""
    result: list[list[dict[str, Any]]] = json.loads(content)["result"]
    return result


def skyrl_request(query: str, topk: int) -> Request:
    """SkyRL-gym's `call_search_api`: one query, JSON, with JSON content type and Accept."""
    payload = {"query": query, "topk": topk, "return_scores": True}
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    return json.dumps(payload).encode(), headers


def skyrl_documents(content: bytes) -> list[list[dict[str, Any]]]:
    """SkyRL-gym reads `response.json()["result"]` and formats each inner list it holds."""
    result: list[list[dict[str, Any]]] = json.loads(content)["result"]
    return result


def gem_request(query: str, topk: int) -> Request:
    """GEM's `SearchTool._search`: `requests.post(url, data=msgpack)`, so no content type."""
    return msgspec.msgpack.encode({"query": query, "topk": topk, "return_scores": True}), {}


def gem_documents(content: bytes) -> list[dict[str, Any]]:
    """GEM reads `msgpack.decode(response.content)["result"]`: one flat list for its query."""
    result: list[dict[str, Any]] = msgspec.msgpack.decode(content)["result"]
    return result


def passages_text(documents: Sequence[dict[str, Any]]) -> str:
    """Search-R1's (and GEM's) `_passages2string`: `Doc i(Title: t) text` per document."""
    lines = []
    for i, item in enumerate(documents, start=1):
        title, _, text = item["document"]["contents"].partition("\n")
        lines.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(lines)


@dataclass(frozen=True, slots=True)
class Script:
    """A scripted episode: the question, the expert's queries, their answers and the final one."""

    question: str
    golds: tuple[str, ...]
    queries: tuple[str, ...]
    hop_answers: tuple[str, ...]
    answer: str


def skyrl_episode(url: str, script: Script, topk: int) -> dict[str, Any]:
    """skyrl-gym 0.4.0's SearchEnv, unchanged, pointed at the server."""
    from skyrl_gym.envs.search.env import SearchEnv, SearchEnvConfig

    env = SearchEnv(
        SearchEnvConfig(search_url=f"{url}/retrieve", topk=topk),
        extras={
            "reward_spec": {"ground_truth": {"target": list(script.golds)}},
            "max_turns": len(script.queries) + 1,
        },
    )
    env.init([{"role": "user", "content": script.question}])
    observations = []
    for query in script.queries:
        out = env.step(f"<think>I need to search.</think><search>{query}</search>")
        observations.append(out["observations"][0]["content"])
    out = env.step(f"<think>I know it.</think><answer>{script.answer}</answer>")
    assert out["done"], "SkyRL's episode did not end on the answer"
    return {"reward": float(out["reward"]), "observations": observations}


def gem_episode(url: str, script: Script, topk: int) -> dict[str, Any]:
    """gem-llm 0.1.0's SearchTool in ToolEnvWrapper(QaEnv), unchanged, pointed at the server."""
    from datasets import Dataset
    from gem.envs.qa_env import QaEnv
    from gem.tools.search_tool import SearchTool
    from gem.tools.tool_env_wrapper import ToolEnvWrapper

    dataset = Dataset.from_list([{"question": script.question, "answer": list(script.golds)}])
    tool = SearchTool(search_url=f"{url}/retrieve", topk=topk, timeout=60)
    env = ToolEnvWrapper(QaEnv(dataset=dataset), tools=[tool], max_tool_uses=len(script.queries))
    env.reset()
    observations = []
    for query in script.queries:
        obs, _, terminated, _, _ = env.step(f"<think>Search.</think><search>{query}</search>")
        assert not terminated and "[SearchTool Error" not in obs, obs[:300]
        observations.append(obs)
    _, reward, terminated, _, _ = env.step(
        f"<think>I know it.</think><answer>{script.answer}</answer>"
    )
    assert terminated, "GEM's episode did not end on the answer"
    return {"reward": float(reward), "observations": observations}
