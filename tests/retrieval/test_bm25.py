"""BM25Retriever: ranking against a brute-force reference, determinism, persistence."""

from __future__ import annotations

import json
import math
import shutil
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from retrieval import (
    BM25Retriever,
    Document,
    IndexFormatError,
    IndexMismatchError,
    Retriever,
    write_corpus,
)
from retrieval.bm25 import top_k_indices
from retrieval.errors import IndexFileError


def test_meets_the_retriever_protocol(toy_bm25):
    assert isinstance(toy_bm25, Retriever)
    assert toy_bm25.index_id.startswith("bm25-")


def test_finds_the_relevant_document_first(toy_bm25):
    results = toy_bm25.search(["capital of Italy", "river through Paris", "Z3 computer"], k=3)
    assert [hits[0].doc_id for hits in results] == ["d1", "d3", "d6"]
    for hits in results:
        assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)
        assert all(h.score > 0 for h in hits)


def test_hits_carry_the_document_fields(toy_bm25, toy_docs):
    hit = toy_bm25.search(["Konrad Zuse"], k=1)[0][0]
    doc = toy_docs[6]
    assert (hit.doc_id, hit.title, hit.text) == (doc.doc_id, doc.title, doc.text)
    assert hit.contents == doc.contents


def test_k_larger_than_the_corpus_returns_only_matching_documents(toy_bm25):
    hits = toy_bm25.search(["capital"], k=1000)[0]
    assert {h.doc_id for h in hits} == {"d0", "d1", "d2"}


def test_queries_without_indexed_terms_get_no_hits(toy_bm25):
    assert toy_bm25.search(["", "   ", "the of and", "xylophone"], k=3) == [[], [], [], []]
    assert toy_bm25.search([], k=3) == []


def test_bad_arguments_raise_clear_errors(toy_bm25):
    with pytest.raises(TypeError, match="not one string"):
        toy_bm25.search("capital", k=3)
    with pytest.raises(TypeError, match=r"queries\[1\] is a int"):
        toy_bm25.search(["a", 3], k=3)
    for bad_k in (0, -1, 2.0, True, "3"):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            toy_bm25.search(["a"], k=bad_k)
    assert toy_bm25.search(["capital"], k=np.int64(1))[0][0].doc_id in {"d0", "d1", "d2"}


def test_build_rejects_empty_corpora_duplicate_ids_and_unknown_stemmers(toy_docs):
    with pytest.raises(ValueError, match="empty corpus"):
        BM25Retriever.build([])
    with pytest.raises(ValueError, match="duplicate document id 'd0'"):
        BM25Retriever.build([*toy_docs, toy_docs[0]])
    with pytest.raises(ValueError, match="unknown stemmer language 'klingon'"):
        BM25Retriever.build(toy_docs, stemmer="klingon")


def test_stemming_and_stopwords_are_configurable(toy_docs):
    stemmed = BM25Retriever.build(toy_docs)
    plain = BM25Retriever.build(toy_docs, stemmer=None, stopwords=None)
    # "rivers" only matches "river" through the stemmer; "the" only counts without stopwords
    assert stemmed.search(["rivers"], k=5)[0]
    assert plain.search(["rivers"], k=5) == [[]]
    assert plain.search(["the"], k=10)[0]
    assert stemmed.search(["the"], k=10) == [[]]
    assert stemmed.index_id != plain.index_id


# -- ranking against a brute-force reference on tiny corpora with many ties --------------

WORDS = ["alpha", "beta", "gamma", "delta", "omega"]
tiny_corpora = st.lists(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=6).map(" ".join),
    min_size=1,
    max_size=12,
)
tiny_queries = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)


def _reference_ranking(texts: list[str], query: str, k: int) -> list[tuple[int, float]]:
    """bm25s's "lucene" BM25 written out longhand; ties go to the earlier document."""
    k1, b = 1.5, 0.75
    docs = [Counter(text.split()) for text in texts]
    avgdl = sum(sum(d.values()) for d in docs) / len(docs)
    scored = []
    for i, doc in enumerate(docs):
        dl = sum(doc.values())
        score = 0.0
        for term in query.split():
            df = sum(1 for d in docs if term in d)
            if not doc[term]:
                continue
            idf = math.log(1 + (len(docs) - df + 0.5) / (df + 0.5))
            score += idf * doc[term] / (doc[term] + k1 * (1 - b + b * dl / avgdl))
        if score > 0:
            scored.append((i, score))
    scored.sort(key=lambda pair: (-pair[1], pair[0]))
    return scored[:k]


