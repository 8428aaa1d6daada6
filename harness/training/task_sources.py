"""Where a training run's questions come from, and the held-out sets it is judged on.

`build_tasks(config.task, eval_sets)` returns `Tasks`: what the trainer trains on and the named
held-out sets it evaluates. The training questions come from one of three sources
(`TaskConfig.source`):

- `world`: one generated world (`world_seed`), its `train_split` questions over its BM25 index;
- `stream`: a fresh world per step: step `s` draws its pool from `World.generate(stream_first_seed
  + s - 1)`, indexed on the spot (a world is about 330 documents: milliseconds), so no question,
  name or fact recurs between steps and only a skill (searching, reading) can be learned;
- `file`: a task file in any format `tracerl bench` reads (HotpotQA, 2Wiki, MuSiQue, FlashRAG,
  ...), over `index`: an index directory or a retriever URL.

Every source is a `TaskSource`: it hands the engine one `TaskCorpus` (questions and the index
they are answered from) per step, so forks, snapshots and the budget meter work the same on all
of them. A generated world's task ids carry its seed (`w100007/bridge-003`), and its env refuses
a snapshot taken on another index (`SnapshotMismatchError`): an episode cannot be restored into
the wrong world.

The held-out sets (`EvalSetName`):

- `split`: the `eval_split` of world `world_seed` (or `eval_file` for a file source): the same
  world's questions; most share facts with training questions, so it mostly measures memory;
- `fact_disjoint`: questions of the warm start's worlds (world `world_seed` and the
  `demo_world_seeds`) none of whose hop facts occurs in any of that world's training questions'
  chains (`World.hop_facts`): the names are familiar, the facts must be read. The set holds
  world `world_seed`'s own mix of question kinds (`fact_disjoint_set`), each world's questions
  over its own index;
- `unseen`: every question of the worlds `unseen_world_seeds`, each over its own index, in a
  seeded shuffle: worlds no policy trained on;
- `decoy`: world `world_seed`'s training questions over another world's documents
  (`decoy_world_seed`): no observation holds the answer, so EM here is answering from memory
  and must stay near 0.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, SupportsFloat, get_args, runtime_checkable

import numpy as np

from envs import QATask, SearchQAConfig, SearchQAEnv, TaskSet, World, WorldConfig
from envs.qa_datasets import load_file
from harness.errors import HarnessError
from harness.rollout.episodes import question_kind
from harness.tiny_policy.pipeline import is_hard
from harness.training.config import EvalSetName
from retrieval import Retriever, make_retriever
from retrieval.bm25 import BM25Retriever
from retrieval.cache import CachedRetriever

if TYPE_CHECKING:
    from harness.training.config import TaskConfig

__all__ = [
    "EVAL_SETS",
    "CorpusRouter",
    "EvalSetName",
    "HeldOut",
    "TaskCorpus",
    "TaskSource",
    "Tasks",
    "WorldStream",
    "build_tasks",
    "eval_set",
    "fact_disjoint_questions",
    "fact_disjoint_set",
    "held_out",
    "sample_pool",
    "world_corpus",
]

EVAL_SETS: tuple[str, ...] = get_args(EvalSetName)


@runtime_checkable
class TaskSource(Protocol):
    """What a training step draws its questions from: a fixed set, or a corpus per step.

    Implement it to train on questions of your own (docs/extending.md): `TaskCorpus` is one
    (a fixed set), `WorldStream` another (a fresh world per step).
    """

    @property
    def fixed_ids(self) -> tuple[str, ...] | None:
        """The questions a data cursor walks over, in order.

        None when every step draws its pool from its own corpus (`sample_pool`).
        """
        ...

    def corpus(self, step: int) -> TaskCorpus:
        """Step `step`'s questions and index (1-based; a fixed set's are the same every step)."""
        ...

    def seed(self, step: int) -> int | None:
        """The seed of the world step `step` trains on, or None (no world per step)."""
        ...


@dataclass(frozen=True, slots=True)
class TaskCorpus:
    """Questions and the index they are answered from: what one env is built over."""

    name: str
    """What it is, for logs and errors: `world 0`, `world 100007`, a file's path."""
    tasks: TaskSet
    retriever: Retriever
    """Searches the questions' corpus (cached: the engine batches each turn's searches)."""

    def make_env(self, settings: SearchQAConfig) -> SearchQAEnv:
        """An env over these questions and this index, refusing snapshots of another index."""
        return settings.make_env(self.tasks, self.retriever, on_other_index="error")

    # the `TaskSource` of a fixed set: the same questions every step
    @property
    def fixed_ids(self) -> tuple[str, ...]:
        """Every question, in order (`TaskSource.fixed_ids`)."""
        return self.tasks.ids

    def corpus(self, step: int) -> TaskCorpus:
        """This corpus, whatever the step (`TaskSource.corpus`)."""
        return self

    def seed(self, step: int) -> None:
        """None: a fixed set has no world per step (`TaskSource.seed`)."""
        return None


