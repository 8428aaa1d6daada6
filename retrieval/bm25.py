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
from retrieval.errors import IndexFileError, IndexFormatError, IndexMismatchError
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
        directory: Path | None = None,
    ) -> None:
        self._documents = tuple(documents)
        self._model = model
        self._params = params
        self._manifest = manifest
        self._watch = watch  # mapped arrays: refuse once their files change under us
        self._directory = directory  # where it was loaded from: named when its arrays fail

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
            scores = self._scores(token_ids)
            best = top_k_indices(scores, k, min_score=0.0)
            results.append([self._hit(int(i), float(scores[i])) for i in best])
        return results

    def _scores(self, token_ids: list[int]) -> np.ndarray:
        """bm25s's score of every document; damaged arrays raise `IndexFileError`, not a crash.

        Raises:
            IndexFileError: the arrays point past the corpus or past themselves (a server
                answers 409: retrying cannot help).
        """
        try:
            scores = np.asarray(self._model.get_scores_from_ids(token_ids))
        except (IndexError, ValueError, TypeError, OverflowError) as err:
            where = (self._directory or Path("(in memory)")) / _BM25S_DIR
            raise IndexFileError(
                where,
                f"holds arrays that fail a search ({type(err).__name__}: {str(err)[:120]}): the "
                "index is damaged; check it with `tracerl index verify` and rebuild it",
            ) from err
        if scores.shape != (len(self._documents),):
            where = (self._directory or Path("(in memory)")) / _BM25S_DIR
            raise IndexFileError(
                where,
                f"scores {scores.shape[0] if scores.ndim else 0} documents, the corpus holds "
                f"{len(self._documents)}: the index is damaged; rebuild it",
            )
        return scores

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
            n_docs = model.scores["num_docs"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError, IndexError) as err:
            # a damaged params or vocab file fails in bm25s as any of these
            raise IndexFormatError(f"{directory}: cannot load the bm25s arrays ({err})") from err
        if n_docs != len(documents):
            raise IndexMismatchError(
                f"{directory}: the bm25s arrays index {n_docs} documents but "
                f"corpus.jsonl holds {len(documents)}; rebuild the index"
            )
        _check_arrays(directory / _BM25S_DIR, model.scores, len(documents), indices=not mmap)
        watch = FileWatch(list((directory / _BM25S_DIR).glob("*.npy"))) if mmap else None
        return cls(
            documents=documents,
            model=model,
            params=params,
            manifest=manifest,
            watch=watch,
            directory=directory,
        )


def _check_arrays(where: Path, scores: dict[str, Any], n_docs: int, *, indices: bool) -> None:
    """Refuse score arrays that a search would read past: their shapes, and the CSC pointers.

    The document ids in `indices` are range-checked too when they are in memory (`indices`);
    mapped ones are not read through at open, and a search that meets a bad one raises
    `IndexFileError` (`BM25Retriever._scores`).

    Raises:
        IndexFileError: naming the array file and what is wrong.
    """
    data, ids, indptr = scores["data"], scores["indices"], scores["indptr"]
    name, problem = "", ""
    if min(np.ndim(data), np.ndim(ids), np.ndim(indptr)) != 1 or len(indptr) < 1:
        name, problem = "data.csc.index.npy", "its arrays are not vectors"
    elif not (len(data) == len(ids) == int(indptr[-1])) or int(indptr[0]) != 0:
        name = "indptr.csc.index.npy"
        problem = (
            f"its pointers span 0..{int(indptr[-1])} ({int(indptr[0])} first), but the arrays hold "
            f"{len(ids)} ids and {len(data)} scores"
        )
    elif len(indptr) > 1 and bool((np.diff(indptr) < 0).any()):
        name, problem = "indptr.csc.index.npy", "its pointers go backwards"
    elif indices and len(ids) and (int(ids.min()) < 0 or int(ids.max()) >= n_docs):
        name = "indices.csc.index.npy"
        problem = f"holds document {int(ids.max())}, past the corpus's {n_docs} documents"
    if problem:
        raise IndexFileError(
            where / name,
            f"is damaged ({problem}); check it with `tracerl index verify` and rebuild the index",
        )


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
