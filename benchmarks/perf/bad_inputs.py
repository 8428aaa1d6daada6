"""Bad command lines for every `tracerl` subcommand, and a runner that tells a traceback.

`bad_command_lines(scratch)` builds, under `scratch`, the files the cases point at (a plain
file where a folder is expected, a folder that is no index or run, a corrupt JSONL) and
returns the cases by name. `run_command_line(argv)` runs `tracerl` in this process, as the
console script does, and reports its exit code, what it printed and whether a traceback
would have reached the user. The reliability benchmark counts the tracebacks; the CLI test
asserts there are none and that every case exits with code 2.

The Hugging Face hub is unreachable from the machines this runs on: the cases run with
`HF_HUB_OFFLINE=1`, which fails a missing model the same way without minutes of retries.
"""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

from benchmarks.cli import COMMANDS, main

__all__ = ["Outcome", "bad_command_lines", "run_command_line"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one command line did."""

    code: int | None
    """the exit code (None: an exception escaped `main`)"""
    output: str
    """stdout and stderr together"""
    traceback: bool
    """a traceback reached the user (or would have: an exception escaped `main`)"""


def run_command_line(argv: list[str]) -> Outcome:
    """Run `tracerl ARGV` in this process and report what the user would see."""
    buffer = io.StringIO()
    escaped = False
    previous = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        with redirect_stdout(buffer), redirect_stderr(buffer):
            try:
                code: int | None = main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else 1
                if isinstance(stop.code, str):
                    buffer.write(stop.code + "\n")
            except Exception:  # the interpreter would print its traceback
                code, escaped = None, True
    finally:
        if previous is None:
            del os.environ["HF_HUB_OFFLINE"]
        else:
            os.environ["HF_HUB_OFFLINE"] = previous
    output = buffer.getvalue()
    return Outcome(code, output, escaped or "Traceback (most recent call last)" in output)


def _flat_file(path: Path) -> Path:
    """A 16-row faiss flat file, for the cases that need a real one to get past."""
    if not path.exists():
        import faiss
        import numpy as np

        flat = faiss.IndexFlatIP(8)
        flat.add(np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32))
        faiss.write_index(flat, str(path))
    return path


def bad_command_lines(scratch: Path) -> dict[str, list[str]]:
    """At least three bad command lines per subcommand (files made under `scratch`)."""
    scratch.mkdir(parents=True, exist_ok=True)
    a_file = scratch / "a-file"
    a_file.write_text("not a folder\n")
    empty = scratch / "empty-dir"
    empty.mkdir(exist_ok=True)
    bad_jsonl = scratch / "bad.jsonl"
    bad_jsonl.write_text('{"id": "0", "contents": "ok"}\n{"id": \n')
    corpus = scratch / "corpus.jsonl"
    corpus.write_text('{"id": "0", "contents": "\\"Paris\\"\\nParis is a city."}\n')
    missing = scratch / "missing"
    under_file = a_file / "sub"  # a path no one can create: its parent is a file
    fifo = scratch / "fifo"  # opening it for reading blocks until a writer comes: forever
    if not fifo.exists():
        os.mkfifo(fifo)
    flat = _flat_file(scratch / "flat.index")
    run = ["--run-dir", str(scratch / "run")]
    cases = {
        "demo: steps not a number": ["demo", *run, "--steps", "many"],
        "demo: unknown question set": ["demo", *run, "--questions", "easy"],
        "demo: unknown flag": ["demo", *run, "--no-such-flag"],
        "demo: negative steps": ["demo", *run, "--steps", "-1"],
        "demo: no unseen questions": ["demo", *run, "--unseen-questions", "0"],
        "demo-env: top-k 0": ["demo-env", "--top-k", "0"],
        "demo-env: epsilon 2": ["demo-env", "--epsilon", "2"],
        "demo-env: 9 hops": ["demo-env", "--world.max-hops", "9"],
        "world: out under a file": ["world", "--out", str(under_file)],
        "world: one city": ["world", "--out", str(scratch / "w"), "--world.n-cities", "1"],
        "world: out missing its value": ["world", "--out"],
        "index build: missing corpus": [
            "index", "build", "--corpus", str(missing), "--out", str(scratch / "i1"),
        ],
        "index build: corrupt corpus": [
            "index", "build", "--corpus", str(bad_jsonl), "--out", str(scratch / "i2"),
        ],
        "index build: out under a file": [
            "index", "build", "--corpus", str(corpus), "--out", str(under_file),
        ],
        "index search: missing index": ["index", "search", str(missing), "q"],
        "index search: an unparseable URL": ["index", "search", "http://[::1", "q"],
        "index search: a folder that is no index": ["index", "search", str(empty), "q"],
        "index compress: missing faiss file": [
            "index", "compress", "--faiss-index", str(missing), "--out", str(scratch / "c"),
        ],
        "index compress: a text file as faiss": [
            "index", "compress", "--faiss-index", str(a_file), "--out", str(scratch / "c"),
        ],
        "index stats: missing files": ["index", "stats", str(missing), "--queries", str(missing)],
        "index: unknown subcommand": ["index", "frobnicate"],
        "serve-retriever: port 70000": [
            "serve-retriever", "--index", str(empty), "--port", "70000",
        ],
        "serve-retriever: max-topk 0": [
            "serve-retriever", "--index", str(empty), "--limits.max-topk", "0",
        ],
        "serve-retriever: missing index": ["serve-retriever", "--index", str(missing)],
        "serve-retriever: no index at all": ["serve-retriever"],
        "serve-retriever: max-open 0": [
            "serve-retriever", "--index", str(empty), "--connections.max-open", "0",
        ],
        "bench: an unparseable retriever URL": [
            "bench", "--retriever-url", "http://[::1", "--out", str(scratch / "b1"),
        ],
        "bench: openai agent with 'not a url'": [
            "bench", "--agent", "openai", "--model", "m", "--base-url", "not a url",
            "--out", str(scratch / "b2"),
        ],
        "bench: out is a file": ["bench", "--out", str(a_file)],
        "bench: out under a file": ["bench", "--out", str(under_file)],
        "bench: resume an empty folder": ["bench", "--resume", "--out", str(empty)],
        "bench: unknown dataset": [
            "bench", "--dataset", "no-such-set", "--out", str(scratch / "b3"),
        ],
        "bench: missing data file": [
            "bench", "--data-file", str(missing), "--out", str(scratch / "b4"),
        ],
        "corpus: missing data file": [
            "corpus", "--data-file", str(missing), "--out", str(scratch / "k1"),
        ],
        "corpus: unknown dataset": [
            "corpus", "--dataset", "no-such-set", "--out", str(scratch / "k2"),
        ],
        "corpus: corrupt data file": [
            "corpus", "--data-file", str(bad_jsonl), "--out", str(scratch / "k3"),
        ],
        "tree show: missing file": ["tree", "show", str(missing)],
        "tree show: not JSON": ["tree", "show", str(bad_jsonl)],
        "tree: unknown subcommand": ["tree", "frobnicate"],
        "init-model: run dir under a file": ["init-model", "--run-dir", str(under_file)],
        "init-model: vocabulary not a number": [
            "init-model", *run, "--policy.vocab-size", "big",
        ],
        "init-model: unknown flag": ["init-model", "--no-such-flag"],
        "train: policy /missing": ["train", *run, "--policy", "/missing"],
        "train: policy no/such-model": ["train", *run, "--policy", "no/such-model"],
        "train: resume a missing run": ["train", "--resume", "--run-dir", str(missing)],
        "train: unknown backend": ["train", "--backend", "nosuch"],
        "train: run dir is a file": ["train", "--run-dir", str(a_file)],
        "plot: missing run": ["plot", str(missing)],
        "plot: a file as run": ["plot", str(a_file)],
        "plot: empty run folder": ["plot", str(empty)],
        # issue 42: a hang, five internal errors and four nonsense values accepted before
        "bench: prompt template file a FIFO": [
            "bench", "--prompt-template-file", str(fifo), "--out", str(scratch / "b5"),
        ],
        "bench: seed -1": ["bench", "--seed", "-1", "--out", str(scratch / "b6")],
        "serve-retriever: threads 0": ["serve-retriever", "--index", str(empty), "--threads", "0"],
        "serve-retriever: threads -1": [
            "serve-retriever", "--index", str(empty), "--threads", "-1",
        ],
        "train: torch-threads 0": ["train", *run, "--torch-threads", "0"],
        "train: keep-checkpoints 0": ["train", *run, "--keep-checkpoints", "0"],
        "index compress: nlist 100,000,000": [
            "index", "compress", "--faiss-index", str(flat), "--out", str(scratch / "c2"),
            "--nlist", "100000000",
        ],
        "index compress: threads 0": [
            "index", "compress", "--faiss-index", str(flat), "--out", str(scratch / "c3"),
            "--threads", "0",
        ],
        "index compress: threads -1": [
            "index", "compress", "--faiss-index", str(flat), "--out", str(scratch / "c4"),
            "--threads", "-1",
        ],
        "init-model: hidden size 0": ["init-model", *run, "--policy.model.hidden-size", "0"],
        "doctor: nodes 0": ["doctor", "--nodes", "0"],
        "doctor: nodes not a number": ["doctor", "--nodes", "zero"],
        "doctor: unknown flag": ["doctor", "--no-such-flag"],
        "train: allocator not MODULE:CLASS": ["train", *run, "--allocator", "greedy"],
        "train: allocator module missing": ["train", *run, "--allocator", "no_such_mod:Rule"],
        "train: allocator kwargs not JSON": [
            "train", *run, "--allocator", "trace_alloc:Uniform", "--allocator-kwargs", "{x: 1}",
        ],
        "train: task source not one": ["train", *run, "--task-source", "trace_alloc:Uniform"],
        "gpu-check: unknown flag": ["gpu-check", "--no-such-flag"],
        "smoke-data: no --out": ["smoke-data"],
        "unknown command": ["frobnicate"],
    }  # fmt: skip
    named = {argv[0] for argv in cases.values()}
    assert named >= set(COMMANDS), f"no bad input for {sorted(set(COMMANDS) - named)}"
    return cases