def world_corpus(
    world: World,
    tasks: Sequence[QATask] | None = None,
    *,
    namespaced: bool = True,
    questions: str = "all",
) -> TaskCorpus:
    """A world's questions over its own BM25 index.

    Args:
        world: The world.
        tasks: Which of its questions (default: all).
        namespaced: Prefix each task id with `w{seed}/`, so that ids (and with them the
            predictor's per-question memory and snapshots) never mix two worlds.
        questions: `hard` keeps 3-4-hop bridges, comparisons and inference questions only.
    """
    chosen = world.tasks if tasks is None else tasks
    kept = [t for t in chosen if questions != "hard" or is_hard(t)]
    if namespaced:
        kept = [dataclasses.replace(t, task_id=f"w{world.seed}/{t.task_id}") for t in kept]
    return TaskCorpus(
        name=f"world {world.seed}",
        tasks=TaskSet(kept),
        retriever=CachedRetriever(BM25Retriever.build(world.documents)),
    )


@dataclass(frozen=True, slots=True)
class WorldStream:
    """A freshly generated world per step, with its own index and env, or a bank of them.

    Stateless: step `s`'s world and pool follow from `s` alone, so a resumed run draws exactly
    what an uninterrupted one would, and no data cursor is checkpointed.
    """

    first_seed: int
    config: WorldConfig
    questions: str = "all"
    """`hard`: only 3-4-hop bridges, comparisons and inference questions."""
    bank: int = 0
    """0: a new world every step; K > 0: the K worlds from `first_seed`, in turn, again and
    again (`TaskConfig.stream_bank`)."""

    @property
    def fixed_ids(self) -> None:
        """None: each step draws its pool from its own world (`TaskSource.fixed_ids`)."""
        return None

    def seed(self, step: int) -> int:
        """The world seed of step `step` (1-based).

        >>> [WorldStream(10, WorldConfig(), bank=3).seed(s) for s in range(1, 8)]
        [10, 11, 12, 10, 11, 12, 10]
        """
        return self.first_seed + ((step - 1) % self.bank if self.bank else step - 1)

    def seeds(self, steps: int) -> range:
        """Every world seed a run of `steps` steps trains on."""
        return range(self.first_seed, self.first_seed + (min(steps, self.bank) or steps))

    def corpus(self, step: int) -> TaskCorpus:
        """Step `step`'s world: its questions over its own BM25 index."""
        world = World.generate(self.seed(step), self.config)
        return world_corpus(world, questions=self.questions)


def sample_pool(corpus: TaskCorpus, n: int, *, seed: int, step: int) -> list[str]:
    """`n` distinct questions of `corpus`, drawn by a generator seeded on (seed, step).

    Stateless, so a resumed run draws exactly what an uninterrupted one would.
    """
    ids = corpus.tasks.ids
    rng = np.random.default_rng([seed, step])
    return [ids[i] for i in rng.choice(len(ids), size=min(n, len(ids)), replace=False)]


