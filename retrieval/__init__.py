"""Retrieval for search agents: the `Retriever` contract, BM25 and dense indexes, HTTP, caching.

The server (`retrieval.server`, FastAPI) is not imported here; `tracerl serve-retriever` runs it.
This face holds what a user calls; helpers (`retrieval.base.check_k`,
`retrieval.corpus.corpus_hash`, `retrieval.deadline.deadline`, ...) come from their modules.
"""

from retrieval.base import Document, Encoder, Hit, Retriever
from retrieval.bm25 import BM25Params, BM25Retriever
from retrieval.cache import CachedRetriever, CacheStats
from retrieval.client import HTTPRetriever
from retrieval.corpus import read_corpus, write_corpus
from retrieval.dense import DenseParams, DenseRetriever
from retrieval.encoder import DEFAULT_ENCODER, SentenceEncoder
from retrieval.errors import (
    EncoderError,
    IndexBusyError,
    IndexFormatError,
    IndexMismatchError,
    InvalidRequest,
    RequestRejected,
    RetrievalError,
    RetrieverUnavailable,
)
from retrieval.indexes import load_index, make_retriever
from retrieval.manifest import IndexManifest, read_manifest

__all__ = [
    "DEFAULT_ENCODER",
    "BM25Params",
    "BM25Retriever",
    "CacheStats",
    "CachedRetriever",
    "DenseParams",
    "DenseRetriever",
    "Document",
    "Encoder",
    "EncoderError",
    "HTTPRetriever",
    "Hit",
    "IndexBusyError",
    "IndexFormatError",
    "IndexManifest",
    "IndexMismatchError",
    "InvalidRequest",
    "RequestRejected",
    "RetrievalError",
    "Retriever",
    "RetrieverUnavailable",
    "SentenceEncoder",
    "load_index",
    "make_retriever",
    "read_corpus",
    "read_manifest",
    "write_corpus",
]
