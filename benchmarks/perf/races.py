"""The reliability attacks of issue 42, each against the real code path.

Racing builds, forged generator states, lying manifests and damaged BM25 arrays; each function
returns its headline count.

- **concurrent builds** (`concurrent_builds`): two or three `tracerl index build --overwrite`
  into one `--out`, started at the same moment (as a launcher's ranks would), and staggered: a
  second CLI build launched while the first holds the lock (reading and indexing a 20,000-line
  corpus), and a second API `save` told to start the moment the first one's `save` starts (the
  probe's recipe: B as A saves), each through two processes.
  A trial is *broken* when the directory left at `--out` does not open, does not verify, lacks
  `corpus.jsonl`, or a process ended otherwise than whole (exit 0) or refused in one line
  naming a builder's PID (exit 2). `concurrent_build_broken_indexes` counts them.
- **forged rng states** (`forged_rng_hangs`): degenerate bit-generator states (all-zero
  MT19937 keys at every position, PCG64 and PCG64DXSM states with even increments) restored
  into an env, then `reset()` and draws, each in a child process with a timeout. A child that
  does not finish in time hung: `forged_rng_hangs` counts them.
- **verify false passes** (`verify_false_passes`): `tracerl index verify` over directories it
  must refuse: no file table (with a flipped byte, or another build's same-size file), a
  compressed record saying `"lists": "in-index"` over split lists or an unknown layout, a
  manifest of another kind, the race's artefact (a table without `corpus.jsonl`), and flipped
  bytes under a table. Each exit code 0 is a false pass.
- **damaged BM25** (`damaged_bm25_statuses`): bit flips (1 and 20) in each `bm25s/` file of a
  BM25 index, same size; each copy served by `tracerl serve-retriever` (read into memory, and
  `--mmap`) and asked every query. `damaged_bm25_500s` counts the 5xx answers.
"""

from __future__ import annotations

import contextlib
import json
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from benchmarks.perf.bad_inputs import run_command_line
from benchmarks.perf.retrieval_server import start_server
from retrieval import BM25Retriever, Document

__all__ = [
    "concurrent_builds",
    "damaged_bm25_statuses",
    "forged_rng_hangs",
    "verify_false_passes",
]

ROOT = Path(__file__).resolve().parents[2]
_CLI = [sys.executable, "-m", "benchmarks.cli"]


def _write_corpus(path: Path, n: int, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w") as out:
        for i in range(n):
            words = " ".join(f"w{rng.randrange(5_000)}" for _ in range(30))
            out.write(json.dumps({"id": f"d{i}", "contents": f'"T{i}"\n{words}'}) + "\n")
    return path


def _whole(out: Path, sizes: set[int]) -> bool:
    """The directory at `out` opens, verifies, holds its corpus and one build's documents."""
    from retrieval import load_index
    from retrieval.errors import RetrievalError
    from retrieval.indexes import verify_index

    try:
        verify_index(out)
        index = load_index(out)
    except RetrievalError:
        return False
    return (out / "corpus.jsonl").is_file() and index.manifest.n_documents in sizes


def _ended_well(code: int, err: str) -> str:
    """One builder's exit: "whole", "refused" (one line naming a PID) or "bad"."""
    if code == 0:
        return "whole"
    lines = err.strip().splitlines()
    if code == 2 and len(lines) == 1 and "is being built by" in lines[0]:
        return "refused"
    return "bad"


_API_BUILD = r"""
import sys
from retrieval import BM25Retriever
from retrieval.corpus import read_corpus
from retrieval.errors import IndexBusyError
retriever = BM25Retriever.build(read_corpus(sys.argv[1]))
if sys.argv[3:] == ["wait"]:  # built; save only when told, to land inside another's save
    print("ready", flush=True)
    sys.stdin.readline()
print("saving", flush=True)
try:
    retriever.save(sys.argv[2])
except IndexBusyError as err:
    print(f"refused: {err}", file=sys.stderr)
    raise SystemExit(2)
"""


def _launch(kind: str, corpus: Path, out: Path, *, wait: bool = False) -> subprocess.Popen[str]:
    if kind == "cli":
        cmd = [*_CLI, "index", "build", "--corpus", str(corpus), "--out", str(out), "--overwrite"]
    else:
        cmd = [sys.executable, "-c", _API_BUILD, str(corpus), str(out), *(["wait"] if wait else [])]
    env = {"TQDM_DISABLE": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**__import__("os").environ, **env},
    )