@dataclass(frozen=True, slots=True)
class Tasks:
    """Where a run's questions come from: the training source and the held-out sets."""

    train: TaskSource
    """A fixed set of questions (one world, a task file), or a stream of fresh worlds."""
    eval: dict[str, tuple[TaskCorpus, ...]]
    """Held-out sets by name (`EvalSetName`), each one or more corpora (`unseen`: one per
    world); the first is the run's primary evaluation."""

    def n_eval(self, name: str) -> int:
        """Questions in held-out set `name`."""
        return sum(len(c.tasks) for c in self.eval.get(name, ()))


def build_tasks(
    task: TaskConfig, eval_sets: Sequence[str] = ("split",), *, train: TaskSource | None = None
) -> Tasks:
    """The training source `task.source` names and the held-out sets `eval_sets` names.

    A `train` source of the caller's own (docs/extending.md) replaces `task.source`'s; the
    held-out sets still come from `task`.

    Raises:
        HarnessError: an unknown held-out set, a task file or index that cannot be read, or a
            set that needs `eval_file` without one.
    """
    unknown = [name for name in eval_sets if name not in EVAL_SETS]
    if unknown:
        raise HarnessError(f"unknown held-out set(s) {unknown}: choose from {list(EVAL_SETS)}")
    if train is None and task.source == "file":
        train = _file_corpus(task, task.train_file)
    elif train is None and task.source == "stream":
        train = WorldStream(task.stream_first_seed, task.world, task.questions, task.stream_bank)
    elif train is None:
        train = _world_split(task, "train")
    return Tasks(
        train=train, eval={name: eval_set(task, name, train) for name in dict.fromkeys(eval_sets)}
    )


