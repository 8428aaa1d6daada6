"""The reliability attacks of issue 25, each against the real code path, with its own fakes.

- **trickle**: an env step (`SearchQAEnv` on an `HTTPRetriever` with its defaults, the env's
  default `retrieval_deadline_s`) against a server that trickles its headers, its body or a
  chunked body one byte every 0.2 s (`benchmarks.perf.hostile`); the wall time of each step.
- **hung turn**: one turn of 64 episodes through `harness.episodes.apply_turn` (what the tree
  engine, evaluation and the OpenRLHF samples generator call each turn) on a `CachedRetriever`
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

import copy
import json
import random
import resource
import socket
import subprocess
import sys
import tempfile
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
from harness.backends import Completion, SamplingParams
from harness.episodes import EpisodeCodec, apply_turn, start_episodes
from retrieval import BM25Retriever, Document, HTTPRetriever
from retrieval.cache import CachedRetriever

__all__ = [
    "cli_bad_inputs",
    "endless_body",
    "hung_turn",
    "server_attacks",
    "snapshot_mutations",
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
        "refusal_logged": "refused" in server_log,
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
