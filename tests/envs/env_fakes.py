"""Fakes and small data shared by the envs tests (imported as `env_fakes`)."""

from __future__ import annotations

import re
from collections.abc import Sequence

from envs import QATask, TaskSet, WorldConfig
from retrieval.base import Document, Hit

SMALL = WorldConfig(
    n_countries=4,
    n_cities=10,
    n_people=48,
    n_films=9,
    n_books=6,
    n_companies=5,
    n_universities=4,
    n_distractors=8,
    questions_per_kind=4,
)


class FakeRetriever:
    """Ranks documents by how many query words they contain (ties: corpus order).

    `calls` counts searches, so tests can see when the env answered from its own cache.
    """

    def __init__(self, documents: Sequence[Document], index_id: str = "fake-1") -> None:
        self.documents = list(documents)
        self._index_id = index_id
        self.calls = 0

    @property
    def index_id(self) -> str:
        return self._index_id

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        self.calls += 1
        out = []
        for query in queries:
            words = set(re.findall(r"\w+", query.lower()))
            scored = []
            for pos, doc in enumerate(self.documents):
                text = f"{doc.title} {doc.text}".lower()
                score = sum(1 for w in words if w in re.findall(r"\w+", text))
                if score:
                    scored.append((-score, pos, doc))
            scored.sort(key=lambda t: (t[0], t[1]))
            out.append(
                [
                    Hit(doc_id=d.doc_id, title=d.title, text=d.text, score=float(-s))
                    for s, _, d in scored[:k]
                ]
            )
        return out


class BrokenRetriever(FakeRetriever):
    """Raises on every search until `healed` is set."""

    healed = False

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        if not self.healed:
            raise ConnectionError("retrieval server down")
        return super().search(queries, k)


DOCS = [
    Document(doc_id="d1", title="Acme", text="Acme was founded by Ann Vole in Paris."),
    Document(doc_id="d2", title="Ann Vole", text="Ann Vole was born in Lyon."),
    Document(doc_id="d3", title="Lyon", text="Lyon is a city in France."),
    Document(doc_id="d4", title="Bolt", text="Bolt was founded by Bo Li."),
]
TASKS = TaskSet(
    [
        QATask(
            task_id="q1", question="Where was the founder of Acme born", golden_answers=("Lyon",)
        ),
        QATask(task_id="q2", question="Who founded Bolt?", golden_answers=("Bo Li", "Li Bo")),
        QATask(task_id="q3", question="Is Lyon in France?", golden_answers=("yes",)),
    ]
)