def _wait_for(proc: subprocess.Popen[str], marker: str, stream: str, timeout_s: float) -> str:
    """Read `proc`'s `stream` until a line holds `marker`; return what was read."""
    source = proc.stderr if stream == "stderr" else proc.stdout
    assert source is not None
    seen = []
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        line = source.readline()
        if not line:
            break
        seen.append(line)
        if marker in line:
            break
    return "".join(seen)


def concurrent_builds(
    work: Path, *, n_at_once: int = 4, n_staggered: int = 3, n_big: int = 20_000
) -> dict[str, Any]:
    """Builds racing into one `--out`; `broken` counts the trials that left a bad index."""
    work.mkdir(parents=True, exist_ok=True)
    small = _write_corpus(work / "small.jsonl", 500, seed=1)
    medium = _write_corpus(work / "medium.jsonl", 3_000, seed=2)
    big = _write_corpus(work / "big.jsonl", n_big, seed=3)
    sizes = {500, 3_000, n_big}
    trials: list[dict[str, Any]] = []
    for kind in ("cli", "api"):
        for i in range(n_at_once):  # as a launcher's ranks: all at the same moment
            out = work / f"{kind}-together-{i}"
            procs = [_launch(kind, medium, out) for _ in range(3 if kind == "cli" else 2)]
            ends = [(p.wait(timeout=600), p.stderr.read() if p.stderr else "") for p in procs]
            trials.append(_trial(kind, "at once", out, ends, sizes))
        for i in range(n_staggered):  # B while A works: A's build (CLI), A's save (API)
            out = work / f"{kind}-staggered-{i}"
            ends = (
                _staggered_cli(big, small, out)
                if kind == "cli"
                else _staggered_api(big, small, out)
            )
            trials.append(_trial(kind, "staggered", out, ends, sizes))
    broken = sum(not t["whole"] or "bad" in t["exits"] for t in trials)
    return {
        "n_trials": len(trials),
        "broken": broken,
        "outcomes": dict(
            Counter(f"{t['kind']} {t['when']}: {'+'.join(t['exits'])}" for t in trials)
        ),
        "strays_left": sum(t["strays"] for t in trials),
        "bad_exits": [line for t in trials for line in t["bad_stderr"]],
    }


def _staggered_cli(big: Path, small: Path, out: Path) -> list[tuple[int, str]]:
    """B launched once A holds the lock (A's PID in it): A is reading and building."""
    first = _launch("cli", big, out)
    lock = out.parent / f".{out.name}.lock"  # retrieval.index_files.lock_path
    end = time.monotonic() + 600
    while time.monotonic() < end and first.poll() is None:
        with contextlib.suppress(OSError):
            if lock.read_text().strip() == str(first.pid):
                break
        time.sleep(0.01)
    second = _launch("cli", small, out)
    return [_end(first), _end(second)]


def _staggered_api(big: Path, small: Path, out: Path) -> list[tuple[int, str]]:
    """B, built and waiting, told to save the moment A starts saving (the probe's recipe)."""
    second = _launch("api", small, out, wait=True)
    _wait_for(second, "ready", "stdout", timeout_s=600)
    first = _launch("api", big, out)
    _wait_for(first, "saving", "stdout", timeout_s=600)
    assert second.stdin is not None
    second.stdin.write("go\n")
    second.stdin.flush()
    return [_end(first), _end(second)]


def _end(proc: subprocess.Popen[str]) -> tuple[int, str]:
    code = proc.wait(timeout=600)
    return code, proc.stderr.read() if proc.stderr else ""


def _trial(
    kind: str, when: str, out: Path, ends: list[tuple[int, str]], sizes: set[int]
) -> dict[str, Any]:
    exits = sorted(_ended_well(code, _last_lines(err)) for code, err in ends)
    strays = len(list(out.parent.glob(f".{out.name}.tmp-*")))
    return {
        "kind": kind,
        "when": when,
        "exits": exits,
        "whole": _whole(out, sizes),
        "strays": strays,
        "bad_stderr": [_last_lines(err)[-300:] for code, err in ends if code not in (0, 2)],
    }


def _last_lines(err: str) -> str:
    """A builder's own last words: its log lines and progress bars left out."""
    lines = [line for line in err.splitlines() if line.strip() and "INFO" not in line]
    return "\n".join(lines[-1:])


# --- forged generator states ---------------------------------------------------------------

