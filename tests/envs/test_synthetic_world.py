from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from env_fakes import SMALL

from envs import EnvConfigError, World, WorldConfig
from envs.synthetic import QUESTION_KINDS
from retrieval.corpus import read_corpus

ROOT = Path(__file__).resolve().parents[2]


def test_same_seed_gives_a_byte_identical_export(tmp_path):
    a, b = World.generate(11, SMALL), World.generate(11, SMALL)
    pa, pb = a.export(tmp_path / "a"), b.export(tmp_path / "b")
    for name in pa:
        assert pa[name].read_bytes() == pb[name].read_bytes()
    assert a.fingerprint == b.fingerprint
    assert World.generate(12, SMALL).fingerprint != a.fingerprint


def test_worlds_do_not_depend_on_hash_randomisation(small_world):
    # set and dict orders of strings change with PYTHONHASHSEED; the world must not
    code = (
        "import sys; sys.path.insert(0, 'tests/envs'); from env_fakes import SMALL; "
        "from envs import World; print(World.generate(3, SMALL).fingerprint)"
    )
    for hash_seed in ("1", "2"):
        run = subprocess.run(
            [sys.executable, "-c", code],
            cwd=ROOT,
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert run.stdout.strip() == small_world.fingerprint
    assert len({World.generate(s, SMALL).fingerprint for s in range(5)}) == 5


def test_export_formats(small_world, tmp_path):
    paths = small_world.export(tmp_path)
    docs = read_corpus(paths["corpus"])
    assert [d.doc_id for d in docs] == [d.doc_id for d in small_world.documents]
    lines = [json.loads(line) for line in paths["questions"].read_text().splitlines()]
    assert len(lines) == len(small_world.tasks)
    for record in lines:
        assert {"id", "question", "golden_answers", "decomposition"} <= set(record)
        assert record["dataset"] == "synthetic"
    manifest = json.loads(paths["world"].read_text())
    assert manifest["schema_version"] == 1 and manifest["fingerprint"] == small_world.fingerprint
    assert manifest["config"]["n_people"] == SMALL.n_people


def test_world_has_every_kind_of_entity_and_question(small_world):
    kinds = {e.kind for e in small_world.entities}
    assert kinds == {"person", "city", "country", "film", "book", "company", "university"}
    types = {(t.question_type, t.n_hops) for t in small_world.tasks}
    assert types >= {
        ("bridge", 2),
        ("bridge", 3),
        ("bridge", 4),
        ("comparison", 2),
        ("inference", 2),
    }
    assert all(t.dataset == "synthetic" for t in small_world.tasks)


def test_every_gold_answer_is_reachable_through_the_supporting_docs(small_world):
    docs = {d.doc_id: d for d in small_world.documents}
    for task in small_world.tasks:
        plan = small_world.decomposition(task.task_id)
        assert task.golden_answers == (plan.answer,)
        assert set(task.supporting_doc_ids) == {s.doc_id for s in plan.steps}
        previous = None
        for step in plan.steps:
            doc = docs[step.doc_id]
            assert step.subject == doc.title, task.task_id  # the hop's paragraph is the subject's
            assert step.answer in doc.text, (task.task_id, step)
            if (
                plan.kind in QUESTION_KINDS
                and QUESTION_KINDS[plan.kind].question_type != "comparison"
            ):
                if previous is not None:
                    assert step.subject == previous  # each hop starts where the last one ended
                previous = step.answer
        if QUESTION_KINDS[plan.kind].question_type == "comparison":
            years = [int(s.answer) for s in plan.steps]
            assert plan.answer == plan.steps[years.index(min(years))].subject
        else:
            assert plan.steps[-1].answer == plan.answer
            assert plan.answer not in task.question


def test_names_are_invented_and_unique(small_world):
    names = [e.name for e in small_world.entities]
    assert len(names) == len(set(names))
    assert all(re.fullmatch(r"[A-Z][\w' -]+", n) for n in names)


def test_sentences_per_doc_one_gives_one_sentence_paragraphs():
    world = World.generate(1, WorldConfig(sentences_per_doc=1, n_distractors=0))
    entity_docs = world.documents
    assert all(d.text.count(". ") == 0 for d in entity_docs), "one sentence each"
    kinds = {world.decomposition(t.task_id).kind for t in world.tasks}
    assert "paternal_grandfather" not in kinds  # family facts live in later sentences
    assert "film_director_birth_capital" in kinds


def test_difficulty_knobs():
    world = World.generate(1, WorldConfig(max_hops=2, n_distractors=50))
    assert max(t.n_hops for t in world.tasks) == 2
    assert len(world.documents) == len(world.entities) + 50
    only = World.generate(1, WorldConfig(question_kinds=("film_star_birthplace",)))
    assert {t.task_id.rsplit("-", 1)[0] for t in only.tasks} == {"film_star_birthplace"}


def test_name_similarity_makes_look_alike_names():
    def near_pairs(world: World) -> int:
        cities = [e.name for e in world.entities_of("city")]
        return sum(
            1
            for i, a in enumerate(cities)
            for b in cities[i + 1 :]
            if len(a) == len(b) and sum(x != y for x, y in zip(a, b, strict=True)) <= 2
        )

    plain = World.generate(4, WorldConfig(name_similarity=0.0))
    similar = World.generate(4, WorldConfig(name_similarity=0.8))
    assert near_pairs(similar) > near_pairs(plain)


def test_bad_configs_raise_typed_errors():
    with pytest.raises(EnvConfigError, match="Did you mean"):
        World.generate(0, WorldConfig(question_kinds=("film_director_birthplac",)))
    with pytest.raises(EnvConfigError, match="n_people"):
        WorldConfig(n_people=10)
    with pytest.raises(EnvConfigError, match="max_hops"):
        WorldConfig(max_hops=5)
    with pytest.raises(EnvConfigError, match="two per country"):
        WorldConfig(n_countries=10, n_cities=12)


def test_split_by_question_and_by_held_out_entity(small_world):
    split = small_world.split(dev_fraction=0.1, test_fraction=0.1, entity_fraction=0.2, seed=1)
    parts = [split.train, split.dev, split.test, split.test_entities]
    ids = [i for part in parts for i in part.ids]
    assert sorted(ids) == sorted(small_world.tasks.ids)  # a partition
    held = {small_world.decomposition(i).subject_id for i in split.test_entities.ids}
    trained = {small_world.decomposition(i).subject_id for i in split.train.ids}
    assert held and not held & trained
    again = small_world.split(dev_fraction=0.1, test_fraction=0.1, entity_fraction=0.2, seed=1)
    assert [p.ids for p in parts] == [
        again.train.ids,
        again.dev.ids,
        again.test.ids,
        again.test_entities.ids,
    ]
    with pytest.raises(EnvConfigError):
        small_world.split(dev_fraction=0.6, test_fraction=0.5)


def test_thirty_worlds_are_cheap_and_distinct():
    worlds = [World.generate(100 + s) for s in range(30)]
    names = [{e.name for e in w.entities_of("person")} for w in worlds]
    assert all(len(a & b) < 0.1 * len(a) for a, b in itertools.pairwise(names))
