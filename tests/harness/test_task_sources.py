"""Task sources and held-out sets: one world, a world stream, a task file; fact-disjoint, unseen,
decoy; forks and snapshots across worlds."""

from __future__ import annotations

import dataclasses
import json
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from envs import (
    EnvSnapshot,
    QATask,
    SnapshotError,
    SnapshotMismatchError,
    World,
    WorldConfig,
)
from harness.errors import HarnessError
from harness.rollout.episodes import question_kind
from harness.tiny_policy import tiny_env_config
from harness.training.config import TaskConfig, TrainConfig
from harness.training.task_sources import (
    TaskCorpus,
    TaskSource,
    WorldStream,
    build_tasks,
    eval_set,
    fact_disjoint_set,
    sample_pool,
)
from retrieval.bm25 import BM25Retriever

WORLD = WorldConfig(
    n_countries=3,
    n_cities=8,
    n_people=40,
    n_films=6,
    n_books=4,
    n_companies=3,
    n_universities=2,
    n_distractors=4,
    questions_per_kind=4,
    sentences_per_doc=1,
)
ENV = dataclasses.replace(tiny_env_config(), max_turns=4, top_k=2, max_doc_chars=200)
TASK = TaskConfig(world=WORLD, env=ENV)


def _facts(world: World, tasks) -> set:
    return set().union(*(world.hop_facts(t.task_id) for t in tasks))


def test_fact_disjoint_questions_share_no_hop_fact_with_their_worlds_training_questions():
    task = dataclasses.replace(TASK, demo_world_seeds=(300, 301, 302))
    corpora = eval_set(task, "fact_disjoint")
    world = World.generate(TASK.world_seed, WORLD)
    trained = {TASK.world_seed: _facts(world, world.split().train)}  # the warm start's split
    for seed in task.demo_world_seeds:  # a demonstration world: every question it asks
        demo = World.generate(seed, WORLD)
        trained[seed] = _facts(demo, demo.tasks)
    held = [t for c in corpora for t in c.tasks]
    assert len(held) > 0 and len({c.name for c in corpora}) > 1
    for corpus in corpora:
        seed = int(corpus.name.removeprefix("world "))
        asked = World.generate(seed, dataclasses.replace(WORLD, questions_per_kind=400))
        # the world's own corpus: every question is answered from that world's documents
        own_index = BM25Retriever.build(World.generate(seed, WORLD).documents)
        assert corpus.retriever.index_id == own_index.index_id
        for t in corpus.tasks:
            prefix, own_id = t.task_id.split("/", 1)
            assert prefix == f"w{seed}+"
            assert asked.tasks[own_id].question == t.question
            assert not asked.hop_facts(own_id) & trained[seed]
    # the world's own held-out split is mostly not fact-disjoint (the reason for this set)
    split = world.split()
    own_held = [*split.dev, *split.test, *split.test_entities]
    assert sum(not world.hop_facts(t.task_id) & trained[0] for t in own_held) < len(own_held)


def test_the_fact_disjoint_set_holds_its_worlds_mix_of_question_kinds():
    task = dataclasses.replace(TASK, demo_world_seeds=(300, 301, 302))
    held = [t for c in eval_set(task, "fact_disjoint") for t in c.tasks]
    world = World.generate(TASK.world_seed, WORLD)
    mix = Counter(question_kind(t.question_type, t.n_hops) for t in world.tasks)
    got = Counter(question_kind(t.question_type, t.n_hops) for t in held)
    assert len(got) > 1
    total = sum(mix[k] for k in got)
    for kind, n in got.items():  # each kind its share of the kinds the set offers, +- rounding
        assert abs(n - len(held) * mix[kind] / total) <= 1, (kind, n, got, mix)
    assert held == [t for c in eval_set(task, "fact_disjoint") for t in c.tasks]  # seeded


def _kind_tasks(kind: str, n: int) -> list[QATask]:
    question_type, hops = ("bridge", 2) if kind == "bridge-2hop" else (kind, None)
    return [
        QATask(
            task_id=f"{kind}-{i}",
            question=f"q {kind} {i}?",
            golden_answers=("a",),
            question_type=question_type,
            n_hops=hops,
        )
        for i in range(n)
    ]


def test_fact_disjoint_set_draws_the_largest_set_in_the_mix_and_nothing_it_does_not_count():
    candidates = _kind_tasks("bridge-2hop", 10) + _kind_tasks("comparison", 40)
    candidates += _kind_tasks("inference", 7)  # a kind the reference does not ask
    mix = {"bridge-2hop": 2, "comparison": 1, "bridge-3hop": 5}  # none offered: not counted
    drawn = fact_disjoint_set(candidates, mix, seed=0)
    got = Counter(question_kind(t.question_type, t.n_hops) for t in drawn)
    assert got == {"bridge-2hop": 10, "comparison": 5}  # 2:1, as large as the bridges allow
    assert len({t.task_id for t in drawn}) == 15
    again = fact_disjoint_set(candidates, mix, seed=0)
    assert again == drawn and fact_disjoint_set(candidates, mix, seed=1) != drawn


