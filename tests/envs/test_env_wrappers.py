from __future__ import annotations

import json

import gymnasium as gym
import pytest
from env_fakes import DOCS, TASKS, FakeRetriever

import envs
from envs import (
    BudgetMeter,
    EnvSnapshot,
    ForkableWrapper,
    SearchQAEnv,
    SnapshotError,
    snapshot_from_dict,
)
from envs.errors import UnforkableWrapperError
from envs.snapshot import WrapperSnapshot


def _metered(max_tool_calls=None) -> BudgetMeter:
    return BudgetMeter(SearchQAEnv(TASKS, FakeRetriever(DOCS)), max_tool_calls=max_tool_calls)


def test_budget_meter_counts_across_episodes():
    env = _metered()
    env.reset(options={"task_id": "q1"})
    env.step("<search> Acme </search>")
    _, _, _, _, info = env.step("<answer> Lyon </answer>")
    env.reset(options={"task_id": "q2"})
    _, _, _, _, info = env.step("<search> Bolt </search>")
    assert info["budget"]["n_tool_calls"] == 2 and info["budget"]["n_episodes"] == 2
    assert info["budget"]["n_retrieved_docs"] == 1 + 1  # "Acme" and "Bolt" match one doc each
    assert info["budget"]["n_steps"] == 3


def test_budget_meter_truncates_when_the_budget_is_spent():
    env = _metered(max_tool_calls=2)
    env.reset(options={"task_id": "q1"})
    assert env.step("<search> Acme </search>")[3] is False
    assert env.step("<search> Ann Vole </search>")[3] is True
    assert env.exhausted


def test_wrapper_chain_snapshot_restore_and_fork_carry_the_wrapper_state():
    env = _metered()
    env.reset(options={"task_id": "q1"})
    env.step("<search> Acme </search>")
    snap = envs.snapshot(env)
    assert isinstance(snap, WrapperSnapshot) and isinstance(snap.inner, EnvSnapshot)
    again = snapshot_from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap
    fresh = _metered()
    envs.restore(fresh, again)
    assert fresh.wrapper_state() == env.wrapper_state()
    expected = env.step("<search> Ann Vole born </search>")
    assert fresh.step("<search> Ann Vole born </search>") == expected
    (branch,) = envs.fork(env)
    assert branch.step("<answer> Lyon </answer>")[4]["budget"]["n_steps"] == 3
    assert env.n_steps == 2 and branch.env is not env.env


def test_restoring_a_chain_checks_each_level():
    env = _metered()
    env.reset(options={"task_id": "q1"})
    bare = SearchQAEnv(TASKS, FakeRetriever(DOCS))
    with pytest.raises(SnapshotError) as caught:
        envs.restore(env, bare.snapshot())
    assert caught.value.field == "wrapper"
    with pytest.raises(SnapshotError) as caught:
        bare.restore(envs.snapshot(env))
    assert caught.value.field == "kind"
    bad = WrapperSnapshot(
        wrapper="BudgetMeter", state=json.dumps({"n_steps": -1}), inner=bare.snapshot()
    )
    before = envs.snapshot(env)
    with pytest.raises(SnapshotError, match="not a count"):
        envs.restore(env, bad)
    assert envs.snapshot(env) == before  # validated before anything changed


def test_unforkable_wrappers_are_named():
    env = gym.wrappers.RecordEpisodeStatistics(SearchQAEnv(TASKS, FakeRetriever(DOCS)))
    with pytest.raises(UnforkableWrapperError, match="RecordEpisodeStatistics"):
        envs.snapshot(env)
    with pytest.raises(UnforkableWrapperError, match="RecordEpisodeStatistics"):
        envs.fork(BudgetMeter(env))
    checked = gym.make(
        "trace_rl/SearchQA-v0",
        tasks=TASKS,
        retriever=FakeRetriever(DOCS),
        disable_env_checker=False,
    )
    with pytest.raises(UnforkableWrapperError, match="PassiveEnvChecker"):
        envs.snapshot(checked)


def test_a_stateless_forkable_wrapper_needs_no_code():
    class Upper(ForkableWrapper):
        def step(self, action):
            obs, *rest = self.env.step(action)
            return (obs.upper(), *rest)

    env = Upper(SearchQAEnv(TASKS, FakeRetriever(DOCS)))
    env.reset(options={"task_id": "q2"})
    (twin,) = envs.fork(env)
    assert twin.step("<search> Bolt </search>") == env.step("<search> Bolt </search>")