@given(texts=tiny_corpora, query=tiny_queries, k=st.integers(1, 15))
def test_ranking_matches_a_brute_force_bm25(texts, query, k):
    # the title is empty, so the indexed text is exactly `text`
    docs = [Document(doc_id=f"d{i}", title="", text=t) for i, t in enumerate(texts)]
    retriever = BM25Retriever.build(docs, stemmer=None, stopwords=None)
    got = [(int(h.doc_id[1:]), h.score) for h in retriever.search([query], k=k)[0]]
    want = _reference_ranking(texts, query, k)
    assert [i for i, _ in got] == [i for i, _ in want]
    np.testing.assert_allclose([s for _, s in got], [s for _, s in want], rtol=1e-5)


@given(texts=tiny_corpora, queries=st.lists(tiny_queries, max_size=5), k=st.integers(1, 15))
def test_a_batch_equals_its_queries_one_by_one_and_smaller_k_is_a_prefix(texts, queries, k):
    docs = [Document(doc_id=f"d{i}", title="", text=t) for i, t in enumerate(texts)]
    retriever = BM25Retriever.build(docs, stemmer=None, stopwords=None)
    batch = retriever.search(queries, k=k)
    assert batch == [retriever.search([q], k=k)[0] for q in queries]
    assert [hits[:1] for hits in batch] == [hits for hits in retriever.search(queries, k=1)]


@given(scores=st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=30))
def test_top_k_indices_is_a_stable_sort_by_descending_score(scores):
    arr = np.array(scores)
    want = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    for k in (1, 3, len(scores)):
        assert top_k_indices(arr, k).tolist() == want[:k]
    positive = [i for i in want if scores[i] > 0]
    assert top_k_indices(arr, len(scores), min_score=0.0).tolist() == positive


def test_concurrent_searches_from_threads_match_sequential(toy_bm25):
    queries = ["capital", "river Paris", "Berlin computer", "France Italy mountains"] * 25
    want = toy_bm25.search(queries, k=4)
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda q: toy_bm25.search([q], k=4)[0], queries))
    assert got == want


# -- persistence --------------------------------------------------------------------------


def test_save_then_load_gives_identical_results(tmp_path: Path, toy_bm25, toy_docs):
    toy_bm25.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["kind"] == "bm25"
    assert manifest["n_documents"] == len(toy_docs)
    assert manifest["index_id"] == toy_bm25.index_id
    assert manifest["params"]["stemmer"] == "english"
    assert not list((tmp_path / "idx").rglob("*.pkl"))
    for mmap in (False, True):
        loaded = BM25Retriever.load(tmp_path / "idx", mmap=mmap)
        assert loaded.index_id == toy_bm25.index_id
        assert loaded.documents == toy_bm25.documents
        queries = ["capital of Italy", "river", "café Paris", "nothing here"]
        assert loaded.search(queries, k=5) == toy_bm25.search(queries, k=5)


def test_index_id_is_a_content_hash(toy_docs):
    a = BM25Retriever.build(toy_docs)
    assert BM25Retriever.build(list(toy_docs)).index_id == a.index_id
    assert BM25Retriever.build(toy_docs[:-1]).index_id != a.index_id
    assert BM25Retriever.build(toy_docs, k1=1.2).index_id != a.index_id
    assert BM25Retriever.build(toy_docs, stopwords=None).index_id != a.index_id


def test_loading_a_changed_corpus_raises_a_mismatch(tmp_path: Path, toy_bm25, toy_docs):
    toy_bm25.save(tmp_path / "idx")
    write_corpus(
        [*toy_docs[:-1], Document(doc_id="d7", title="X", text="edited")],
        tmp_path / "idx" / "corpus.jsonl",
    )
    # a corpus of another size is refused by the file table, one of the same size by its hash
    with pytest.raises((IndexMismatchError, IndexFileError), match="rebuild"):
        BM25Retriever.load(tmp_path / "idx")


def test_loading_broken_directories_raises_format_errors(tmp_path: Path, toy_bm25):
    with pytest.raises(IndexFormatError, match="does not exist"):
        BM25Retriever.load(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(IndexFormatError, match="not an index directory"):
        BM25Retriever.load(tmp_path / "empty")
    toy_bm25.save(tmp_path / "idx")
    manifest_path = tmp_path / "idx" / "manifest.json"
    good = manifest_path.read_text()
    manifest_path.write_text("{oops")
    with pytest.raises(IndexFormatError, match="unreadable manifest"):
        BM25Retriever.load(tmp_path / "idx")
    manifest_path.write_text(good.replace('"schema_version": 1', '"schema_version": 99'))
    with pytest.raises(IndexFormatError, match="schema_version 99"):
        BM25Retriever.load(tmp_path / "idx")
    manifest_path.write_text(good.replace('"k1": 1.5', '"k1": 2.5'))
    with pytest.raises(IndexMismatchError, match="does not match its fields"):
        BM25Retriever.load(tmp_path / "idx")
    manifest_path.write_text(good)
    shutil.rmtree(tmp_path / "idx" / "bm25s")
    with pytest.raises(IndexFileError, match=r"bm25s/\S+ is missing"):
        BM25Retriever.load(tmp_path / "idx")
