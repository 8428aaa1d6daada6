"""The peers' own, unchanged search clients against a real `tracerl serve-retriever` process.

skyrl-gym 0.4.0's `SearchEnv` and gem-llm 0.1.0's `SearchTool` (in GEM's `ToolEnvWrapper`) run
one episode each. They are not trace-rl dependencies (heavy requirements), so each test skips,
naming the missing module, where its package is not installed; `make install` installs them
without their requirements (the Makefile's PEER_CLIENTS), so `make test` runs both.
"""

from __future__ import annotations

import importlib

import pytest

from retrieval.peers import Script, gem_episode, skyrl_episode

ROME = Script(
    question="What is the capital of Italy?",
    golds=("Rome",),
    queries=("capital of Italy",),
    hop_answers=("Rome",),
    answer="Rome",
)


def _require(module: str, package: str) -> None:
    try:
        importlib.import_module(module)
    except ImportError as err:
        pytest.skip(f"{package} is not installed here ({err}); pip install --no-deps {package}")


def test_skyrl_gym_search_env_runs_an_episode_against_the_server(toy_server):
    _require("skyrl_gym.envs.search.env", "skyrl-gym==0.4.0")
    run = skyrl_episode(toy_server.url, ROME, topk=3)
    observation = run["observations"][0]
    assert "Search error" not in observation  # a 422 used to land here
    assert 'Doc 1: \\"Rome\\"\\nRome is the capital city of Italy.' in observation
    assert run["reward"] == 1.0


def test_gem_search_tool_runs_an_episode_against_the_server(toy_server):
    _require("gem.tools.search_tool", "gem-llm==0.1.0")
    run = gem_episode(toy_server.url, ROME, topk=3)
    observation = run["observations"][0]
    assert '<information>Doc 1(Title: "Rome") Rome is the capital city of Italy.' in observation
    assert run["reward"] == 1.0
