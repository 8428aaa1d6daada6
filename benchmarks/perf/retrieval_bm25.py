"""BM25 speed: trace-rl's bm25s index against rank_bm25, on one ≥100k-passage corpus.

The corpus pools the real paragraphs of the shared dev samples (HotpotQA, MuSiQue, 2Wiki, PopQA;
read in place, never copied) and tops them up with seeded synthetic worlds (`envs.synthetic`,
one world per seed, ids prefixed by the seed) to `--n-docs`. Queries are the datasets' own
questions, then the worlds' questions. Both libraries see the same tokens (bm25s's tokenizer
with the English stemmer and stopwords) and the same scoring family: bm25s's "robertson"
variant is rank_bm25's BM25Okapi up to a constant factor and the floor on negative idf, so
top-10 lists should agree. rank_bm25 scans every document in Python for every query term, so
it is timed on a subset of the queries (`--n-rank-queries`); qps is queries per second.

Run: `python -m benchmarks.perf.retrieval_bm25 --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import bm25s
import Stemmer
import tyro

from benchmarks.meta import run_meta
from retrieval import BM25Retriever, Document
from retrieval.corpus import index_text

log = logging.getLogger(__name__)

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
REAL_FILES = (
    "hotpotqa/hotpot_dev_distractor.rpt_sample500.hf.jsonl",
    "hotpotqa/hotpot_dev_distractor.rpt_sample300.hf.jsonl",
    "hotpotqa/hotpot_dev_distractor.migres200.jsonl",
    "musique/musique_ans_v1.0_dev.migres200.jsonl",
    "musique/musique_ans_v1.0_dev.kag100.json",
    "2wikimultihopqa/2wiki_dev.migres164.jsonl",
    "popqa/popqa.hipporag2_1000.json",
)


@dataclass
class Args:
    """BM25 speed benchmark options."""

    n_docs: int = 100_000
    """corpus size: all real paragraphs, then synthetic worlds up to this many"""
    n_queries: int = 1_000
    """queries timed on bm25s"""
    n_rank_queries: int = 100
    """of those, queries timed on rank_bm25 and compared top-10 against bm25s"""
    repeats: int = 3
    """timing repeats; the median is reported"""
    data_dir: Path = DEFAULT_DATA
    """the shared real dataset samples (synthetic only if absent)"""
    seed: int = 0
    """first synthetic world seed"""
    quick: bool = False
    """a smoke test: 3,000 documents, 50 queries, 10 on rank_bm25, one repeat"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.n_docs, self.n_queries, self.n_rank_queries, self.repeats = 3_000, 50, 10, 1


def bench_corpus(
    n_docs: int, data_dir: Path, *, seed: int = 0
) -> tuple[list[Document], list[str], dict[str, int]]:
    """Real paragraphs plus synthetic worlds: (documents, queries, counts by source).

    Args:
        n_docs: the corpus size to reach (the real paragraphs alone may exceed it).
        data_dir: the shared dataset samples; skipped if absent.
        seed: the first synthetic world's seed.
    """
    from envs.qa_datasets import build_corpus, load_file
    from envs.synthetic import World

    documents: list[Document] = []
    queries: list[str] = []
    counts: dict[str, int] = {"real_documents": 0, "synthetic_documents": 0}
    files = [data_dir / name for name in REAL_FILES if (data_dir / name).is_file()]
    if files:
        build = build_corpus([load_file(path) for path in files])
        documents += build.documents
        queries += [task.question for task in build.tasks]
        documents = documents[:n_docs]
        counts["real_documents"] = len(documents)
    else:
        log.warning("no real datasets under %s: the corpus is synthetic only", data_dir)
    seen = {(d.title, d.text) for d in documents}
    world_seed = seed
    synthetic_queries: list[str] = []
    while len(documents) < n_docs:
        world = World.generate(world_seed)
        for doc in world.documents:
            if (doc.title, doc.text) not in seen and len(documents) < n_docs:
                seen.add((doc.title, doc.text))
                documents.append(
                    Document(doc_id=f"w{world_seed}-{doc.doc_id}", title=doc.title, text=doc.text)
                )
                counts["synthetic_documents"] += 1
        synthetic_queries += [task.question for task in world.tasks]
        world_seed += 1
    counts["synthetic_worlds"] = world_seed - seed
    return documents, queries + synthetic_queries, counts


