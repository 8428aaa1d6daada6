"""Fixtures of the retrieval tests: a small corpus with known answers, and a counting fake."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from retrieval import BM25Retriever, Document, Hit

TOY_DOCS = [
    Document(doc_id="d0", title="Paris", text="Paris is the capital and largest city of France."),
    Document(doc_id="d1", title="Rome", text="Rome is the capital city of Italy."),
    Document(doc_id="d2", title="Berlin", text="Berlin is the capital of Germany."),
    Document(doc_id="d3", title="Seine", text="The Seine is a river that flows through Paris."),
    Document(doc_id="d4", title="Tiber", text="The Tiber is the river of Rome."),
    Document(
        doc_id="d5", title="Alps", text="The Alps are mountains in Europe, in France and Italy."
    ),
    Document(doc_id="d6", title="Zuse", text="Konrad Zuse built the Z3 computer in Berlin."),
    Document(doc_id="d7", title="Café", text="A café serves coffee; Ｐａｒｉｓ has many cafés."),
]


@pytest.fixture(scope="session")
def toy_docs() -> list[Document]:
    return list(TOY_DOCS)


@pytest.fixture(scope="session")
def toy_bm25() -> BM25Retriever:
    return BM25Retriever.build(TOY_DOCS)


class CountingRetriever:
    """A fake `Retriever`: hit i of query q is `q#i`, and every call is recorded."""

    def __init__(self, index_id: str = "fake-1", *, fail: bool = False) -> None:
        self._index_id = index_id
        self.fail = fail
        self.calls: list[tuple[list[str], int]] = []
        self._lock = threading.Lock()

    @property
    def index_id(self) -> str:
        return self._index_id

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        with self._lock:
            self.calls.append((list(queries), k))
        if self.fail:
            from retrieval import RetrieverUnavailable

            raise RetrieverUnavailable("fake outage")
        return [
            [
                Hit(doc_id=f"{q}#{i}", title=q, text=f"text {i}", score=float(k - i))
                for i in range(k)
            ]
            for q in queries
        ]


@pytest.fixture
def counting() -> CountingRetriever:
    return CountingRetriever()


@pytest.fixture
def counting_cls() -> type[CountingRetriever]:
    return CountingRetriever
