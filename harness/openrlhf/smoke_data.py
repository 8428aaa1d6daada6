"""The GPU smoke's inputs: the synthetic world as OpenRLHF prompt files and a BM25 index.

`scripts/gpu_smoke.sh` and `tracerl gpu-check` both write them here.

Writes, under `--out`:

- `train.jsonl` and `eval.jsonl`: one question per line, `{"prompt", "task", "datasource"}`, the
  layout `scripts/prepare_hotpotqa.py` writes (the `task` column holds `QATask.to_json()`);
- `index/`: a BM25 index of the world's documents (`--retriever DIR` reads it in process).

The world is the one `tracerl init-model` warm-starts the tiny policy on (`tracerl train`'s
default `--task.world-seed` and `--task.world.*`), so the policy answers some questions and
misses others.

Usage: `tracerl smoke-data --out /tmp/smoke --n-train 64 --n-eval 16`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tyro

from envs import World
from harness.training.config import TaskConfig
from retrieval.bm25 import BM25Retriever

__all__ = ["SmokeDataArgs", "command", "main"]


@dataclass(frozen=True)
class SmokeDataArgs:
    """Smoke-test data options."""

    out: Path
    """Output directory."""
    n_train: int = 64
    """Training questions (the train split's first ones)."""
    n_eval: int = 16
    """Evaluation questions (the dev split's first ones)."""


def main(args: SmokeDataArgs) -> None:
    """Write the prompt files and the index."""
    task = TaskConfig()  # the warm start's world (a tiny policy refuses any other)
    world = World.generate(task.world_seed, task.world)
    split = world.split()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, tasks in (
        ("train", list(split.train)[: args.n_train]),
        ("eval", list(split.dev)[: args.n_eval]),
    ):
        rows = [
            {"prompt": t.question, "task": json.dumps(t.to_json()), "datasource": "synthetic"}
            for t in tasks
        ]
        (args.out / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    BM25Retriever.build(world.documents).save(args.out / "index")
    print(f"wrote {args.out}: {args.n_train} train, {args.n_eval} eval questions, BM25 index")


def command(argv: list[str]) -> int:
    """`tracerl smoke-data`: write the prompt files and the index under `--out`."""
    main(tyro.cli(SmokeDataArgs, args=argv, prog="tracerl smoke-data"))
    return 0