_RNG_CHILD = r"""
import dataclasses, json, sys
from envs import QATask, SearchQAEnv, SnapshotError, TaskSet
from retrieval import BM25Retriever, Document
tasks = TaskSet([QATask(task_id=f"q{i}", question=f"Who is {i}?", golden_answers=("x",))
                 for i in range(390)])
env = SearchQAEnv(tasks, BM25Retriever.build([Document(doc_id="d", title="T", text="who")]))
env.reset(seed=1)
good = env.snapshot()
for i, state in enumerate(json.loads(sys.argv[1])):
    if i < int(sys.argv[2]):
        continue
    print(f"start {i}", flush=True)
    try:
        env.restore(dataclasses.replace(good, rng_state=json.dumps(state)))
    except SnapshotError as err:
        print(f"refused {i} {err.field}", flush=True)
        continue
    env.reset()
    env.np_random.integers(390, size=64)
    print(f"drew {i}", flush=True)
"""


def _degenerate_states() -> list[dict[str, Any]]:
    mt = [
        {"bit_generator": "MT19937", "state": {"key": key, "pos": pos}}
        for key in ([0] * 624, [0x7FFFFFFF] + [0] * 623, [12345] + [0] * 623)
        for pos in (0, 1, 312, 623, 624)
    ]
    pcg = [
        {"bit_generator": name, "state": {"state": state, "inc": inc}, "has_uint32": 0,
         "uinteger": 0}
        for name in ("PCG64", "PCG64DXSM")
        for state, inc in ((0, 0), (0, 2), (0, 1 << 127), (5, 0), (1 << 100, 0))
    ]  # fmt: skip
    return mt + pcg


