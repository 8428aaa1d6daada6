"""The reliability attacks of issue 25, each against the real code path, with its own fakes.

- **trickle**: an env step (`SearchQAEnv` on an `HTTPRetriever` with its defaults, the env's
  default `retrieval_deadline_s`) against a server that trickles its headers, its body or a
  chunked body one byte every 0.2 s (`benchmarks.perf.hostile`); the wall time of each step.
- **hung turn**: one turn of 64 episodes through `harness.rollout.episodes.apply_turn` (what the
  tree engine, evaluation and the OpenRLHF samples generator call each turn) on a `CachedRetriever`
  over a server that never answers: 63 episodes search, one answers. The turn's wall time.
- **endless body**: a fresh Python process searches a server that sends an endless chunked
  body as fast as it is read; its peak RSS above the RSS it had before the search.
- **idle connections**: `tracerl serve-retriever` under `ulimit -n 1024`, held by 1,100 idle
  sockets; 20 requests while they are open and 20 once the header deadline has passed. Every
  request must get a status (200 or 503), none may fail or hang, and a line is logged.
- **500 MB header**: one request whose header line is 500 MB, streamed to the same server;
  the status and the server's memory growth (VmHWM and VmRSS, from /proc).
- **CLI**: every bad command line of `benchmarks.perf.bad_inputs`; the tracebacks counted.
- **snapshots**: `n` snapshots mutated at random (a value replaced by one of `_HOSTILE`, a field
  deleted or duplicated, or the whole wrapped in wrappers), restored into a fresh env; the
  errors that are not `SnapshotError` counted by type.
"""

from __future__ import annotations

import contextlib
import copy
import json
import random
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.perf.bad_inputs import bad_command_lines, run_command_line
from benchmarks.perf.hostile import HostileServer, Mode, idle_sockets, send_header_line
from benchmarks.perf.retrieval_server import start_server
from envs import (
    BudgetMeter,
    QATask,
    RetrievalFailedError,
    SearchQAEnv,
    SnapshotError,
    TaskSet,
    restore,
    snapshot,
    snapshot_from_dict,
)
from harness.policies import Completion, SamplingParams
from harness.rollout import EpisodeCodec, apply_turn, start_episodes
from retrieval import BM25Retriever, Document, HTTPRetriever
from retrieval.cache import CachedRetriever

__all__ = [
    "cli_bad_inputs",
    "endless_body",
    "files_changed_after_open",
    "forged_rng_states",
    "hung_turn",
    "index_file_opens",
    "kill_during_overwrite",
    "parser_seconds",
    "server_attacks",
    "snapshot_mutations",
    "starvation",
    "trickle_steps",
]

_TRICKLES: tuple[Mode, ...] = ("trickle-headers", "trickle-body", "trickle-chunked")


def _tasks(n: int) -> TaskSet:
    return TaskSet(
        [QATask(task_id=f"q{i}", question=f"Who is {i}?", golden_answers=("x",)) for i in range(n)]
    )


def trickle_steps() -> dict[str, Any]:
    """The wall time of one env step against each trickling server."""
    times: dict[str, float] = {}
    deadline_s: float | None = None
    for mode in _TRICKLES:
        with HostileServer(mode, interval_s=0.2) as server:
            remote = HTTPRetriever(server.url, index_id="trickle")
            env = SearchQAEnv(_tasks(1), remote)
            deadline_s = env.config.retrieval_deadline_s
            env.reset(seed=0)
            start = time.perf_counter()
            try:
                env.step("<search> who is 0 </search>")
            except RetrievalFailedError:
                pass
            else:
                raise RuntimeError(f"a step against a {mode} server succeeded")
            times[mode] = time.perf_counter() - start
            remote.close()
    return {
        "deadline_s": deadline_s,
        "step_s": times,
        "worst_step_s": max(times.values()),
    }


class _CharTokenizer:
    bos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(map(chr, ids))


