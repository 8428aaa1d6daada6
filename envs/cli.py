"""`tracerl demo-env` and `tracerl world`: the synthetic world from the command line."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tyro
from rich.console import Console
from rich.table import Table

from envs.agents import EpisodeResult, NaiveAgent, OracleAgent, run_agent
from envs.base import ScriptedPolicy
from envs.errors import EnvConfigError
from envs.search_qa import SearchQAEnv
from envs.synthetic.config import WorldConfig
from envs.synthetic.world import World
from envs.tasks import QATask
from retrieval.bm25 import BM25Retriever

__all__ = ["DemoEnvArgs", "WorldArgs", "demo_env", "world"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class DemoEnvArgs:
    """Run the scripted agents on a synthetic world and print EM / F1 per question type."""

    seed: int = 0
    """The world's seed."""
    world: WorldConfig = field(default_factory=WorldConfig)
    """The world's size and difficulty."""
    epsilon: float = 0.2
    """Noise rate of the noisy oracle (wrong queries, wrong answers)."""
    top_k: int = 3
    """Documents per search."""
    max_turns: int = 8
    """Actions per episode."""
    max_questions: int | None = None
    """Play only the first N questions (all when unset)."""

    def __post_init__(self) -> None:
        if self.max_questions is not None and self.max_questions < 1:
            raise EnvConfigError(f"--max-questions {self.max_questions}: must be >= 1")


def _summary_rows(
    results: dict[str, list[EpisodeResult]],
) -> list[tuple[str, int, dict[str, tuple[float, float]]]]:
    """(label, n, {agent: (EM, F1)}) per question type and hop count, then overall."""
    first = next(iter(results.values()))
    keys = sorted({(r.question_type, r.n_hops or 0) for r in first})
    rows = []
    for qtype, hops in [*keys, ("all", -1)]:
        scores = {}
        n = 0
        for agent, episodes in results.items():
            chosen = [
                r
                for r in episodes
                if hops == -1 or (r.question_type, r.n_hops or 0) == (qtype, hops)
            ]
            n = len(chosen)
            scores[agent] = (
                sum(r.em for r in chosen) / max(n, 1),
                sum(r.f1 for r in chosen) / max(n, 1),
            )
        rows.append((qtype if hops == -1 else f"{qtype} ({hops} hops)", n, scores))
    return rows


def demo_env(argv: list[str]) -> int:
    """`tracerl demo-env`: world, BM25 index, scripted agents, and a table of EM / F1."""
    args = tyro.cli(DemoEnvArgs, args=argv, prog="tracerl demo-env")
    start = time.perf_counter()
    world_ = World.generate(args.seed, args.world)
    retriever = BM25Retriever.build(world_.documents)
    log.info(
        "world %d: %d documents, %d questions, indexed in %.2f s",
        args.seed,
        len(world_.documents),
        len(world_.tasks),
        time.perf_counter() - start,
    )
    env = SearchQAEnv(world_.tasks, retriever, max_turns=args.max_turns, top_k=args.top_k)
    task_ids: Sequence[str] = world_.tasks.ids[: args.max_questions]
    agents: dict[str, ScriptedPolicy] = {
        "oracle": OracleAgent(world_),
        f"oracle ε={args.epsilon:g}": OracleAgent(world_, epsilon=args.epsilon, seed=args.seed),
        "naive": NaiveAgent(),
    }
    results = {
        name: run_agent(env, agent, task_ids, progress=True, desc=name)
        for name, agent in agents.items()
    }
    table = Table(title=f"Scripted agents on synthetic world {args.seed} (EM / F1)")
    table.add_column("question type")
    table.add_column("n", justify="right")
    for name in agents:
        table.add_column(name, justify="right")
    for label, n, scores in _summary_rows(results):
        cells = [f"{em:.2f} / {f1:.2f}" for em, f1 in scores.values()]
        table.add_row(label, str(n), *cells, end_section=label == "all")
    console = Console()
    console.print(table)
    n_steps = sum(r.n_turns for episodes in results.values() for r in episodes)
    console.print(f"{n_steps} env steps in {time.perf_counter() - start:.1f} s")
    return 0


@dataclass(frozen=True, kw_only=True)
class WorldArgs:
    """Generate a synthetic world and write its corpus and questions."""

    out: Path
    """Folder for corpus.jsonl, questions.jsonl (FlashRAG) and world.json."""
    seed: int = 0
    """The world's seed (the same seed and config give byte-identical files)."""
    world: WorldConfig = field(default_factory=WorldConfig)
    """The world's size and difficulty."""
    index: bool = False
    """Also build a BM25 index of the corpus and save it under OUT/bm25."""


def world(argv: list[str]) -> int:
    """`tracerl world`: generate a world and export it (and optionally its BM25 index)."""
    args = tyro.cli(WorldArgs, args=argv, prog="tracerl world")
    world_ = World.generate(args.seed, args.world)
    paths = world_.export(args.out)
    if args.index:
        BM25Retriever.build(world_.documents, progress=True).save(args.out / "bm25")
    table = Table(title=f"Synthetic world {args.seed} ({world_.fingerprint[:12]})")
    table.add_column("question kind")
    table.add_column("type")
    table.add_column("hops", justify="right")
    table.add_column("questions", justify="right")
    by_kind: dict[str, list[QATask]] = {}
    for task in world_.tasks:
        by_kind.setdefault(world_.decomposition(task.task_id).kind, []).append(task)
    for kind, tasks in by_kind.items():
        table.add_row(kind, tasks[0].question_type, str(tasks[0].n_hops), str(len(tasks)))
    console = Console()
    console.print(table)
    console.print(
        f"{len(world_.entities)} entities, {len(world_.documents)} documents, "
        f"{len(world_.tasks)} questions → " + ", ".join(str(p) for p in paths.values())
    )
    return 0