def forged_rng_hangs(timeout_s: float = 20.0) -> dict[str, Any]:
    """Restore each degenerate state and draw, in children; count the ones that never return."""
    states = _degenerate_states()
    hangs, outcomes, start = 0, Counter[str](), 0
    while start < len(states):
        proc = subprocess.Popen(
            [sys.executable, "-c", _RNG_CHILD, json.dumps(states), str(start)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        try:
            out, err = proc.communicate(timeout=timeout_s + 0.3 * (len(states) - start))
        except subprocess.TimeoutExpired:
            proc.kill()  # SIGINT does not stop the spinning draw: it holds the GIL
            out, err = proc.communicate()
        lines = out.split("\n")
        for line in lines:
            if line.startswith(("refused", "drew")):
                outcomes[line.split()[0]] += 1
        started = [int(line.split()[1]) for line in lines if line.startswith("start")]
        finished = {int(line.split()[1]) for line in lines if line.startswith(("refused", "drew"))}
        if proc.returncode == 0:
            break
        if started and started[-1] not in finished:
            hangs += 1  # killed (or dead) on the state it had started
            outcomes["hung"] += 1
            start = started[-1] + 1
        else:
            raise RuntimeError(f"the forged-state child failed: {err[-2000:]}")
    return {"n_states": len(states), "hangs": hangs, "outcomes": dict(outcomes)}


# --- verify false passes --------------------------------------------------------------------


def _flip(path: Path, n_bits: int, rng: random.Random, skip: int = 128) -> None:
    data = bytearray(path.read_bytes())
    lo = min(skip, max(0, len(data) - 1))
    for _ in range(n_bits):
        i = rng.randrange(lo, len(data))
        data[i] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _edit_json(path: Path, change: Any) -> None:
    record = json.loads(path.read_text())
    change(record)
    path.write_text(json.dumps(record))


def verify_false_passes(work: Path, bm25_dir: Path) -> dict[str, Any]:
    """`tracerl index verify` over directories it must refuse; exit code 0 is a false pass."""
    from benchmarks.perf.attacks import _build, _flat_file
    from retrieval.manifest import make_index_id

    work.mkdir(parents=True, exist_ok=True)
    flat, _ = _flat_file(work)
    compressed = work / "compressed"
    _build(flat, compressed, 0)
    other = work / "other"
    _build(flat, other, 1)  # another build, same nlist: same-size files
    rng = random.Random(0)

    def no_table(directory: Path, manifest: str) -> None:
        _edit_json(directory / manifest, lambda r: r.pop("files"))

    def to_dense(record: dict[str, Any]) -> None:
        record["kind"] = "dense"
        record["index_id"] = make_index_id("dense", record["corpus_hash"], record["params"])

    def no_corpus(directory: Path) -> None:
        (directory / "corpus.jsonl").unlink()
        _edit_json(directory / "manifest.json", lambda r: r["files"].pop("corpus.jsonl"))

    def bm25_flip_no_table(d: Path) -> None:
        no_table(d, "manifest.json")
        _flip(d / "corpus.jsonl", 1, rng)

    def codes_flip_no_table(d: Path) -> None:
        no_table(d, "compressed.json")
        _flip(d / "lists.codes", 1, rng)

    def swap_no_table(d: Path) -> None:
        no_table(d, "compressed.json")
        shutil.copyfile(other / "index.faiss", d / "index.faiss")

    def layout(value: str) -> Any:
        return lambda d: _edit_json(d / "compressed.json", lambda r: r.update(lists=value))

    cases: dict[str, tuple[Path, Any]] = {
        "bm25: no table, a flipped byte": (bm25_dir, bm25_flip_no_table),
        "bm25: a flipped bit under the table": (
            bm25_dir, lambda d: _flip(d / "bm25s" / "data.csc.index.npy", 1, rng),
        ),
        "bm25: kind dense over bm25 files": (
            bm25_dir, lambda d: _edit_json(d / "manifest.json", to_dense),
        ),
        "bm25: a table without corpus.jsonl (the race's artefact)": (bm25_dir, no_corpus),
        "compressed: no table, a flipped byte in lists.codes": (compressed, codes_flip_no_table),
        "compressed: no table, another build's index.faiss": (compressed, swap_no_table),
        "compressed: lists in-index over split lists": (compressed, layout("in-index")),
        "compressed: an unknown lists layout": (compressed, layout("sharded")),
        "compressed: another build's lists.ids under the table": (
            compressed, lambda d: shutil.copyfile(other / "lists.ids", d / "lists.ids"),
        ),
    }  # fmt: skip
    passed, results = [], {}
    for name, (original, damage) in cases.items():
        case = work / "case"
        shutil.copytree(original, case)
        damage(case)
        outcome = run_command_line(["index", "verify", str(case)])
        lines = outcome.output.strip().splitlines()
        results[name] = {"code": outcome.code, "line": lines[-1][:200] if lines else ""}
        if outcome.code == 0:
            passed.append(name)
        shutil.rmtree(case)
    return {"n_cases": len(cases), "false_passes": passed, "cases": results}


# --- damaged BM25 served --------------------------------------------------------------------


def _bm25_docs(n: int = 330) -> list[Document]:
    rng = random.Random(7)
    words = [f"w{i}" for i in range(800)]
    return [
        Document(doc_id=f"d{i}", title=f"T{i}", text=" ".join(rng.choices(words, k=25)))
        for i in range(n)
    ]


def _ask(url: str, queries: list[str], statuses: Counter[str], examples: dict[str, str]) -> None:
    """Send each query; count the statuses, and a connection the server dropped (it died)."""
    with httpx.Client(base_url=url, timeout=60) as http:
        for query in queries:
            try:
                r = http.post("/retrieve", json={"queries": [query], "topk": 3})
            except httpx.TransportError as err:
                statuses["no answer"] += 1
                examples.setdefault("no answer", repr(err)[:200])
                return
            statuses[str(r.status_code)] += 1
            if r.status_code != 200:
                examples.setdefault(str(r.status_code), r.text[:200])


def damaged_bm25_statuses(work: Path, *, n_queries: int = 60) -> dict[str, Any]:
    """Serve BM25 indexes with flipped bits in each array; count the statuses answered."""
    work.mkdir(parents=True, exist_ok=True)
    docs = _bm25_docs()
    clean = work / "clean"
    BM25Retriever.build(docs).save(clean)
    rng = random.Random(3)
    queries = [" ".join(rng.choices(docs[rng.randrange(len(docs))].text.split(), k=3))
               for _ in range(n_queries)]  # fmt: skip
    files = sorted(p.relative_to(clean) for p in (clean / "bm25s").iterdir())
    statuses: Counter[str] = Counter()
    starts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for rel in files:
        for n_bits in (1, 20):
            case = work / "case"
            shutil.copytree(clean, case)
            _flip(case / rel, n_bits, rng)
            for mode in ((), ("--mmap",)):
                log_path = work / "server.log"
                with log_path.open("w") as log:
                    try:
                        proc, url = start_server(case, *mode, timeout_s=120, stderr=log)
                    except RuntimeError as err:
                        code = str(err).rsplit(" ", 1)[-1]
                        starts[f"refused at start (exit {code})"] += 1
                        first = log_path.read_text().strip().splitlines()
                        examples.setdefault(f"start exit {code}", first[-1][:200] if first else "")
                        continue
                    starts["served"] += 1
                    try:
                        _ask(url, queries, statuses, examples)
                    finally:
                        if proc.poll() is not None:  # it died under a query
                            starts[f"died while serving (exit {proc.returncode})"] += 1
                        proc.terminate()
                        proc.wait(timeout=60)
            shutil.rmtree(case)
    n_5xx = sum(n for status, n in statuses.items() if status.startswith("5"))
    return {
        "n_cases": len(files) * 2 * 2,
        "server_deaths": sum(n for name, n in starts.items() if name.startswith("died")),
        "starts": dict(starts),
        "statuses": dict(statuses),
        "n_5xx": n_5xx,
        "examples": examples,
    }
