"""Dense retrieval at wiki-18 scale on one CPU box: compressed indexes against exact flat search.

The question: which index built from Search-R1's `e5_Flat.index` (21.0M x 768 fp32, 64.6 GB)
serves at <= 1/8 of flat's memory with 10-recall@10 >= 0.98 against exact fp32 flat, and how fast?
wiki-18's e5 vectors are not available here, so the benchmark stands in for them:

- **Vectors.** `benchmarks.perf.e5like`: 768-d, e5's geometry (random-pair cosine about 0.72,
  clusters at three levels, queries shifted off passages), written as a real faiss flat file of
  `max(sizes)` rows; each size N is its first N rows. Query sets at three difficulties (query
  noise x0.5, x1, x2); the goals are read at medium.
- **Indexes.** Every preset of `retrieval.compressed.PRESETS` asked for, built by the same
  `compress_flat_index` users run, from that flat file, with nlist = N / 320 (list lengths as at
  21M). One k-means per N: the other IVF presets reuse its centroids.
- **Accuracy.** Exact fp32 top-100 per query (and fp16 flat's top-10, what Search-R1's GPU server
  computes), then for each preset the smallest nprobe on a grid reaching 10-recall@10 >= 0.98,
  with top-3 set agreement there.
- **Cost.** At that nprobe, batch 512 on one thread: coarse quantizer, list scan and exact
  re-rank timed apart; flat-file pages the re-rank touches per 1,000 queries (and the recall with
  the flat file's page cache dropped between batches); resident memory of a fresh process that
  loads the index; cold start to the first answer.
- **Extrapolation to 21.0M.** Memory exactly (bytes per row x N + centroids + graph, checked
  against the files); nprobe as a power law in N, with a bootstrap over queries for its spread;
  time per query from per-component constants (ns per scanned code, quantizer time against
  log nlist, us per re-ranked candidate).
- **Real text.** The shared datasets' paragraphs and questions embedded with the packaged MiniLM:
  every preset's recall at fixed settings on real text and on the synthetic set of the same size,
  and the rank correlation between the two orderings.
- **Encoder.** An e5-base-v2-shaped BERT (random weights: the FLOPs do not depend on them) timed
  at 16-token queries, batch 32, one thread, in fp32, bf16, torch int8 and ONNX Runtime int8;
  top-3 set agreement with fp32 measured with real weights (the packaged MiniLM) on the real
  questions against the real paragraphs.

Run: `nice -n 10 python -m benchmarks.perf.retrieval_scale --json` (`--quick`: 50k rows, a smoke
test). Files go to `--work-dir` (runs/retrieval_scale) and are deleted unless `--keep-files`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import tyro

from benchmarks.meta import run_meta
from benchmarks.perf.e5like import Difficulty, E5Like, write_flat_file
from benchmarks.perf.retrieval_bm25 import DEFAULT_DATA
from retrieval.compressed import (
    PRESETS,
    CompressConfig,
    CompressedIndex,
    SearchDefaults,
    compress_flat_index,
    fitted_search,
)
from retrieval.faiss_files import FlatVectors
from retrieval.index_stats import exact_top_k, score_stats

log = logging.getLogger(__name__)

WIKI18_ROWS = 21_015_324
FLAT_BYTES_21M = WIKI18_ROWS * 768 * 4  # 64.56 GB
NPROBE_GRID = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
EF_GRID = (16, 32, 64, 128, 256, 512)
K = 10
GOAL_RECALL = 0.98
K_FACTOR = {
    "pq96fs": 32,
    "pq192fs": 16,
    "opq96fs": 32,
    "rabitq3": 2,
    "rabitq4": 2,
    "rabitqfs": 2,
    "rabitqfs2": 2,
    "rabitqfs4": 2,
    "sq4": 2,
}
"""The first k_factor tried (candidates re-ranked exactly per hit), by preset: 4-bit PQ needs
many, RaBitQ and 3-4 bits/dim few (re-scoring only their own top 10, k_factor 1, caps recall at the
codes' own: benchmarks/RESULTS.md, "Wiki scale: search speed and memory"); presets not
named here (8 bits/dim) re-score their own top 10. `FACTOR_STEPS` doublings of it are tried
(`pick_factor`)."""
FACTOR_STEPS = 4
REAL_SET_FILES = (
    "hotpotqa/hotpot_dev_distractor.migres200.jsonl",
    "2wikimultihopqa/2wiki_dev.migres164.jsonl",
)
"""The real-text set: every paragraph of these questions, so each question's gold is there."""


@dataclass
class Args:
    """Options of the wiki-scale retrieval benchmark."""

    sizes: tuple[int, ...] = (250_000, 500_000, 1_000_000)
    """row counts N (each the prefix of the largest)"""
    presets: tuple[str, ...] = ("rabitqfs", "pq192fs", "sq8")
    """index families measured at every N"""
    small_presets: tuple[str, ...] = ("rabitqfs2", "rabitq3", "sq4")
    """families measured only up to `small_max_n` (their add or search is the slow part)"""
    small_max_n: int = 500_000
    default_preset: str = "rabitqfs"
    """the configuration the JSON's headline keys describe"""
    n_queries: int = 1000
    """queries at the headline difficulty (medium)"""
    n_queries_other: int = 300
    """queries at the other difficulties"""
    difficulties: tuple[Literal["easy", "medium", "hard"], ...] = ("easy", "medium", "hard")
    n_bootstrap: int = 200
    """bootstrap resamples of the queries for the nprobe power law's spread"""
    real_paragraphs: int = 4000
    """at most this many real paragraphs (HotpotQA's and 2Wiki's: about 3,200)"""
    real_questions: int = 400
    """at most this many real questions (those files hold 364)"""
    real_files: tuple[str, ...] = REAL_SET_FILES
    """the shared files whose paragraphs and questions make the real-text set"""
    data_dir: Path = DEFAULT_DATA
    """the shared datasets (the real-text check is skipped if absent)"""
    work_dir: Path = Path("runs/retrieval_scale")
    """where the flat file, indexes and caches go"""
    keep_files: bool = False
    """keep the generated flat file and indexes"""
    drop: Literal["file", "global"] = "file"
    """how the page cache is dropped: posix_fadvise on this benchmark's files, or the whole
    machine's (echo 1 > /proc/sys/vm/drop_caches, root only; slows every other process down)"""
    encoder_layers: int = 12
    """layers of the e5-shaped encoder timed (12 = e5-base-v2)"""
    cold_precision: Literal["fp32", "bf16", "int8", "int8-onnx", "onnx-fp32"] = "onnx-fp32"
    """the query encoder in the cold-start probe: onnx-fp32 is the served route (`tracerl index
    export-encoder`, no torch in the server; docs/decisions.md, "Query encoder"), the others
    build the torch encoder from the model folder"""
    cold_only: bool = False
    """measure only the cold start: build (or reuse) the default preset's index over
    max(sizes) rows with its fitted search settings, drop the page cache, probe, extrapolate"""
    drop_libraries: bool = True
    """with --drop file, also drop the files of the Python packages the server imports (torch,
    transformers, tokenizers, faiss, numpy, ...), so the cold start reads its libraries too"""
    refit: Path | None = None
    """instead of measuring: read a saved --json result and print its build-time model"""
    plot: Path | None = None
    """draw recall against nprobe and the fitted nprobe law to this PNG"""
    quick: bool = False
    """a smoke test: 50k rows, 200 queries, two presets, 300 real paragraphs, a 2-layer encoder"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.sizes = (50_000,)
            self.presets = (self.default_preset, "sq8")
            self.small_presets = ()
            self.n_queries = self.n_queries_other = 200
            self.difficulties = ("medium",)
            self.n_bootstrap = 20
            self.real_paragraphs, self.real_questions = 300, 100
            self.encoder_layers = 2
            self.work_dir = self.work_dir.with_name(self.work_dir.name + "_quick")


# --- helpers: recall, timing, memory -------------------------------------------------------


def recall_at(ids: np.ndarray, truth: np.ndarray, k: int = K) -> np.ndarray:
    """Per-query k-recall@k of `ids` (Q, >= k) against `truth` (Q, >= k)."""
    return np.array(
        [
            len(set(a[:k].tolist()) & set(b[:k].tolist())) / k
            for a, b in zip(ids, truth, strict=True)
        ]
    )


def top3_same(ids: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Per query: is the top-3 set the same as the truth's?"""
    return np.array(
        [set(a[:3].tolist()) == set(b[:3].tolist()) for a, b in zip(ids, truth, strict=True)]
    )


def _anonymous_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("Anonymous:"):
            return int(line.split()[1]) * 1024
    return 0


def drop_page_cache(paths: list[Path], how: str) -> str:
    """Drop `paths` from the page cache; returns what was done."""
    if how == "global":
        try:
            Path("/proc/sys/vm/drop_caches").write_text("1\n")
            return "global drop_caches"
        except OSError as err:
            log.warning("cannot write /proc/sys/vm/drop_caches (%s); using posix_fadvise", err)
    for path in paths:
        if not path.exists():
            continue
        files = [p for p in path.rglob("*") if p.is_file()] if path.is_dir() else [path]
        for file in files:
            fd = os.open(file, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return "posix_fadvise DONTNEED on the server's files"


def server_libraries() -> list[Path]:
    """The folders of the Python packages a compressed-index server imports."""
    import importlib.util

    names = ("torch", "transformers", "tokenizers", "safetensors", "faiss", "numpy", "onnxruntime")
    specs = [importlib.util.find_spec(name) for name in names]
    return [Path(spec.origin).parent for spec in specs if spec is not None and spec.origin]


def _fit_power(n: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(a, b) of y = a · (n / 1e6) ** b, least squares in log space."""
    b, log_a = np.polyfit(np.log(n / 1e6), np.log(y), 1)
    return float(math.exp(log_a)), float(b)


def _fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(intercept, slope) of y = intercept + slope · x."""
    if len(x) < 2 or np.ptp(x) == 0:
        return float(np.mean(y)), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), float(slope)


# --- data: the flat file, query sets, ground truth ----------------------------------------


@dataclass
class QuerySet:
    """Queries of one difficulty with their ground truth at one N."""

    vectors: np.ndarray
    truth: np.ndarray  # (Q, 100) exact fp32 top ids
    truth_scores: np.ndarray  # (Q, 100)
    fp16_top: np.ndarray | None  # (Q, 10) ids by fp16 flat scoring


def ground_truth(flat: FlatVectors, n: int, queries: np.ndarray, *, fp16: bool) -> QuerySet:
    """Exact fp32 top-100 (and fp16 flat's top-10) over the first `n` rows, in chunks."""
    scores, ids = exact_top_k(flat.vectors[:n], queries, 100)
    if not fp16:
        return QuerySet(vectors=queries, truth=ids, truth_scores=scores, fp16_top=None)
    q16 = queries.astype(np.float16).astype(np.float32)
    # fp16 flat: vectors and queries rounded to fp16, products summed in fp32 (as a GPU's
    # fp16 GEMM with fp32 accumulation does)
    best_s = np.full((len(queries), K), -np.inf, dtype=np.float32)
    best_i = np.full((len(queries), K), -1, dtype=np.int64)
    for lo in range(0, n, 65_536):
        block = np.asarray(flat.vectors[lo : min(n, lo + 65_536)]).astype(np.float16)
        s = q16 @ block.astype(np.float32).T
        part = np.argpartition(-s, K - 1, axis=1)[:, :K]
        cs = np.concatenate([best_s, np.take_along_axis(s, part, 1)], 1)
        ci = np.concatenate([best_i, part + lo], 1)
        top = np.argsort(-cs, 1, kind="stable")[:, :K]
        best_s, best_i = np.take_along_axis(cs, top, 1), np.take_along_axis(ci, top, 1)
    return QuerySet(vectors=queries, truth=ids, truth_scores=scores, fp16_top=best_i)


def _cached_truth(
    args: Args, flat: FlatVectors, n: int, difficulty: str, queries: np.ndarray, fp16: bool
) -> QuerySet:
    """`ground_truth`, kept in the work dir so that a rerun does not scan the rows again."""
    # keyed by the queries themselves: another --sizes draws other queries of the same count
    tag = hashlib.sha256(queries.tobytes()).hexdigest()[:12]
    path = args.work_dir / f"truth_{n}_{difficulty}_{len(queries)}_{tag}.npz"
    if path.is_file():
        saved = np.load(path)
        fp16_top = saved["fp16_top"] if fp16 else None
        return QuerySet(queries, saved["truth"], saved["truth_scores"], fp16_top)
    qs = ground_truth(flat, n, queries, fp16=fp16)
    np.savez(
        path,
        truth=qs.truth,
        truth_scores=qs.truth_scores,
        fp16_top=qs.fp16_top if qs.fp16_top is not None else np.zeros((0, K), dtype=np.int64),
    )
    return qs


# --- one index at one N --------------------------------------------------------------------


def _search(index: CompressedIndex, queries: np.ndarray, nprobe: int, k_factor: int) -> np.ndarray:
    ef = nprobe if index.nlist == 0 else 0  # the grid is efSearch for an HNSW index
    index.set_search(SearchDefaults(nprobe=nprobe, k_factor=k_factor, ef_search=ef))
    return index.search(queries, K)[1]


def sweep(
    index: CompressedIndex, qs: QuerySet, k_factor: int, grid: tuple[int, ...]
) -> dict[str, Any]:
    """Recall along the nprobe grid, stopping once the goal holds for two grid steps."""
    curve: list[dict[str, float]] = []
    per_query: dict[int, np.ndarray] = {}
    reached = None
    for nprobe in grid:
        ids = _search(index, qs.vectors, nprobe, k_factor)
        r = recall_at(ids, qs.truth)
        per_query[nprobe] = r
        curve.append(
            {
                "nprobe": nprobe,
                "recall10": float(r.mean()),
                "top3": float(top3_same(ids, qs.truth).mean()),
            }
        )
        if reached is None and r.mean() >= GOAL_RECALL:
            reached = nprobe
        elif reached is not None:
            break
        if index.nlist and nprobe >= index.nlist:
            break
    at = next((c for c in curve if c["nprobe"] == reached), None)
    return {"curve": curve, "nprobe_goal": reached, "at_goal": at, "_per_query": per_query}


def pick_factor(goals: dict[int, int | None], *, final: bool) -> int | None:
    """The k_factor to serve with, from the goal nprobe each k_factor tried reached.

    More candidates let fewer cells be probed; the pick is the smallest k_factor whose goal
    nprobe is at most twice the next doubling's (doubling the re-rank no longer halves the
    scan). Before every doubling is tried (`final` False) a pick needs that next doubling;
    after, the k_factor with the smallest goal nprobe (the smaller k_factor on a tie).
    """
    factors = sorted(goals)
    for factor, bigger in itertools.pairwise(factors):
        g, g2 = goals[factor], goals[bigger]
        if g is not None and g2 is not None and g <= 2 * g2:
            return factor
    if final:
        reached = [f for f in factors if goals[f] is not None]
        return min(reached, key=lambda f: (goals[f], f)) if reached else None
    return None


def time_components(
    index: CompressedIndex, queries: np.ndarray, nprobe: int, k_factor: int, repeats: int = 3
) -> dict[str, float]:
    """CPU seconds per query at batch 512 on one thread: quantizer, scan, re-rank (medians).

    CPU time of this process, not wall time: on a box shared with other jobs it is the cost a
    core pays (cache contention still inflates it a little). One untimed pass first, so the
    candidates' flat-file pages are cached (the cold case is `_cold_checks`'). The scan is also
    timed at 4x nprobe: the slope is the cost per scanned code, the rest a per-query constant.
    """
    import faiss

    faiss.omp_set_num_threads(1)
    batch = queries[:512]
    n = len(batch)

    def cpu(call: Any) -> float:
        times = []
        for _ in range(repeats):
            t = time.process_time()
            call()
            times.append(time.process_time() - t)
        return float(np.median(times)) / n

    index.set_search(SearchDefaults(nprobe=4 * nprobe, k_factor=k_factor))
    quant_4x = cpu(lambda: index.coarse(batch)) if index.nlist else 0.0
    cand_4x = cpu(lambda: index.candidates(batch, K))
    index.set_search(SearchDefaults(nprobe=nprobe, k_factor=k_factor))
    index.search(batch, K)  # warm-up
    quant = cpu(lambda: index.coarse(batch)) if index.nlist else 0.0
    cand = cpu(lambda: index.candidates(batch, K))
    wall = time.perf_counter()
    full = cpu(lambda: index.search(batch, K))
    wall = (time.perf_counter() - wall) / (repeats * n)
    return {
        "quantizer_s": quant,
        "scan_s": max(0.0, cand - quant),
        "scan_4x_s": max(0.0, cand_4x - quant_4x),
        "rerank_s": max(0.0, full - cand),
        "total_s": full,
        "wall_total_s": wall,
    }


_RSS_PROBE = textwrap.dedent(
    """
    import json, resource, sys, time
    t0 = time.perf_counter()
    sys.path.insert(0, {root!r})
    import numpy as np
    import faiss  # a library, like numpy: its import is not the index's open
    from retrieval.compressed import CompressedIndex
    def anon(field="Anonymous:"):
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    def read_bytes():  # bytes this process made the kernel fetch from storage
        for line in open("/proc/self/io"):
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    a0 = anon()
    r0 = read_bytes()
    t1 = time.perf_counter()
    index = CompressedIndex({directory!r})
    t2 = time.perf_counter()
    a1 = anon()
    r_open = read_bytes()
    te = time.perf_counter()
    {encoder_load}
    tq = time.perf_counter()
    r_encoder = read_bytes()
    q = np.load({queries!r})[:1]
    {first_query}
    scores, ids = index.search(q, 10)
    t3 = time.perf_counter()
    r_query = read_bytes() - r_encoder  # before the background load of the other lists reads
    use = resource.getrusage(resource.RUSAGE_SELF)
    out = {{"imports_s": t1 - t0, "open_s": t2 - t1, "first_answer_s": t3 - t0,
            "encoder_s": tq - te, "encoder_libraries_s": tl, "query_s": t3 - tq,
            "cpu_s": use.ru_utime + use.ru_stime, "major_faults": use.ru_majflt,
            "read_bytes_imports": r0, "read_bytes_to_open": r_open - r0,
            "read_bytes_encoder": r_encoder - r_open, "read_bytes_query": r_query,
            "lists_loaded": index.lists.n_loaded if index.lists else None,
            "torch_imported": "torch" in sys.modules,
            "index_anonymous_bytes": a1 - a0, "anonymous_bytes": anon(), "rss_bytes": anon("Rss:")}}
    if index.lists is not None:  # the lists the first query did not probe, read after it
        index.lists.wait()
        out["lists_background_s"] = time.perf_counter() - t3
        out["anonymous_bytes_lists_loaded"] = anon()
    print(json.dumps(out))
    """
)


def probe_process(
    directory: Path,
    queries: Path,
    encoder_dir: Path | None,
    onnx_cache: Path,
    precision: str = "onnx-fp32",
) -> dict[str, Any]:
    """A fresh process: open the index (and the encoder), answer one query; times and memory.

    `first_answer_s` is wall time from the interpreter's start (the Python startup before it
    is not counted), `cpu_s` the process's CPU time (user + system). Precision
    `onnx-fp32` serves `encoder_dir` as `tracerl index export-encoder` wrote it (`OnnxEncoder`:
    no torch in the process); the others build `PooledEncoder` from the model folder.
    """
    if encoder_dir is None:
        encoder_load = "tl = 0.0"
        first_query = ""
    elif precision == "onnx-fp32":
        encoder_load = (
            "import onnxruntime, tokenizers\n"  # timed apart: the libraries' share of the start
            "tl = time.perf_counter() - te\n"
            "from retrieval.onnx_encoder import OnnxEncoder\n"
            f"encoder = OnnxEncoder({str(encoder_dir)!r}, threads=1)"
        )
        first_query = "q = encoder.encode(['query: who wrote the iliad'])"
    else:
        encoder_load = (
            "import torch, transformers\n"
            "tl = time.perf_counter() - te\n"
            "from retrieval.prebuilt import PooledEncoder\n"
            f"encoder = PooledEncoder({str(encoder_dir)!r}, precision={precision!r}, "
            f"cache_dir=__import__('pathlib').Path({str(onnx_cache)!r}))"
        )
        first_query = "q = encoder.encode(['query: who wrote the iliad'])"
    code = _RSS_PROBE.format(
        root=str(Path(__file__).resolve().parents[2]),
        directory=str(directory),
        queries=str(queries),
        encoder_load=encoder_load,
        first_query=first_query,
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, env=env
    )
    if done.returncode != 0:
        raise RuntimeError(f"probe failed: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.splitlines()[-1]))


def mapped_flat_probe(flat_path: Path) -> dict[str, float]:
    """Anonymous memory a fresh process adds by opening the flat file with the mapping fix."""
    code = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        import faiss, numpy as np
        from retrieval.faiss_files import read_index
        def anon():
            for line in open("/proc/self/smaps_rollup"):
                if line.startswith("Anonymous:"):
                    return int(line.split()[1]) * 1024
        a0 = anon()
        index = read_index({str(flat_path)!r}, mmap=True)
        index.search(np.ones((1, index.d), dtype="float32"), 10)
        print(json.dumps({{"added": anon() - a0}}))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    added = json.loads(done.stdout.splitlines()[-1])["added"]
    return {"anonymous_added_bytes": added, "over_file": added / flat_path.stat().st_size}


# --- the encoder ----------------------------------------------------------------------------


def e5_shaped_encoder(folder: Path, layers: int) -> Path:
    """Save a random-init BERT-base (e5-base-v2's shape) with MiniLM's uncased WordPiece."""
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoTokenizer, BertConfig, BertModel

    from retrieval.encoder import resolve_model_dir

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30_522,
        hidden_size=768,
        num_hidden_layers=layers,
        num_attention_heads=12,
        intermediate_size=3_072,
    )
    BertModel(config).eval().save_pretrained(folder)
    AutoTokenizer.from_pretrained(str(resolve_model_dir(None))).save_pretrained(folder)
    return folder


ENCODER_PRECISIONS = ("fp32", "bf16", "int8", "int8-onnx", "onnx-fp32")
"""The query encoders compared: torch's fp32, bf16 autocast and dynamic int8, ONNX Runtime's
int8 (`PooledEncoder(precision="int8-onnx")`) and the fp32 export served without torch."""


def _encoder(folder: Path, precision: str, onnx_cache: Path, **kwargs: Any) -> Any:
    """`PooledEncoder` at `precision`, or for onnx-fp32 an `OnnxEncoder` of its export."""
    from retrieval.onnx_encoder import OnnxEncoder
    from retrieval.prebuilt import PooledEncoder, Precision

    if precision != "onnx-fp32":
        torch_precision = cast(Precision, precision)
        return PooledEncoder(folder, precision=torch_precision, cache_dir=onnx_cache, **kwargs)
    return OnnxEncoder(exported_encoder(folder, onnx_cache), threads=1, **kwargs)


def exported_encoder(folder: Path, onnx_cache: Path) -> Path:
    """`folder` exported as `tracerl index export-encoder` does, once, under `onnx_cache`."""
    from retrieval.onnx_encoder import export_encoder, is_exported

    exported = onnx_cache / f"{folder.name}_export"
    if not is_exported(exported):
        export_encoder(folder, exported)
    return exported


def encoder_speed(
    folder: Path, texts: list[str], onnx_cache: Path, repeats: int = 3
) -> dict[str, float]:
    """Queries per second per core at batch 32 for each precision (one thread, medians)."""
    import torch

    torch.set_num_threads(1)
    out: dict[str, float] = {}
    batch = texts[:32]
    for precision in ENCODER_PRECISIONS:
        encoder = _encoder(folder, precision, onnx_cache, batch_size=32, max_length=16)
        encoder.encode(batch)  # warm-up
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            encoder.encode(batch)
            times.append(time.perf_counter() - t)
        out[precision] = len(batch) / float(np.median(times))
    return out


def encoder_agreement(
    paragraphs: np.ndarray, questions: list[str], cache: Path
) -> dict[str, float]:
    """Top-3 set agreement of MiniLM's query vectors at each precision with fp32's."""
    from retrieval.encoder import resolve_model_dir

    vectors = {}
    for precision in ENCODER_PRECISIONS:
        encoder = _encoder(resolve_model_dir(None), precision, cache)
        vectors[precision] = encoder.encode(questions)
    _, truth = exact_top_k(paragraphs, vectors["fp32"], 3)
    out = {}
    for precision in ENCODER_PRECISIONS[1:]:
        _, ids = exact_top_k(paragraphs, vectors[precision], 3)
        out[precision] = float(top3_same(ids, truth).mean())
    return out


# --- the real-text sanity set --------------------------------------------------------------


def real_set(args: Args, cache: Path) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """MiniLM vectors of the shared paragraphs and questions (cached), or None without data."""
    from envs.qa_datasets import build_corpus, load_file
    from retrieval.corpus import index_text
    from retrieval.encoder import SentenceEncoder

    files = [args.data_dir / name for name in args.real_files if (args.data_dir / name).is_file()]
    if not files:
        log.warning("no shared datasets under %s: the real-text check is skipped", args.data_dir)
        return None
    build = build_corpus([load_file(path) for path in files])
    documents = build.documents[: args.real_paragraphs]
    questions = [task.question for task in build.tasks][: args.real_questions]
    path = cache / f"real_{len(documents)}_{len(questions)}.npz"
    if path.is_file():
        saved = np.load(path)
        return saved["paragraphs"], saved["questions"], questions
    encoder = SentenceEncoder()
    paragraphs = encoder.encode([index_text(doc) for doc in documents], progress=True)
    question_vectors = encoder.encode(questions)
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(path, paragraphs=paragraphs, questions=question_vectors)
    return paragraphs, question_vectors, questions


def real_text_check(
    args: Args, real: tuple[np.ndarray, np.ndarray, list[str]], generator: E5Like
) -> dict[str, Any]:
    """Each preset's recall at fixed settings on real text and on synthetic rows of the same N."""
    from scipy.stats import spearmanr

    paragraphs, questions, _ = real
    n = len(paragraphs)
    sets = {
        "real": (paragraphs, questions),
        "synthetic": (generator.passages(0, n), generator.queries(len(questions), max_row=n)[0]),
    }
    settings = [
        (p, kf) for p in (*args.presets, *args.small_presets) for kf in (0, K_FACTOR.get(p, 1))
    ]
    table: dict[str, dict[str, float]] = {}
    for name, (vectors, queries) in sets.items():
        folder = args.work_dir / f"sanity_{name}"
        folder.mkdir(parents=True, exist_ok=True)
        flat_path = folder / "flat.index"
        _write_array_flat(flat_path, vectors)
        _, truth = exact_top_k(vectors, queries, K)
        for preset, kf in settings:
            out = folder / preset
            if not (out / "compressed.json").is_file():
                compress_flat_index(flat_path, out, CompressConfig(preset=preset))  # type: ignore[arg-type]
            index = CompressedIndex(out, search=SearchDefaults(nprobe=4, k_factor=max(kf, 1)))
            index.load_lists()
            index.set_search(SearchDefaults(nprobe=4, k_factor=kf, ef_search=32))
            _, ids = index.search(queries, K)
            table.setdefault(f"{preset}/kf{kf}", {})[name] = float(recall_at(ids, truth).mean())
    real_r = [v["real"] for v in table.values()]
    synth_r = [v["synthetic"] for v in table.values()]
    rho = spearmanr(real_r, synth_r).statistic if len(table) > 2 else float("nan")
    return {"n": n, "n_queries": len(questions), "recall10": table, "spearman": float(rho)}


def _write_array_flat(path: Path, vectors: np.ndarray) -> None:
    import faiss

    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    faiss.write_index(index, str(path))


# --- main -------------------------------------------------------------------------------------


@dataclass
class _SizeResult:
    n: int
    nlist: int
    presets: dict[str, Any] = field(default_factory=dict)
    fp16_top3: dict[str, float] = field(default_factory=dict)
    fp16_recall10: dict[str, float] = field(default_factory=dict)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)


def main(args: Args) -> dict[str, Any]:
    """Run the benchmark; returns the result dict (see the module docstring)."""
    import faiss

    faiss.omp_set_num_threads(1)
    started = time.perf_counter()
    load_before = os.getloadavg()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    generator = E5Like()
    flat_path = stand_in_flat_file(args, generator)
    if args.cold_only:
        return cold_start_only(args, generator, flat_path, load_before, started)
    flat = FlatVectors(flat_path)
    query_rows = min(args.sizes)
    headline = "medium" if "medium" in args.difficulties else args.difficulties[0]
    queries = {
        d: generator.queries(
            args.n_queries if d == headline else args.n_queries_other,
            max_row=query_rows,
            difficulty=d,
        )[0]
        for d in args.difficulties
    }
    query_file = args.work_dir / "queries_medium.npy"
    np.save(query_file, queries[headline])

    sizes: list[_SizeResult] = []
    for n in sorted(args.sizes):
        res = _SizeResult(n=n, nlist=CompressConfig().nlist_for(n))
        log.info("N = %d: ground truth", n)
        truth = {d: _cached_truth(args, flat, n, d, q, d == headline) for d, q in queries.items()}
        for d, qs in truth.items():
            if qs.fp16_top is not None:
                res.fp16_top3[d] = float(top3_same(qs.fp16_top, qs.truth).mean())
                res.fp16_recall10[d] = float(recall_at(qs.fp16_top, qs.truth).mean())
            res.stats[d] = score_stats(qs.truth_scores[:, :11])
        centroids = None
        presets = list(args.presets) + (list(args.small_presets) if n <= args.small_max_n else [])
        for preset in presets:
            res.presets[preset], centroids = _measure_preset(
                args, flat, n, preset, truth, queries[headline], headline, centroids
            )
        sizes.append(res)
        log.info("N = %d done at %.0f s", n, time.perf_counter() - started)
        partial = [asdict(x) for x in sizes]
        for x in partial:
            for e in x["presets"].values():
                e.pop("_per_query", None)
        (args.work_dir / "partial.json").write_text(json.dumps(partial, default=float))

    result: dict[str, Any] = {
        "sizes": [asdict(s) for s in sizes],
        "difficulties": list(args.difficulties),
        "headline_difficulty": headline,
        "default_preset": args.default_preset,
        "stand_in_stats": {d: sizes[-1].stats[d] for d in args.difficulties},
    }
    for s in result["sizes"]:
        for entry in s["presets"].values():
            entry.pop("_per_query", None)
    result["extrapolation"] = extrapolate(args, sizes)
    result["mmap_probe"] = mapped_flat_probe(flat_path)

    # encoder: speed on the e5 shape, agreement with real weights
    encoder_dir = e5_shaped_encoder(
        args.work_dir / f"e5shape_{args.encoder_layers}", args.encoder_layers
    )
    texts = [f"query: who wrote the book number {i} of the series" for i in range(32)]
    onnx_cache = args.work_dir / "onnx"  # outside the model folder, whose files are hashed
    result["encoder_qps_per_core"] = encoder_speed(encoder_dir, texts, onnx_cache)
    real = real_set(args, args.work_dir / "cache")
    if real is not None:
        result["encoder_top3_agreement"] = encoder_agreement(
            real[0], real[2], args.work_dir / "cache" / "onnx"
        )
        result["real_text"] = real_text_check(args, real, generator)
    served = args.work_dir / f"{args.default_preset}_{max(args.sizes)}"
    result.update(cold_start(args, served, query_file, encoder_dir, flat_path))
    result["headline"] = headline_keys(args, result, sizes)
    result["build_time_model"] = build_time_model(result, args.default_preset)
    result["meta"] = {
        **run_meta(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }
    flat.close()
    if not args.keep_files:
        shutil.rmtree(args.work_dir / "sanity_real", ignore_errors=True)
        shutil.rmtree(args.work_dir / "sanity_synthetic", ignore_errors=True)
        for path in args.work_dir.iterdir():
            if path.name.startswith(("e5like_",)) or any(
                path.name.startswith(p + "_") for p in PRESETS
            ):
                if path.is_dir():
                    shutil.rmtree(path)
                else:
                    path.unlink()
    return result


def stand_in_flat_file(args: Args, generator: E5Like) -> Path:
    """The e5 stand-in's flat file of max(sizes) rows (or a larger one already written)."""
    n_max = max(args.sizes)
    # rows are prefix-stable, so any larger file generated earlier holds the same rows
    larger = [p for p in args.work_dir.glob("e5like_*.index") if int(p.stem.split("_")[1]) >= n_max]
    flat_path = min(larger, default=args.work_dir / f"e5like_{n_max}.index")
    if not flat_path.is_file():
        t = time.perf_counter()
        write_flat_file(flat_path, generator, n_max)
        log.info("wrote %s in %.0f s", flat_path, time.perf_counter() - t)
    return flat_path


def cold_start(
    args: Args, served: Path, query_file: Path, encoder_dir: Path, flat_path: Path
) -> dict[str, Any]:
    """Drop the served files' page cache, then time a fresh process to its first answer.

    With `onnx-fp32` the encoder is first exported as users export theirs (`tracerl index
    export-encoder`) and the export is what the probe loads. Returns `cold_start_drop` (how the
    cache was dropped), `cold_start_probe` (`probe_process`) and `cold_start_model` (the
    extrapolation to 21.0M rows, `cold_start_model`).
    """
    onnx_cache = args.work_dir / "onnx"
    if args.cold_precision == "onnx-fp32":
        encoder_dir = exported_encoder(encoder_dir, onnx_cache)
    dropped = [served, encoder_dir, onnx_cache, flat_path]
    if args.drop_libraries:
        dropped += server_libraries()
    how = drop_page_cache(dropped, args.drop)
    if args.drop_libraries and args.drop == "file":
        how += " and the server's Python packages"
    cold = probe_process(served, query_file, encoder_dir, onnx_cache, args.cold_precision)
    # the index's own reads at open, apart from the library code faiss pages in for it: a
    # second probe with only the index files dropped
    drop_page_cache([served, flat_path], "file")
    index_only = probe_process(served, query_file, None, onnx_cache)
    cold["index_read_bytes_to_open"] = index_only["read_bytes_to_open"]
    rate = disk_read_rate(flat_path)
    record = json.loads((served / "compressed.json").read_text())
    model = cold_start_model(cold, record, fitted_search(record["preset"], WIKI18_ROWS), rate)
    return {"cold_start_drop": how, "cold_start_probe": cold, "cold_start_model": model}


def disk_read_rate(path: Path, limit: int = 256 << 20) -> float:
    """Bytes a second read from `path` out of a dropped page cache (the disk's sequential rate).

    Reads the first `limit` bytes, 8 MiB at a time.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        start, done = time.perf_counter(), 0
        while done < limit:
            got = len(os.pread(fd, 8 << 20, done))
            if not got:
                break
            done += got
        elapsed = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return done / max(elapsed, 1e-9)


def cold_start_model(
    cold: dict[str, Any], record: dict[str, Any], at_21m: SearchDefaults, read_rate: float
) -> dict[str, Any]:
    """The cold start extrapolated to 21.0M rows, component by component.

    `cold_21m = imports + encoder + open + open_bytes · (21.0M / N - 1) / read_rate
    + query · max(nprobe_21m / nprobe, k_factor_21m / k_factor) + quantizer_bytes_21m /
    read_rate`. The libraries and the encoder do not depend on N. The open reads what faiss
    does not map (`index.faiss`'s HNSW levels and offsets, `lists.sizes.npy`: in proportion to
    nlist = N / 320): every byte of the index's
    files it read (`index_read_bytes_to_open`, measured with the libraries cached) is taken to
    grow with N, at the disk's sequential rate (an upper bound: the flat file's fingerprint,
    2 MiB and its read-ahead, does not grow). The first query reads `nprobe` lists, whose size
    does not change with N (320 rows), and `k · k_factor` flat-file rows, so it is scaled by
    the larger of the two ratios (its encoding too: an upper bound). Its HNSW walk over the
    centroids faults in pages of the mapped centroids and graph, which grow with nlist: the
    whole of them at 21.0M (`_fixed_bytes`, 0.22 GB) is added, read at the disk's rate
    (`+ quantizer_bytes_21m / read_rate`: an upper bound, a walk touches a few thousand
    centroids of 65,536).
    """
    n = int(record["n_rows"])
    search = record["search"]
    query_ratio = max(
        at_21m.nprobe / search["nprobe"], at_21m.k_factor / max(1, search["k_factor"])
    )
    parts = {
        "imports_s": cold["imports_s"],
        "encoder_s": cold["encoder_s"],
        "open_s": cold["open_s"]
        + cold["index_read_bytes_to_open"] * (WIKI18_ROWS / n - 1) / max(read_rate, 1.0),
        "query_s": cold["query_s"] * query_ratio,
        "quantizer_pages_s": _fixed_bytes(CompressConfig().nlist_for(WIKI18_ROWS)) / read_rate,
    }
    return {
        "cold_start_s_21m": sum(parts.values()),
        "parts_21m": parts,
        "measured_n": n,
        "measured_search": search,
        "search_21m": asdict(at_21m),
        "query_ratio": query_ratio,
        "disk_read_bytes_per_s": read_rate,
        "formula": "imports + encoder + open + open_bytes * (21.0M / N - 1) / read_rate"
        " + query * max(nprobe ratio, k_factor ratio) + quantizer_bytes_21m / read_rate",
    }


def cold_start_only(
    args: Args, generator: E5Like, flat_path: Path, load_before: tuple[float, ...], started: float
) -> dict[str, Any]:
    """`--cold-only`: the default preset over max(sizes) rows, served with its fitted search."""
    n = max(args.sizes)
    served = args.work_dir / f"{args.default_preset}_{n}_cold"
    config = CompressConfig(
        preset=args.default_preset,  # type: ignore[arg-type]
        search=fitted_search(args.default_preset, n),
    )
    record = _reuse(served, n, args.default_preset)
    if record is None or record.get("lists") != "split":
        shutil.rmtree(served, ignore_errors=True)
        record = compress_flat_index(flat_path, served, config, n_rows=n)
    query_file = args.work_dir / "queries_medium.npy"
    np.save(query_file, generator.queries(16, max_row=n, difficulty="medium")[0])
    encoder_dir = e5_shaped_encoder(
        args.work_dir / f"e5shape_{args.encoder_layers}", args.encoder_layers
    )
    result: dict[str, Any] = {"default_preset": args.default_preset, "n": n, "build": record}
    result.update(cold_start(args, served, query_file, encoder_dir, flat_path))
    result["headline"] = {
        "cold_start_s": result["cold_start_model"]["cold_start_s_21m"],
        "cold_start_s_measured_at_n": result["cold_start_probe"]["first_answer_s"],
        "n_measured_max": n,
    }
    result["meta"] = {
        **run_meta(),
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "wall_s": time.perf_counter() - started,
    }
    if not args.keep_files:
        shutil.rmtree(served, ignore_errors=True)
    return result


def _measure_preset(
    args: Args,
    flat: FlatVectors,
    n: int,
    preset: str,
    truth: dict[Difficulty, QuerySet],
    headline_queries: np.ndarray,
    headline: Difficulty,
    centroids: np.ndarray | None,
) -> tuple[dict[str, Any], np.ndarray | None]:
    """Build (or reuse) one preset's index over the first `n` rows of `flat` and measure it.

    Returns the preset's entry and the IVF centroids that later presets over the same rows
    share (trained by the first preset that shares them).
    """
    out = args.work_dir / f"{preset}_{n}"
    kf = K_FACTOR.get(preset, 1)
    shares = preset not in ("opq96fs", "hnsw-sq8")
    record = _reuse(out, n, preset)
    if record is None:  # built by an earlier run with the same rows and preset: reused
        shutil.rmtree(out, ignore_errors=True)
        record = compress_flat_index(
            flat.path,
            out,
            CompressConfig(preset=preset, search=SearchDefaults(nprobe=8, k_factor=kf)),  # type: ignore[arg-type]
            n_rows=n,
            centroids=centroids if shares else None,
        )
    index = CompressedIndex(out)
    index.load_lists()  # times are the steady state's, after the lists' background load
    if shares and centroids is None:
        centroids = index.centroids()
    entry: dict[str, Any] = {
        "k_factor": kf,
        "index_bytes": record["index_bytes"],
        "bytes_per_row": record["index_bytes"] / n,
        "train_s": record["train_s"],
        "add_s": record["add_s"],
        "kmeans": record["n_train"] if record["centroids"] == "trained" else 0,
        "by_difficulty": {},
    }
    grid = EF_GRID if preset == "hnsw-sq8" else NPROBE_GRID
    tried: dict[int, dict[Difficulty, dict[str, Any]]] = {}
    factors = [kf * 2**i for i in range(FACTOR_STEPS)] if kf > 1 else [kf]
    goals: dict[int, Any] = {}
    for factor in factors:
        tried[factor] = {d: sweep(index, qs, factor, grid) for d, qs in truth.items()}
        goals = {f: t[headline]["nprobe_goal"] for f, t in tried.items()}
        if pick_factor(goals, final=False) is not None:
            break
    entry["k_factor"] = kf = pick_factor(goals, final=True) or factors[-1]
    entry["k_factor_goals"] = goals
    for d, swept in tried[kf].items():
        per_query = swept.pop("_per_query")
        entry["by_difficulty"][d] = swept
        if d == headline:
            entry["_per_query"] = per_query
    goal = entry["by_difficulty"][headline]["nprobe_goal"]
    if goal is not None:
        entry["time"] = time_components(index, headline_queries, goal, kf)
        index.set_search(SearchDefaults(nprobe=goal, k_factor=kf))
        ids = index.candidates(headline_queries[:1000], K)[1]
        if index.flat is not None and kf > 0:
            entry["rerank_pages_per_1000_queries"] = int(
                len(index.flat.pages_of(_valid(ids))) * 1000 / len(ids)
            )
        if preset == args.default_preset:
            entry.update(_cold_checks(args, index, truth[headline], goal, kf, out, flat))
    index.close()
    return entry, centroids


def _reuse(out: Path, n: int, preset: str) -> dict[str, Any] | None:
    """The record of an index an earlier run built at `out` for the same rows, or None."""
    path = out / "compressed.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if record["n_rows"] == n and record["preset"] == preset else None


def _cold_checks(
    args: Args,
    index: CompressedIndex,
    qs: QuerySet,
    nprobe: int,
    k_factor: int,
    out: Path,
    flat: FlatVectors,
) -> dict[str, Any]:
    """Recall and speed with the flat file's page cache dropped before every batch of 512.

    `flat` is this benchmark's own map of the file (the ground truth read every row through
    it): the OS keeps a page that any mapping holds, so it is dropped as well as the index's.
    """
    assert index.flat is not None
    index.set_search(SearchDefaults(nprobe=nprobe, k_factor=k_factor))
    warm_ids = index.search(qs.vectors, K)[1]
    how = drop_page_cache([flat.path], args.drop)
    resident_before = 0
    cold_ids, elapsed, cpu = [], 0.0, 0.0
    for lo in range(0, len(qs.vectors), 512):
        flat.drop_cache()
        index.flat.drop_cache()
        resident_before = index.flat.resident_pages()
        t, c = time.perf_counter(), time.process_time()
        cold_ids.append(index.search(qs.vectors[lo : lo + 512], K)[1])
        elapsed += time.perf_counter() - t
        cpu += time.process_time() - c
    resident_after = index.flat.resident_pages()
    cold = np.concatenate(cold_ids)
    last_candidates = index.candidates(qs.vectors[-len(cold_ids[-1]) :], K)[1]
    return {
        "cold": {
            "drop": how,
            "recall10": float(recall_at(cold, qs.truth).mean()),
            "same_as_warm": bool(np.array_equal(cold, warm_ids)),
            "s_per_query": elapsed / len(qs.vectors),
            "cpu_s_per_query": cpu / len(qs.vectors),
            "resident_pages_before_last_batch": resident_before,
            "resident_pages_after_last_batch": resident_after,
            "pages_of_last_batch_candidates": len(index.flat.pages_of(_valid(last_candidates))),
        },
        "disk_bytes": sum(p.stat().st_size for p in out.iterdir()),
    }


def extrapolate(args: Args, sizes: list[_SizeResult]) -> dict[str, Any]:
    """Fit the cost models over N and read them at wiki-18's 21.0M rows."""
    out: dict[str, Any] = {}
    rng = np.random.default_rng(0)
    for preset in (*args.presets, *args.small_presets):
        entries_all = [(s, s.presets.get(preset)) for s in sizes]
        kept = [(s, e) for s, e in entries_all if e is not None]
        if len(kept) < 1:
            continue
        entries = [e for _, e in kept]
        ns = np.array([s.n for s, _ in kept], dtype=float)
        fit: dict[str, Any] = {}
        # memory: bytes per row from the files, checked at every N
        per_row = [(e["index_bytes"] - _fixed_bytes(s.nlist)) / s.n for s, e in kept]
        fit["bytes_per_row"] = float(np.median(per_row))
        fit["index_bytes_21m"] = fit["bytes_per_row"] * WIKI18_ROWS + _fixed_bytes(
            round(WIKI18_ROWS / 320)
        )
        # nprobe for the goal: power law in N, bootstrap over queries
        goals = [
            e["by_difficulty"][
                args.difficulties[0] if "medium" not in args.difficulties else "medium"
            ]["nprobe_goal"]
            for e in entries
        ]
        if all(g is not None for g in goals) and len(ns) >= 2:
            a, b = _fit_power(ns, np.array(goals, dtype=float))
            fit["nprobe_law"] = {
                "a": a,
                "b": b,
                "nprobe_at": dict(zip(map(int, ns), goals, strict=True)),
            }
            fit["nprobe_21m"] = a * (WIKI18_ROWS / 1e6) ** b
            boot = []
            for _ in range(args.n_bootstrap):
                pick = rng.integers(0, args.n_queries, args.n_queries)
                g = [_goal_from(e["_per_query"], pick) for e in entries]
                if all(x is not None for x in g):
                    ab = _fit_power(ns, np.array(g, dtype=float))
                    boot.append(ab[0] * (WIKI18_ROWS / 1e6) ** ab[1])
            if boot:
                fit["nprobe_21m_p05_p95"] = [
                    float(np.percentile(boot, 5)),
                    float(np.percentile(boot, 95)),
                ]
        # k_factor for the goal: a power law in N too (more rows crowd the codes' ranking)
        factors = np.array([e["k_factor"] for e in entries], dtype=float)
        kf_a, kf_b = _fit_power(ns, factors) if len(ns) >= 2 else (float(factors[0]), 0.0)
        fit["k_factor_law"] = {
            "a": kf_a,
            "b": kf_b,
            "k_factor_at": dict(zip(map(int, ns), factors.tolist(), strict=True)),
        }
        fit["k_factor_21m"] = max(1.0, kf_a * (WIKI18_ROWS / 1e6) ** kf_b)
        # time: per-component constants (CPU time, one thread, batch 512)
        timed = [(e, s) for s, e in kept if "time" in e]
        if timed and "nprobe_21m" in fit:
            headline = "medium" if "medium" in args.difficulties else args.difficulties[0]
            codes = np.array(
                [e["by_difficulty"][headline]["nprobe_goal"] * s.n / s.nlist for e, s in timed]
            )
            scan = np.array([e["time"]["scan_s"] for e, _ in timed])
            scan_4x = np.array([e["time"]["scan_4x_s"] for e, _ in timed])
            # the slope between nprobe and 4 nprobe: the cost of one more scanned code; the
            # rest of the scan (look-up tables, the heap) is paid once per query
            per_code = float(np.median(np.maximum(scan_4x - scan, 0.0) / (3 * codes)))
            fit["scan_ns_per_code"] = per_code * 1e9
            fit["scan_fixed_s"] = float(np.median(np.maximum(scan - per_code * codes, 0.0)))
            logn = np.array([math.log2(s.nlist) for _, s in timed])
            fit["quantizer_fit"] = _fit_line(
                logn, np.array([e["time"]["quantizer_s"] for e, _ in timed])
            )
            per_candidate = [e["time"]["rerank_s"] / (K * e["k_factor"]) for e, _ in timed]
            fit["rerank_us_per_candidate"] = float(np.median(per_candidate) * 1e6)
            nlist_21m = round(WIKI18_ROWS / 320)
            nprobe_21m = math.ceil(fit["nprobe_21m"])
            q0, q1 = fit["quantizer_fit"]
            parts = {
                "quantizer_s": max(0.0, q0 + q1 * math.log2(nlist_21m)),
                "scan_s": fit["scan_fixed_s"] + nprobe_21m * 320 * per_code,
                "rerank_s": K * fit["k_factor_21m"] * float(np.median(per_candidate)),
            }
            fit["s_per_query_21m_parts"] = parts
            fit["s_per_query_21m"] = t = sum(parts.values())
            fit["qps_per_core_21m"] = 1 / t
            fit["rerank_rows_per_query_21m"] = K * fit["k_factor_21m"]
        out[preset] = fit
    return out