def hung_turn(n_episodes: int = 64) -> dict[str, Any]:
    """One turn of `n_episodes` (all but one searching) against a server that never answers."""
    tasks = _tasks(n_episodes)
    codec = EpisodeCodec(_CharTokenizer())
    actions = [f"<search> who is {i} </search>" for i in range(n_episodes - 1)]
    actions.append("<answer> x </answer>")
    completions = [
        Completion(token_ids=tuple(codec.encode_text(a)), text=a, finish_reason="stop")
        for a in actions
    ]
    with HostileServer("hung") as server:
        remote = HTTPRetriever(server.url, index_id="hung")  # the defaults: 4 attempts x 30 s
        env = SearchQAEnv(tasks, CachedRetriever(remote))  # the default retrieval_deadline_s
        live = start_episodes(env, [t.task_id for t in tasks], codec)
        start = time.perf_counter()
        apply_turn(live, completions, codec, SamplingParams(max_new_tokens=64))
        took = time.perf_counter() - start
        remote.close()
    return {
        "n_episodes": n_episodes,
        "deadline_s": env.config.retrieval_deadline_s,
        "turn_s": took,
        "n_failed": sum(e.info.get("failed") == "retrieval" for e in live),
        "n_answered": sum("answer" in e.info for e in live),
    }


_RSS_PROBE = """
import json, sys, threading, time
from retrieval import HTTPRetriever, RetrievalError

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmRSS")) / 1024

remote = HTTPRetriever(sys.argv[1], index_id="endless")
baseline, peak, done = rss_mb(), [0.0], threading.Event()

def sample():
    while not done.is_set():
        peak[0] = max(peak[0], rss_mb())
        time.sleep(0.005)

threading.Thread(target=sample, daemon=True).start()
start = time.perf_counter()
try:
    remote.search(["q"], 3)
    error = None
except RetrievalError as err:
    error = type(err).__name__
took = time.perf_counter() - start
done.set()
time.sleep(0.02)
print(json.dumps({"baseline_mb": baseline, "peak_mb": max(peak[0], rss_mb()), "s": took,
                  "error": error}))
"""


