"""evaluate(): the episode loop, metrics aggregation against hand-computed cases, EM/F1 parity."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from envs import SearchQAEnv
from envs.tasks import QATask, TaskSet
from harness.evaluation.agents import ScriptedAgent
from harness.rollout.agent import AgentAction
from harness.rollout.evaluation import EpisodeRecord, Report, TurnLog, aggregate, evaluate
from retrieval import BM25Retriever, Document

DOCS = [
    Document(doc_id="d-acme", title="Acme", text="Acme was founded by Ann Vole in Velmora."),
    Document(doc_id="d-ann", title="Ann Vole", text="Ann Vole was born in Tarsk."),
    Document(doc_id="d-bolt", title="Bolt", text="Bolt was founded by Bo Li."),
]


def _task(task_id: str, answers: tuple[str, ...], **kw: Any) -> QATask:
    return QATask(task_id=task_id, question=f"question {task_id}?", golden_answers=answers, **kw)


@dataclass
class Replay:
    """A scripted policy that plays a fixed list of actions per task."""

    script: dict[str, list[str]]
    _todo: list[str] = field(default_factory=list)

    def reset(self, prompt: str, info: dict) -> None:
        self._todo = list(self.script[info["task_id"]])

    def act(self, observation: str, info: dict) -> str:
        return self._todo.pop(0)


def _run(tasks: list[QATask], script: dict[str, list[str]], **kw: Any) -> Report:
    task_set = TaskSet(tasks)
    retriever = BM25Retriever.build(DOCS)
    agent = ScriptedAgent("replay", lambda: Replay(script))
    return evaluate(
        agent, lambda: SearchQAEnv(task_set, retriever, max_turns=3, top_k=1), task_set, **kw
    )


# --- EM / F1 parity on the field's edge cases (SQuAD / Search-R1 / FlashRAG normaliser) --------

PARITY = [
    # (prediction, golds, em, sub_em, f1): hand-computed with the SQuAD normaliser
    ("The Beatles", ("Beatles",), 1.0, 1.0, 1.0),  # articles dropped
    ("an apple", ("Apple",), 1.0, 1.0, 1.0),
    ("U.S.A.!", ("USA",), 1.0, 1.0, 1.0),  # punctuation dropped
    ("Jean-Paul Sartre", ("JeanPaul Sartre",), 1.0, 1.0, 1.0),  # hyphen removed, not spaced
    ("Wilhelm Conrad Röntgen", ("wilhelm conrad röntgen",), 1.0, 1.0, 1.0),  # lowercase unicode
    ("Rontgen", ("Röntgen",), 0.0, 0.0, 0.0),  # accents are not folded
    ("  Paris   France ", ("paris",), 0.0, 1.0, 2 / 3),  # F1: p=1/2, r=1 -> 2/3
    ("no way", ("no",), 0.0, 1.0, 0.0),  # yes/no: F1 only on exact agreement
    ("no", ("no way",), 0.0, 0.0, 0.0),
    ("yes", ("Yes",), 1.0, 1.0, 1.0),
    ("Mildred Gale", ("Mildred Warner", "Mildred Gale"), 1.0, 1.0, 1.0),  # any gold counts
    ("Mildred", ("Mildred Warner", "Mildred Gale"), 0.0, 0.0, 2 / 3),  # best over golds
    ("the", ("The",), 1.0, 1.0, 0.0),  # both normalise to "": sub-EM follows EM
    ("Paris", ("The",), 0.0, 0.0, 0.0),  # an empty gold sub-matches only an empty prediction
]


@pytest.mark.parametrize(("prediction", "golds", "em", "sub_em", "f1"), PARITY)
def test_em_sub_em_f1_parity_on_edge_cases(prediction, golds, em, sub_em, f1) -> None:
    report = _run([_task("q", golds)], {"q": [f"<answer> {prediction} </answer>"]})
    record = report.episodes[0]
    assert (record.em, record.sub_em) == (em, sub_em)
    assert record.f1 == pytest.approx(f1)


def test_only_the_generated_answer_is_scored_never_the_prompt_example() -> None:
    # Search-R1's prompt holds `<answer> Beijing </answer>` as an example; a gold "Beijing"
    # must not be matched by an agent that never answers it
    report = _run([_task("q", ("Beijing",))], {"q": ["<answer> Shanghai </answer>"]})
    assert (
        "<answer> Beijing </answer>"
        in SearchQAEnv(TaskSet([_task("q", ("x",))]), BM25Retriever.build(DOCS)).reset(seed=0)[0]
    )
    assert report.episodes[0].em == 0.0


# --- the loop ----------------------------------------------------------------------------------


def test_records_follow_the_trajectory() -> None:
    tasks = [
        QATask(
            task_id="a",
            question="Who founded Acme?",
            golden_answers=("Ann Vole",),
            question_type="bridge",
            n_hops=2,
            supporting_doc_ids=("d-acme", "d-ann"),
            dataset="toy",
        )
    ]
    script = {"a": ["<search> Acme founded </search>", "bad action", "<answer> ann vole </answer>"]}
    record = _run(tasks, script).episodes[0]
    assert record.answer == "ann vole" and record.em == 1.0 and record.end == "answer"
    assert [t.kind for t in record.turns] == ["search", "invalid", "answer"]
    assert [t.valid for t in record.turns] == [True, False, True]
    assert record.n_tool_calls == 1 and record.n_turns == 3 and record.n_valid == 2
    assert record.retrieved_doc_ids == ("d-acme",)
    assert record.recall == 0.5  # one of two supporting documents retrieved
    assert "Acme was founded by Ann Vole" in record.turns[0].observation
    assert (record.dataset, record.question_type, record.n_hops) == ("toy", "bridge", 2)


def test_truncated_episode_scores_zero_and_has_no_answer() -> None:
    script = {"t": ["<search> Bolt </search>", "<search> Acme </search>", "<search> x </search>"]}
    record = _run([_task("t", ("Bo Li",))], script).episodes[0]
    assert record.end == "max_turns" and record.answer is None
    assert (record.em, record.sub_em, record.f1) == (0.0, 0.0, 0.0)
    assert record.n_tool_calls == 3


def test_batches_refill_and_episodes_come_back_in_task_order() -> None:
    # episodes of different lengths finish out of order; the report keeps the task order
    tasks = [_task(f"q{i}", ("Bo Li",)) for i in range(7)]
    script = {
        f"q{i}": ["<search> Bolt </search>"] * (i % 3) + ["<answer> Bo Li </answer>"]
        for i in range(7)
    }
    seen: list[str] = []
    report = _run(tasks, script, batch_size=2, on_episode=lambda r: seen.append(r.task_id))
    assert [r.task_id for r in report.episodes] == [f"q{i}" for i in range(7)]
    assert sorted(seen) == sorted(f"q{i}" for i in range(7)) and seen != sorted(seen)
    assert all(r.em == 1.0 for r in report.episodes)
    assert report.meta["batch_size"] == 2 and report.meta["agent"]["agent"] == "replay"


class ContextAgent:
    """Uses 5 tokens per action; its context runs out on the second action."""

    name = "context"

    def settings(self) -> dict:
        return {}

    def start(self, prompt: str, info: dict) -> list[int]:
        return [0]

    def act(self, states, observations, infos) -> list[AgentAction]:
        out = []
        for state in states:
            state[0] += 1
            if state[0] > 1:
                out.append(AgentAction(text="", finish_reason="context"))
            else:
                out.append(
                    AgentAction(text="<search> Acme </search>", n_tokens=5, finish_reason="stop")
                )
        return out


def test_context_overflow_stops_the_episode_and_tokens_are_counted() -> None:
    task_set = TaskSet([_task("c", ("x",))])
    retriever = BM25Retriever.build(DOCS)
    report = evaluate(ContextAgent(), lambda: SearchQAEnv(task_set, retriever), task_set)
    record = report.episodes[0]
    assert record.end == "context" and record.n_tokens == 5 and record.n_turns == 1


def test_evaluate_rejects_bad_arguments() -> None:
    task_set = TaskSet([_task("c", ("x",))])
    agent = ScriptedAgent("r", lambda: Replay({}))
    with pytest.raises(ValueError, match="batch_size"):
        evaluate(agent, lambda: None, task_set, batch_size=0)
    with pytest.raises(ValueError, match="no tasks"):
        evaluate(agent, lambda: None, [])


# --- aggregation against hand-computed numbers -------------------------------------------------


def _record(
    task_id: str,
    *,
    em: float,
    f1: float,
    turns: list[bool],
    searches: int,
    tokens: int,
    supporting: tuple[str, ...] = (),
    retrieved: tuple[str, ...] = (),
    dataset: str = "d",
    qtype: str = "bridge",
    hops: int | None = 2,
    answered: bool = True,
) -> EpisodeRecord:
    return EpisodeRecord(
        task_id=task_id,
        dataset=dataset,
        question="?",
        golden_answers=("a",),
        question_type=qtype,
        n_hops=hops,
        answer="a" if answered else None,
        em=em,
        sub_em=em,
        f1=f1,
        end="answer" if answered else "max_turns",
        n_tool_calls=searches,
        n_tokens=tokens,
        retrieved_doc_ids=retrieved,
        supporting_doc_ids=supporting,
        turns=tuple(
            TurnLog(action="", observation="", kind="x", valid=v, n_tokens=0, finish_reason="stop")
            for v in turns
        ),
    )


def test_aggregate_matches_hand_computed_values() -> None:
    records = [
        _record("1", em=1.0, f1=1.0, turns=[True, True], searches=1, tokens=10,
                supporting=("s1", "s2"), retrieved=("s1", "x")),
        _record("2", em=0.0, f1=0.5, turns=[True, False, True], searches=2, tokens=20,
                supporting=("s3",), retrieved=("s3",)),
        _record("3", em=0.0, f1=0.0, turns=[False, False, False, False], searches=0, tokens=30,
                answered=False),
    ]  # fmt: skip
    m = aggregate(records)
    assert m.n == 3
    assert m.em == pytest.approx(1 / 3) and m.f1 == pytest.approx(0.5)
    assert m.answered == pytest.approx(2 / 3)
    assert m.valid_action_rate == pytest.approx(4 / 9)  # 4 valid of 9 actions, not a mean of rates
    assert m.searches == pytest.approx(1.0) and m.turns == pytest.approx(3.0)
    assert m.tokens == pytest.approx(20.0)
    assert m.recall == pytest.approx((0.5 + 1.0) / 2) and m.n_recall == 2  # task 3 names none
    assert m.searches_hist == {1: 1, 2: 1, 0: 1}
    assert m.ends == {"answer": 2, "max_turns": 1}
    with pytest.raises(ValueError, match="zero episodes"):
        aggregate([])


def test_report_groups_by_dataset_type_and_hops() -> None:
    records = (
        _record("1", em=1.0, f1=1.0, turns=[True], searches=0, tokens=0, dataset="hotpotqa",
                qtype="comparison", hops=2),
        _record("2", em=0.0, f1=0.0, turns=[True], searches=0, tokens=0, dataset="hotpotqa",
                qtype="bridge", hops=2),
        _record("3", em=1.0, f1=1.0, turns=[True], searches=0, tokens=0, dataset="musique",
                qtype="3hop1", hops=3),
        _record("4", em=0.0, f1=0.0, turns=[True], searches=0, tokens=0, dataset="nq",
                qtype="", hops=None),
    )  # fmt: skip
    report = Report(agent="x", episodes=records)
    assert {k: v.n for k, v in report.by_dataset.items()} == {"hotpotqa": 2, "musique": 1, "nq": 1}
    assert report.by_dataset["hotpotqa"].em == 0.5
    assert set(report.by_type) == {
        "hotpotqa/bridge",
        "hotpotqa/comparison",
        "musique/3hop1",
        "nq/-",
    }
    assert set(report.by_hops) == {"hotpotqa/2-hop", "musique/3-hop", "nq/?-hop"}
    assert report.overall.em == 0.5
    assert report.to_json()["by_type"]["hotpotqa/comparison"]["em"] == 1.0


def test_episode_record_json_roundtrip() -> None:
    record = _record("1", em=1.0, f1=1.0, turns=[True, False], searches=1, tokens=3,
                     supporting=("s",), retrieved=("s",))  # fmt: skip
    assert EpisodeRecord.from_json(record.to_json()) == record
