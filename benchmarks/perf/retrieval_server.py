"""Retrieval serving: micro-batched against one-query-per-call, under 64 concurrent clients.

One dense index (MiniLM + faiss flat, where batching matters most: a forward pass over 64
queries costs far less than 64 passes over one) is served twice by `tracerl serve-retriever`
in a subprocess: with the default micro-batching, and with `--batching.max-batch-queries 1`,
which makes one encoder call and one search call per request, as a synchronous server does.
`--concurrency` asyncio clients in this process, each with its own HTTPRetriever and connection,
send one-query requests until `--n-requests` are done. Reported: throughput (requests per
second over the timed run), p50/p99 latency per request, and the server process's CPU time per
request (user + system, from psutil: less sensitive than wall time to other load on the
machine), for both modes. The clients' CPU time per request is reported too: on a small machine
the clients share the cores with the server, so throughput is bounded by both. The same two
configurations of `retrieval.batching.MicroBatcher` are also timed in this process without
HTTP (`in_process`), which separates the gain of batching from the cost of the HTTP path.
`--kind bm25` serves a BM25 index instead: there a batch saves only per-call overhead (each
query is still scored on its own), so it shows what batching gives when no encoder runs.

Run: `python -m benchmarks.perf.retrieval_server --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import asyncio
import functools
import json
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import psutil
import tyro

from benchmarks.meta import run_meta
from benchmarks.perf.retrieval_bm25 import DEFAULT_DATA, bench_corpus
from retrieval import BM25Retriever, DenseRetriever, HTTPRetriever, Retriever, SentenceEncoder
from retrieval.batching import BatchingConfig, MicroBatcher


@dataclass
class Args:
    """Server batching benchmark options."""

    kind: Literal["dense", "bm25"] = "dense"
    """the index served: dense (MiniLM + faiss flat) or bm25"""
    n_docs: int = 1_000
    """documents in the index (for dense, query encoding, not search, dominates a request)"""
    n_requests: int = 3_000
    """timed requests per mode, one query each"""
    concurrency: int = 64
    """concurrent clients"""
    data_dir: Path = DEFAULT_DATA
    """the shared real dataset samples (synthetic only if absent)"""
    threads: int | None = None
    """passed to the servers' --threads, and used in process (None: the libraries' defaults)"""
    quick: bool = False
    """a smoke test: 32 documents, 64 requests"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.n_docs, self.n_requests = 32, 64


def start_server(
    index_dir: Path,
    *extra: str,
    timeout_s: float = 300.0,
    descriptor_limit: int | None = None,
    stderr: Any = None,
) -> tuple[Any, str]:
    """`tracerl serve-retriever` on a free port; returns (process, base URL) once it is ready.

    `descriptor_limit` sets the server's `ulimit -n` (soft and hard); `stderr` is where its log
    goes (None: this process's stderr).
    """
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.cli",
        "-q",
        "serve-retriever",
        "--index",
        str(index_dir),
    ]
    if descriptor_limit is not None:  # the shell's ulimit: no preexec_fn in a threaded parent
        cmd = ["sh", "-c", f'ulimit -n {int(descriptor_limit)} && exec "$0" "$@"', *cmd]
    proc = subprocess.Popen(
        [*cmd, "--port", "0", *extra], stdout=subprocess.PIPE, stderr=stderr, text=True
    )
    lines: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put("")

    threading.Thread(target=pump, daemon=True).start()
    while True:
        line = lines.get(timeout=timeout_s)
        if not line:
            raise RuntimeError(f"the server exited with code {proc.wait()}")
        found = re.search(r"ready at (http://\S+)", line)
        if found:
            return proc, found.group(1)


async def _load(url: str, queries: list[str], n_requests: int, concurrency: int) -> dict[str, Any]:
    # Each client owns its connection, as separate rollout workers would: one shared pool of 64
    # connections costs the client process far more CPU per request (httpcore's pool
    # bookkeeping) than the server spends, and would make this a benchmark of the client.
    # One attempt (an error must not hide) and a long timeout: a serial server under 64
    # clients makes the last request wait for 63 others, and latency is what we measure.
    clients = [
        HTTPRetriever(url, max_attempts=1, max_connections=1, timeout_s=600.0, index_id="bench")
        for _ in range(concurrency)
    ]
    latencies: list[float] = []
    n_sent = 0

    async def client(remote: HTTPRetriever, warm_up: bool) -> None:
        nonlocal n_sent
        while True:
            if warm_up:
                if n_sent >= concurrency:
                    return
            elif n_sent >= n_requests:
                return
            query = queries[n_sent % len(queries)]
            n_sent += 1
            start = time.perf_counter()
            await remote.asearch([query], k=3)
            if not warm_up:
                latencies.append(time.perf_counter() - start)

    try:
        await asyncio.gather(*(client(c, True) for c in clients))
        n_sent = 0
        start = time.perf_counter()
        await asyncio.gather(*(client(c, False) for c in clients))
        elapsed = time.perf_counter() - start
    finally:
        await asyncio.gather(*(c.aclose() for c in clients))
    ms = np.array(latencies) * 1000
    return {
        "throughput_rps": len(latencies) / elapsed,
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
        "n_requests": len(latencies),
    }