def test_the_unseen_set_is_one_namespaced_corpus_per_unseen_world():
    task = dataclasses.replace(TASK, unseen_world_seeds=(7, 8))
    corpora = eval_set(task, "unseen")
    assert [c.name for c in corpora] == ["world 7", "world 8"]
    for seed, corpus in zip((7, 8), corpora, strict=True):
        world = World.generate(seed, WORLD)
        assert {t.task_id for t in corpus.tasks} == {f"w{seed}/{i}" for i in world.tasks.ids}
        assert corpus.retriever.index_id != corpora[0].retriever.index_id or seed == 7


def test_the_decoy_asks_training_questions_over_another_worlds_documents():
    (decoy,) = eval_set(TASK, "decoy")
    world = World.generate(TASK.world_seed, WORLD)
    assert sorted(decoy.tasks.ids) == sorted(world.split().train.ids)
    # shuffled: the first N cover the kinds, not only the split's first kind
    assert decoy.tasks.ids != world.split().train.ids
    assert len({(t.question_type, t.n_hops) for t in decoy.tasks[:10]}) > 1
    other = World.generate(TASK.decoy_world_seed, WORLD)
    hits = decoy.retriever.search([decoy.tasks[0].question], 3)[0]
    own_docs = {d.doc_id: d.text for d in world.documents}
    decoy_docs = {d.doc_id: d.text for d in other.documents}
    assert all(decoy_docs.get(h.doc_id) == h.text != own_docs.get(h.doc_id) for h in hits)


def test_a_world_stream_gives_each_step_a_fresh_world_and_a_seeded_pool():
    tasks = build_tasks(dataclasses.replace(TASK, source="stream", stream_first_seed=500), ())
    stream = tasks.train
    assert isinstance(stream, WorldStream) and stream.fixed_ids is None
    one, two = stream.corpus(1), stream.corpus(2)
    assert (one.name, two.name) == ("world 500", "world 501")
    assert not set(one.tasks.ids) & set(two.tasks.ids)  # ids name their world
    assert one.retriever.index_id != two.retriever.index_id
    pool = sample_pool(one, 5, seed=0, step=1)
    assert len(set(pool)) == 5 and set(pool) <= set(one.tasks.ids)
    assert pool == sample_pool(stream.corpus(1), 5, seed=0, step=1)  # resumable
    assert pool != sample_pool(one, 5, seed=1, step=1)


def _what_a_step_reads(source: TaskSource, step: int) -> tuple[Any, str, int | None]:
    """The protocol's view of one step, as the trainer reads it."""
    return source.fixed_ids, source.corpus(step).name, source.seed(step)


def test_a_fixed_set_is_a_task_source_with_the_same_questions_every_step():
    tasks = build_tasks(TASK, ())
    source = tasks.train
    assert isinstance(source, TaskCorpus)
    ids = World.generate(TASK.world_seed, WORLD).split().train.ids
    assert _what_a_step_reads(source, 1) == (ids, source.name, None)
    assert _what_a_step_reads(source, 7) == _what_a_step_reads(source, 1)
    assert source.corpus(3) is source  # one env serves the whole run


def test_a_world_stream_is_a_task_source_with_a_world_per_step():
    source: TaskSource = WorldStream(300, WORLD)
    assert _what_a_step_reads(source, 1) == (None, "world 300", 300)
    assert _what_a_step_reads(source, 5) == (None, "world 304", 304)
    assert source.corpus(5).tasks.ids[0].startswith("w304/")


def test_a_bank_of_worlds_comes_back_every_k_steps_with_the_same_questions():
    source = build_tasks(dataclasses.replace(TASK, source="stream", stream_first_seed=300,
                                             stream_bank=2), ()).train  # fmt: skip
    assert [_what_a_step_reads(source, s)[1:] for s in (1, 2, 3, 4)] == [
        ("world 300", 300), ("world 301", 301), ("world 300", 300), ("world 301", 301)
    ]  # fmt: skip
    assert source.corpus(3).tasks.ids == source.corpus(1).tasks.ids  # revisited: an epoch
    assert isinstance(source, WorldStream) and list(source.seeds(9)) == [300, 301]
    assert list(WorldStream(300, WORLD).seeds(3)) == [300, 301, 302]  # no bank: fresh worlds
    # a bank near the held-out worlds is refused only for the seeds it really trains on
    near = dataclasses.replace(TASK, source="stream", stream_first_seed=4_998, stream_bank=2)
    TrainConfig(task=near, steps=30)
    with pytest.raises(ValueError, match=r"include the held-out world\(s\) \[5000\]"):
        TrainConfig(task=dataclasses.replace(near, stream_bank=3), steps=30)


