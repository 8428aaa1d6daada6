"""Snapshots that cannot hang (issue 42): unusable generator states are refused with the field
named, and any action or hit survives the JSON round trip, surrogate pairs included."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from env_fakes import DOCS, TASKS, FakeRetriever
from hypothesis import event, given
from hypothesis import strategies as st

import envs
from envs import SearchQAEnv, SnapshotError, snapshot_from_json
from envs.search_qa import _generator_from
from retrieval.base import Document

ROOT = Path(__file__).resolve().parents[2]
_U32, _U64, _U128 = (1 << 32) - 1, (1 << 64) - 1, (1 << 128) - 1

HANGING = {
    "MT19937 all-zero key": {"bit_generator": "MT19937", "state": {"key": [0] * 624, "pos": 624}},
    "MT19937 zero but key[0]'s low bits": {
        "bit_generator": "MT19937",
        "state": {"key": [0x7FFFFFFF] + [0] * 623, "pos": 624},
    },
    "PCG64 state 0 inc 0": {
        "bit_generator": "PCG64",
        "state": {"state": 0, "inc": 0},
        "has_uint32": 0,
        "uinteger": 0,
    },
    "PCG64DXSM state 0 inc 0": {
        "bit_generator": "PCG64DXSM",
        "state": {"state": 0, "inc": 0},
        "has_uint32": 0,
        "uinteger": 0,
    },
}
FIELD = {
    "MT19937": "MT19937.state.key",
    "PCG64": "PCG64.state.inc",
    "PCG64DXSM": "PCG64DXSM.state.inc",
}

_CHILD = r"""
import dataclasses, json, sys
sys.path.insert(0, sys.argv[2])
from envs import SearchQAEnv, SnapshotError
from envs.tasks import QATask, TaskSet
from retrieval import BM25Retriever, Document
tasks = TaskSet([QATask(task_id=f"q{i}", question=f"Who is {i}?", golden_answers=("x",))
                 for i in range(390)])
env = SearchQAEnv(tasks, BM25Retriever.build([Document(doc_id="d", title="T", text="who")]))
env.reset(seed=1)
try:
    env.restore(dataclasses.replace(env.snapshot(), rng_state=sys.argv[1]))
except SnapshotError as err:
    print("refused", err.field, err, flush=True)
    raise SystemExit(0)
