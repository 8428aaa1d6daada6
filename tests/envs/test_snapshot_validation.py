"""`restore` checks a snapshot completely: anything wrong is a `SnapshotError`, env untouched.

The forged snapshots of issue 15 are regressions (each restored before the fix); the
Hypothesis test mutates valid snapshots and asks that each one either restores into an env
that replays identically or is refused with a `SnapshotError`.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from env_fakes import DOCS, TASKS, FakeRetriever
from hypothesis import event, given
from hypothesis import strategies as st

import envs
from envs import BudgetMeter, SearchQAEnv, SnapshotError, snapshot_from_dict, snapshot_from_json

ACTIONS = [
    "<search> Acme founder </search>",
    "<search> Ann Vole born </search>",
    "nonsense",
    "<answer> Lyon </answer>",
]


_BASE = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, top_k=2)


def _env() -> SearchQAEnv:
    return _BASE.fork()[0]  # O(1): building a text space costs ~10 ms, and Hypothesis builds many


def _played(n_actions: int) -> SearchQAEnv:
    env = _env()
    env.reset(seed=7, options={"task_id": "q1"})
    for action in ACTIONS[:n_actions]:
        env.step(action)
    return env


def _record(n_actions: int = 2) -> dict:
    return _played(n_actions).snapshot().to_dict()


def _hit(**fields) -> dict:
    return {"id": "d1", "title": "Acme", "text": "Acme text", "score": 1.0} | fields


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def _forged() -> dict[str, dict]:
    """Snapshots that restored before the fix, each wrong in one way."""
    cases = {}

    def case(name, mutate):
        record = _record()
        mutate(record)
        cases[name] = record

    case(
        "PCG64 state is a number",
        lambda r: r.update(rng_state='{"bit_generator":"PCG64","state":5}'),
    )
    case("rng_state nests deeply", lambda r: r.update(rng_state="[" * 2000))
    case("more hits than top_k", lambda r: r["turns"][0].update(hits=[_hit()] * 3))
    case("a 10 MB hit text", lambda r: r["turns"][0].update(hits=[_hit(text="x" * 10_000_000)]))
    case("an inf score", lambda r: r["turns"][0].update(hits=[_hit(score=float("inf"))]))
    case("a NaN score", lambda r: r["turns"][0].update(hits=[_hit(score=float("nan"))]))
    case("tags in a search", lambda r: r["turns"][0].update(content="a <answer> b"))
    case("an unstripped search", lambda r: r["turns"][0].update(content=" Acme "))
    case("an overlong search", lambda r: r["turns"][0].update(content="\ufdfa" * 228))
    case("a boolean max_turns", lambda r: r.update(max_turns=True))
    case("a string top_k", lambda r: r.update(top_k="2"))
    case("a list task_id", lambda r: r.update(task_id=["q1"]))
    case("a score that is a string", lambda r: r["turns"][0].update(hits=[_hit(score="1")]))
    case("a huge index id", lambda r: r.update(index_id="i" * 100_000))
    case("a boolean schema version", lambda r: r.update(schema_version=True))
    # issue 25: integers too large for a float overflowed instead of being refused
    case("a 400-digit f1_threshold", lambda r: r.update(f1_threshold=10**400))
    case("a 400-digit score", lambda r: r["turns"][0].update(hits=[_hit(score=-(10**400))]))
    # ... and a value nested 5,000 deep broke the repr in the refusal's own message
    case("a schema version nested 5,000 deep", lambda r: r.update(schema_version=_deep(5_000)))
    case("a kind nested 5,000 deep", lambda r: r.update(kind=_deep(5_000)))
    return cases


@pytest.mark.parametrize("name", list(_forged()))
def test_a_forged_snapshot_is_refused_and_the_env_is_untouched(name):
    record = _forged()[name]
    env = _played(1)
    before = env.snapshot()
    with pytest.raises(SnapshotError):
        env.restore(snapshot_from_dict(record))
    assert env.snapshot() == before
    assert env.step(ACTIONS[1]) == _played(1).step(ACTIONS[1])


def test_forged_values_built_in_python_are_refused_too():
    # restore() must not trust a snapshot that never went through JSON
    good = _played(2).snapshot()
    hit = good.turns[0].hits[0]
    forged = [
        dataclasses.replace(good, rng_state='{"bit_generator":"PCG64","state":5}'),
        dataclasses.replace(good, max_turns="4"),
        dataclasses.replace(good, turns=[{"kind": "search"}]),
        dataclasses.replace(good, turns=(dataclasses.replace(good.turns[0], hits=(hit,) * 3),)),
        dataclasses.replace(
            good,
            turns=(
                dataclasses.replace(
                    good.turns[0], hits=(dataclasses.replace(hit, score=float("inf")),)
                ),
            ),
        ),
        dataclasses.replace(good, turns=(dataclasses.replace(good.turns[0], content=None),)),
    ]
    for snap in forged:
        env = _played(1)
        before = env.snapshot()
        with pytest.raises(SnapshotError):
            env.restore(snap)
        assert env.snapshot() == before


def test_deeply_nested_wrapper_snapshots_are_a_snapshot_error():
    record = _record()
    for _ in range(3_000):
        record = {
            "kind": "wrapper",
            "schema_version": 1,
            "wrapper": "W",
            "state": {},
            "inner": record,
        }
    with pytest.raises(SnapshotError, match="nests more than"):
        snapshot_from_dict(record)


def test_a_deep_wrapper_state_is_a_snapshot_error():
    state: list = []
    for _ in range(5_000):
        state = [state]
    record = {"kind": "wrapper", "schema_version": 1, "wrapper": "BudgetMeter", "state": state,
              "inner": _record()}  # fmt: skip
    with pytest.raises(SnapshotError):
        snapshot_from_dict(record)


def test_a_wrapper_state_nested_5000_deep_is_refused_on_restore():
    # a WrapperSnapshot built in Python (never through from_json) reached json.loads's recursion
    wrapped = BudgetMeter(_env())
    wrapped.reset(seed=7, options={"task_id": "q1"})
    good = envs.snapshot(wrapped)
    deep = dataclasses.replace(good, state="[" * 5_000 + "]" * 5_000)
    with pytest.raises(SnapshotError, match="wrapper state is not JSON"):
        envs.restore(wrapped, deep)
    assert envs.snapshot(wrapped) == good


# -- fuzzing: mutate a valid snapshot anywhere ------------------------------------------------


def _paths(value, prefix=()):
    """Every path into a JSON value (dict keys and list indices)."""
    yield prefix
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _paths(item, (*prefix, i))


_JSON_LEAVES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=30),
    st.sampled_from(["search", "answer", "invalid", "<answer>", "PCG64", "q2", "d1", "2"]),
)
_JSON = st.recursive(
    _JSON_LEAVES,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=6,
)


def _mutate(record: dict, data) -> dict:
    record = copy.deepcopy(record)
    path = data.draw(st.sampled_from(list(_paths(record))[1:]))
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    how = data.draw(st.sampled_from(["replace", "delete", "duplicate"]))
    if how == "replace":
        parent[path[-1]] = data.draw(_JSON)
    elif how == "delete":
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.append(copy.deepcopy(parent[path[-1]]))
    else:
        parent[path[-1]] = [parent[path[-1]], parent[path[-1]]]
    return record


def _canonical(snap, *, with_rng: bool = True) -> dict:
    """A snapshot's JSON with its rng_state parsed (restore re-serialises the state)."""
    record = snap.to_dict()
    inner = record
    while inner["kind"] == "wrapper":
        inner = inner["inner"]
    if not with_rng:  # a None state (never seeded) is drawn from entropy by the next snapshot
        del inner["rng_state"]
    elif inner["rng_state"] is not None:
        inner["rng_state"] = json.loads(inner["rng_state"])
    return record


