"""Dense retrieval: sentence-transformers embeddings in a faiss inner-product index.

Three index types, by corpus size and memory:

- `flat`: exact inner product; memory 4·dim bytes per document (1.5 kB for MiniLM).
- `hnsw`: an HNSW graph over the same vectors (`hnsw_m` links per node; about 8·m more bytes
  per document); approximate, much faster on large corpora. Built on one thread, so that two
  builds of one corpus give one graph and the content hash `index_id` stays honest.
- `ivf`: an inverted file of `ivf_nlist` k-means cells, `ivf_nprobe` of them searched per query.

Vectors are unit length, so scores are cosine similarities. An index directory holds
`manifest.json`, `corpus.jsonl` and `index.faiss`. The encoder is named in the manifest (the
packaged MiniLM, or a model folder) together with a fingerprint of its files, and loading with an
encoder whose fingerprint differs raises `IndexMismatchError`.

Query embeddings are computed in batches, and padding a batch changes the last bits of a float,
so the same query can score a few ulp differently in two batches; rankings differ only on exact
near-ties. Environments cache their results per episode (and `CachedRetriever` across episodes),
which keeps every rollout deterministic.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import faiss
import numpy as np

from retrieval.base import Document, Encoder, Hit, check_k, check_queries
from retrieval.corpus import corpus_hash, index_text, read_corpus, write_corpus
from retrieval.errors import IndexFileError, IndexFormatError, IndexMismatchError
from retrieval.faiss_files import read_index
from retrieval.index_files import FileWatch, atomic_directory
from retrieval.manifest import CORPUS_NAME, MANIFEST_NAME, IndexManifest, now_utc, read_manifest

__all__ = ["DenseParams", "DenseRetriever", "IndexType"]

log = logging.getLogger(__name__)

IndexType = Literal["flat", "hnsw", "ivf"]
_FAISS_NAME = "index.faiss"


@dataclass(frozen=True, slots=True, kw_only=True)
class DenseParams:
    """Encoder options and faiss index settings; part of the index id."""

    encoder_fingerprint: str
    """`Encoder.fingerprint` of the encoder the passages were embedded with."""
    dim: int
    index_type: IndexType = "flat"
    query_prefix: str = ""
    """Prepended to every query before encoding (e5: `"query: "`)."""
    passage_prefix: str = ""
    """Prepended to every passage before encoding (e5: `"passage: "`)."""
    hnsw_m: int = 32
    hnsw_ef_construction: int = 200
    hnsw_ef_search: int = 128
    """Candidate list size at search time; at least the largest k you ask for."""
    ivf_nlist: int = 0
    """k-means cells (0 in `DenseRetriever.build` picks about 4·sqrt(n))."""
    ivf_nprobe: int = 16


class DenseRetriever:
    """A faiss index over embedded documents; meets the `Retriever` protocol.

    Build one with `DenseRetriever.build(documents, encoder)` or load one with
    `DenseRetriever.load(dir)`. One `search` call makes one encoder call and one faiss call
    for the whole batch. Searching mutates nothing, so one instance can serve many threads.
    """

    def __init__(
        self,
        *,
        documents: Sequence[Document],
        index: Any,
        encoder: Encoder,
        params: DenseParams,
        manifest: IndexManifest,
        watch: FileWatch | None = None,
        directory: Path | None = None,
    ) -> None:
        self._documents = tuple(documents)
        self._index = index
        self._encoder = encoder
        self._params = params
        self._manifest = manifest
        self._watch = watch  # a mapped faiss file: refuse once it changes under us
        self._directory = directory  # where it was loaded from: named when it is damaged
        if params.index_type == "hnsw":
            # (faiss's type stubs lag its SWIG classes: these exist and take these keywords)
            self._search_params: Any = faiss.SearchParametersHNSW(efSearch=params.hnsw_ef_search)  # type: ignore[attr-defined]
        elif params.index_type == "ivf":
            self._search_params = faiss.SearchParametersIVF(nprobe=params.ivf_nprobe)  # type: ignore[call-arg]
        else:
            self._search_params = None

    @classmethod
    def build(
        cls,
        documents: Sequence[Document],
        encoder: Encoder,
        *,
        index_type: IndexType = "flat",
        query_prefix: str = "",
        passage_prefix: str = "",
        hnsw_m: int = 32,
        hnsw_ef_construction: int = 200,
        hnsw_ef_search: int = 128,
        ivf_nlist: int = 0,
        ivf_nprobe: int = 16,
        progress: bool = False,
    ) -> DenseRetriever:
        """Embed documents (title and text) and index them.

        Args:
            documents: the corpus; ids must be unique.
            encoder: the encoder (`SentenceEncoder()` for the packaged MiniLM).
            index_type: `"flat"`, `"hnsw"` or `"ivf"`.
            query_prefix: prepended to queries (e5 wants `"query: "`).
            passage_prefix: prepended to passages (e5 wants `"passage: "`).
            hnsw_m: HNSW links per node.
            hnsw_ef_construction: HNSW build-time candidate list size.
            hnsw_ef_search: HNSW search-time candidate list size.
            ivf_nlist: IVF cells; 0 picks about 4·sqrt(n), at most n/39 (k-means wants 39
                points per cell).
            ivf_nprobe: IVF cells searched per query.
            progress: draw a tqdm bar while encoding.

        Raises:
            ValueError: `documents` is empty or has a repeated id, or an option is invalid.
        """
        if not documents:
            raise ValueError("cannot build a dense index over an empty corpus")
        if index_type not in ("flat", "hnsw", "ivf"):
            raise ValueError(f"index_type {index_type!r}: choose 'flat', 'hnsw' or 'ivf'")
        if len({doc.doc_id for doc in documents}) != len(documents):
            raise ValueError("duplicate document ids; ids must be unique")
        if "e5" in encoder.name.lower() and not (query_prefix or passage_prefix):
            log.warning(
                "encoder %s looks like e5, which expects query_prefix='query: ' and "
                "passage_prefix='passage: '; none given",
                encoder.name,
            )
        if index_type == "ivf" and ivf_nlist == 0:
            ivf_nlist = max(1, min(int(4 * math.sqrt(len(documents))), len(documents) // 39))
        params = DenseParams(
            encoder_fingerprint=encoder.fingerprint,
            dim=encoder.dim,
            index_type=index_type,
            query_prefix=query_prefix,
            passage_prefix=passage_prefix,
            hnsw_m=hnsw_m,
            hnsw_ef_construction=hnsw_ef_construction,
            hnsw_ef_search=hnsw_ef_search,
            ivf_nlist=ivf_nlist,
            ivf_nprobe=ivf_nprobe,
        )
        vectors = encoder.encode(
            [passage_prefix + index_text(doc) for doc in documents], progress=progress
        )
        index = _make_index(params, vectors)
        manifest = IndexManifest(
            kind="dense",
            corpus_hash=corpus_hash(documents),
            n_documents=len(documents),
            params=asdict(params),
            encoder=encoder.name,
            created_at=now_utc(),
        )
        log.info(
            "built dense %s index %s over %d documents",
            index_type,
            manifest.index_id,
            len(documents),
        )
        return cls(
            documents=documents, index=index, encoder=encoder, params=params, manifest=manifest
        )

    @property
    def index_id(self) -> str:
        """A content hash of the corpus, the encoder's files and the index settings."""
        return self._manifest.index_id

    @property
    def documents(self) -> tuple[Document, ...]:
        """The indexed documents, in corpus order."""
        return self._documents

    @property
    def manifest(self) -> IndexManifest:
        """What this index is and what it was built from."""
        return self._manifest

    @property
    def params(self) -> DenseParams:
        """The encoder options and faiss settings."""
        return self._params

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top-`k` documents for each query by cosine similarity, best first.

        Args:
            queries: the queries; one encoder call embeds them all.
            k: hits per query; larger than the corpus returns the whole corpus.

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
        vectors = self._encoder.encode([self._params.query_prefix + q for q in queries])
        k_index = min(k, self._index.ntotal)
        scores, positions = self._index.search(vectors, k_index, params=self._search_params)
        if positions.size and int(positions.max()) >= len(self._documents):
            # a damaged graph or list can name a row the corpus lacks: refused (a server
            # answers 409), never an IndexError (a 500)
            raise IndexFileError(
                self._directory / _FAISS_NAME if self._directory else Path(_FAISS_NAME),
                f"answered row {int(positions.max())}, past the corpus's "
                f"{len(self._documents)} documents: the index is damaged; check it with "
                "`tracerl index verify` and rebuild it",
            )
        return [
            [self._hit(int(i), float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, positions, strict=True)
        ]

    def _hit(self, position: int, score: float) -> Hit:
        doc = self._documents[position]
        return Hit(doc_id=doc.doc_id, title=doc.title, text=doc.text, score=score)

    def save(self, directory: str | Path) -> None:
        """Write the index to `directory`: manifest, corpus, faiss index.

        The files are written to a new directory beside it that then takes its place in one
        atomic rename: an index already there is replaced whole, or kept whole if the process
        dies first. A non-empty directory that holds no index is refused, not replaced.

        Raises:
            IndexFormatError: `directory` exists and holds something else than an index.
        """
        # built beside it, then swapped in at once: a kill leaves the old index or the new one
        with atomic_directory(directory, marker=MANIFEST_NAME) as work:
            write_corpus(self._documents, work / CORPUS_NAME)
            faiss.write_index(self._index, str(work / _FAISS_NAME))
            # last: a directory with a manifest is complete, and its table lists what is there
            self._manifest = self._manifest.write(work)
        log.info("saved dense index %s to %s", self.index_id, directory)

    @classmethod
    def load(
        cls, directory: str | Path, encoder: Encoder | None = None, *, mmap: bool = False
    ) -> DenseRetriever:
        """Load an index written by `save`.

        Args:
            directory: the index directory.
            encoder: the query encoder; None loads the one the manifest names.
            mmap: memory-map the faiss file instead of reading it (flat, HNSW and IVF alike;
                see `retrieval.faiss_files.read_index`).

        Raises:
            IndexFormatError: files are missing or malformed.
            IndexMismatchError: the directory holds another kind of index; its corpus or
                vectors do not match its manifest; or `encoder` is not the one it was built with.
            EncoderError: the manifest's encoder cannot be loaded.
        """
        directory = Path(directory)
        manifest = read_manifest(directory)
        manifest.expect(kind="dense")
        try:
            params = DenseParams(**manifest.params)
        except TypeError as err:
            raise IndexFormatError(f"{directory}: bad dense params {manifest.params}") from err
        documents = read_corpus(directory / CORPUS_NAME)
        manifest.expect(corpus_hash=corpus_hash(documents))
        path = directory / _FAISS_NAME
        if not path.is_file():
            raise IndexFormatError(f"{path} not found; rebuild the index")
        index = read_index(path, mmap=mmap)
        if index.ntotal != len(documents) or index.d != params.dim:
            raise IndexMismatchError(
                f"{path} holds {index.ntotal} vectors of dim {index.d}, but the manifest says "
                f"{len(documents)} documents of dim {params.dim}; rebuild the index"
            )
        if encoder is None:
            from retrieval.encoder import SentenceEncoder

            encoder = SentenceEncoder(manifest.encoder)
        if encoder.fingerprint != params.encoder_fingerprint:
            raise IndexMismatchError(
                f"{directory} was built with encoder {manifest.encoder!r} (fingerprint "
                f"{params.encoder_fingerprint}), but the query encoder {encoder.name!r} has "
                f"fingerprint {encoder.fingerprint}; queries and passages must share one encoder"
            )
        return cls(
            documents=documents,
            index=index,
            encoder=encoder,
            params=params,
            manifest=manifest,
            watch=FileWatch([path]) if mmap else None,
            directory=directory,
        )


def _make_index(params: DenseParams, vectors: np.ndarray) -> Any:
    dim = params.dim
    if params.index_type == "flat":
        index = faiss.IndexFlatIP(dim)
        index.add(vectors)
        return index
    if params.index_type == "hnsw":
        hnsw = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = params.hnsw_ef_construction
        n_threads = faiss.omp_get_max_threads()
        faiss.omp_set_num_threads(1)  # parallel insertion would make the graph vary by run
        try:
            hnsw.add(vectors)
        finally:
            faiss.omp_set_num_threads(n_threads)
        return hnsw
    quantizer = faiss.IndexFlatIP(dim)
    ivf = faiss.IndexIVFFlat(quantizer, dim, params.ivf_nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.train(vectors)
    ivf.add(vectors)
    return ivf