async def _load_in_process(
    retriever: Retriever,
    config: BatchingConfig,
    queries: list[str],
    n_requests: int,
    concurrency: int,
    threads: int | None,
) -> dict[str, Any]:
    thread_setup = None
    if threads is not None:
        import faiss

        thread_setup = functools.partial(faiss.omp_set_num_threads, threads)  # as the server does
    batcher = MicroBatcher(retriever, config, thread_setup=thread_setup)
    await batcher.start()
    n_sent = 0

    async def client() -> None:
        nonlocal n_sent
        while n_sent < n_requests:
            query = queries[n_sent % len(queries)]
            n_sent += 1
            await batcher.search([query], 3)

    try:
        start = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    finally:
        await batcher.stop()
    return {"throughput_rps": n_requests / elapsed, "n_batches": batcher.stats().n_batches}


def _serve_and_load(index_dir: Path, extra: list[str], args: Args, queries: list[str]) -> Any:
    proc, url = start_server(index_dir, *extra)
    server, client = psutil.Process(proc.pid), psutil.Process()
    try:
        before = server.cpu_times(), client.cpu_times()
        result = asyncio.run(_load(url, queries, args.n_requests, args.concurrency))
        after = server.cpu_times(), client.cpu_times()
        n_sent = args.n_requests + args.concurrency  # the warm-up is in the CPU times too
        for name, start, end in zip(("server", "client"), before, after, strict=True):
            cpu_s = (end.user + end.system) - (start.user + start.system)
            result[f"{name}_cpu_ms_per_request"] = 1000 * cpu_s / n_sent
        result["server_stats"] = HTTPRetriever(url).health()["stats"]
        result["server_flags"] = extra
        return result
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main(args: Args) -> dict[str, Any]:
    """Build the index, then load-test it served with and without micro-batching."""
    documents, queries, counts = bench_corpus(args.n_docs, args.data_dir)
    print(f"corpus: {len(documents):,} documents {counts}", file=sys.stderr)
    if args.threads is not None:
        import faiss
        import torch

        torch.set_num_threads(args.threads)  # the in-process run matches the servers
        faiss.omp_set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        index_dir = Path(tmp) / args.kind
        retriever: DenseRetriever | BM25Retriever = (
            DenseRetriever.build(documents, SentenceEncoder(), progress=True)
            if args.kind == "dense"
            else BM25Retriever.build(documents, progress=True)
        )
        retriever.save(index_dir)
        in_process = {
            mode: asyncio.run(
                _load_in_process(
                    retriever, config, queries, args.n_requests, args.concurrency, args.threads
                )
            )
            for mode, config in (
                ("batched", BatchingConfig()),
                ("unbatched", BatchingConfig(max_batch_queries=1)),
            )
        }
        print(f"in process: {in_process}", file=sys.stderr)
        threads = [] if args.threads is None else ["--threads", str(args.threads)]
        batched = _serve_and_load(index_dir, threads, args, queries)
        print(f"batched: {batched}", file=sys.stderr)
        unbatched = _serve_and_load(
            index_dir, [*threads, "--batching.max-batch-queries", "1"], args, queries
        )
        print(f"unbatched: {unbatched}", file=sys.stderr)
    return {
        "batched_over_unbatched_throughput": batched["throughput_rps"]
        / unbatched["throughput_rps"],
        "p50_ms": batched["p50_ms"],
        "p99_ms": batched["p99_ms"],
        "unbatched_over_batched_server_cpu": unbatched["server_cpu_ms_per_request"]
        / batched["server_cpu_ms_per_request"],
        "batched": batched,
        "unbatched": unbatched,
        "in_process": {
            **in_process,
            "batched_over_unbatched_throughput": in_process["batched"]["throughput_rps"]
            / in_process["unbatched"]["throughput_rps"],
        },
        "kind": args.kind,
        "n_documents": len(documents),
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """The figures, human-readable, on stderr."""
    print(
        f"{'mode':<10} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'batches':>8} "
        f"{'server cpu ms/req':>18} {'client cpu ms/req':>18}",
        file=sys.stderr,
    )
    for mode in ("batched", "unbatched"):
        r = result[mode]
        print(
            f"{mode:<10} {r['throughput_rps']:>8.1f} {r['p50_ms']:>8.1f} {r['p99_ms']:>8.1f} "
            f"{r['server_stats']['n_batches']:>8} {r['server_cpu_ms_per_request']:>18.1f} "
            f"{r['client_cpu_ms_per_request']:>18.1f}",
            file=sys.stderr,
        )
    print(f"throughput ratio: {result['batched_over_unbatched_throughput']:.2f}x", file=sys.stderr)
    in_process = result["in_process"]
    print(
        f"without HTTP (MicroBatcher in process): {in_process['batched']['throughput_rps']:.1f} "
        f"vs {in_process['unbatched']['throughput_rps']:.1f} queries/s, "
        f"{in_process['batched_over_unbatched_throughput']:.2f}x",
        file=sys.stderr,
    )


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