def _median_qps(fn: Any, n_queries: int, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return n_queries / statistics.median(times)


def main(args: Args) -> dict[str, Any]:
    """Build both indexes on one corpus, time both on the same queries, compare top-10s."""
    documents, all_queries, counts = bench_corpus(args.n_docs, args.data_dir, seed=args.seed)
    queries = all_queries[: args.n_queries]
    rank_queries = queries[: args.n_rank_queries]
    print(f"corpus: {len(documents):,} documents {counts}", file=sys.stderr)

    start = time.perf_counter()
    ours = BM25Retriever.build(documents, method="robertson")
    build_s_bm25s = time.perf_counter() - start

    from rank_bm25 import BM25Okapi

    stemmer = Stemmer.Stemmer("english")
    start = time.perf_counter()
    corpus_tokens = bm25s.tokenize(
        [index_text(d) for d in documents],
        stopwords="en",
        stemmer=stemmer,
        return_ids=False,
        show_progress=False,
    )
    theirs = BM25Okapi(corpus_tokens)
    build_s_rank = time.perf_counter() - start
    query_tokens = bm25s.tokenize(
        rank_queries, stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
    )

    ours.search(queries[:10], k=10)  # warm-up
    qps_batch = _median_qps(lambda: ours.search(queries, k=10), len(queries), args.repeats)
    qps_single = _median_qps(
        lambda: [ours.search([q], k=10) for q in queries], len(queries), args.repeats
    )

    def rank_top10() -> list[list[int]]:
        out = []
        for tokens in query_tokens:
            scores = theirs.get_scores(tokens)
            out.append(sorted(range(len(scores)), key=lambda i: (-scores[i], i))[:10])
        return out

    start = time.perf_counter()
    rank_results = rank_top10()
    qps_rank = len(rank_queries) / (time.perf_counter() - start)

    position = {d.doc_id: i for i, d in enumerate(documents)}
    agreements = []
    for ours_hits, theirs_top in zip(ours.search(rank_queries, k=10), rank_results, strict=True):
        ours_top = {position[h.doc_id] for h in ours_hits}
        # rank_bm25 always returns 10; compare on the documents that match the query at all
        theirs_set = set(theirs_top[: len(ours_top)]) if ours_top else set()
        agreements.append(len(ours_top & theirs_set) / max(1, len(ours_top)))

    return {
        "bm25s_over_rank_bm25_qps": qps_single / qps_rank,
        "top10_agreement": statistics.fmean(agreements),
        "bm25s_qps_single_query_calls": qps_single,
        "bm25s_qps_one_batched_call": qps_batch,
        "rank_bm25_qps": qps_rank,
        "build_s_bm25s": build_s_bm25s,
        "build_s_rank_bm25": build_s_rank,
        "n_documents": len(documents),
        "n_queries_bm25s": len(queries),
        "n_queries_rank_bm25": len(rank_queries),
        "corpus": counts,
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """The figures, human-readable, on stderr."""
    rows = [
        ("documents", f"{result['n_documents']:,}"),
        ("bm25s qps (one query per call)", f"{result['bm25s_qps_single_query_calls']:,.0f}"),
        ("bm25s qps (one batched call)", f"{result['bm25s_qps_one_batched_call']:,.0f}"),
        ("rank_bm25 qps", f"{result['rank_bm25_qps']:,.1f}"),
        ("ratio (one query per call)", f"{result['bm25s_over_rank_bm25_qps']:,.1f}x"),
        ("top-10 agreement", f"{result['top10_agreement']:.3f}"),
        ("build s (bm25s / rank_bm25)", f"{result['build_s_bm25s']:.1f} / "
         f"{result['build_s_rank_bm25']:.1f}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}", file=sys.stderr)


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
