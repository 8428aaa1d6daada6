"""Dense retrieval: encoder throughput, and flat against HNSW (and IVF) faiss search.

One corpus (real paragraphs of the shared samples, topped up with synthetic worlds; see
`benchmarks.perf.retrieval_bm25.bench_corpus`) is embedded once with the packaged MiniLM. The three
index types are built from those same vectors, and searched with the same query vectors, so
search latency excludes encoding (a memo in front of the encoder serves repeats). Reported:
passages/s when building, queries/s when encoding one query per call and one batch per call,
per-query search latency for each index type (one batched call, and single-query calls), and
recall@10 of HNSW and IVF against exact flat search.

Run: `python -m benchmarks.perf.retrieval_dense --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import tyro

from benchmarks.meta import run_meta
from benchmarks.perf.retrieval_bm25 import DEFAULT_DATA, bench_corpus
from retrieval import DenseRetriever, Encoder, SentenceEncoder


@dataclass
class Args:
    """Dense retrieval benchmark options."""

    n_docs: int = 10_000
    """documents embedded and indexed"""
    n_queries: int = 500
    """queries searched"""
    n_single: int = 100
    """of those, queries timed one per call (encoding and search)"""
    repeats: int = 3
    """search timing repeats; the median is reported"""
    data_dir: Path = DEFAULT_DATA
    """the shared real dataset samples (synthetic only if absent)"""
    threads: int | None = None
    """torch and faiss CPU threads (None: the libraries' defaults, one per core)"""
    quick: bool = False
    """a smoke test: 100 documents, 20 queries, 5 single, one repeat"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.n_docs, self.n_queries, self.n_single, self.repeats = 100, 20, 5, 1


class MemoEncoder:
    """An `Encoder` that embeds each distinct text once, so indexes share one embedding pass."""

    def __init__(self, inner: Encoder) -> None:
        self._inner = inner
        self._memo: dict[str, np.ndarray] = {}

    @property
    def name(self) -> str:
        """The inner encoder's name."""
        return self._inner.name

    @property
    def fingerprint(self) -> str:
        """The inner encoder's fingerprint."""
        return self._inner.fingerprint

    @property
    def dim(self) -> int:
        """The inner encoder's dimension."""
        return self._inner.dim

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Vectors from the memo, encoding the texts it lacks in one call."""
        missing = [t for t in dict.fromkeys(texts) if t not in self._memo]
        if missing:
            vectors = self._inner.encode(missing, progress=progress)
            self._memo.update(zip(missing, vectors, strict=True))
        return np.stack([self._memo[t] for t in texts]) if texts else np.empty((0, self.dim))


def _median_s(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _recall_at_10(approx: list[list[Any]], exact: list[list[Any]]) -> float:
    return statistics.fmean(
        len({h.doc_id for h in a} & {h.doc_id for h in e}) / max(1, len(e))
        for a, e in zip(approx, exact, strict=True)
    )


def main(args: Args) -> dict[str, Any]:
    """Embed once, build flat/HNSW/IVF, time encoding and search, measure recall@10."""
    documents, all_queries, counts = bench_corpus(args.n_docs, args.data_dir)
    queries = all_queries[: args.n_queries]
    single = queries[: args.n_single]
    print(f"corpus: {len(documents):,} documents {counts}", file=sys.stderr)
    if args.threads is not None:
        import faiss
        import torch

        torch.set_num_threads(args.threads)
        faiss.omp_set_num_threads(args.threads)
    encoder = SentenceEncoder()
    encoder.encode(["warm-up"] * 8)

    encode_single_s = _median_s(lambda: [encoder.encode([q]) for q in single], 1)
    encode_batch_s = _median_s(lambda: encoder.encode(queries), 1)
    memo = MemoEncoder(encoder)
    start = time.perf_counter()
    indexes = {"flat": DenseRetriever.build(documents, memo, progress=True)}
    encode_passages_s = time.perf_counter() - start
    build_s = {}
    for index_type in ("hnsw", "ivf"):
        start = time.perf_counter()
        indexes[index_type] = DenseRetriever.build(documents, memo, index_type=index_type)
        build_s[index_type] = time.perf_counter() - start
    memo.encode(queries)  # the query vectors, once; searches below time faiss, not the encoder

    results: dict[str, Any] = {}
    exact = indexes["flat"].search(queries, k=10)
    for index_type, retriever in indexes.items():
        batch_s = _median_s(lambda r=retriever: r.search(queries, k=10), args.repeats)
        single_s = _median_s(
            lambda r=retriever: [r.search([q], k=10) for q in single], args.repeats
        )
        results[index_type] = {
            "ms_per_query_batched": 1000 * batch_s / len(queries),
            "ms_per_query_single": 1000 * single_s / len(single),
            "recall_at_10_vs_flat": _recall_at_10(retriever.search(queries, k=10), exact),
        }
    return {
        "encode_passages_per_s": len(documents) / encode_passages_s,
        "encode_queries_per_s_single": len(single) / encode_single_s,
        "encode_queries_per_s_batched": len(queries) / encode_batch_s,
        "hnsw_recall_at_10": results["hnsw"]["recall_at_10_vs_flat"],
        "ivf_recall_at_10": results["ivf"]["recall_at_10_vs_flat"],
        "flat_ms_per_query": results["flat"]["ms_per_query_single"],
        "hnsw_ms_per_query": results["hnsw"]["ms_per_query_single"],
        "search": results,
        "build_s": build_s,
        "hnsw_params": {k: v for k, v in asdict(indexes["hnsw"].params).items() if "hnsw" in k},
        "n_documents": len(documents),
        "n_queries": len(queries),
        "corpus": counts,
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """The figures, human-readable, on stderr."""
    print(
        f"encode: {result['encode_passages_per_s']:.0f} passages/s; queries/s "
        f"{result['encode_queries_per_s_single']:.0f} one per call, "
        f"{result['encode_queries_per_s_batched']:.0f} batched",
        file=sys.stderr,
    )
    print(f"{'index':<6} {'ms/q batch':>11} {'ms/q single':>12} {'recall@10':>10}", file=sys.stderr)
    for index_type, r in result["search"].items():
        print(
            f"{index_type:<6} {r['ms_per_query_batched']:>11.3f} {r['ms_per_query_single']:>12.3f} "
            f"{r['recall_at_10_vs_flat']:>10.3f}",
            file=sys.stderr,
        )


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