def build_time_model(result: dict[str, Any], preset: str) -> dict[str, Any]:
    """One-core build time of `preset` at 21.0M rows, from the measured builds at each N.

    k-means costs about n_train · nlist · d per iteration, so its time is fitted as
    c_kmeans · n_train · nlist (from the builds that trained their centroids); adding costs a
    coarse assignment and an encoding per row, fitted as c_add · N. At 21.0M: nlist 65,536 and
    n_train = 30 · nlist (1.97M rows). faiss runs both on every core, so 16 cores divide them by
    up to 16 (not measured here: this box has 2 busy cores).
    """
    kmeans, add = [], []
    for size in result["sizes"]:
        entry = size["presets"].get(preset)
        if entry is None:
            continue
        add.append(entry["add_s"] / size["n"])
        if entry["kmeans"]:
            kmeans.append(entry["train_s"] / (entry["kmeans"] * size["nlist"]))
    nlist = round(WIKI18_ROWS / 320)
    n_train = min(2_000_000, 30 * nlist)
    train_s = float(np.median(kmeans)) * n_train * nlist if kmeans else float("nan")
    add_s = float(np.median(add)) * WIKI18_ROWS
    return {
        "c_kmeans_s": float(np.median(kmeans)) if kmeans else None,
        "c_add_s_per_row": float(np.median(add)),
        "train_s_21m_one_core": train_s,
        "add_s_21m_one_core": add_s,
        "build_s_21m_16_cores_if_linear": (train_s + add_s) / 16,
    }


