"""`tracerl bench` throughput and the cost of resuming, on the shared real samples.

For each agent (scripted `naive` and `oracle`, and `openai` against a local fake
OpenAI-compatible server that searches the question and answers the first title it is shown),
three runs of the same command over the same questions, BM25 over their own paragraphs (an
index built once by `tracerl corpus`):

1. uninterrupted: wall time, and episodes per second of the episode loop alone;
2. stopped half-way (the retriever made to fail after half the episodes, in process) and then
   `--resume`d: the resume overhead is (stopped + resumed) - uninterrupted, and the resumed
   report must equal the uninterrupted one (all but the run folder and the start time);
3. once, for `naive`: a real `tracerl bench` process killed with SIGKILL once half its episodes
   are on disk, then resumed in a new process: same check.

Run: `python -m benchmarks.perf.bench_throughput --json` (`--limit 20` for a smoke test).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import tyro
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from benchmarks.meta import run_meta
from envs.errors import RetrievalFailedError
from harness.evaluation import BenchConfig, BenchResult, EpisodeRecord, corpus, run_bench

log = logging.getLogger(__name__)

DEFAULT_DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
FILES = (
    "hotpotqa/hotpot_dev_distractor.rpt_sample500.hf.jsonl",
    "musique/musique_ans_v1.0_dev.migres200.jsonl",
    "2wikimultihopqa/2wiki_dev.migres164.jsonl",
)
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Args:
    """Throughput benchmark options."""

    limit: int = 100
    """questions per dataset (three datasets)"""
    agents: tuple[str, ...] = ("naive", "oracle", "openai")
    """agents to time"""
    concurrency: int = 16
    """episodes in flight"""
    kill: bool = True
    """also kill a real `tracerl bench` process with SIGKILL and resume it"""
    data_dir: Path = DEFAULT_DATA
    """the shared real dataset samples"""
    out: Path = Path("runs/bench_throughput")
    """scratch folder for the runs"""
    json: bool = False
    """print one JSON object with the figures as the last line"""


# --- a fake OpenAI-compatible server -----------------------------------------------------------

_TITLE = re.compile(r"Doc 1\(Title: ([^)]*)\)")


def _fake_reply(prompt: str) -> tuple[str, str]:
    """Search the question first; then answer the first title of the last observation."""
    if "<information>" not in prompt:
        question = prompt.split("Question: ")[-1].strip()
        return f"<think>Look it up.</think><search> {question} </search>", "</search>"
    titles = _TITLE.findall(prompt.rsplit("<information>", 1)[1])
    answer = titles[0].strip('"') if titles else "unknown"
    return f"<think>Found it.</think><answer> {answer} </answer>", "</answer>"


@contextmanager
def fake_openai_server() -> Iterator[str]:
    """A vLLM-like `/v1/completions` and `/v1/models` on a free local port; yields the URL."""
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    @app.post("/v1/completions")
    async def completions(request: Request) -> JSONResponse:
        body = await request.json()
        text, stop = _fake_reply(body["prompt"])
        choice = {"index": 0, "text": text, "finish_reason": "stop", "stop_reason": stop}
        usage = {"prompt_tokens": len(body["prompt"]) // 4, "completion_tokens": len(text) // 4}
        return JSONResponse({"choices": [choice], "usage": usage})

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()


# --- timing ------------------------------------------------------------------------------------


class _StopAfter:
    """A `run_bench` episode hook that makes the retriever fail once `n` episodes are done."""

    def __init__(self, n: int | None) -> None:
        self.n, self.seen = n, 0

    def __call__(self, agent: str, record: EpisodeRecord) -> None:
        self.seen += 1
        if self.n is not None and self.seen >= self.n:
            raise RetrievalFailedError("benchmark: the retriever is made to fail here")


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report without what two runs in two folders must differ in: start time, --out."""
    meta = {k: v for k, v in report["meta"].items() if k not in ("created_at", "command")}
    meta["config"] = {k: v for k, v in meta["config"].items() if k != "out"}
    return {**report, "meta": meta}


def _episodes(folder: Path) -> list[dict[str, Any]]:
    """The run's trajectories without the request latencies (timings differ run to run)."""
    lines = (folder / "trajectories.jsonl").read_text("utf-8").splitlines()
    episodes = [json.loads(line) for line in lines]
    for episode in episodes:
        for turn in episode["turns"]:
            turn.pop("latency_s", None)
    return episodes


def _same_report(a: Path, b: Path) -> bool:
    report_a = json.loads((a / "report.json").read_text())
    report_b = json.loads((b / "report.json").read_text())
    return comparable(report_a) == comparable(report_b) and _episodes(a) == _episodes(b)


