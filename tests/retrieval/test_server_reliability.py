"""Reliability on loopback against a real server process: load, faults, bad input.

Counts and times are bounded: 10,000 requests at concurrency 64; a kill and restart.
"""

from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import psutil
import pytest

from envs.errors import RetrievalFailedError
from envs.search_qa import SearchQAEnv
from envs.synthetic import World
from retrieval import BM25Retriever, HTTPRetriever, RetrieverUnavailable

N_REQUESTS = 10_000
CONCURRENCY = 64


@pytest.mark.slow
def test_10k_requests_at_concurrency_64_match_in_process_search(
    tmp_path, synthetic_index, server_cls, query_maker
):
    retriever, index_dir = synthetic_index
    server = server_cls(index_dir, tmp_path / "server.log")
    server.start()
    try:
        pool = query_maker(300)
        # request i: 1-3 queries from the pool, k in {1, 3, 5}
        plan = [
            ([pool[(i * 7 + j) % len(pool)] for j in range(1 + i % 3)], (1, 3, 5)[i % 3])
            for i in range(N_REQUESTS)
        ]
        want = {
            (q, k): hits
            for k in (1, 3, 5)
            for q, hits in zip(pool, retriever.search(pool, k=k), strict=True)
        }
        process = psutil.Process(server.proc.pid)

        async def run() -> tuple[list[str], int, int]:
            # 64 clients, each with its own connection; one attempt, so no retry hides an error
            remotes = [
                HTTPRetriever(server.url, max_attempts=1, max_connections=1)
                for _ in range(CONCURRENCY)
            ]
            errors: list[str] = []
            next_i = 0
            rss_warm = 0

            async def client(remote: HTTPRetriever) -> None:
                nonlocal next_i, rss_warm
                while next_i < len(plan):
                    i = next_i
                    next_i += 1
                    if i == 1_000:
                        rss_warm = process.memory_info().rss
                    queries, k = plan[i]
                    try:
                        got = await remote.asearch(queries, k=k)
                    except Exception as err:
                        errors.append(f"request {i}: {err!r}")
                        continue
                    if got != [want[(q, k)] for q in queries]:
                        errors.append(f"request {i}: results differ from in-process search")

            try:
                await asyncio.gather(*(client(r) for r in remotes))
            finally:
                await asyncio.gather(*(r.aclose() for r in remotes))
            return errors, rss_warm, process.memory_info().rss

        errors, rss_warm, rss_end = asyncio.run(run())
        assert errors == []
        health = httpx.get(server.url + "/health").json()
        assert health["stats"]["n_requests"] == N_REQUESTS
        assert health["stats"]["n_batches"] < N_REQUESTS  # concurrent requests were merged
        # bounded memory: 9,000 requests after the warm-up grow the server by under 64 MiB
        assert rss_end - rss_warm < 64 * 2**20, (rss_warm, rss_end)
    finally:
        server.stop()


def _rollouts(n: int, pool: list[str]) -> list[list[str]]:
    """n "rollouts", each a sequence of 3 search queries."""
    return [[pool[(r * 3 + t) % len(pool)] for t in range(3)] for r in range(n)]


def test_killing_the_server_mid_batch_raises_typed_errors_and_a_restart_resumes_exactly(
    tmp_path, synthetic_index, server_cls, query_maker
):
    retriever, index_dir = synthetic_index
    server = server_cls(index_dir, tmp_path / "server.log")
    server.start()
    port = server.port
    rollouts = _rollouts(24, query_maker(100))
    k = 3
    expected = [[retriever.search([q], k=k)[0] for q in rollout] for rollout in rollouts]
    # the server restarts at once: no circuit breaker, which would skip it for breaker_s
    remote = HTTPRetriever(server.url, max_attempts=3, backoff_s=0.01, timeout_s=10.0, breaker_s=0)
    completed: dict[int, list] = {}  # rollout index -> its results
    progress: dict[int, list] = {r: [] for r in range(len(rollouts))}
    failures: dict[int, BaseException] = {}
    killed = threading.Event()
    n_done_before_kill = 8
    lock = threading.Lock()

    def run_rollout(r: int) -> None:
        for turn, query in enumerate(rollouts[r]):
            if r == n_done_before_kill and turn == 1:
                with lock:
                    if not killed.is_set():
                        server.kill()  # mid-rollout, with other rollouts in flight
                        killed.set()
            try:
                hits = remote.search([query], k=k)[0]
            except Exception as err:
                failures[r] = err
                return  # this rollout stops; its finished turns stay in `progress`
            progress[r].append(hits)
        completed[r] = progress[r]

    try:
        # the first rollouts finish before the kill
        for r in range(n_done_before_kill):
            run_rollout(r)
        assert sorted(completed) == list(range(n_done_before_kill))
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(run_rollout, range(n_done_before_kill, len(rollouts))))
        assert killed.is_set()
        assert failures, "every rollout after the kill should have failed"
        for err in failures.values():
            assert isinstance(err, RetrieverUnavailable)
            assert f"{server.url}/retrieve failed 3 times" in str(err)
        # nothing that finished was lost or changed, and partial rollouts kept their turns
        for r, results in completed.items():
            assert results == expected[r]
        for r in failures:
            assert progress[r] == expected[r][: len(progress[r])]

        server.start(port=port)  # same address: the same client object must just work again
        assert server.port == port
        for r in sorted(failures):
            resumed = progress[r] + [
                remote.search([q], k=k)[0] for q in rollouts[r][len(progress[r]) :]
            ]
            assert resumed == expected[r]
    finally:
        remote.close()
        server.stop()


