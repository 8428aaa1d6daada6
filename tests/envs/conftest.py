"""Fixtures for the envs tests: a small synthetic world, its BM25 index, and fake retrievers."""

from __future__ import annotations

import pytest
from env_fakes import DOCS, SMALL, TASKS, FakeRetriever

from envs import SearchQAEnv, World
from retrieval.bm25 import BM25Retriever


@pytest.fixture
def fake_env() -> SearchQAEnv:
    return SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, top_k=2)


@pytest.fixture(scope="session")
def small_world() -> World:
    return World.generate(3, SMALL)


@pytest.fixture(scope="session")
def small_retriever(small_world: World) -> BM25Retriever:
    return BM25Retriever.build(small_world.documents)


@pytest.fixture
def small_env(small_world: World, small_retriever: BM25Retriever) -> SearchQAEnv:
    return SearchQAEnv(small_world.tasks, small_retriever, max_turns=8)