env.reset()
print("reset", flush=True)
"""


@pytest.mark.parametrize("name", list(HANGING))
def test_a_forged_state_that_hung_reset_is_refused_naming_its_field(name: str) -> None:
    state = HANGING[name]
    # in a child with a timeout: before the fix, reset() spun forever holding the GIL
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(state), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("refused rng_state"), done.stdout
    assert FIELD[state["bit_generator"]] in done.stdout


def test_states_next_to_the_degenerate_ones_still_restore() -> None:
    for state in (
        {"bit_generator": "MT19937", "state": {"key": [1 << 31] + [0] * 623, "pos": 624}},
        {"bit_generator": "MT19937", "state": {"key": [0] * 623 + [1], "pos": 624}},
        {"bit_generator": "PCG64", "state": {"state": 0, "inc": 1}, "has_uint32": 0,
         "uinteger": 0},
        {"bit_generator": "SFC64", "state": {"state": [0] * 4}, "has_uint32": 0, "uinteger": 0},
        {"bit_generator": "Philox", "state": {"counter": [0] * 4, "key": [0, 0]},
         "buffer": [0] * 4, "buffer_pos": 4, "has_uint32": 0, "uinteger": 0},
    ):  # fmt: skip
        generator = _generator_from(json.dumps(state))
        assert 0 <= int(generator.integers(390)) < 390


def _words(bound: int, n: int | None) -> st.SearchStrategy:
    """Words in [0, bound]: mostly the edges (0, 1, the top bit, the maximum), else any."""
    word = st.one_of(st.sampled_from([0, 0, 1, 2, bound >> 1, (bound >> 1) + 1, bound]),
                     st.integers(0, bound))  # fmt: skip
    if n is None:
        return word
    return st.one_of(st.just([0] * n), st.lists(word, min_size=n, max_size=n))


_SPARE = {"has_uint32": st.integers(0, 1), "uinteger": _words(_U32, None)}
_PCG = st.fixed_dictionaries({"state": _words(_U128, None), "inc": _words(_U128, None)})
STATES = st.one_of(
    st.fixed_dictionaries({
        "bit_generator": st.just("MT19937"),
        "state": st.fixed_dictionaries({
            "key": st.one_of(_words(_U32, 624), st.builds(lambda w, i: [w] + [0] * 623 if i else
                                                          [0] * 623 + [w], _words(_U32, None),
                                                          st.booleans())),
            "pos": st.sampled_from([0, 1, 623, 624]) | st.integers(0, 624),
        }),
    }),
    st.fixed_dictionaries({"bit_generator": st.sampled_from(["PCG64", "PCG64DXSM"]),
                           "state": _PCG, **_SPARE}),
    st.fixed_dictionaries({
        "bit_generator": st.just("Philox"),
        "state": st.fixed_dictionaries({"counter": _words(_U64, 4), "key": _words(_U64, 2)}),
        "buffer": _words(_U64, 4),
        "buffer_pos": st.integers(0, 4),
        **_SPARE,
    }),
    st.fixed_dictionaries({"bit_generator": st.just("SFC64"),
                           "state": st.fixed_dictionaries({"state": _words(_U64, 4)}),
                           **_SPARE}),
)  # fmt: skip


@given(STATES)
def test_any_forged_state_is_refused_naming_a_field_or_draws(state: dict) -> None:
    try:
        generator = _generator_from(json.dumps(state))
    except SnapshotError as err:
        event("refused")
        assert err.field == "rng_state"
        assert f"{state['bit_generator']}.state" in str(err)  # the field, by its path
        return
    event(f"restored {state['bit_generator']}")
    # raw draws never loop: a stream stuck on one value would hang the bounded draw below
    probe = type(generator.bit_generator)()
    probe.state = generator.bit_generator.state
    raw = probe.random_raw(2 * 624 + 8)
    assert not (raw == raw[0]).all()
    assert 0 <= int(generator.integers(390)) < 390  # the task draw of reset()
    assert generator.integers(1 << 30, size=8).shape == (8,)


# --- surrogates: the JSON round trip -------------------------------------------------------

_PIECES = ["\ud83d", "\udfff", "\ud800", "\udc00", "\U0001f7ff", "a", " ", "Acme", "Lyon"]
_TEXT = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)


def _actions(text: str) -> list[str]:
    return [f"<search> {text} </search>", f"<answer> {text} </answer>", text]


@pytest.mark.parametrize("protocol", ["trace-rl", "search-r1"])
@pytest.mark.parametrize(
    "text",
    [
        "\ud83d\udfff",
        "x\ud83d\udfffy",
        "\ud800",
        "\udfff Lyon",
        "\udfff\ud83d",
        "\ud83d\ud83d\udfff",
    ],
)
def test_a_surrogate_pair_action_survives_the_json_round_trip(protocol: str, text: str) -> None:
    for action in _actions(text):
        env = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, protocol=protocol)
        env.reset(seed=0, options={"task_id": "q1"})
        env.step(action)
        snap = env.snapshot()
        assert envs.snapshot_from_json(snap.to_json()) == snap
        restored = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, protocol=protocol)
        restored.restore(snapshot_from_json(snap.to_json()))
        assert restored.snapshot() == snap


@given(st.lists(_TEXT, min_size=1, max_size=3), st.sampled_from(["trace-rl", "search-r1"]))
def test_any_text_with_surrogates_survives_a_utf8_file(texts: list[str], protocol: str) -> None:
    docs = [Document(doc_id=f"s{i}", title=t or "x", text=f"Acme {t}") for i, t in enumerate(texts)]
    env = SearchQAEnv(TASKS, FakeRetriever([*DOCS, *docs]), max_turns=4, protocol=protocol)
    env.reset(seed=0, options={"task_id": "q1"})
    for text in texts:
        env.step(f"<search> Acme {text} </search>")
    snap = env.snapshot()
    text_json = snap.to_json()
    text_json.encode("utf-8")  # ASCII escapes: any string fits a UTF-8 file
    assert snapshot_from_json(text_json) == snap
    restored = SearchQAEnv(TASKS, FakeRetriever([*DOCS, *docs]), max_turns=4, protocol=protocol)
    restored.restore(snapshot_from_json(text_json))
    assert restored.snapshot() == snap


def test_hits_holding_a_surrogate_pair_are_stored_as_json_gives_them_back() -> None:
    pair = Document(doc_id="p\ud83d\udfff", title="Acme \ud83d\udfff", text="Acme \ud83d\udfff")
    env = SearchQAEnv(TASKS, FakeRetriever([pair]), max_turns=4)
    env.reset(seed=0, options={"task_id": "q1"})
    env.step("<search> Acme </search>")
    snap = env.snapshot()
    hit = snap.turns[0].hits[0]
    assert (hit.doc_id, hit.title, hit.text) == (
        "p\U0001f7ff",
        "Acme \U0001f7ff",
        "Acme \U0001f7ff",
    )
    assert snapshot_from_json(snap.to_json()) == snap


def test_a_restored_generator_draws_what_the_original_draws() -> None:
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4)
    env.np_random = np.random.Generator(np.random.MT19937(3))
    env.reset(seed=None, options={"task_id": "q1"})
    snap = env.snapshot()
    other = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4)
    other.restore(snapshot_from_json(snap.to_json()))
    assert (
        other.np_random.integers(1 << 30, size=4).tolist()
        == env.np_random.integers(1 << 30, size=4).tolist()
    )
    assert dataclasses.replace(snap) == snap