BAD_BODIES = {
    "empty query list": json.dumps({"queries": []}).encode(),
    "empty query": json.dumps({"queries": ["ok", ""]}).encode(),
    "blank query": json.dumps({"queries": [" \t\n"]}).encode(),
    "100 kB query": json.dumps({"queries": ["x" * 100_000]}).encode(),
    "non-UTF-8 bytes": b'{"queries": ["\xc3\x28 broken"]}',
    "latin-1 body": '{"queries": ["café"]}'.encode("latin-1"),
    "queries is a string": json.dumps({"queries": "capital"}).encode(),
    "queries holds numbers": json.dumps({"queries": [1, 2.5]}).encode(),
    "queries holds objects": json.dumps({"queries": [{"q": "x"}]}).encode(),
    "topk is a string": json.dumps({"queries": ["a"], "topk": "3"}).encode(),
    "topk is negative": json.dumps({"queries": ["a"], "topk": -1}).encode(),
    "return_scores is a string": json.dumps({"queries": ["a"], "return_scores": "no"}).encode(),
    "malformed JSON": b'{"queries": ["a"',
    "JSON array": b'["a"]',
    "lone surrogate": b'{"queries": ["\\ud83d"]}',
    "2 MB body": json.dumps({"queries": ["x" * 1000] * 2000}).encode(),
}


def test_bad_input_gets_a_clear_4xx_and_never_a_500(toy_server, toy_bm25):
    with httpx.Client(base_url=toy_server.url, timeout=30) as http:
        for name, body in BAD_BODIES.items():
            response = http.post(
                "/retrieve", content=body, headers={"content-type": "application/json"}
            )
            assert 400 <= response.status_code < 500, (name, response.status_code, response.text)
            assert response.json()["detail"], name
        # and the server is unharmed
        ok = http.post("/retrieve", json={"queries": ["capital"], "topk": 2, "return_scores": True})
        assert ok.status_code == 200
        assert [r["document"]["id"] for r in ok.json()["result"][0]] == [
            h.doc_id for h in toy_bm25.search(["capital"], k=2)[0]
        ]


def _scripted_actions(task) -> list[str]:
    """Search the question, search the gold answer, answer it: three turns of a rollout."""
    gold = task.golden_answers[0]
    return [f"<search> {task.question} </search>", f"<search> {gold} </search>",
            f"<answer> {gold} </answer>"]  # fmt: skip


def _rollout(env, task, actions):
    env.reset(seed=0, options={"task_id": task.task_id})
    return [env.step(a) for a in actions]


def test_killing_the_server_mid_rollouts_leaves_envs_unchanged_and_retryable(tmp_path, server_cls):
    world = World.generate(0)
    local = BM25Retriever.build(world.documents)
    local.save(tmp_path / "index")
    tasks = list(world.tasks)[:10]
    server = server_cls(tmp_path / "index", tmp_path / "server.log")
    server.start()
    port = server.port
    # the server restarts at once: no circuit breaker, which would skip it for breaker_s
    remote = HTTPRetriever(server.url, max_attempts=3, backoff_s=0.01, timeout_s=10.0, breaker_s=0)
    reference = SearchQAEnv(world.tasks, local)
    env = SearchQAEnv(world.tasks, remote)
    try:
        expected = [_rollout(reference, t, _scripted_actions(t)) for t in tasks]
        completed = [_rollout(env, t, _scripted_actions(t)) for t in tasks[:6]]
        assert completed == expected[:6]

        # rollout 6 takes one turn, then forks into three continuations; the server dies
        task = tasks[6]
        actions = _scripted_actions(task)
        env.reset(seed=0, options={"task_id": task.task_id})
        first = env.step(actions[0])
        branches = [env, *env.fork(3)]
        before = [b.snapshot().to_dict() for b in branches]
        server.kill()
        for branch in branches:
            with pytest.raises(RetrievalFailedError) as info:
                branch.step(actions[1])
            assert isinstance(info.value.__cause__, RetrieverUnavailable)
            assert f"{server.url}/retrieve failed 3 times" in str(info.value.__cause__)
        # the failed step changed nothing, and finished rollouts are intact
        assert [b.snapshot().to_dict() for b in branches] == before
        assert completed == expected[:6]

        server.start(port=port)
        for branch in branches:
            resumed = [first, *(branch.step(a) for a in actions[1:])]
            assert resumed == expected[6]
        finished = [_rollout(env, t, _scripted_actions(t)) for t in tasks[7:]]
        assert finished == expected[7:]
    finally:
        remote.close()
        server.stop()