def plot_result(result: dict[str, Any], path: Path) -> None:
    """Recall against nprobe at the largest N; goal nprobe against N with its law to 21.0M."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    headline = result["headline_difficulty"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    last = result["sizes"][-1]
    for preset, entry in last["presets"].items():
        curve = entry["by_difficulty"][headline]["curve"]
        left.plot([c["nprobe"] for c in curve], [c["recall10"] for c in curve], "o-", label=preset)
    left.axhline(GOAL_RECALL, color="grey", lw=0.8, ls="--")
    left.set(xscale="log", xlabel="nprobe", ylabel="10-recall@10 vs exact flat",
             title=f"N = {last['n']:,}, {headline}, k_factor per preset")  # fmt: skip
    left.legend(fontsize=8)
    for preset, fit in result["extrapolation"].items():
        law = fit.get("nprobe_law")
        if not law:
            continue
        ns = np.array([int(n) for n in law["nprobe_at"]], dtype=float)
        (line,) = right.plot(ns, list(law["nprobe_at"].values()), "o", label=preset)
        grid = np.geomspace(ns.min(), WIKI18_ROWS, 50)
        right.plot(grid, law["a"] * (grid / 1e6) ** law["b"], "-", color=line.get_color())
        lo_hi = fit.get("nprobe_21m_p05_p95")
        if lo_hi:
            mid = fit["nprobe_21m"]
            bar = [[mid - lo_hi[0]], [lo_hi[1] - mid]]
            right.errorbar([WIKI18_ROWS], [mid], yerr=bar, fmt="s", color=line.get_color())
    right.set(xscale="log", yscale="log", xlabel="rows N", ylabel="nprobe for recall@10 >= 0.98",
              title="fitted power law, extrapolated to 21.0M (5-95 % bootstrap)")  # fmt: skip
    right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _valid(ids: np.ndarray) -> np.ndarray:
    return ids[ids >= 0]


def _goal_from(per_query: dict[int, np.ndarray], pick: np.ndarray) -> int | None:
    for nprobe in sorted(per_query):
        if per_query[nprobe][pick].mean() >= GOAL_RECALL:
            return nprobe
    return None


def _fixed_bytes(nlist: int, d: int = 768) -> int:
    """Centroids and their HNSW32 graph (two levels of links, 4-byte ids)."""
    return nlist * 4 * d + nlist * 2 * 32 * 4


def headline_keys(args: Args, result: dict[str, Any], sizes: list[_SizeResult]) -> dict[str, Any]:
    """The issue's keys for the default preset at medium, extrapolated to 21.0M where noted."""
    preset = args.default_preset
    fit = result["extrapolation"].get(preset, {})
    last = sizes[-1].presets[preset]
    headline = result["headline_difficulty"]
    curve = last["by_difficulty"][headline]["curve"]
    # where the goal is missed, the best point of the sweep stands in (and goal_reached says so)
    at_goal = last["by_difficulty"][headline]["at_goal"] or max(curve, key=lambda c: c["recall10"])
    cold = result["cold_start_probe"]
    # fixed memory: the probe process's resident memory minus its index part, at the largest N;
    # resident, not only anonymous: torch maps the encoder's weights from their file
    fixed = cold.get("rss_bytes", cold["anonymous_bytes"]) - cold["index_anonymous_bytes"]
    memory_21m = fixed + fit.get("index_bytes_21m", float("nan")) + 8 * WIKI18_ROWS  # + offsets
    # the fastest reduced precision whose top-3 sets agree with fp32's on >= 97 % of queries
    agreement = result.get("encoder_top3_agreement", {})
    speeds = result["encoder_qps_per_core"]
    reduced = ("bf16", "int8", "int8-onnx", "onnx-fp32")
    good = [p for p in reduced if agreement.get(p, 0.0) >= 0.97]
    encoder = max(good or list(reduced), key=lambda p: speeds[p])
    return {
        "memory_over_flat": memory_21m / FLAT_BYTES_21M,
        "memory_bytes_21m": memory_21m,
        "rerank_pages_touched_per_1000_queries": last.get("rerank_pages_per_1000_queries"),
        "goal_reached": last["by_difficulty"][headline]["at_goal"] is not None,
        "k_factor": last["k_factor"],
        "recall10_vs_flat": at_goal.get("recall10"),
        "top3_set_agreement": at_goal.get("top3"),
        "fp16_flat_top3_set_agreement": sizes[-1].fp16_top3[headline],
        "fp16_flat_recall10": sizes[-1].fp16_recall10[headline],
        "qps_batch512_per_core": fit.get("qps_per_core_21m"),
        "qps_batch512_per_core_measured_at_n": 1 / last["time"]["total_s"]
        if "time" in last
        else None,
        "s_per_query_21m_parts": fit.get("s_per_query_21m_parts"),
        "nprobe_21m": fit.get("nprobe_21m"),
        "k_factor_21m": fit.get("k_factor_21m"),
        "rerank_rows_per_query_21m": fit.get("rerank_rows_per_query_21m"),
        "cold_start_s": result["cold_start_model"]["cold_start_s_21m"],
        "cold_start_s_measured_at_n": cold["first_answer_s"],
        "encoder_precision": encoder,
        "encoder_qps_per_core_int8_or_bf16": result["encoder_qps_per_core"][encoder],
        "encoder_top3_agreement": agreement.get(encoder),
        "encoder_fp32_qps_per_core": result["encoder_qps_per_core"]["fp32"],
        "mmap_resident_over_file": result["mmap_probe"]["over_file"],
        "n_measured_max": max(args.sizes),
    }