def _bench(args: list[str], stop_after: int | None = None) -> tuple[BenchResult, float]:
    """One in-process `tracerl bench` run (`run_bench`): its result and wall seconds."""
    config = tyro.cli(BenchConfig, args=args, prog="tracerl bench")
    start = time.perf_counter()
    result = run_bench(config, command=args, on_episode=_StopAfter(stop_after))
    return result, time.perf_counter() - start


def time_agent(agent: str, common: list[str], out: Path, n: int) -> dict[str, Any]:
    """Uninterrupted, then stopped half-way and resumed."""
    full = out / agent / "full"
    uninterrupted, wall = _bench([*common, "--out", str(full), "--overwrite"])
    assert uninterrupted.finished, f"{agent}: {uninterrupted.failure}"
    resumed = out / agent / "resumed"
    stopped, wall_stop = _bench([*common, "--out", str(resumed), "--overwrite"], stop_after=n // 2)
    assert not stopped.finished, f"{agent}: the run that was to stop half-way finished"
    result, wall_resume = _bench([*common, "--out", str(resumed), "--resume"])
    assert result.finished, f"{agent}: the resumed run stopped: {result.failure}"
    loop = uninterrupted.loop_s
    return {
        "episodes": n,
        "wall_s": round(wall, 3),
        "loop_s": round(loop, 3),
        "episodes_per_s": round(n / loop, 1),
        "stopped_s": round(wall_stop, 3),
        "resumed_s": round(wall_resume, 3),
        "resume_overhead_s": round(wall_stop + wall_resume - wall, 3),
        "same_report": _same_report(full, resumed),
    }


def kill_and_resume(common: list[str], out: Path, n: int) -> dict[str, Any]:
    """A real process killed with SIGKILL half-way, then resumed in a new one."""
    folder = out / "killed"
    command = [sys.executable, "-m", "benchmarks.cli", "bench", *common, "--out", str(folder)]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    path = folder / "trajectories.jsonl"
    while proc.poll() is None:
        if path.is_file() and path.read_bytes().count(b"\n") >= n // 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    proc.wait()
    on_disk = path.read_bytes().count(b"\n") if path.is_file() else 0
    resume = subprocess.run([*command, "--resume"], env=env, capture_output=True, timeout=1800)
    return {
        "killed_with": "SIGKILL"
        if proc.returncode == -signal.SIGKILL
        else f"exit {proc.returncode}",
        "episodes_on_disk_when_killed": on_disk,
        "resume_exit": resume.returncode,
        "same_report": _same_report(out / "naive" / "full", folder),
    }


def main(args: Args) -> dict[str, Any]:
    """Build the corpus once, then time each agent."""
    files = [args.data_dir / f for f in FILES if (args.data_dir / f).is_file()]
    if not files:
        raise SystemExit(
            f"benchmarks.perf.bench_throughput: no shared samples under {args.data_dir}"
        )
    args.out.mkdir(parents=True, exist_ok=True)
    corpus_dir = args.out / "corpus"
    data = ["--data-file", *map(str, files), "--limit", str(args.limit)]
    if not (corpus_dir / "bm25").is_dir():
        assert corpus([*data, "--out", str(corpus_dir)]) == 0
    base = [*data, "--index", str(corpus_dir / "bm25"), "--no-progress"]
    base += ["--concurrency", str(args.concurrency)]
    n = sum(
        1 for line in (corpus_dir / "tasks.jsonl").read_text("utf-8").splitlines() if line.strip()
    )
    figures: dict[str, Any] = {}
    with fake_openai_server() as url:
        for agent in args.agents:
            extra = ["--agent", agent]
            if agent == "openai":
                extra += ["--model", "fake", "--base-url", url]
            for run in ("full", "resumed"):
                _clear(args.out / agent / run)
            figures[agent] = time_agent(agent, [*base, *extra], args.out, n)
            print(f"{agent}: {figures[agent]}", file=sys.stderr)
    if args.kill and "naive" in args.agents:
        _clear(args.out / "killed")
        figures["kill_resume"] = kill_and_resume([*base, "--agent", "naive"], args.out, n)
        print(f"kill and resume: {figures['kill_resume']}", file=sys.stderr)
    return {
        "meta": {**run_meta(), "args": {k: str(v) for k, v in asdict(args).items()}},
        "questions": n,
        "files": [str(f) for f in files],
        **figures,
    }


def _clear(folder: Path) -> None:
    for name in ("run.json", "trajectories.jsonl", "report.json", "report.md", "report.png"):
        (folder / name).unlink(missing_ok=True)


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    options = tyro.cli(Args)
    result = main(options)
    if options.json:
        print(json.dumps(result, sort_keys=True))
