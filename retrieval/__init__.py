"""Retrieval for search agents: the `Retriever` contract, BM25 and dense indexes, HTTP, caching."""

from retrieval.base import (
    Document,
    Hit,
    Retriever,
    check_k,
    check_queries,
    format_contents,
    parse_contents,
)
from retrieval.bm25 import BM25Params, BM25Retriever
from retrieval.cache import CachedRetriever, CacheStats, normalize_query
from retrieval.corpus import corpus_hash, read_corpus, write_corpus
from retrieval.errors import (
    IndexFormatError,
    IndexMismatchError,
    RetrievalError,
    RetrieverUnavailable,
)
from retrieval.manifest import IndexManifest, read_manifest

__all__ = [
    "BM25Params",
    "BM25Retriever",
    "CacheStats",
    "CachedRetriever",
    "Document",
    "Hit",
    "IndexFormatError",
    "IndexManifest",
    "IndexMismatchError",
    "RetrievalError",
    "Retriever",
    "RetrieverUnavailable",
    "check_k",
    "check_queries",
    "corpus_hash",
    "format_contents",
    "normalize_query",
    "parse_contents",
    "read_corpus",
    "read_manifest",
    "write_corpus",
]
