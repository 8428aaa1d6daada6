"""Issue 25: a turn's batched searches share one deadline, and a failed batch ends its episodes.

Before, `prefetch_searches` called the retriever outside any deadline (the client's 4 x 30 s
retry budget), then every searching episode asked again under its own deadline, one after the
other: a turn of N episodes on a hung server cost 121 s + N deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from benchmarks.perf.hostile import HostileServer
from envs import QATask, SearchQAEnv, TaskSet
from harness.policies import Completion, SamplingParams
from harness.rollout.episodes import EpisodeCodec, apply_turn, start_episodes
from retrieval import HTTPRetriever
from retrieval.cache import CachedRetriever

DEADLINE_S = 1.0


class CharTokenizer:
    """One token per character."""

    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(map(chr, ids))


def test_a_hung_server_costs_a_turn_one_deadline_and_fails_its_searching_episodes_once():
    n = 16
    tasks = TaskSet(
        [QATask(task_id=f"q{i}", question=f"Who is {i}?", golden_answers=("x",)) for i in range(n)]
    )
    codec = EpisodeCodec(CharTokenizer())
    actions = [f"<search> who is {i} </search>" for i in range(n - 1)] + ["<answer> x </answer>"]
    completions = [
        Completion(token_ids=tuple(codec.encode_text(a)), text=a, finish_reason="stop")
        for a in actions
    ]
    with HostileServer("hung") as server:
        remote = HTTPRetriever(server.url, index_id="hung")  # the default 4 x 30 s budget
        env = SearchQAEnv(tasks, CachedRetriever(remote), retrieval_deadline_s=DEADLINE_S)
        live = start_episodes(env, [t.task_id for t in tasks], codec)
        start = time.monotonic()
        apply_turn(live, completions, codec, SamplingParams(max_new_tokens=64))
        took = time.monotonic() - start
        remote.close()
    assert took <= DEADLINE_S + 2.0
    assert [e.info.get("failed") for e in live[:-1]] == ["retrieval"] * (n - 1)
    assert all(e.done and e.reward == 0.0 for e in live[:-1])
    assert [e.info["turn_idx"] for e in live[:-1]] == [0] * (n - 1)  # the envs never stepped
    answered = live[-1]
    assert answered.done and "failed" not in answered.info and answered.reward == 1.0
