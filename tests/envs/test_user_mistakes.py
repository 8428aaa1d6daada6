"""What a user who writes a retriever or keeps an old snapshot call is told (issue 40).

A `TypeError` raised inside a user's retriever is reported as the retriever's own error, not
with advice about a server's query-length limits (which a `RequestRejected` still gets); the
removed `EnvSnapshot.to_json_str()` raises an error that names `to_json()`.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from env_fakes import DOCS, TASKS, FakeRetriever

from envs import RetrievalFailedError, SearchQAEnv
from retrieval import Hit, RequestRejected


class TypoRetriever(FakeRetriever):
    """A retriever with a bug: it calls a helper with the wrong arguments."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        return [sorted(queries, k)]  # type: ignore[call-overload]  # the user's bug


class RefusingRetriever(FakeRetriever):
    """A server that answers 4xx: the query breaks one of its limits."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        raise RequestRejected("422: query longer than max_query_chars")


def _search_error(retriever: FakeRetriever) -> RetrievalFailedError:
    env = SearchQAEnv(TASKS, retriever)
    env.reset(options={"task_id": "q1"})
    with pytest.raises(RetrievalFailedError) as caught:
        env.step("<search> Acme </search>")
    return caught.value


def test_a_type_error_in_a_users_retriever_is_reported_as_its_own():
    error = _search_error(TypoRetriever(DOCS))
    assert isinstance(error.__cause__, TypeError)
    assert "raised TypeError" in str(error) and "bug" in str(error)
    assert "max_query_chars" not in str(error)


def test_a_refused_query_still_gets_the_limits_advice():
    error = _search_error(RefusingRetriever(DOCS))
    assert "max_query_chars" in str(error) and "raised TypeError" not in str(error)


def test_the_removed_to_json_str_names_to_json(fake_env):
    fake_env.reset(options={"task_id": "q1"})
    snapshot = fake_env.snapshot()
    with pytest.raises(AttributeError, match=r"to_json_str\(\) was removed: call to_json\(\)"):
        snapshot.to_json_str()  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        snapshot.nope  # noqa: B018  # type: ignore[attr-defined]
    assert not hasattr(snapshot, "to_json_str")
    assert snapshot.to_json().startswith("{")  # the method it names works
