"""Inputs of `scripts/gpu_smoke.sh`: the synthetic world as OpenRLHF prompt files and a BM25 index.

Writes, under `--out`:

- `train.jsonl` and `eval.jsonl`: one question per line, `{"prompt", "task", "datasource"}`, the
  layout `scripts/prepare_hotpotqa.py` writes (the `task` column holds `QATask.to_json()`);
- `index/`: a BM25 index of the world's documents (`--retriever DIR` reads it in process).

The world is the one `tracerl init-model` warm-starts the tiny policy on (`TinyPolicyConfig`'s
world seed and config), so the policy answers some questions and misses others.

Usage: `python scripts/gpu_smoke_data.py --out /tmp/smoke --n-train 64 --n-eval 16`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import tyro

from envs import World
from harness.tiny_policy.config import TinyPolicyConfig
from retrieval.bm25 import BM25Retriever


@dataclass(frozen=True)
class Args:
    """Smoke-test data options."""

    out: Path
    """Output directory."""
    n_train: int = 64
    """Training questions (the train split's first ones)."""
    n_eval: int = 16
    """Evaluation questions (the dev split's first ones)."""


def main(args: Args) -> None:
    """Write the prompt files and the index."""
    recipe = TinyPolicyConfig()
    world = World.generate(recipe.world_seed, recipe.world)
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


if __name__ == "__main__":
    main(tyro.cli(Args))
