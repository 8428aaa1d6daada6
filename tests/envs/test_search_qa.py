from __future__ import annotations

import json
import logging

import pytest
from env_fakes import DOCS, TASKS, BrokenRetriever, FakeRetriever

from envs import (
    EnvConfigError,
    EnvSnapshot,
    EpisodeStateError,
    RetrievalFailedError,
    SearchQAEnv,
    SnapshotError,
    UnknownTaskError,
)
from envs.errors import ActionTypeError
from envs.protocol import MAX_TEXT_CHARS

INFO_KEYS = {
    "task_id", "golden_answers", "question_type", "n_hops", "turn_idx", "max_turns",
    "n_tool_calls", "retrieved_doc_ids", "valid_action", "action_kind",
}  # fmt: skip


def test_reset_returns_the_prompt_and_the_task_info(fake_env):
    prompt, info = fake_env.reset(options={"task_id": "q1"})
    assert prompt.endswith("Question: Where was the founder of Acme born?\n")
    assert "<answer> Beijing </answer>" in prompt  # the template's example, never scored
    assert set(info) >= INFO_KEYS
    assert info["task_id"] == "q1" and info["golden_answers"] == ["Lyon"]
    assert (info["turn_idx"], info["n_tool_calls"], info["retrieved_doc_ids"]) == (0, 0, [])
    assert info["action_kind"] is None and info["question"] == TASKS["q1"].question


def test_reset_without_task_id_draws_with_the_seed(fake_env):
    drawn = [fake_env.reset(seed=s)[1]["task_id"] for s in range(20)]
    again = [fake_env.reset(seed=s)[1]["task_id"] for s in range(20)]
    assert drawn == again and len(set(drawn)) == 3


def test_a_two_hop_episode(fake_env):
    fake_env.reset(options={"task_id": "q1"})
    obs, reward, terminated, truncated, info = fake_env.step(
        "<think>hm</think><search> Acme founded </search>"
    )
    assert obs.startswith(
        "\n<information>Doc 1(Title: Acme) Acme was founded by Ann Vole in Paris."
    )
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["action_kind"] == "search" and info["valid_action"]
    assert (info["turn_idx"], info["n_tool_calls"]) == (1, 1)
    first_ids = info["retrieved_doc_ids"]
    assert first_ids[0] == "d1" and len(first_ids) == 2
    obs, *_, info = fake_env.step("<search> Ann Vole born </search>")
    assert info["retrieved_doc_ids"][: len(first_ids)] == first_ids  # cumulative
    assert "Ann Vole was born in Lyon." in obs
    obs, reward, terminated, truncated, info = fake_env.step("<answer> lyon. </answer> trailing")
    assert (obs, reward, terminated, truncated) == ("", 1.0, True, False)
    assert (info["answer"], info["em"], info["sub_em"], info["f1"]) == ("lyon.", 1.0, 1.0, 1.0)
    assert info["action_kind"] == "answer" and info["turn_idx"] == 3


def test_invalid_actions_are_observations_not_errors(fake_env):
    fake_env.reset(options={"task_id": "q2"})
    obs, reward, terminated, truncated, info = fake_env.step("Bo Li, obviously")
    assert "My previous action is invalid" in obs and "closing tag" in obs
    assert (reward, terminated, truncated) == (0.0, False, False)
    assert info["valid_action"] is False and info["action_kind"] == "invalid"
    assert info["n_tool_calls"] == 0 and info["turn_idx"] == 1


def test_the_last_turn_truncates(fake_env):
    fake_env.reset(options={"task_id": "q2"})
    for _ in range(3):
        *_, terminated, truncated, _ = fake_env.step("<search> Bolt </search>")
        assert not terminated and not truncated
    _, reward, terminated, truncated, info = fake_env.step("<search> Bolt </search>")
    assert (terminated, truncated, reward) == (False, True, 0.0)
    assert "answer" not in info and info["turn_idx"] == 4
    with pytest.raises(EpisodeStateError, match="truncated after 4 turns"):
        fake_env.step("<answer> Bo Li </answer>")


