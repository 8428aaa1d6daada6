"""BM25 retrieval on bm25s: a sparse, exact, CPU-only index that builds in seconds.

Ranking is deterministic: documents are ordered by score, then by their position in the corpus,
so ties never depend on the batch or on `k`. Only documents that share at least one term with
the query are returned (as pyserini does), so a query with no known term gets no hits.

An index directory holds `manifest.json`, `corpus.jsonl` and bm25s's own files under `bm25s/`
(`.npy` arrays saved without pickle, plus JSON vocab and params).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np
import Stemmer

from retrieval.base import Document, Hit, check_k, check_queries
from retrieval.corpus import corpus_hash, index_text, read_corpus, write_corpus
from retrieval.errors import IndexFormatError, IndexMismatchError
from retrieval.index_files import FileWatch, atomic_directory
from retrieval.manifest import CORPUS_NAME, MANIFEST_NAME, IndexManifest, now_utc, read_manifest

__all__ = ["BM25Params", "BM25Retriever", "top_k_indices"]

log = logging.getLogger(__name__)

_BM25S_DIR = "bm25s"


@dataclass(frozen=True, slots=True, kw_only=True)
class BM25Params:
    """Tokenizer and scoring parameters; part of the index id."""

    stemmer: str | None = "english"
    """A PyStemmer language ("english", "french", …), or None for no stemming."""
    stopwords: str | None = "en"
    """A bm25s stopword list name ("en", …), or None to keep every token."""
    k1: float = 1.5
    b: float = 0.75
    method: str = "lucene"
    """bm25s's scoring variant: "lucene", "robertson", "atire", "bm25l" or "bm25+"."""


def top_k_indices(scores: np.ndarray, k: int, *, min_score: float | None = None) -> np.ndarray:
    """Indices of the `k` best scores, best first, ties broken by the lower index.

    The result does not depend on how ties fall at the k-th place: every tied candidate is
    kept until the final stable ordering.

    Args:
        scores: one score per document, shape (n_docs,).
        k: how many to return (fewer if fewer qualify).
        min_score: if set, only scores strictly above it qualify.

    >>> top_k_indices(np.array([0.5, 2.0, 0.5, 1.0]), 3).tolist()
    [1, 3, 0]
    >>> top_k_indices(np.array([0.0, 2.0, 0.0]), 3, min_score=0.0).tolist()
    [1]
    """
    candidates = np.arange(len(scores)) if min_score is None else np.flatnonzero(scores > min_score)
    if len(candidates) > k:
        cand_scores = scores[candidates]
        kth = np.partition(cand_scores, len(cand_scores) - k)[len(cand_scores) - k]
        candidates = candidates[cand_scores >= kth]  # keeps every tie at the k-th place
    order = np.lexsort((candidates, -scores[candidates]))  # score desc, then index asc
    return np.asarray(candidates[order[:k]])


