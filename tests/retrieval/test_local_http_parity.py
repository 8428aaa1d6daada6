"""One query rule for every retriever: a local index and a server give identical observations.

Regressions of issue 15: a query that NFKC lengthens past the server's limit, and a lone
surrogate, crashed a step on the HTTP retriever while the local index answered it.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from envs import QATask, SearchQAEnv, TaskSet
from retrieval import (
    CachedRetriever,
    HTTPRetriever,
    RetrieverUnavailable,
    make_retriever,
)

TASKS = TaskSet([QATask(task_id="q", question="Which city is the capital?", golden_answers=("x",))])
# 228 x U+FDFA is 228 characters, 4,104 once NFKC-normalised: over the server's 4,096
EXPANDING = "\ufdfa" * 228


def _step(env: SearchQAEnv, action: str) -> tuple:
    env.reset(seed=0, options={"task_id": "q"})
    return env.step(action)


@pytest.fixture(scope="module")
def env_pair(toy_server, toy_bm25):
    remote = HTTPRetriever(toy_server.url, max_attempts=1)
    yield SearchQAEnv(TASKS, toy_bm25, max_turns=3), SearchQAEnv(TASKS, remote, max_turns=3)
    remote.close()


def test_a_query_that_normalisation_lengthens_is_an_invalid_action_on_both(env_pair):
    local, remote = env_pair
    action = f"<search>{EXPANDING}</search>"
    obs, _, _, _, info = _step(remote, action)
    assert (obs, info) == _step(local, action)[::4]
    assert info["valid_action"] is False
    assert "4104 characters once normalised" in obs


def test_a_lone_surrogate_is_searched_as_u_fffd_on_both(env_pair):
    local, remote = env_pair
    for action in ("<search>\ud800</search>", "<search>capital \udfff city</search>"):
        got = _step(remote, action)
        assert got == _step(local, action)
        assert got[4]["valid_action"] is True


def test_every_retriever_refuses_a_surrogate_alike_and_a_cache_normalises_it(toy_server, toy_bm25):
    with HTTPRetriever(toy_server.url, max_attempts=1) as remote:
        for retriever in (toy_bm25, remote):
            with pytest.raises(ValueError, match="lone surrogate U\\+D800"):
                retriever.search(["a\ud800"], k=1)
        want = toy_bm25.search(["café \ufffd"], k=2)
        assert CachedRetriever(remote).search(["Café \ud800"], k=2) == want
        assert CachedRetriever(toy_bm25).search(["Café \ud800"], k=2) == want


def test_make_retriever_on_a_url_works_while_the_server_is_down(refused_port):
    url = f"http://127.0.0.1:{refused_port}"
    retriever = make_retriever(url)  # used to ask /health here and raise
    assert isinstance(retriever, CachedRetriever)
    with pytest.raises(RetrieverUnavailable):
        _ = retriever.index_id


# Unicode of every kind, lone surrogates, protocol-tag fragments and long runs of letters.
_adversarial = st.one_of(
    st.text(max_size=60),
    st.text(st.sampled_from("\ud800\udbff\udc00\udfffa"), min_size=1, max_size=4),
    st.text(st.sampled_from("aé Ｐ\ufdfa\u00a8\t\n<>/ ﬁ\u0130"), max_size=400),
    st.sampled_from(["capital", "Paris", "river", "PARIS  city", "café", "ﬁle"]),
)


@given(st.lists(_adversarial, min_size=1, max_size=3).map(" ".join))
def test_local_and_http_give_identical_observations_on_any_query(env_pair, query):
    local, remote = env_pair
    action = f"<search>{query}</search>"
    assert _step(remote, action) == _step(local, action)