def _replay(env) -> list:
    out = []
    for action in ACTIONS:
        if env.unwrapped.episode_over:
            out.append(env.reset())
        else:
            out.append(env.step(action))
    return out


@given(n_actions=st.integers(0, 4), wrapped=st.booleans(), data=st.data())
def test_a_mutated_snapshot_restores_to_an_identical_replay_or_is_refused(n_actions, wrapped, data):
    def build():
        env = _env()
        return BudgetMeter(env) if wrapped else env

    source = build()
    source.reset(seed=7, options={"task_id": "q1"})
    for action in ACTIONS[:n_actions]:
        source.step(action)
    mutated = _mutate(json.loads(json.dumps(envs.snapshot(source).to_dict())), data)
    target = build()
    target.reset(seed=1, options={"task_id": "q2"})
    before = envs.snapshot(target)
    try:
        snap = snapshot_from_dict(json.loads(json.dumps(mutated)))
        envs.restore(target, snap)
    except SnapshotError as err:
        event(f"refused ({err.field})")
        assert envs.snapshot(target) == before  # refused: nothing changed
        return
    event("restored")
    # accepted: the env holds exactly that snapshot, and a second restore replays identically
    inner = snap.inner if wrapped else snap
    with_rng = inner.rng_state is not None
    assert _canonical(envs.snapshot(target), with_rng=with_rng) == _canonical(
        snap, with_rng=with_rng
    )
    twin = build()
    envs.restore(twin, envs.snapshot_from_json(envs.snapshot(target).to_json()))
    assert _replay(twin) == _replay(target)