def test_step_needs_a_running_episode(fake_env):
    with pytest.raises(EpisodeStateError, match="before reset"):
        fake_env.step("<answer> x </answer>")
    fake_env.reset(options={"task_id": "q2"})
    fake_env.step("<answer> Li Bo </answer>")
    with pytest.raises(EpisodeStateError, match="answered"):
        fake_env.step("<answer> x </answer>")
    with pytest.raises(ActionTypeError):
        fake_env.reset(options={"task_id": "q2"}) and fake_env.step(42)  # type: ignore[arg-type]


def test_bad_reset_options_raise_typed_errors_and_change_nothing(fake_env):
    fake_env.reset(seed=1, options={"task_id": "q2"})
    before = fake_env.snapshot()
    with pytest.raises(UnknownTaskError, match="'nope' is not in this env's task set"):
        fake_env.reset(seed=2, options={"task_id": "nope"})
    assert fake_env.snapshot() == before  # neither the episode nor the RNG moved
    with pytest.raises(EnvConfigError, match="unknown reset options"):
        fake_env.reset(options={"task": "q1"})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_turns": 1}, "max_turns"),
        ({"top_k": 0}, "top_k"),
        ({"reward": "accuracy"}, "reward"),
        ({"f1_threshold": 1.5}, "f1_threshold"),
        ({"prompt_template": "no placeholder"}, "placeholder"),
        ({"max_doc_chars": 10**6}, "lower max_doc_chars"),
    ],
)
def test_bad_config_raises(kwargs, match):
    with pytest.raises(EnvConfigError, match=match):
        SearchQAEnv(TASKS, FakeRetriever(DOCS), **kwargs)


def test_max_doc_chars_none_takes_the_largest_that_fits():
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), top_k=5, max_doc_chars=None)
    assert 5 * env.config.max_doc_chars < MAX_TEXT_CHARS


@pytest.mark.parametrize(
    ("reward", "answer", "expected"),
    [
        ("em", "Bo", 0.0),
        ("f1", "Bo", 2 / 3),
        ("f1_threshold", "Bo", 1.0),
        ("format", "Bo", 0.2),
        ("format", "Bo Li", 1.0),
    ],
)
def test_reward_kinds(reward, answer, expected):
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), reward=reward, f1_threshold=0.5)
    env.reset(options={"task_id": "q2"})
    assert env.step(f"<answer> {answer} </answer>")[1] == pytest.approx(expected)


def test_format_reward_counts_invalid_actions_and_truncation():
    env = SearchQAEnv(TASKS, FakeRetriever(DOCS), reward="format", max_turns=2)
    env.reset(options={"task_id": "q2"})
    env.step("garbage")
    assert env.step("<answer> Bo Li </answer>")[1] == pytest.approx(0.8)
    env.reset(options={"task_id": "q2"})
    env.step("<search> Bolt </search>")
    assert env.step("<search> Bolt </search>")[1:4] == (pytest.approx(0.2), False, True)


def test_repeated_queries_come_from_the_episode_cache():
    retriever = FakeRetriever(DOCS)
    env = SearchQAEnv(TASKS, retriever)
    env.reset(options={"task_id": "q1"})
    first = env.step("<search> Acme  Founded </search>")[0]
    second = env.step("<search>acme founded</search>")[0]
    assert first == second and retriever.calls == 1
    assert env.history[1].content == "acme founded"  # the policy's own words are kept


def test_retriever_failure_raises_and_leaves_the_state_unchanged():
    retriever = BrokenRetriever(DOCS)
    env = SearchQAEnv(TASKS, retriever)
    env.reset(options={"task_id": "q1"})
    before = env.snapshot()
    with pytest.raises(RetrievalFailedError, match="retry") as caught:
        env.step("<search> Acme </search>")
    assert isinstance(caught.value.__cause__, ConnectionError)
    assert env.snapshot() == before
    retriever.healed = True
    obs, *_, info = env.step("<search> Acme </search>")  # the same step, retried
    assert info["turn_idx"] == 1 and "Acme" in obs


def test_a_retriever_that_breaks_its_contract_is_reported():
    class TooMany(FakeRetriever):
        def search(self, queries, k):
            return [super().search(queries, k)[0] * 3]

    env = SearchQAEnv(TASKS, TooMany(DOCS), top_k=2)
    env.reset(options={"task_id": "q1"})
    with pytest.raises(RetrievalFailedError, match="broke its contract"):
        env.step("<search> Acme </search>")


