"""CachedRetriever and normalize_query: determinism, sharing, bounds, errors."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval import CachedRetriever, Retriever, RetrieverUnavailable
from retrieval.cache import normalize_query


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("Who founded Acme?", "who founded acme?"),
        ("  many   spaces\tand\nnewlines  ", "many spaces and newlines"),
        ("ＦＵＬＬＷＩＤＴＨ", "fullwidth"),  # NFKC folds full-width letters
        ("ﬁsh", "fish"),  # and ligatures
        ("", ""),
        (" \u3000 ", ""),  # ideographic space is whitespace after NFKC
    ],
)
def test_normalize_query_examples(raw, want):
    assert normalize_query(raw) == want


@given(st.text())
def test_normalize_query_is_idempotent(query):
    once = normalize_query(query)
    assert normalize_query(once) == once
    assert once == once.strip()
    assert "  " not in once


def test_results_equal_the_inner_retrievers_on_the_normalised_query(toy_bm25):
    cached = CachedRetriever(toy_bm25)
    assert isinstance(cached, Retriever)
    assert cached.index_id == toy_bm25.index_id
    queries = ["Capital of ITALY", "  river  Paris ", "Ｐａｒｉｓ café", "nothing matches zzz"]
    want = toy_bm25.search([normalize_query(q) for q in queries], k=3)
    assert cached.search(queries, k=3) == want  # misses
    assert cached.search(queries, k=3) == want  # hits


def test_every_spelling_of_a_query_gets_the_same_hits_whichever_came_first(counting_cls):
    a, b = counting_cls(), counting_cls()
    first_a = CachedRetriever(a).search(["Acme  Corp"], k=2)
    first_b = CachedRetriever(b).search(["acme corp"], k=2)
    assert first_a == first_b
    assert a.calls == b.calls == [(["acme corp"], 2)]


def test_misses_go_to_the_inner_retriever_once_per_distinct_key(counting):
    cached = CachedRetriever(counting)
    cached.search(["A", "a ", "B"], k=2)
    assert counting.calls == [(["a", "b"], 2)]
    cached.search(["b", "C", "A"], k=2)
    assert counting.calls[1] == (["c"], 2)
    cached.search(["a"], k=3)  # k is part of the key
    assert counting.calls[2] == (["a"], 3)
    stats = cached.stats()
    assert (stats.n_misses, stats.n_hits, stats.n_entries) == (4, 3, 4)


def test_callers_cannot_change_what_is_cached(counting):
    cached = CachedRetriever(counting)
    first = cached.search(["q"], k=2)
    first[0].clear()
    first.append([])
    assert len(cached.search(["q"], k=2)[0]) == 2


def test_the_cache_is_bounded_and_evicts_least_recently_used(counting):
    cached = CachedRetriever(counting, max_entries=2)
    cached.search(["a"], k=1)
    cached.search(["b"], k=1)
    cached.search(["a"], k=1)  # a is now the most recent
    cached.search(["c"], k=1)  # evicts b
    assert cached.stats().n_entries == 2
    n_calls = len(counting.calls)
    cached.search(["a"], k=1)
    assert len(counting.calls) == n_calls
    cached.search(["b"], k=1)
    assert counting.calls[-1] == (["b"], 1)
    with pytest.raises(ValueError, match="max_entries"):
        CachedRetriever(counting, max_entries=0)


def test_an_inner_failure_propagates_and_caches_nothing(counting_cls):
    inner = counting_cls(fail=True)
    cached = CachedRetriever(inner)
    with pytest.raises(RetrieverUnavailable):
        cached.search(["q"], k=1)
    assert cached.stats().n_entries == 0
    inner.fail = False
    assert cached.search(["q"], k=1)[0][0].doc_id == "q#0"


def test_bad_arguments_raise_before_touching_the_inner_retriever(counting):
    cached = CachedRetriever(counting)
    with pytest.raises(TypeError):
        cached.search("q", k=1)
    with pytest.raises(ValueError):
        cached.search(["q"], k=0)
    assert counting.calls == []


def test_threads_sharing_one_cache_all_see_the_inner_results(toy_bm25):
    cached = CachedRetriever(toy_bm25, max_entries=3)  # small, so threads also evict
    queries = ["capital", "river", "Berlin", "France", "Italy", "computer"] * 40
    want = {q: toy_bm25.search([q.lower()], k=3)[0] for q in set(queries)}
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: cached.search([q], k=3)[0], queries))
    assert got == [want[q] for q in queries]
    stats = cached.stats()
    assert stats.n_hits + stats.n_misses == len(queries)
    assert stats.n_entries <= 3