class CorpusRouter:
    """The envs of several corpora as one env: `reset` picks the corpus that holds the question.

    A held-out set of many worlds (the fact-disjoint set: 35 worlds of a few questions each)
    is then one evaluation, its episodes batched together, not one small batch per world. Each
    corpus's env is built on its first question.
    """

    def __init__(self, corpora: Sequence[TaskCorpus], settings: SearchQAConfig) -> None:
        self._corpora, self._settings = corpora, settings
        self._corpus_of = {t.task_id: i for i, c in enumerate(corpora) for t in c.tasks}
        self._envs: dict[int, SearchQAEnv] = {}
        self._env: SearchQAEnv | None = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """Reset the env of the corpus that holds `options["task_id"]`."""
        i = self._corpus_of[options["task_id"]]
        if i not in self._envs:
            self._envs[i] = self._corpora[i].make_env(self._settings)
        self._env = self._envs[i]
        return self._env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env of the question `reset` chose."""
        if self._env is None:
            raise RuntimeError("step before reset")
        return self._env.step(action)


@dataclass(frozen=True, slots=True)
class HeldOut:
    """The questions one evaluation of a held-out set plays, and the env they are played in."""

    tasks: list[QATask]
    """The questions in order, each repeated once per sample."""
    corpora: tuple[TaskCorpus, ...]
    settings: SearchQAConfig

    def make_env(self) -> CorpusRouter:
        """An env over every corpus of the set (`evaluate`'s `env_factory`)."""
        return CorpusRouter(self.corpora, self.settings)


def held_out(
    corpora: Sequence[TaskCorpus], n_questions: int, n_samples: int, settings: SearchQAConfig
) -> HeldOut:
    """The first `n_questions` of a held-out set, taken equally from each corpus.

    The training curve (`EvalConfig`), the demo's before/after table and the experiments all
    choose their questions here, so the same counts give the same questions.

    Raises:
        ValueError: `n_questions` or `n_samples` below 1, or no corpus.
    """
    if n_questions < 1 or n_samples < 1 or not corpora:
        raise ValueError(
            f"need corpora, n_questions >= 1 and n_samples >= 1 (got {len(corpora)} corpora, "
            f"{n_questions}, {n_samples})"
        )
    per_corpus = -(-n_questions // len(corpora))  # equally from each corpus, n in all
    chosen = [t for c in corpora for t in c.tasks[:per_corpus]][:n_questions]
    return HeldOut(
        tasks=[t for t in chosen for _ in range(n_samples)],
        corpora=tuple(corpora),
        settings=settings,
    )


def eval_set(
    task: TaskConfig, name: str, train: TaskSource | None = None
) -> tuple[TaskCorpus, ...]:
    """The corpora of held-out set `name` (see the module docstring).

    Args:
        task: The run's task config.
        name: One of `EVAL_SETS`.
        train: The run's training source, when already built (a file source shares its index).

    Raises:
        HarnessError: `split` of a file source without `eval_file`, or an unknown name.
    """
    if name == "split":
        if task.source != "file":
            return (_world_split(task, task.eval_split),)
        if task.eval_file is None:
            raise HarnessError("held-out set 'split' of a task file needs --task.eval-file")
        index = None if train is None else train.corpus(1).retriever  # a file: one corpus
        return (_file_corpus(task, task.eval_file, retriever=index),)
    world = World.generate(task.world_seed, task.world)
    split = world.split()
    if name == "fact_disjoint":
        return _fact_disjoint(world, split.train, task)
    if name == "unseen":
        corpora = [
            world_corpus(World.generate(seed, task.world), questions=task.questions)
            for seed in task.unseen_world_seeds
        ]
        return tuple(_shuffled(c, seed=task.world_seed) for c in corpora)
    if name == "decoy":
        decoy = World.generate(task.decoy_world_seed, task.world)
        corpus = TaskCorpus(
            name=f"world {task.world_seed} questions over world {decoy.seed}'s documents",
            tasks=_filter(task, split.train),
            retriever=CachedRetriever(BM25Retriever.build(decoy.documents)),
        )
        return (_shuffled(corpus, seed=task.world_seed),)  # the split lists them kind by kind
    raise HarnessError(f"unknown held-out set {name!r}: choose from {list(EVAL_SETS)}")


FACT_DISJOINT_PER_KIND = 400
"""Questions per kind the `fact_disjoint` set draws its candidates from (every one a small world
can ask): its training questions chain most of its facts, so few of its own held-out questions
(26 of world 0's 111) avoid them all."""


def fact_disjoint_questions(world: World, train: Sequence[QATask]) -> tuple[World, TaskSet]:
    """The questions world `world` can ask whose hop facts no `train` question chains.

    The candidates are every question the world's templates can ask of its entities: the world
    drawn again with `FACT_DISJOINT_PER_KIND` questions per kind (the same entities and
    documents: only the question draw depends on the count).

    Returns:
        That larger draw of the world (for decompositions), and the questions, with its ids.

    Raises:
        HarnessError: the larger draw changed the world's documents (a generator change).
    """
    config = dataclasses.replace(
        world.config,
        questions_per_kind=max(world.config.questions_per_kind, FACT_DISJOINT_PER_KIND),
    )
    asked = World.generate(world.seed, config)
    if asked.documents != world.documents:
        raise HarnessError(
            f"world {world.seed} with {config.questions_per_kind} questions per kind has other "
            "documents: the fact-disjoint set needs the same corpus"
        )
    seen = frozenset().union(*(world.hop_facts(t.task_id) for t in train))
    return asked, TaskSet(t for t in asked.tasks if not asked.hop_facts(t.task_id) & seen)


def fact_disjoint_set(
    candidates: Sequence[QATask], mix: Mapping[str, int], *, seed: int
) -> list[QATask]:
    """The largest draw of `candidates` whose question kinds hold the proportions of `mix`.

    The fact-disjoint filter keeps few questions of the kinds that chain many facts (a 3-hop
    bridge in a small world nearly always reuses a training fact; comparisons, two facts of
    two entities, mostly survive), so unstratified it is a set of comparisons. This restores
    the world's own mix, fixed before any policy is measured: each kind (`question_kind`)
    `mix` counts and `candidates` offer gets its share of the kinds they offer, the total is
    as large as the scarcest kind allows, and each kind's questions are a seeded draw.

    Args:
        candidates: The fact-disjoint questions, of any kinds.
        mix: Questions per kind of the reference (a world's own questions).
        seed: Seeds the draw and the order of the result.

    Returns:
        The drawn questions, in a seeded shuffle (the first N cover the kinds in proportion).
    """
    by_kind: dict[str, list[QATask]] = {}
    for t in candidates:
        by_kind.setdefault(question_kind(t.question_type, t.n_hops), []).append(t)
    kinds = sorted(k for k in by_kind if mix.get(k, 0) > 0)
    total = sum(mix[k] for k in kinds)
    size = min((len(by_kind[k]) * total // mix[k] for k in kinds), default=0)
    rng = random.Random(seed)
    # size * mix[k] / total <= len(by_kind[k]) for every kind, by the choice of size
    drawn = [t for k in kinds for t in rng.sample(by_kind[k], round(size * mix[k] / total))]
    rng.shuffle(drawn)
    return drawn


def _fact_disjoint(
    world: World, train: Sequence[QATask], task: TaskConfig
) -> tuple[TaskCorpus, ...]:
    """`fact_disjoint_set` of the warm start's worlds, one corpus per world over its index.

    World `world_seed` was trained on its `train` split, each of `task.demo_world_seeds` on
    every question it asks; a world's candidates are its `fact_disjoint_questions`. Their ids
    are prefixed `w{seed}+/`: they are not the worlds' own question ids.
    """
    trained = [(world, train)] + [
        (w, list(w.tasks)) for w in (World.generate(s, task.world) for s in task.demo_world_seeds)
    ]
    candidates: dict[str, QATask] = {}
    for w, questions in trained:
        _, held = fact_disjoint_questions(w, questions)
        for t in _filter(task, held):
            candidates[f"w{w.seed}+/{t.task_id}"] = dataclasses.replace(
                t, task_id=f"w{w.seed}+/{t.task_id}"
            )
    mix = Counter(question_kind(t.question_type, t.n_hops) for t in _filter(task, world.tasks))
    drawn = {t.task_id for t in fact_disjoint_set(list(candidates.values()), mix, seed=world.seed)}
    corpora = []
    for w, _ in trained:
        own = TaskSet(
            t for i, t in candidates.items() if i in drawn and i.startswith(f"w{w.seed}+/")
        )
        if len(own):
            corpora.append(_shuffled(world_corpus(w, own, namespaced=False), seed=w.seed))
    return tuple(corpora)


def _world_split(task: TaskConfig, split_name: str) -> TaskCorpus:
    """A split of world `world_seed` over its index, task ids as the world gives them.

    `split_name`: `all`, `train`, `dev`, `test`, `test_entities`, or `heldout` (test, then
    test_entities).
    """
    world = World.generate(task.world_seed, task.world)
    split = world.split()
    if split_name == "all":
        tasks: Sequence[QATask] = world.tasks
    elif split_name == "heldout":
        tasks = [*split.test, *split.test_entities]
    else:
        tasks = getattr(split, split_name)
    return world_corpus(world, tasks, namespaced=False, questions=task.questions)


def _filter(task: TaskConfig, tasks: Sequence[QATask]) -> TaskSet:
    return TaskSet(t for t in tasks if task.questions != "hard" or is_hard(t))


def _shuffled(corpus: TaskCorpus, *, seed: int) -> TaskCorpus:
    """The corpus with its questions in a seeded shuffle.

    A world lists its questions kind by kind; the first N of the shuffle cover the kinds in
    proportion.
    """
    tasks = list(corpus.tasks)
    random.Random(seed).shuffle(tasks)
    return dataclasses.replace(corpus, tasks=TaskSet(tasks))


def _file_corpus(task: TaskConfig, path: Any, *, retriever: Retriever | None = None) -> TaskCorpus:
    """A task file's questions (any format `tracerl bench` reads) over `task.index`.

    Raises:
        HarnessError: no file or index was given, or either cannot be read.
    """
    if path is None or task.index is None:
        raise HarnessError("--task.source file needs --task.train-file and --task.index")
    try:
        dataset = load_file(path, format=task.file_format)
        if retriever is None:
            retriever = make_retriever(task.index)
    except (OSError, ValueError) as err:  # DatasetFormatError, IndexFormatError are ValueErrors
        raise HarnessError(f"cannot read the task source: {err}") from err
    return TaskCorpus(name=str(path), tasks=_filter(task, dataset.tasks), retriever=retriever)