def test_a_stream_that_would_train_on_a_held_out_world_is_refused():
    task = dataclasses.replace(TASK, source="stream", stream_first_seed=4_990)
    with pytest.raises(ValueError, match=r"include the held-out world\(s\) \[5000\]"):
        TrainConfig(task=task, steps=11)
    TrainConfig(task=task, steps=10)  # 4990..4999 misses them


def test_a_stream_over_the_warm_start_worlds_is_refused():
    from harness.training.trainer import _check_policy_task

    shipped = Path(__file__).resolve().parents[2] / "harness" / "tiny_policy" / "warm_start"
    task = TaskConfig(source="stream", stream_first_seed=1_030)  # demos: worlds 1000..1039
    config = TrainConfig(policy=shipped, task=task, steps=5)
    with pytest.raises(HarnessError, match="warm-started or selected on"):
        _check_policy_task(config)
    ok = dataclasses.replace(config, task=dataclasses.replace(task, stream_first_seed=100_000))
    _check_policy_task(ok)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"source": "file"}, "needs --task.train-file and --task.index"),
        ({"source": "file", "train_file": Path("x.jsonl")}, "needs --task.index"),
        ({"index": "runs/idx"}, "need --task.source file"),
        ({"unseen_world_seeds": (0,)}, "is also a held-out world"),
        ({"stream_bank": 4}, "needs --task.source stream"),
        ({"source": "stream", "stream_bank": -1}, "stream-bank -1"),
    ],
)
def test_task_configs_that_cannot_work_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        TaskConfig(**fields)


def test_an_unknown_held_out_set_is_a_clear_error():
    with pytest.raises(HarnessError, match="unknown held-out set"):
        build_tasks(TASK, ("unseen", "nope"))


# --- forks and snapshots across worlds --------------------------------------------------------


def _played(corpus):
    env = corpus.make_env(ENV)
    task = corpus.tasks[0]
    env.reset(options={"task_id": task.task_id})
    env.step(f"<search> {task.question} </search>")
    return env


def test_forks_and_snapshots_stay_in_their_world():
    stream = WorldStream(100, WORLD)
    a, b = stream.corpus(1), stream.corpus(2)
    env = _played(a)
    snap = EnvSnapshot.from_dict(env.snapshot().to_dict())
    assert snap.task_id.startswith("w100/") and snap.index_id == a.retriever.index_id
    # the fork law holds within the world: a fork and a restored env step alike
    fork = env.fork(1)[0]
    restored = a.make_env(ENV)
    restored.restore(snap)
    action = "<answer> nobody </answer>"
    assert fork.step(action) == restored.step(action) == env.step(action)
    # another world's env refuses it, and is left as it was
    other = _played(b)
    before = other.snapshot()
    with pytest.raises(SnapshotMismatchError) as caught:
        other.restore(snap)
    assert caught.value.field == "task_id" and isinstance(caught.value, SnapshotError)
    assert other.snapshot() == before


def test_a_snapshot_restored_over_another_index_is_a_typed_error():
    (decoy,) = eval_set(TASK, "decoy")
    (train,) = eval_set(dataclasses.replace(TASK, eval_split="train"), "split")
    env = _played(train)  # a training question over its own world's index
    snap = env.snapshot()
    wrong = decoy.make_env(ENV)  # the same questions over another world's documents
    with pytest.raises(SnapshotMismatchError, match="another corpus") as caught:
        wrong.restore(snap)
    assert caught.value.field == "index_id"
    lenient = ENV.make_env(decoy.tasks, decoy.retriever)  # the default only warns
    lenient.restore(snap)
    assert lenient.snapshot().turns == snap.turns


def test_trace_memory_remembers_recurring_questions_and_falls_back_to_its_prior_on_a_stream():
    from harness.training.config import PredictorConfig

    predictor = PredictorConfig().build(seed=0)
    stream = WorldStream(100, WORLD)
    seen = [t.question for t in stream.corpus(1).tasks]
    fresh = [t.question for t in stream.corpus(2).tasks]
    assert not set(seen) & set(fresh)  # a fresh world never asks the same question twice
    n = len(seen)
    predictor.update(seen, np.zeros(n), weights=np.full(n, 6), is_root=np.ones(n, dtype=bool))
    text = predictor.text_model
    # a question asked again is predicted from its own outcomes (6 failures pull it down) ...
    assert np.all(predictor.predict(seen) < text.predict(seen) - 0.05)
    # ... a question of a fresh world has none: its prediction is the text model's alone
    np.testing.assert_allclose(predictor.predict(fresh), text.predict(fresh))


def test_a_file_sources_config_reads_back_equal(tmp_path):
    from harness.training.config import CONFIG_FILE, load_config

    task = TaskConfig(source="file", train_file=Path("q.jsonl"), index="http://127.0.0.1:1")
    config = TrainConfig(run_dir=tmp_path, task=task)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(config.to_json()))
    assert load_config(tmp_path) == config
