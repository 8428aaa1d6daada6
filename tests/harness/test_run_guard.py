"""A run that fails loud: a dead retriever stops the CPU trainer within K steps, with its cause.

The retriever is a real HTTP server (Search-R1's protocol over the synthetic world's BM25 index)
that answers step 1 and is shut down after it, as a retriever node that dies mid-run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from envs import World
from harness.errors import HarnessError, RunAborted
from harness.tiny_policy import tiny_env_config
from harness.tiny_policy.config import TinyPolicyConfig
from harness.training.config import AbortConfig, BudgetConfig, TaskConfig, TrainConfig
from harness.training.metrics_log import read_metrics
from harness.training.run_guard import FailureStreak
from retrieval.bm25 import BM25Retriever
from retrieval.protocol import render_result

pytest.importorskip("openrlhf")  # the CPU trainer's loss is OpenRLHF's PolicyLoss

WARM_START = Path(__file__).resolve().parents[2] / "harness" / "tiny_policy" / "warm_start"


def serve(index: BM25Retriever) -> ThreadingHTTPServer:
    """A Search-R1-protocol server over `index`, with `/health`, on a free port."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["content-length"])))
            rows = index.search(body["queries"], k=body["topk"])
            self._send(render_result(rows, return_scores=body["return_scores"]))

        def do_GET(self) -> None:
            self._send({"status": "ok", "index_id": index.index_id})

        def _send(self, payload: object) -> None:
            data = json.dumps(payload).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def world_files(tmp_path_factory) -> tuple[Path, BM25Retriever, Path]:
    """The warm start's world as a question file and index, and the policy without its task
    record (so any env settings are accepted)."""
    root = tmp_path_factory.mktemp("guard")
    recipe = TinyPolicyConfig()
    world = World.generate(recipe.world_seed, recipe.world)
    questions = world.export(root / "world")["questions"]
    policy = root / "policy"
    shutil.copytree(WARM_START, policy, ignore=shutil.ignore_patterns("tiny_policy.json"))
    return questions, BM25Retriever.build(world.documents), policy


def config(run_dir: Path, questions: Path, policy: Path, url: str, steps: int) -> TrainConfig:
    return TrainConfig(
        run_dir=run_dir,
        policy=policy,
        steps=steps,
        checkpoint_every=steps,
        tensorboard=False,
        progress=False,
        torch_threads=1,
        task=TaskConfig(
            source="file",
            train_file=questions,
            index=url,
            env=dataclasses.replace(tiny_env_config(), max_turns=3, top_k=2, max_doc_chars=240),
        ),
        budget=BudgetConfig(per_step=4, pool_size=2),
        abort=AbortConfig(failed_share=0.5, steps=2),
    )


def test_a_retriever_that_dies_after_step_1_stops_the_run_within_k_steps(
    tmp_path, world_files, monkeypatch
):
    import harness.training.trainer as trainer

    questions, index, policy = world_files
    server = serve(index)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    step = trainer._step

    def step_then_kill(run, progress, n):  # type: ignore[no-untyped-def]
        out = step(run, progress, n)
        if n == 1:  # the retriever's node dies once step 1 is done
            server.shutdown()
            server.server_close()
        return out

    monkeypatch.setattr(trainer, "_step", step_then_kill)
    with pytest.raises(RunAborted, match=rf"aborted at step 3: 2 steps .* cause: .*{url}"):
        trainer.train(config(tmp_path / "run", questions, policy, url, steps=10))
    records = read_metrics(tmp_path / "run")
    assert [r["step"] for r in records] == [1, 2, 3]  # every step logged, failed ones too
    assert records[0]["rollout/failed_share"] == 0.0
    assert all(r["rollout/failed_share"] > 0.5 for r in records[1:])


def test_a_dead_retriever_stops_the_run_before_its_first_step(tmp_path, world_files, refused_port):
    from harness.training.trainer import train

    questions, _, policy = world_files
    url = f"http://127.0.0.1:{refused_port}"
    with pytest.raises(HarnessError, match=rf"retriever at {url} does not answer before"):
        train(config(tmp_path / "run", questions, policy, url, steps=2))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_the_streak_resets_on_a_good_step_and_zero_steps_never_aborts():
    streak = FailureStreak(AbortConfig(failed_share=0.5, steps=2))
    for share in (1.0, 0.2, 1.0, 0.0):  # never two failed steps in a row
        streak.observe(1, {"rollout/failed_share": share})
    never = FailureStreak(AbortConfig(failed_share=0.5, steps=0))
    for step in range(5):
        never.observe(step, {"rollout/failed_share": 1.0})
    with pytest.raises(RunAborted, match="cause: see the log"):
        streak.observe(9, {"rollout/failed_share": 0.6})
        streak.observe(10, {"rollout/failed_share": 0.6})