class BM25Retriever:
    """A BM25 index over a fixed list of documents; meets the `Retriever` protocol.

    Build one with `BM25Retriever.build(documents)` or load one with `BM25Retriever.load(dir)`.
    Searching reads shared arrays only, so one instance may serve many threads and many
    environment forks.

    >>> docs = [Document(doc_id="d1", title="Paris", text="Paris is the capital of France."),
    ...         Document(doc_id="d2", title="Rome", text="Rome is the capital of Italy.")]
    >>> r = BM25Retriever.build(docs)
    >>> [hit.doc_id for hit in r.search(["capital of Italy"], k=2)[0]]
    ['d2', 'd1']
    """

    def __init__(
        self,
        *,
        documents: Sequence[Document],
        model: bm25s.BM25,
        params: BM25Params,
        manifest: IndexManifest,
        watch: FileWatch | None = None,
    ) -> None:
        self._documents = tuple(documents)
        self._model = model
        self._params = params
        self._manifest = manifest
        self._watch = watch  # mapped arrays: refuse once their files change under us

    @classmethod
    def build(
        cls,
        documents: Sequence[Document],
        *,
        stemmer: str | None = "english",
        stopwords: str | None = "en",
        k1: float = 1.5,
        b: float = 0.75,
        method: str = "lucene",
        progress: bool = False,
    ) -> BM25Retriever:
        """Index documents (title and text).

        Args:
            documents: the corpus; ids must be unique.
            stemmer: a PyStemmer language, or None.
            stopwords: a bm25s stopword list name, or None.
            k1: BM25 term-frequency saturation.
            b: BM25 length normalisation.
            method: bm25s's scoring variant.
            progress: draw tqdm bars while tokenising and indexing.

        Raises:
            ValueError: `documents` is empty or has a repeated id.
        """
        if not documents:
            raise ValueError("cannot build a BM25 index over an empty corpus")
        _check_unique_ids(documents)
        params = BM25Params(stemmer=stemmer, stopwords=stopwords, k1=k1, b=b, method=method)
        tokens = bm25s.tokenize(
            [index_text(doc) for doc in documents],
            stopwords=_stopwords(params),
            stemmer=_make_stemmer(params),
            show_progress=progress,
        )
        model = bm25s.BM25(k1=k1, b=b, method=method)
        model.index(tokens, show_progress=progress)
        manifest = IndexManifest(
            kind="bm25",
            corpus_hash=corpus_hash(documents),
            n_documents=len(documents),
            params=asdict(params),
            created_at=now_utc(),
        )
        log.info("built BM25 index %s over %d documents", manifest.index_id, len(documents))
        return cls(documents=documents, model=model, params=params, manifest=manifest)

    @property
    def index_id(self) -> str:
        """A content hash of the corpus, the tokenizer and the BM25 parameters."""
        return self._manifest.index_id

    @property
    def documents(self) -> tuple[Document, ...]:
        """The indexed documents, in corpus order."""
        return self._documents

    @property
    def manifest(self) -> IndexManifest:
        """What this index is and what it was built from."""
        return self._manifest

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top-`k` documents for each query, best first.

        Args:
            queries: the queries; an empty query, or one with no indexed term, gets no hits.
            k: how many hits per query at most; larger than the corpus is fine.

        Returns:
            One list of hits per query, in the queries' order.

        Raises:
            TypeError: `queries` is a string or holds a non-string.
            ValueError: `k` is not a positive integer.
        """
        queries = check_queries(queries)
        k = check_k(k)
        if not queries:
            return []
        if self._watch is not None:
            self._watch.check()
        query_tokens = bm25s.tokenize(
            queries,
            stopwords=_stopwords(self._params),
            stemmer=_make_stemmer(self._params),  # PyStemmer objects are not thread-safe
            return_ids=False,
            show_progress=False,
        )
        results: list[list[Hit]] = []
        for tokens in query_tokens:
            token_ids = self._model.get_tokens_ids(tokens)
            if not token_ids:
                results.append([])
                continue
            scores = self._model.get_scores_from_ids(token_ids)
            best = top_k_indices(scores, k, min_score=0.0)
            results.append([self._hit(int(i), float(scores[i])) for i in best])
        return results

    def _hit(self, position: int, score: float) -> Hit:
        doc = self._documents[position]
        return Hit(doc_id=doc.doc_id, title=doc.title, text=doc.text, score=score)

    def save(self, directory: str | Path) -> None:
        """Write the index to `directory`: manifest, corpus, bm25s arrays.

        The files are written to a new directory beside it that then takes its place in one
        atomic rename: an index already there is replaced whole, or kept whole if the process
        dies first. A non-empty directory that holds no index is refused, not replaced.

        Raises:
            IndexFormatError: `directory` exists and holds something else than an index.
        """
        # built beside it, then swapped in at once: a kill leaves the old index or the new one
        with atomic_directory(directory, marker=MANIFEST_NAME) as work:
            write_corpus(self._documents, work / CORPUS_NAME)
            self._model.save(str(work / _BM25S_DIR), show_progress=False, allow_pickle=False)
            # last: a directory with a manifest is complete, and its table lists what is there
            self._manifest = self._manifest.write(work)
        log.info("saved BM25 index %s to %s", self.index_id, directory)

    @classmethod
    def load(cls, directory: str | Path, *, mmap: bool = False) -> BM25Retriever:
        """Load an index written by `save`.

        Args:
            directory: the index directory.
            mmap: memory-map the score arrays instead of reading them (for big indexes).

        Raises:
            IndexFormatError: files are missing or malformed.
            IndexFileError: a file is missing, of another size or not in the manifest.
            IndexMismatchError: the directory holds another kind of index, or its corpus or
                arrays do not match its manifest.
        """
        directory = Path(directory)
        manifest = read_manifest(directory)
        manifest.expect(kind="bm25")
        documents = read_corpus(directory / CORPUS_NAME)
        manifest.expect(corpus_hash=corpus_hash(documents))
        try:
            params = BM25Params(**manifest.params)
        except TypeError as err:
            raise IndexFormatError(f"{directory}: bad BM25 params {manifest.params}") from err
        try:
            model = bm25s.BM25.load(str(directory / _BM25S_DIR), mmap=mmap, load_corpus=False)
        except (OSError, ValueError, KeyError) as err:
            raise IndexFormatError(f"{directory}: cannot load the bm25s arrays ({err})") from err
        if model.scores["num_docs"] != len(documents):
            raise IndexMismatchError(
                f"{directory}: the bm25s arrays index {model.scores['num_docs']} documents but "
                f"corpus.jsonl holds {len(documents)}; rebuild the index"
            )
        watch = FileWatch(list((directory / _BM25S_DIR).glob("*.npy"))) if mmap else None
        return cls(documents=documents, model=model, params=params, manifest=manifest, watch=watch)


def _check_unique_ids(documents: Sequence[Document]) -> None:
    seen: set[str] = set()
    for doc in documents:
        if doc.doc_id in seen:
            raise ValueError(f"duplicate document id {doc.doc_id!r}; ids must be unique")
        seen.add(doc.doc_id)


def _stopwords(params: BM25Params) -> Any:
    return params.stopwords if params.stopwords is not None else []


def _make_stemmer(params: BM25Params) -> Any:
    if params.stemmer is None:
        return None
    try:
        return Stemmer.Stemmer(params.stemmer)
    except KeyError as err:
        raise ValueError(
            f"unknown stemmer language {params.stemmer!r}; "
            f"choose one of {sorted(Stemmer.algorithms())} or None"
        ) from err
