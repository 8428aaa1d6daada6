"""Regressions of issue 15's env defects: each of these failed on the code before the fix."""

from __future__ import annotations

import dataclasses
import socket
import time

import gymnasium as gym
import pytest
from env_fakes import DOCS, SMALL, TASKS, FakeRetriever

import envs
from envs import RetrievalFailedError, SearchQAEnv, World
from envs.errors import UnforkableWrapperError
from retrieval import HTTPRetriever, RequestRejected, RetrieverUnavailable

WORLD = World.generate(1, SMALL)


def _env(retriever=None) -> SearchQAEnv:
    return SearchQAEnv(WORLD.tasks, retriever or FakeRetriever(WORLD.documents), max_turns=4)


def test_reading_the_seed_after_restore_keeps_the_random_stream():
    # an unseeded reset draws its task from np_random: a restored env must draw the same one
    for seed in range(20):
        original = _env()
        original.reset(seed=seed)
        restored = _env()
        restored.restore(original.snapshot())
        assert restored.np_random_seed == -1  # Gymnasium's "set directly, seed unknown"
        assert restored.reset()[0] == original.reset()[0], seed
        assert restored.reset()[1] == original.reset()[1], seed


def test_reset_and_snapshot_with_the_server_down_raise_the_typed_error_and_change_nothing(
    refused_port,
):
    env = _env(HTTPRetriever(f"http://127.0.0.1:{refused_port}", max_attempts=1))
    for call in (lambda: env.reset(seed=3), env.snapshot):
        with pytest.raises(RetrievalFailedError) as info:
            call()
        assert isinstance(info.value.__cause__, RetrieverUnavailable)
        assert "retry the step once the retriever is back" in str(info.value)
    assert env.task is None and env._np_random is None  # the seed was not applied either


def test_a_refused_query_is_not_advised_to_be_retried():
    class Refusing(FakeRetriever):
        def search(self, queries, k):
            raise RequestRejected("HTTP 422: query too long")

    env = SearchQAEnv(TASKS, Refusing(DOCS), max_turns=4)
    env.reset(seed=0)
    with pytest.raises(RetrievalFailedError) as info:
        env.step("<search> Acme </search>")
    assert "retrying cannot help" in str(info.value)
    assert "once the retriever is back" not in str(info.value)


def test_a_snapshot_holding_a_lone_surrogate_goes_through_a_utf8_file(tmp_path):
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4)
    env.reset(seed=0, options={"task_id": "q1"})
    env.step("<search> Acme \ud800 </search>")
    env.step("<answer> \udfff Lyon </answer>")
    path = tmp_path / "snap.json"
    path.write_text(env.snapshot().to_json(), encoding="utf-8")
    restored = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4)
    restored.restore(envs.snapshot_from_json(path.read_text(encoding="utf-8")))
    assert restored.snapshot() == env.snapshot()


def test_the_unforkable_wrapper_advice_runs_and_gives_a_forkable_env():
    gym.register(id="trace_rl_test/Checked-v0", entry_point="envs.search_qa:SearchQAEnv")
    try:
        kwargs = {"tasks": TASKS, "retriever": FakeRetriever(DOCS)}
        checked = gym.make("trace_rl_test/Checked-v0", **kwargs)
        with pytest.raises(UnforkableWrapperError) as info:
            envs.fork(checked)
        advice = str(info.value).split("go with ", 1)[1]
        assert advice.startswith("gym.make(")
        # the advised call, with the env's own keyword arguments
        env = eval(advice[:-1] + ", **kwargs)", {"gym": gym, "dataclasses": dataclasses}, locals())
        env.reset(seed=0)
        assert len(envs.fork(env, 2)) == 2
    finally:
        del gym.registry["trace_rl_test/Checked-v0"]


def test_a_hung_server_costs_a_step_its_deadline_not_the_whole_retry_budget():
    with socket.socket() as hung:  # listens but never accepts: connects succeed, no answer
        hung.bind(("127.0.0.1", 0))
        hung.listen(64)
        url = f"http://127.0.0.1:{hung.getsockname()[1]}"
        remote = HTTPRetriever(url, index_id="x")  # defaults: 4 attempts of up to 30 s each
        env = SearchQAEnv(TASKS, remote, max_turns=4, retrieval_deadline_s=0.5)
        env.reset(seed=0)
        before = env.snapshot()
        start = time.monotonic()
        with pytest.raises(RetrievalFailedError) as info:
            env.step("<search> Acme </search>")
        elapsed = time.monotonic() - start
        remote.close()
    assert "before its deadline ran out" in str(info.value.__cause__)
    assert elapsed < 10  # not 120 s (even on a loaded machine); the benchmark times it
    assert env.snapshot() == before


def _tiny_env() -> SearchQAEnv:
    return SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4)


def test_async_vector_envs_refuse_shared_memory_clearly_and_work_without_it():
    from gymnasium.vector import AsyncVectorEnv

    with pytest.raises(envs.EnvConfigError, match=r"shared_memory=False"):
        AsyncVectorEnv([_tiny_env, _tiny_env])  # returned 65,536 tabs per observation before
    vector = AsyncVectorEnv([_tiny_env, _tiny_env], shared_memory=False)
    try:
        reference = _tiny_env()
        prompts, _ = vector.reset(seed=[0, 1], options={"task_id": "q1"})
        assert list(prompts) == [reference.reset(seed=0, options={"task_id": "q1"})[0]] * 2
        obs, *_ = vector.step(["<search> Acme </search>", "nonsense"])
        assert obs[0] == reference.step("<search> Acme </search>")[0]
        assert "My previous action is invalid" in obs[1]
    finally:
        vector.close()
