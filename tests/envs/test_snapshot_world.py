"""Snapshots know their world: a task fingerprint, and two serialisations that cannot be mixed."""

from __future__ import annotations

import json

import pytest

import envs
from envs import EnvSnapshot, SearchQAEnv, SnapshotError, World
from envs.errors import SnapshotMismatchError
from envs.snapshot import WrapperSnapshot
from retrieval import BM25Retriever


def _env(seed: int) -> SearchQAEnv:
    world = World.generate(seed)
    return SearchQAEnv(world.tasks, BM25Retriever.build(world.documents))


def _played(env: SearchQAEnv, task_id: str) -> EnvSnapshot:
    env.reset(seed=0, options={"task_id": task_id})
    env.step("<search> who </search>")
    return env.snapshot()


def test_a_snapshot_from_another_world_is_refused_though_its_task_id_exists():
    world0, world1 = _env(0), _env(1)
    shared = next(
        t.task_id
        for t in world0.tasks
        if t.task_id in world1.tasks and world1.tasks[t.task_id].question != t.question
    )
    snap = _played(world0, shared)
    with pytest.raises(SnapshotMismatchError, match="task_sha256") as err:
        world1.restore(snap)
    assert err.value.field == "task_sha256"
    same = _env(0)
    same.restore(snap)  # the same world's env takes it
    assert same.history == snap.turns


def test_a_snapshot_written_before_the_fingerprint_still_restores():
    env = _env(0)
    record = _played(env, env.tasks[0].task_id).to_dict()
    del record["task_sha256"]
    _env(0).restore(EnvSnapshot.from_dict(record))


def test_to_json_is_text_and_to_dict_a_dict_and_each_reader_refuses_the_other():
    env = _env(0)
    snap = _played(env, env.tasks[0].task_id)
    text, record = snap.to_json(), snap.to_dict()
    assert isinstance(text, str) and json.loads(text) == record
    assert EnvSnapshot.from_json(text) == EnvSnapshot.from_dict(record) == snap
    assert envs.snapshot_from_json(text) == envs.snapshot_from_dict(record) == snap
    with pytest.raises(
        SnapshotError, match=r"from_json reads JSON text .*use EnvSnapshot\.from_dict"
    ):
        EnvSnapshot.from_json(record)  # type: ignore[arg-type]
    with pytest.raises(
        SnapshotError, match=r"from_dict reads the dict .*use EnvSnapshot\.from_json"
    ):
        EnvSnapshot.from_dict(text)  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="snapshot_from_dict"):
        envs.snapshot_from_json(record)  # type: ignore[arg-type]
    with pytest.raises(SnapshotError, match="not JSON"):
        EnvSnapshot.from_json("{cut")
    wrapped = WrapperSnapshot(wrapper="W", state="{}", inner=snap)
    assert WrapperSnapshot.from_json(wrapped.to_json()) == wrapped
    with pytest.raises(SnapshotError, match=r"WrapperSnapshot\.from_json"):
        WrapperSnapshot.from_dict(wrapped.to_json())  # type: ignore[arg-type]