def test_the_fuzzer_reaches_both_outcomes():
    # a mutation the schema allows (another task's id, with no fingerprint as in an old
    # snapshot) restores; a wrong type is refused
    record = _record()
    record["task_id"], record["task_sha256"] = "q2", None
    env = _env()
    env.restore(snapshot_from_dict(record))
    assert env.task.task_id == "q2"
    record["task_id"] = 7
    with pytest.raises(SnapshotError):
        snapshot_from_dict(record)


def test_a_snapshot_of_the_other_protocol_is_refused():
    # the observations differ between protocols, so such a restore would break the fork law
    exact = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, top_k=2, protocol="search-r1")
    exact.reset(seed=0, options={"task_id": "q1"})
    exact.step("<search> Acme founder </search>")
    with pytest.raises(SnapshotError) as info:
        _env().restore(exact.snapshot())
    assert info.value.field == "protocol"
    record = _record()
    del record["protocol"]  # written before the field existed: trace-rl
    _env().restore(snapshot_from_dict(record))


def _mt19937_state(**changes) -> dict:
    state = {"bit_generator": "MT19937", "state": {"key": [5] * 624, "pos": 624}}
    state["state"].update(changes)
    return state


@pytest.mark.parametrize(
    "state",
    [
        _mt19937_state(pos=10**8),  # accepted by numpy; the next draw reads past the key
        _mt19937_state(pos=-1),
        _mt19937_state(key=[5] * 623),
        _mt19937_state(key=[5] * 623 + [1 << 32]),
        _mt19937_state(key=[5] * 623 + [True]),
        {**_mt19937_state(), "extra": 1},
        {"bit_generator": "PCG64", "state": {"state": -1, "inc": 1}},
        {"bit_generator": "Philox", "state": {"counter": [0] * 4, "key": [0, 0]}},
        {"bit_generator": "Random", "state": {}},
    ],
    ids=lambda s: json.dumps(s)[:60],
)
def test_a_forged_rng_state_is_refused_before_any_draw(state: dict) -> None:
    env = _played(1)
    before = env.snapshot()
    forged = dataclasses.replace(before, rng_state=json.dumps(state))
    with pytest.raises(SnapshotError, match="rng_state"):
        env.restore(forged)
    assert env.snapshot() == before
    env.reset()  # the env's own generator still draws


@pytest.mark.parametrize("name", ["MT19937", "Philox", "SFC64", "PCG64DXSM"])
def test_every_bit_generator_snapshots_and_restores(name: str) -> None:
    import numpy as np

    env = _played(1)
    env.np_random = np.random.Generator(getattr(np.random, name)(11))
    snap = env.snapshot()  # MT19937's state holds numpy arrays: it used to raise TypeError
    other = _env()
    other.restore(snapshot_from_json(snap.to_json()))
    assert other.np_random.integers(1 << 30, size=4).tolist() == (
        env.np_random.integers(1 << 30, size=4).tolist()
    )