def test_megabyte_action_is_an_invalid_action(fake_env):
    fake_env.reset(options={"task_id": "q1"})
    obs, _, _, _, info = fake_env.step("x" * (1 << 20))
    assert info["valid_action"] is False and len(obs) < 1000
    obs, _, _, _, info = fake_env.step("<search>" + "y " * (1 << 19) + "</search>")
    assert info["valid_action"] is False and "at most" in obs


def test_snapshot_round_trips_through_json(fake_env):
    fake_env.reset(seed=5, options={"task_id": "q1"})
    fake_env.step("<search> Acme </search>")
    fake_env.step("nonsense")
    snap = fake_env.snapshot()
    again = EnvSnapshot.from_dict(json.loads(json.dumps(snap.to_dict())))
    assert again == snap and snap.turn_idx == 2
    assert [t.kind for t in snap.turns] == ["search", "invalid"]


def test_restore_refuses_another_format_version_config_or_task(fake_env):
    fake_env.reset(options={"task_id": "q1"})
    record = fake_env.snapshot().to_dict()
    with pytest.raises(SnapshotError, match="schema_version") as caught:
        EnvSnapshot.from_dict(record | {"schema_version": 99})
    assert caught.value.field == "schema_version"
    other = SearchQAEnv(TASKS, FakeRetriever(DOCS), max_turns=4, top_k=3)
    with pytest.raises(SnapshotError) as caught:
        other.restore(fake_env.snapshot())
    assert caught.value.field == "top_k" and "restore into an env configured like" in str(
        caught.value
    )
    fewer = SearchQAEnv(TASKS[1:], FakeRetriever(DOCS), max_turns=4, top_k=2)
    with pytest.raises(SnapshotError) as caught:
        fewer.restore(fake_env.snapshot())
    assert caught.value.field == "task_id"
    with pytest.raises(SnapshotError) as caught:
        EnvSnapshot.from_dict({k: v for k, v in record.items() if k != "turns"})
    assert caught.value.field == "turns"


def test_failed_restore_changes_nothing(fake_env):
    fake_env.reset(options={"task_id": "q2"})
    fake_env.step("<search> Bolt </search>")
    before = fake_env.snapshot()
    bad = EnvSnapshot.from_dict(before.to_dict() | {"task_id": "nope"})
    with pytest.raises(SnapshotError):
        fake_env.restore(bad)
    assert fake_env.snapshot() == before


def test_restored_episode_replays_cached_results_with_another_retriever(fake_env, caplog):
    fake_env.reset(options={"task_id": "q1"})
    obs = fake_env.step("<search> Acme </search>")[0]
    snap = fake_env.snapshot()
    empty = FakeRetriever([DOCS[3]], index_id="fake-2")
    other = SearchQAEnv(TASKS, empty, max_turns=4, top_k=2)
    with caplog.at_level(logging.WARNING):
        other.restore(EnvSnapshot.from_dict(snap.to_dict()))
    assert "index fake-1" in caplog.text
    assert other.step("<search> acme </search>")[0] == obs and empty.calls == 0
    assert "No results" in other.step("<search> Lyon </search>")[0]


def test_snapshot_before_any_reset_restores_to_no_episode(fake_env):
    snap = fake_env.snapshot()
    assert snap.task_id is None and snap.turns == ()
    fake_env.reset(options={"task_id": "q1"})
    fake_env.restore(snap)
    assert fake_env.episode_over
    with pytest.raises(EpisodeStateError):
        fake_env.step("<answer> x </answer>")


def test_forks_are_independent(fake_env):
    fake_env.reset(options={"task_id": "q2"})
    fake_env.step("<search> Bolt </search>")
    a, b = fake_env.fork(2)
    assert a.step("<answer> Bo Li </answer>")[1] == 1.0
    assert b.step("<answer> Bo </answer>")[1] == 0.0
    assert not fake_env.episode_over and fake_env.snapshot().turn_idx == 1
    assert a.tasks is fake_env.tasks and a.retriever is fake_env.retriever
    assert a.action_space is not fake_env.action_space
    with pytest.raises(ValueError):
        fake_env.fork(0)


def test_forks_continue_the_random_stream(fake_env):
    fake_env.reset(seed=3)
    twin = fake_env.fork()[0]
    assert [fake_env.reset()[1]["task_id"] for _ in range(5)] == [
        twin.reset()[1]["task_id"] for _ in range(5)
    ]