def endless_body() -> dict[str, Any]:
    """Peak RSS growth of a fresh process whose search gets an endless body."""
    with HostileServer("endless-body") as server:
        done = subprocess.run(
            [sys.executable, "-c", _RSS_PROBE, server.url],
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        sent = server.bytes_sent
    probe = json.loads(done.stdout.splitlines()[-1])
    return {
        **probe,
        "growth_mb": max(0.0, probe["peak_mb"] - probe["baseline_mb"]),
        "server_sent_mb": sent / 1e6,
    }


def _memory_mb(pid: int) -> dict[str, float]:
    with open(f"/proc/{pid}/status") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    return {k: int(fields[k].split()[0]) / 1024 for k in ("VmRSS", "VmHWM")}


def _statuses(url: str, n: int) -> Counter[str]:
    outcomes: Counter[str] = Counter()
    for _ in range(n):
        try:
            status = httpx.post(url + "/retrieve", json={"queries": ["capital"]}, timeout=15)
            outcomes[str(status.status_code)] += 1
        except httpx.HTTPError as err:
            outcomes[type(err).__name__] += 1
    return outcomes


def server_attacks(index_dir: Path, *, n_idle: int = 1_100, descriptor_limit: int = 1_024) -> dict:
    """Idle sockets under a descriptor limit, then a 500 MB header, against one server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n_idle + 64:  # this process holds the idle sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n_idle + 256), hard))
    with tempfile.TemporaryFile("w+") as log:
        proc, url = start_server(index_dir, descriptor_limit=descriptor_limit, stderr=log)
        try:
            header_timeout_s = 10.0  # ConnectionLimits' default
            with idle_sockets(url, n_idle) as held:
                time.sleep(1.0)
                during = _statuses(url, 20)
                time.sleep(header_timeout_s + 1.0)
                after = _statuses(url, 20)
                n_open = sum(_still_open(s) for s in held)
            before = _memory_mb(proc.pid)
            start = time.perf_counter()
            status = send_header_line(url, 500_000_000, timeout_s=120)
            header_s = time.perf_counter() - start
            later = _memory_mb(proc.pid)
            good_after = _statuses(url, 1)
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        log.seek(0)
        server_log = log.read()
    clean = all(k in ("200", "503") for k in (*during, *after)) and after.get("200", 0) == 20
    return {
        "descriptor_limit": descriptor_limit,
        "n_idle": n_idle,
        "during_idle": dict(during),
        "after_header_timeout": dict(after),
        "idle_still_open_after_timeout": n_open,
        "refusal_logged": "refused" in server_log or "to make room" in server_log,
        "idle_connections_refused_cleanly": clean,
        "header_500mb_status": status,
        "header_500mb_s": header_s,
        "header_500mb_server_growth_mb": max(
            later["VmHWM"] - before["VmHWM"], later["VmRSS"] - before["VmRSS"], 0.0
        ),
        "good_request_after": dict(good_after),
    }


def _still_open(sock: socket.socket) -> bool:
    """Whether the server still holds `sock` open: nothing to read, neither a status nor EOF."""
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def cli_bad_inputs() -> dict[str, Any]:
    """Run every bad command line; count the tracebacks and the exit codes."""
    with tempfile.TemporaryDirectory() as tmp:
        cases = bad_command_lines(Path(tmp))
        outcomes = {name: run_command_line(argv) for name, argv in cases.items()}
    return {
        "n_cases": len(outcomes),
        "n_commands": len({argv[0] for argv in cases.values()}),
        "with_traceback": sorted(n for n, o in outcomes.items() if o.traceback),
        "exit_codes": dict(Counter(str(o.code) for o in outcomes.values())),
    }


def _deep(depth: int, leaf: Any = 0) -> Any:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


_HOSTILE: list[Any] = [
    None, True, False, -1, 0, 1, 2**63, 10**400, -(10**400), 1e308, float("nan"), float("inf"),
    "", " ", "x" * 100_000, "<answer> a </answer>", "search", "answer", "PCG64", "q0", "d0",
    [], {}, _deep(5_000), {"a": _deep(5_000)}, "[" * 5_000, '{"bit_generator": "PCG64"}',
]  # fmt: skip
"""Values a forger puts anywhere: huge and non-finite numbers, wrong types, deep nesting."""


def _paths(value: Any, prefix: tuple = (), depth: int = 0) -> list[tuple]:
    found = [prefix]
    if depth > 12:
        return found
    if isinstance(value, dict):
        items: Any = value.items()
    else:
        items = enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found += _paths(item, (*prefix, key), depth + 1)
    return found


def _mutate(record: dict, rng: random.Random) -> dict:
    record = copy.deepcopy(record)
    if rng.random() < 0.02:  # a chain of wrappers far deeper than any real one
        for _ in range(rng.choice([70, 5_000])):
            record = {"kind": "wrapper", "schema_version": 1, "wrapper": "BudgetMeter",
                      "state": {}, "inner": record}  # fmt: skip
        return record
    path = rng.choice(_paths(record)[1:])
    parent = record
    for key in path[:-1]:
        parent = parent[key]
    how = rng.random()
    if how < 0.7:
        parent[path[-1]] = rng.choice(_HOSTILE)  # shared: nothing downstream mutates it
    elif how < 0.85:
        del parent[path[-1]]
    elif isinstance(parent, list):
        parent.append(copy.deepcopy(parent[path[-1]]))
    else:
        parent[path[-1]] = [parent[path[-1]], parent[path[-1]]]
    return record


def snapshot_mutations(n: int, seed: int = 0) -> dict[str, Any]:
    """Restore `n` randomly mutated snapshots; count outcomes and untyped errors by type."""
    docs = [Document(doc_id=f"d{i}", title=f"T{i}", text=f"who is {i} x") for i in range(8)]
    base = SearchQAEnv(_tasks(4), BM25Retriever.build(docs))
    sources = []
    for wrapped in (False, True):
        for n_actions in range(3):
            env = BudgetMeter(base.fork()[0]) if wrapped else base.fork()[0]
            env.reset(seed=7, options={"task_id": "q1"})
            for i in range(n_actions):
                env.step(f"<search> who is {i} </search>")
            sources.append((wrapped, json.loads(json.dumps(snapshot(env).to_dict()))))
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    untyped: Counter[str] = Counter()
    for _ in range(n):
        wrapped, record = rng.choice(sources)
        mutated = _mutate(record, rng)
        target = BudgetMeter(base.fork()[0]) if wrapped else base.fork()[0]
        target.reset(seed=1, options={"task_id": "q2"})
        try:
            restore(target, snapshot_from_dict(mutated))
        except SnapshotError:
            outcomes["refused"] += 1
        except Exception as err:  # what this counts
            outcomes["untyped"] += 1
            untyped[type(err).__name__] += 1
        else:
            outcomes["restored"] += 1
    return {"n": n, "outcomes": dict(outcomes), "untyped_by_type": dict(untyped)}


# -- issue 32: index files that cannot lie, a server one client cannot starve -------------------

ROOT = Path(__file__).resolve().parents[2]
_FLAT_ROWS = 4_000
_FLAT_DIM = 32


def _flat_file(directory: Path) -> tuple[Path, Any]:
    """A clustered faiss flat file and 40 queries near its rows."""
    import faiss
    import numpy as np

    rng = np.random.default_rng(5)
    centres = rng.standard_normal((40, _FLAT_DIM))
    rows = centres[rng.integers(0, 40, _FLAT_ROWS)] + 0.5 * rng.standard_normal(
        (_FLAT_ROWS, _FLAT_DIM)
    )
    rows = (rows / np.linalg.norm(rows, axis=1, keepdims=True)).astype(np.float32)
    flat = faiss.IndexFlatIP(_FLAT_DIM)
    flat.add(rows)
    path = directory / "flat.index"
    faiss.write_index(flat, str(path))
    return path, rows[:40] + np.float32(0.01)


def _build(flat: Path, out: Path, seed: int) -> None:
    """The index `_compress_args` builds, built in this process."""
    from retrieval.compressed import CompressConfig, SearchDefaults, compress_flat_index

    search = SearchDefaults(nprobe=4, k_factor=0)
    compress_flat_index(flat, out, CompressConfig(nlist=32, seed=seed, search=search))


def _compress_args(flat: Path, out: Path, seed: int) -> list[str]:
    return [
        "index", "compress", "--faiss-index", str(flat), "--out", str(out), "--preset",
        "rabitqfs", "--nlist", "32", "--nprobe", "4", "--k-factor", "0", "--seed", str(seed),
        "--threads", "1", "--overwrite",
    ]  # fmt: skip


def _answers(directory: Path, queries: Any) -> Any:
    from retrieval.compressed import CompressedIndex

    index = CompressedIndex(directory)
    try:
        return index.search(queries, 10)[1]
    finally:
        index.close()


def index_file_opens(work: Path, bm25_dir: Path) -> dict[str, Any]:
    """Open a compressed and a BM25 index with each file missing, short, or one extra file."""
    import shutil

    from retrieval.compressed import CompressedIndex
    from retrieval.errors import RetrievalError
    from retrieval.indexes import load_index

    flat, _ = _flat_file(work)
    compressed = work / "compressed"
    _build(flat, compressed, 0)
    cases: list[tuple[str, str, Path]] = []
    for kind, directory in (("compressed", compressed), ("bm25", bm25_dir)):
        for path in sorted(p for p in directory.rglob("*") if p.is_file()):
            if path.name not in ("compressed.json", "manifest.json"):
                rel = str(path.relative_to(directory))
                cases += [(kind, f"missing {rel}", path), (kind, f"short {rel}", path)]
        cases.append((kind, "extra file", directory))
    opened: list[str] = []
    for kind, name, path in cases:
        original = compressed if kind == "compressed" else bm25_dir
        copy_dir = work / "case"
        shutil.copytree(original, copy_dir)
        target = copy_dir / path.relative_to(original) if path != original else copy_dir
        if name.startswith("missing"):
            target.unlink()
        elif name.startswith("short"):
            target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
        else:
            (target / "lists.codes.old").write_bytes(b"stale")
        try:
            if kind == "compressed":
                CompressedIndex(copy_dir).close()
            else:
                load_index(copy_dir)
            opened.append(f"{kind}: {name}")
        except RetrievalError:
            pass
        shutil.rmtree(copy_dir)
    return {"n_cases": len(cases), "opened": opened}


def kill_during_overwrite(work: Path, n_kills: int = 20, seed: int = 0) -> dict[str, Any]:
    """`kill -9` at random moments of `tracerl index compress --overwrite`, then open the result.

    The index alternates between two builds (seeds 0 and 1) whose answers differ; after each
    kill the directory must open as one of them (or be refused), never as a mix. Kills fall
    at random in the second half of a run's time (the first is Python starting).
    """
    import numpy as np

    from retrieval.compressed import check_compressed_files
    from retrieval.errors import RetrievalError

    flat, queries = _flat_file(work)
    out = work / "idx"
    cmd = [sys.executable, "-m", "benchmarks.cli", "-q"]
    builds = []
    for build_seed in (0, 1):
        start = time.perf_counter()
        subprocess.run(
            [*cmd, *_compress_args(flat, out, build_seed)],
            check=True,
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        builds.append((time.perf_counter() - start, _answers(out, queries)))
    full_s = max(s for s, _ in builds)
    rng = random.Random(seed)
    outcomes: Counter[str] = Counter()
    mixed = wrong = 0
    for i in range(n_kills):
        proc = subprocess.Popen(
            [*cmd, *_compress_args(flat, out, i % 2)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        # the second half of a run: its first half is the interpreter starting and importing
        time.sleep(rng.uniform(full_s / 2, full_s))
        proc.kill()
        proc.wait()
        try:
            got = _answers(out, queries)
        except RetrievalError:
            outcomes["refused"] += 1
            continue
        try:
            check_compressed_files(out, hashes=True)
            whole = True
        except RetrievalError:
            whole = False
        same = [np.array_equal(got, answers) for _, answers in builds]
        outcomes["old or new build" if any(same) else "other answers"] += 1
        mixed += not whole
        wrong += not any(same)
    return {
        "n_kills": n_kills,
        "full_build_s": full_s,
        "outcomes": dict(outcomes),
        "mixed_dirs": mixed,
        "wrong_answers": wrong,
    }


_CHANGE_CHILD = r"""
import os, sys, numpy as np
from pathlib import Path
from retrieval.compressed import CompressedIndex
from retrieval.errors import RetrievalError
directory, case, other, work = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
queries, before = np.load(work / "queries.npy"), np.load(work / "answers.npy")
index = CompressedIndex(directory)
if case.startswith("after-load"):
    index.load_lists()
name = case.split(":")[1]
target = directory / name
if case.endswith("truncate"):
    os.truncate(target, target.stat().st_size // 3)
elif case.endswith("overwrite"):
    target.write_bytes((other / name).read_bytes())
else:
    tmp = directory / (name + ".new")
    tmp.write_bytes((other / name).read_bytes())
    os.replace(tmp, target)
try:
    after = index.search(queries, 10)[1]
    print("same" if np.array_equal(before, after) else "different")
except RetrievalError as err:
    print("refused:" + type(err).__name__)
"""


def files_changed_after_open(work: Path) -> dict[str, Any]:
    """A process searching a compressed index whose files are truncated or replaced under it.

    Each case runs in its own child process, so a SIGBUS is seen as a signal exit.
    """
    import shutil

    import numpy as np

    flat, queries = _flat_file(work)
    np.save(work / "queries.npy", queries)
    base, other = work / "a", work / "b"
    for directory, build_seed in ((base, 0), (other, 1)):
        _build(flat, directory, build_seed)
    np.save(work / "answers.npy", _answers(base, queries))
    results: dict[str, str] = {}
    for when in ("after-open", "after-load"):
        for name in ("lists.codes", "lists.ids", "index.faiss"):
            for how in ("truncate", "overwrite", "rename"):
                case = f"{when}:{name}:{how}"
                directory = work / "case" / "idx"
                shutil.copytree(base, directory)
                done = subprocess.run(
                    [
                        sys.executable,
                        "-c",
                        _CHANGE_CHILD,
                        str(directory),
                        case,
                        str(other),
                        str(work),
                    ],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    check=False,
                    timeout=300,
                )
                last = done.stdout.strip().splitlines()[-1:] or [done.stderr.strip()[-300:]]
                results[case] = f"signal {-done.returncode}" if done.returncode < 0 else last[0]
                shutil.rmtree(work / "case")
    return {
        "cases": results,
        "crashes": sum(v.startswith("signal") for v in results.values()),
        "silent_wrong_answers": sum(v == "different" for v in results.values()),
    }


def _rss_mb(pid: int) -> float:
    return _memory_mb(pid)["VmRSS"]


def _big_docs(n: int) -> list[Document]:
    """Documents of about 400 characters, so that a maximal answer is a few MB."""
    words = [f"w{i}" for i in range(300)]
    rng = random.Random(3)
    return [
        Document(
            doc_id=f"d{i}",
            title=f"City {i}",
            text=f"City {i} is a capital of land {i}. " + " ".join(rng.choices(words, k=70)),
        )
        for i in range(n)
    ]


def _max_body() -> bytes:
    """A maximal valid request: 512 distinct queries x topk 8 (the 4,096-hit limit)."""
    queries = [f"capital of land {i} w{i % 300}" for i in range(512)]
    return json.dumps({"queries": queries, "topk": 8}).encode()


def starvation(work: Path, *, n_unread: int = 64, window_s: float = 15.0) -> dict[str, Any]:
    """Clients that starve a server, each beside a real server and normal clients.

    Non-reading clients (memory), SIGTERM while they are connected, 3 clients looping maximal
    requests, and a reconnecting slowloris past the connection cap.
    """
    import signal
    import statistics

    from benchmarks.perf.hostile import NormalClients, Slowloris, non_readers

    index_dir = work / "big"
    BM25Retriever.build(_big_docs(3_000)).save(index_dir)
    body = _max_body()
    out: dict[str, Any] = {}
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4_096), hard))
    extra = ("--batching.max-pending-queries", "65536")

    # 1. clients that never read, then SIGTERM while they are connected
    proc, url = start_server(index_dir, *extra, stderr=subprocess.DEVNULL)
    try:
        httpx.post(url + "/retrieve", content=body, timeout=60)  # warm: one answer rendered
        time.sleep(1.0)
        baseline = _rss_mb(proc.pid)
        peak = baseline
        with non_readers(url, body, n_unread):
            end = time.monotonic() + window_s
            while time.monotonic() < end:
                peak = max(peak, _rss_mb(proc.pid))
                time.sleep(0.2)
            settled = _rss_mb(proc.pid)
        out["unread"] = {
            "n_clients": n_unread,
            "answer_bytes": len(httpx.post(url + "/retrieve", content=body, timeout=60).content),
            "baseline_mb": baseline,
            "peak_growth_mb": peak - baseline,
            "growth_after_s": window_s,
            "settled_growth_mb": settled - baseline,
        }
        with non_readers(url, body, n_unread):
            time.sleep(3.0)  # their answers are rendered and stuck in the buffers
            start = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=120)
                out["sigterm_exit_s"] = time.perf_counter() - start
            except subprocess.TimeoutExpired:
                out["sigterm_exit_s"] = None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # 2. normal clients alone, then beside 3 clients looping maximal requests
    proc, url = start_server(index_dir, *extra, stderr=subprocess.DEVNULL)
    try:
        with NormalClients(url) as alone:
            time.sleep(window_s)
        stop = time.monotonic() + window_s

        def heavy() -> None:
            with httpx.Client(timeout=120) as client:
                while time.monotonic() < stop:
                    with contextlib.suppress(httpx.HTTPError):  # only its load matters
                        client.post(url + "/retrieve", content=body)

        heavies = [threading.Thread(target=heavy, daemon=True) for _ in range(3)]
        for thread in heavies:
            thread.start()
        time.sleep(1.0)
        with NormalClients(url) as loaded:
            time.sleep(window_s - 1.0)
        for thread in heavies:
            thread.join(timeout=180)
        out["heavy"] = {
            "p50_ms_alone": 1e3 * statistics.median(s for ok, s in alone.results if ok),
            "p50_ms_beside_heavy": 1e3 * statistics.median(s for ok, s in loaded.results if ok),
            "ok_beside_heavy": sum(ok for ok, _ in loaded.results),
            "n_beside_heavy": len(loaded.results),
        }

        # 3. 600 reconnecting slowloris sockets, over the 512 cap
        with Slowloris(url, 600) as attack:
            time.sleep(3.0)
            with NormalClients(url) as during:
                time.sleep(window_s)
        out["slowloris"] = {
            "n_sockets": 600,
            "reconnects": attack.reconnects,
            "ok": sum(ok for ok, _ in during.results),
            "n": len(during.results),
            "share_ok": sum(ok for ok, _ in during.results) / max(1, len(during.results)),
            "server_alive": proc.poll() is None,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    return out


_FORGED_CHILD = r"""
import dataclasses, json, sys
from benchmarks.perf.attacks import _tasks
from envs import SearchQAEnv, SnapshotError
from retrieval import BM25Retriever, Document
docs = [Document(doc_id=f"d{i}", title=f"T{i}", text=f"who is {i} x") for i in range(8)]
env = SearchQAEnv(_tasks(4), BM25Retriever.build(docs))
env.reset(seed=1)
good = env.snapshot()
for i, state in enumerate(json.loads(sys.argv[1])):
    if i < int(sys.argv[2]):
        continue
    print(i, flush=True)
    try:
        env.restore(dataclasses.replace(good, rng_state=json.dumps(state)))
    except SnapshotError:
        continue
    env.reset()
    env.np_random.integers(1 << 30, size=1000)
print("done", flush=True)
"""


def forged_rng_states() -> dict[str, Any]:
    """Restore forged bit-generator states, then draw; count processes killed by a signal."""
    key = [5] * 624
    forged = [
        {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
        for pos in (10**8, 625, 10**4, -1, 2**40)
    ] + [
        {"bit_generator": "MT19937", "state": {"key": key[:10], "pos": 3}},
        {"bit_generator": "PCG64", "state": {"state": 2**200, "inc": 1}, "has_uint32": 0,
         "uinteger": 0},
        {"bit_generator": "Philox", "state": {"counter": [0] * 4, "key": [0, 0]},
         "buffer": [0] * 4, "buffer_pos": 10**6, "has_uint32": 0, "uinteger": 0},
        {"bit_generator": "SFC64", "state": {"state": [0] * 4}, "has_uint32": 7,
         "uinteger": 0},
    ]  # fmt: skip
    crashes, start = 0, 0
    while start < len(forged):
        done = subprocess.run(
            [sys.executable, "-c", _FORGED_CHILD, json.dumps(forged), str(start)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
            timeout=300,
        )
        lines = done.stdout.split()
        if done.returncode < 0:  # killed while on the last index it printed
            crashes += 1
            start = int(lines[-1]) + 1
        elif done.returncode != 0:
            raise RuntimeError(f"the forged-state child failed: {done.stderr[-2000:]}")
        else:
            break
    return {"n_forged": len(forged), "crashes": crashes}


def parser_seconds(n_bytes: int = 131_072) -> float:
    """CPU seconds to parse one `n_bytes` search-r1 action made to be slow (openers only)."""
    from envs.protocol import parse_action_search_r1

    text = "<search>" * (n_bytes // 8)
    start = time.process_time()
    parse_action_search_r1(text)
    return time.process_time() - start