def print_table(result: dict[str, Any]) -> None:
    """The per-N, per-preset table on stdout."""
    print(f"{'N':>9} {'preset':>9} {'B/row':>7} {'kf':>3} {'nprobe*':>7} {'r@10':>6} {'top3':>6} "
          f"{'ms/q':>6} {'pages/1k':>9}")  # fmt: skip
    for s in result["sizes"]:
        for preset, e in s["presets"].items():
            d = e["by_difficulty"][result["headline_difficulty"]]
            at = d["at_goal"] or {}
            ms = e.get("time", {}).get("total_s", float("nan")) * 1e3
            print(
                f"{s['n']:>9} {preset:>9} {e['bytes_per_row']:>7.1f} {e['k_factor']:>3} "
                f"{d['nprobe_goal'] or '-':>7} {at.get('recall10', float('nan')):>6.3f} "
                f"{at.get('top3', float('nan')):>6.3f} {ms:>6.3f} "
                f"{e.get('rerank_pages_per_1000_queries', '-'):>9}"
            )
    print(json.dumps(result["headline"], indent=1))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    parsed = tyro.cli(Args)
    if parsed.refit is not None:
        saved = json.loads(parsed.refit.read_text().splitlines()[-1])
        model = build_time_model(saved, saved["default_preset"])
        if parsed.plot is not None:
            plot_result(saved, parsed.plot)
        print(json.dumps(model, indent=1 if not parsed.json else None), flush=True)
        sys.exit(0)
    out = main(parsed)
    if parsed.plot is not None:
        plot_result(out, parsed.plot)
    if parsed.cold_only:
        print(json.dumps(out["cold_start_model"], indent=1))
    else:
        print_table(out)
    if parsed.json:
        print(json.dumps(out, sort_keys=True, default=float), flush=True)
