"""MicroBatcher: concurrent requests share retriever calls, and each gets its own rows."""

from __future__ import annotations

import asyncio
import threading

import pytest

from retrieval import RetrievalError
from retrieval.batching import BatchingConfig, MicroBatcher, ServerBusy


def _run(coro):
    return asyncio.run(coro)


async def _with_batcher(retriever, config, body):
    batcher = MicroBatcher(retriever, config)
    await batcher.start()
    try:
        return await body(batcher), batcher.stats()
    finally:
        await batcher.stop()


def test_concurrent_requests_are_merged_and_answered_in_order(counting):
    requests = [[f"q{i}", f"q{i + 1}"] for i in range(50)]

    async def body(batcher):
        return await asyncio.gather(*(batcher.search(qs, 3) for qs in requests))

    results, stats = _run(_with_batcher(counting, BatchingConfig(max_wait_ms=0), body))
    assert results == [counting.search(qs, 3) for qs in requests]
    assert stats.n_requests == 50
    assert stats.n_batches < 50
    # each distinct query is searched once per batch: q0..q50 are 51 queries
    assert stats.n_searched == 51
    assert len(counting.calls) == stats.n_batches + 50  # + the reference calls above


def test_a_group_s_repeated_queries_are_searched_once(counting):
    # GRPO: 8 samples of each of 3 prompts, most opening with their prompt's same search
    requests = [
        [f"prompt {p}" if s < 7 else f"prompt {p} v{s}"] for p in range(3) for s in range(8)
    ]

    async def body(batcher):
        return await asyncio.gather(*(batcher.search(qs, 3) for qs in requests))

    results, stats = _run(_with_batcher(counting, BatchingConfig(max_wait_ms=50), body))
    assert results == [counting.search(qs, 3) for qs in requests]  # each gets its own answer
    assert stats.n_batches == 1
    assert (stats.n_queries, stats.n_searched) == (24, 6)
    assert sorted(counting.calls[0][0]) == sorted({q for qs in requests for q in qs})


def test_batching_off_gives_one_retriever_call_per_request(counting):
    async def body(batcher):
        return await asyncio.gather(*(batcher.search([f"q{i}"], 2) for i in range(20)))

    results, stats = _run(_with_batcher(counting, BatchingConfig(max_batch_queries=1), body))
    assert [r[0][0].doc_id for r in results] == [f"q{i}#0" for i in range(20)]
    assert stats.n_batches == 20
    assert all(len(queries) == 1 for queries, _ in counting.calls)


def test_batches_respect_the_query_limit(counting):
    async def body(batcher):
        return await asyncio.gather(*(batcher.search([f"a{i}", f"b{i}"], 1) for i in range(10)))

    _, stats = _run(_with_batcher(counting, BatchingConfig(max_batch_queries=6), body))
    assert stats.largest_batch <= 6
    assert all(len(queries) <= 6 for queries, _ in counting.calls)


def test_requests_with_different_k_get_their_own_k(counting):
    async def body(batcher):
        return await asyncio.gather(batcher.search(["x"], 1), batcher.search(["x"], 4))

    (one, four), _ = _run(_with_batcher(counting, BatchingConfig(), body))
    assert len(one[0]) == 1 and len(four[0]) == 4


def test_a_retriever_failure_reaches_every_request_of_the_batch(counting_cls):
    async def body(batcher):
        return await asyncio.gather(
            *(batcher.search([f"q{i}"], 1) for i in range(5)), return_exceptions=True
        )

    results, _ = _run(_with_batcher(counting_cls(fail=True), BatchingConfig(), body))
    assert all(isinstance(r, RetrievalError) for r in results)


def test_a_full_queue_refuses_new_requests(counting):
    async def body(batcher):
        return await asyncio.gather(
            *(batcher.search([f"q{i}"] * 3, 1) for i in range(4)), return_exceptions=True
        )

    results, _ = _run(_with_batcher(counting, BatchingConfig(max_pending_queries=7), body))
    busy = [r for r in results if isinstance(r, ServerBusy)]
    assert len(busy) == 2  # 3 + 3 queued fit under 7; the next two do not
    assert all("retry" in str(b) for b in busy)


def test_searching_before_start_is_an_error(counting):
    async def body():
        await MicroBatcher(counting).search(["q"], 1)

    with pytest.raises(RetrievalError, match="start"):
        _run(body())


def test_invalid_batching_config_is_rejected():
    with pytest.raises(ValueError, match="positive"):
        BatchingConfig(max_batch_queries=0)
    with pytest.raises(ValueError, match="positive"):
        BatchingConfig(max_wait_ms=-1)


def test_searches_run_in_one_thread_set_up_once(counting):
    # faiss's OpenMP thread count holds per thread: the setup must reach the searching thread
    set_up, searched_in = [], set()

    class Recording:
        index_id = counting.index_id

        def search(self, queries, k):
            searched_in.add(threading.get_ident())
            return counting.search(queries, k)

    async def body():
        batcher = MicroBatcher(
            Recording(),
            BatchingConfig(max_batch_queries=1),
            thread_setup=lambda: set_up.append(threading.get_ident()),
        )
        await batcher.start()
        try:
            await asyncio.gather(*(batcher.search([f"q{i}"], 1) for i in range(20)))
        finally:
            await batcher.stop()

    _run(body())
    assert len(set_up) == 1
    assert searched_in == set(set_up)
    assert threading.get_ident() not in searched_in


def test_a_small_request_is_not_held_up_by_a_large_one_queued_first(counting):
    # the retriever's time grows with its batch, as a real index's does
    class Timed(type(counting)):
        def search(self, queries, k):
            threading.Event().wait(0.001 * len(queries))
            return super().search(queries, k)

    retriever = Timed()
    finished: list[str] = []

    async def body(batcher):
        async def ask(name, queries):
            rows = await batcher.search(queries, 2)
            finished.append(name)
            return rows

        large = asyncio.create_task(ask("large", [f"big {i}" for i in range(512)]))
        await asyncio.sleep(0.005)  # the large request is queued and being searched first
        small = asyncio.create_task(ask("small", ["small one"]))
        return await large, await small

    config = BatchingConfig(max_wait_ms=0, slice_queries=32)
    (large, small), stats = _run(_with_batcher(retriever, config, body))
    assert finished == ["small", "large"]  # it rode a slice batch, not after all 512 queries
    assert large == counting.search([f"big {i}" for i in range(512)], 2)  # whole, in order
    assert small == counting.search(["small one"], 2)
    assert stats.n_queries == 513 and stats.largest_batch <= 512
