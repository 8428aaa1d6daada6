from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from env_fakes import DOCS, TASKS, FakeRetriever
from gymnasium.utils.env_checker import check_env

import envs
from envs import SearchQAEnv


def _check(env: gym.Env) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the checker's warnings are failures here
        check_env(env)


def test_search_qa_passes_check_env():
    env = gym.make("trace_rl/SearchQA-v0", tasks=TASKS, retriever=FakeRetriever(DOCS))
    assert isinstance(env, SearchQAEnv)  # registered without stateful gymnasium wrappers
    _check(env)


def test_synthetic_multihop_passes_check_env():
    env = gym.make("trace_rl/SyntheticMultiHop-v0", world_seed=1)
    assert env.spec is not None and env.spec.max_episode_steps is None
    _check(env)


def test_registered_kwargs_reach_the_env():
    env = gym.make("trace_rl/SyntheticMultiHop-v0", world_seed=2, split="dev", top_k=2, reward="f1")
    assert env.config.top_k == 2 and env.config.reward == "f1" and env.config.max_turns == 8
    assert len(env.tasks) < len(envs.World.generate(2).tasks)


def _make_synthetic():
    return gym.make("trace_rl/SyntheticMultiHop-v0", world_seed=0)


def _drive(vec: gym.vector.VectorEnv) -> None:
    obs, info = vec.reset(seed=[1, 2])
    assert len(obs) == 2 and all("Question:" in o for o in obs)
    assert list(info["turn_idx"]) == [0, 0]
    obs, reward, terminated, _, info = vec.step(
        ["<search> capital </search>", "<answer> nobody </answer>"]
    )
    assert obs[0].startswith("\n<information>Doc 1(Title: ") and obs[1] == ""
    assert list(terminated) == [False, True] and list(reward) == [0.0, 0.0]
    assert list(info["n_tool_calls"]) == [1, 0]
    # next-step autoreset: the finished env starts a new episode
    obs, reward, terminated, _, info = vec.step(["<answer> x </answer>", "ignored"])
    assert obs[1].startswith("Answer the given question.") and list(terminated) == [True, False]
    vec.close()


def test_runs_in_sync_vector_env():
    _drive(gym.vector.SyncVectorEnv([_make_synthetic, _make_synthetic]))


@pytest.mark.slow
def test_runs_in_async_vector_env():
    # Gymnasium reads Text observations from shared memory once only (its issue #1164),
    # so text envs need shared_memory=False
    _drive(gym.vector.AsyncVectorEnv([_make_synthetic, _make_synthetic], shared_memory=False))
