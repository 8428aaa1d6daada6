"""The fork law (docs/design.md §3) as a Hypothesis state machine.

An original env is driven by random actions (valid searches and answers, invalid text, resets
with and without a seed). Along the way the machine makes copies of it: forks, forks of forks,
and envs restored from snapshots that went through JSON (into fresh envs built on another
retriever instance). Every copy is then stepped with the same actions as the original, and
must give identical observations, rewards, flags and infos; a fork stepped on its own must
leave the original untouched.
"""

from __future__ import annotations

import json

from env_fakes import SMALL
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from envs import EnvSnapshot, SearchQAEnv, World
from retrieval.bm25 import BM25Retriever

WORLD = World.generate(5, SMALL)
RETRIEVER = BM25Retriever.build(WORLD.documents)
OTHER_RETRIEVER = BM25Retriever.build(WORLD.documents)  # restored envs get an equal, other one
TASK_IDS = list(WORLD.tasks.ids)
QUERIES = sorted({s.query for t in TASK_IDS for s in WORLD.decomposition(t).steps})
ANSWERS = sorted({WORLD.decomposition(t).answer for t in TASK_IDS})

ACTIONS = st.one_of(
    st.sampled_from(QUERIES).map(lambda q: f"<think>hop</think><search> {q} </search>"),
    st.sampled_from(QUERIES).map(lambda q: f"<search>{q.upper()}</search> trailing"),
    st.sampled_from(ANSWERS).map(lambda a: f"<answer> {a} </answer>"),
    st.text(max_size=40),
)


def _make_env(retriever=RETRIEVER) -> SearchQAEnv:
    return SearchQAEnv(WORLD.tasks, retriever, max_turns=5, top_k=2, reward="format")


class ForkLaw(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.original = _make_env()
        self.copies: list[SearchQAEnv] = []
        self.over = True

    def _all(self) -> list[SearchQAEnv]:
        return [self.original, *self.copies]

    @rule(task=st.none() | st.sampled_from(TASK_IDS), seed=st.none() | st.integers(0, 2**16))
    def reset(self, task, seed):
        options = None if task is None else {"task_id": task}  # None: drawn with np_random
        results = [env.reset(seed=seed, options=options) for env in self._all()]
        assert all(r == results[0] for r in results)
        self.over = False

    @precondition(lambda self: not self.over)
    @rule(action=ACTIONS)
    def step(self, action):
        results = [env.step(action) for env in self._all()]
        for result in results[1:]:
            assert result == results[0]
        self.over = results[0][2] or results[0][3]

    @rule(data=st.data())
    def fork(self, data):
        source = data.draw(st.sampled_from(self._all()))
        self.copies.append(source.fork()[0])

    @rule(data=st.data())
    def restore_from_json(self, data):
        source = data.draw(st.sampled_from(self._all()))
        text = json.dumps(source.snapshot().to_dict())
        fresh = _make_env(OTHER_RETRIEVER)
        fresh.restore(EnvSnapshot.from_dict(json.loads(text)))
        self.copies.append(fresh)

    @rule(data=st.data())
    def restore_in_place(self, data):
        if self.copies:
            target = data.draw(st.sampled_from(self.copies))
            target.restore(self.original.snapshot())

    @precondition(lambda self: not self.over)
    @rule(action=ACTIONS)
    def diverging_fork_leaves_the_original_alone(self, action):
        before = self.original.snapshot()
        branch = self.original.fork()[0]
        branch.step(action)
        assert self.original.snapshot() == before

    @invariant()
    def every_copy_holds_the_same_state(self):
        snap = self.original.snapshot()
        for env in self.copies:
            assert env.snapshot() == snap
        if len(self.copies) > 6:
            del self.copies[:-3]  # keep the machine fast; later copies descend from earlier ones


# a quarter of the profile's examples (50 under `ci`), each up to 30 rules long
ForkLaw.TestCase.settings = settings(
    max_examples=settings().max_examples // 4, stateful_step_count=30
)
test_fork_law = ForkLaw.TestCase
