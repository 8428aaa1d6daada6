"""`World`: a seeded synthetic multi-hop world — entities, corpus, questions, decompositions.

>>> world = World.generate(0)
>>> len(world.documents) > 300, len(world.tasks) > 300
(True, True)
>>> world.tasks[0].question
'In which city was the director of The Hollow Window born?'
>>> [step.query for step in world.decomposition(world.tasks[0].task_id).steps]
['The Hollow Window director', 'Piondine Sumkrerk born']
"""

from __future__ import annotations

import difflib
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from envs.errors import EnvConfigError
from envs.synthetic.config import WorldConfig
from envs.synthetic.dice import Dice
from envs.synthetic.entities import Entity, EntityKind, build_entities
from envs.synthetic.names import NameMaker
from envs.synthetic.questions import QUESTION_KINDS, Decomposition, QuestionKind, make_questions
from envs.synthetic.text import render_documents
from envs.tasks import QATask, TaskSet
from retrieval.base import Document

__all__ = ["SCHEMA_VERSION", "World", "WorldSplit"]

SCHEMA_VERSION = 1
"""Version of the export format (`world.json`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class WorldSplit:
    """Train / dev / test questions of a world, split by question and by held-out entity.

    Attributes:
        train: training questions.
        dev: held-out questions about entities that also appear in train (for checkpoint picks).
        test: held-out questions about entities that also appear in train.
        test_entities: every question whose subject entity was held out: nothing in train
            asks about these entities. Their paragraphs stay in the corpus.
    """

    train: TaskSet
    dev: TaskSet
    test: TaskSet
    test_entities: TaskSet


class World:
    """A generated world; build one with `World.generate(seed, config)`.

    Worlds are immutable and cheap: the default one builds in well under a second, so a
    warm start can generate dozens with fresh names (`World.generate(seed)` for many seeds).
    """

    def __init__(
        self,
        *,
        seed: int,
        config: WorldConfig,
        entities: Sequence[Entity],
        documents: Sequence[Document],
        questions: Sequence[tuple[QATask, Decomposition]],
    ) -> None:
        self._seed = seed
        self._config = config
        self._entities = tuple(entities)
        self._by_id: Mapping[str, Entity] = MappingProxyType({e.entity_id: e for e in entities})
        self._documents = tuple(documents)
        self._tasks = TaskSet(task for task, _ in questions)
        self._decompositions: Mapping[str, Decomposition] = MappingProxyType(
            {task.task_id: decomposition for task, decomposition in questions}
        )

    @classmethod
    def generate(cls, seed: int, config: WorldConfig = WorldConfig()) -> World:  # noqa: B008 (frozen)
        """Build the world of a seed; the same seed and config give a byte-identical export.

        Raises:
            EnvConfigError: an unknown question kind, or a config too small for its roles.
        """
        kinds = _select_kinds(config)
        dice = Dice(seed)
        names = NameMaker(dice.spawn("names"), similarity=config.name_similarity)
        entities = build_entities(dice.spawn("entities"), config, names)
        documents, facts = render_documents(entities, dice.spawn("text"), config, names)
        questions = make_questions(
            kinds,
            entities,
            documents,
            facts,
            dice.spawn("questions"),
            per_kind=config.questions_per_kind,
        )
        return cls(
            seed=seed, config=config, entities=entities, documents=documents, questions=questions
        )

    @property
    def seed(self) -> int:
        """The seed the world was generated from."""
        return self._seed

    @property
    def config(self) -> WorldConfig:
        """The config the world was generated with."""
        return self._config

    @property
    def entities(self) -> tuple[Entity, ...]:
        """Every entity: countries, cities, people, films, books, companies, universities."""
        return self._entities

    def entity(self, entity_id: str) -> Entity:
        """The entity with this id.

        Raises:
            KeyError: no such entity.
        """
        try:
            return self._by_id[entity_id]
        except KeyError:
            raise KeyError(f"no entity {entity_id!r} in this world") from None

    def entities_of(self, kind: EntityKind) -> tuple[Entity, ...]:
        """Every entity of one kind."""
        return tuple(e for e in self._entities if e.kind == kind)

    @property
    def documents(self) -> list[Document]:
        """The corpus: one paragraph per entity, then the distractors (a fresh list)."""
        return list(self._documents)

    @property
    def tasks(self) -> TaskSet:
        """Every question, kind by kind."""
        return self._tasks

    def decomposition(self, task_id: str) -> Decomposition:
        """How question `task_id` is answered, hop by hop.

        Raises:
            KeyError: no such question.
        """
        try:
            return self._decompositions[task_id]
        except KeyError:
            raise KeyError(f"no question {task_id!r} in this world") from None

    def split(
        self,
        *,
        dev_fraction: float = 0.1,
        test_fraction: float = 0.1,
        entity_fraction: float = 0.1,
        seed: int = 0,
    ) -> WorldSplit:
        """Split the questions for training and evaluation.

        First `entity_fraction` of the questions' subject entities are held out with all their
        questions (`test_entities`); then the remaining questions are split at random into
        train, dev and test by the given fractions.

        Raises:
            EnvConfigError: the fractions are negative or leave no training questions.
        """
        fractions = (dev_fraction, test_fraction, entity_fraction)
        if min(fractions) < 0 or dev_fraction + test_fraction >= 1 or entity_fraction >= 1:
            raise EnvConfigError(f"split fractions {fractions} must be >= 0 and leave a train set")
        dice = Dice(seed).spawn(f"split:{self._seed}")
        subjects = sorted({self.decomposition(t.task_id).subject_id for t in self._tasks})
        held = set(dice.sample(subjects, round(entity_fraction * len(subjects))))
        by_entity = [t for t in self._tasks if self.decomposition(t.task_id).subject_id in held]
        rest = dice.shuffled(
            [t for t in self._tasks if self.decomposition(t.task_id).subject_id not in held]
        )
        n_dev, n_test = round(dev_fraction * len(rest)), round(test_fraction * len(rest))
        order = {t.task_id: i for i, t in enumerate(self._tasks)}

        def ordered(tasks: Sequence[QATask]) -> TaskSet:
            return TaskSet(sorted(tasks, key=lambda t: order[t.task_id]))

        return WorldSplit(
            train=ordered(rest[n_dev + n_test :]),
            dev=ordered(rest[:n_dev]),
            test=ordered(rest[n_dev : n_dev + n_test]),
            test_entities=ordered(by_entity),
        )

    def hop_facts(self, task_id: str) -> frozenset[tuple[str, str]]:
        """The facts question `task_id` chains, as `(subject entity id, relation)` pairs.

        A fact's answer is fixed by its subject and relation, so the pair names the fact.
        Two questions that share no pair share no fact: the fact-disjoint held-out set
        (`harness.training.task_sources`) keeps the questions none of whose facts a training
        question chains.

        Raises:
            KeyError: no such question.
        """
        return frozenset((s.subject_id, s.relation) for s in self.decomposition(task_id).steps)

    def question_records(self) -> list[dict[str, Any]]:
        """The questions in FlashRAG form (`id`, `question`, `golden_answers`, ...).

        Each record also holds the question's `decomposition`.
        """
        return [
            task.to_json() | {"decomposition": self._decompositions[task.task_id].to_json()}
            for task in self._tasks
        ]

    def export(self, directory: str | Path) -> dict[str, Path]:
        """Write the world's files into `directory`.

        The files are `corpus.jsonl` (`{"id", "contents"}` lines), `questions.jsonl` (FlashRAG
        lines with decompositions) and `world.json` (seed, config, counts, fingerprint).

        Returns:
            The written paths, by name.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        corpus, questions = self._corpus_bytes(), self._questions_bytes()
        paths = {
            "corpus": directory / "corpus.jsonl",
            "questions": directory / "questions.jsonl",
            "world": directory / "world.json",
        }
        paths["corpus"].write_bytes(corpus)
        paths["questions"].write_bytes(questions)
        paths["world"].write_text(
            json.dumps(self.manifest(), indent=2, sort_keys=True) + "\n", encoding="utf-8"
        )
        return paths

    def manifest(self) -> dict[str, Any]:
        """What `world.json` holds: schema version, seed, config, counts and fingerprint."""
        return {
            "schema_version": SCHEMA_VERSION,
            "seed": self._seed,
            "config": asdict(self._config),
            "n_entities": len(self._entities),
            "n_documents": len(self._documents),
            "n_questions": len(self._tasks),
            "fingerprint": self.fingerprint,
        }

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the exported corpus and questions: equal exactly when the worlds are."""
        digest = hashlib.sha256(self._corpus_bytes())
        digest.update(self._questions_bytes())
        return digest.hexdigest()

    def _corpus_bytes(self) -> bytes:
        return "".join(
            json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in self._documents
        ).encode()

    def _questions_bytes(self) -> bytes:
        lines = (json.dumps(r, ensure_ascii=False) + "\n" for r in self.question_records())
        return "".join(lines).encode()


def _select_kinds(config: WorldConfig) -> list[QuestionKind]:
    for name in config.question_kinds:
        if name not in QUESTION_KINDS:
            close = difflib.get_close_matches(name, QUESTION_KINDS, n=3)
            hint = f" Did you mean {', '.join(close)}?" if close else ""
            raise EnvConfigError(
                f"unknown question kind {name!r}.{hint} Known kinds: {', '.join(QUESTION_KINDS)}"
            )
    names = config.question_kinds or tuple(QUESTION_KINDS)
    kinds = [QUESTION_KINDS[n] for n in names if QUESTION_KINDS[n].n_hops <= config.max_hops]
    if not kinds:
        raise EnvConfigError(
            f"no question kind among {list(names)} has at most max_hops={config.max_hops} hops"
        )
    return kinds
