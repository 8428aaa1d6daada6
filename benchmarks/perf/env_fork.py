"""Forking a search env mid-episode: `env.fork()` against the two ways users fork today.

At history depths 1, 4, 8 and 16 (search turns already taken), one operation is "make an
independent copy of the env at this state, then take one step in it". Three ways:

- **fork**: `env.fork()[0]`, O(1): the copy shares the immutable episode history;
- **deepcopy**: a careful `copy.deepcopy(env, memo)` whose memo shares the task set (and the
  current task), the retriever and the spaces, so that only the episode state (the turns with
  their hits, and the RNG) is copied;
- **replay**: reset a spare env on the same task and re-run the action history, retrieval
  included (what a harness without snapshots does).

The step is an answer (scored, terminal), so that the copy's cost is what is measured; the
same ratios with a fresh (uncached) search as the step are reported too. Also: snapshot size
in bytes and the JSON round trip (snapshot → JSON text → snapshot → restore into a fresh env).
All methods run in one process, on the same env states, interleaved, after a warm-up; each
figure is the median over repeats of the mean time of a batch of operations.

Run: `python -m benchmarks.perf.env_fork --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import copy
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import tyro
from rich.console import Console
from rich.table import Table

from benchmarks.meta import run_meta
from envs import EnvSnapshot, SearchQAEnv, World
from retrieval.bm25 import BM25Retriever


@dataclass
class Args:
    """Env fork benchmark options."""

    depths: tuple[int, ...] = (1, 4, 8, 16)
    """history depths (search turns taken before the copy)"""
    repeats: int = 15
    """timing repeats per method and depth; the median is reported"""
    batch: int = 200
    """operations per timed batch"""
    seed: int = 0
    """synthetic world seed"""
    quick: bool = False
    """a smoke test: 3 repeats of 20 operations"""
    json: bool = False
    """print one JSON object as the last line of stdout"""

    def __post_init__(self) -> None:
        if self.quick:
            self.repeats, self.batch = 3, 20


def _time_us(op: Callable[[], object], batch: int) -> float:
    """Mean microseconds per call over one batch."""
    start = time.perf_counter_ns()
    for _ in range(batch):
        op()
    return (time.perf_counter_ns() - start) / batch / 1e3


def _careful_deepcopy(env: SearchQAEnv) -> SearchQAEnv:
    """How a careful user copies an env: share everything read-only through deepcopy's memo."""
    shared = (
        env.tasks,
        env.task,
        env.retriever,
        env.observation_space,
        env.spec,
        env._shared.space_template,
    )
    memo = {id(obj): obj for obj in shared}
    return copy.deepcopy(env, memo)


def _prepare(
    world: World, retriever: BM25Retriever, depth: int
) -> tuple[SearchQAEnv, str, list[str]]:
    """An env `depth` distinct searches into an episode, the task id, and the actions taken."""
    env = SearchQAEnv(world.tasks, retriever, max_turns=max(depth + 2, 4))
    task_id = world.tasks.ids[0]
    queries = list(
        dict.fromkeys(s.query for t in world.tasks.ids for s in world.decomposition(t).steps)
    )
    actions = [f"<search> {q} </search>" for q in queries[:depth]]
    env.reset(seed=0, options={"task_id": task_id})
    for action in actions:
        env.step(action)
    return env, task_id, actions


def _operations(
    env: SearchQAEnv,
    answer: str,
    fresh_search: str,
    replay: Callable[[str], None],
    roundtrip: Callable[[], None],
) -> dict[str, Callable[[], object]]:
    """The timed operations at one depth, by name."""
    return {
        "fork": lambda: env.fork()[0].step(answer),
        "deepcopy": lambda: _careful_deepcopy(env).step(answer),
        "replay": lambda: replay(answer),
        "fork_search": lambda: env.fork()[0].step(fresh_search),
        "deepcopy_search": lambda: _careful_deepcopy(env).step(fresh_search),
        "replay_search": lambda: replay(fresh_search),
        "fork_only": lambda: env.fork(),
        "json_roundtrip": roundtrip,
    }


def main(args: Args) -> dict[str, Any]:
    """Time fork, careful deepcopy and replay at each depth; measure snapshots."""
    world = World.generate(args.seed)
    retriever = BM25Retriever.build(world.documents)
    answer = f"<answer> {world.decomposition(world.tasks.ids[0]).answer} </answer>"
    fresh_search = "<search> a query never seen before in this episode </search>"
    rows = []
    for depth in args.depths:
        env, task_id, actions = _prepare(world, retriever, depth)
        spare = SearchQAEnv(world.tasks, retriever, max_turns=env.config.max_turns)
        target = SearchQAEnv(world.tasks, retriever, max_turns=env.config.max_turns)

        def replay(
            step: str,
            spare: SearchQAEnv = spare,
            task_id: str = task_id,
            actions: list[str] = actions,
        ) -> None:
            spare.reset(options={"task_id": task_id})
            for action in actions:
                spare.step(action)
            spare.step(step)

        def roundtrip(env: SearchQAEnv = env, target: SearchQAEnv = target) -> None:
            text = json.dumps(env.snapshot().to_dict())
            target.restore(EnvSnapshot.from_dict(json.loads(text)))

        methods = _operations(env, answer, fresh_search, replay, roundtrip)
        samples: dict[str, list[float]] = {name: [] for name in methods}
        for op in methods.values():  # warm-up
            _time_us(op, max(1, args.batch // 10))
        for _ in range(args.repeats):
            for name, op in methods.items():  # interleaved, so drift hits every method alike
                samples[name].append(_time_us(op, args.batch))
        row = {f"{name}_us": statistics.median(values) for name, values in samples.items()}
        row["depth"] = depth
        row["snapshot_bytes"] = len(json.dumps(env.snapshot().to_dict()).encode())
        rows.append(row)
    by_depth = {row["depth"]: row for row in rows}
    result: dict[str, Any] = {"rows": rows, "meta": run_meta()}
    if 8 in by_depth:
        d8 = by_depth[8]
        result["deepcopy_over_fork_depth8"] = d8["deepcopy_us"] / d8["fork_us"]
        result["replay_over_fork_depth8"] = d8["replay_us"] / d8["fork_us"]
        result["deepcopy_over_fork_search_depth8"] = d8["deepcopy_search_us"] / d8["fork_search_us"]
        result["replay_over_fork_search_depth8"] = d8["replay_search_us"] / d8["fork_search_us"]
    if 1 in by_depth and 16 in by_depth:
        result["fork_depth16_over_depth1"] = by_depth[16]["fork_us"] / by_depth[1]["fork_us"]
        result["fork_only_depth16_over_depth1"] = (
            by_depth[16]["fork_only_us"] / by_depth[1]["fork_only_us"]
        )
    return result


def print_table(result: dict[str, Any]) -> None:
    """The per-depth timings and the headline ratios, on stderr."""
    console = Console(stderr=True, width=max(Console(stderr=True).width, 150))
    table = Table(title="copy the env at depth d, then step (µs, median)")
    columns = [
        ("depth", "depth", "{}"),
        ("fork+answer", "fork_us", "{:.1f}"),
        ("deepcopy+answer", "deepcopy_us", "{:.1f}"),
        ("replay+answer", "replay_us", "{:.1f}"),
        ("fork+search", "fork_search_us", "{:.1f}"),
        ("deepcopy+search", "deepcopy_search_us", "{:.1f}"),
        ("replay+search", "replay_search_us", "{:.1f}"),
        ("fork only", "fork_only_us", "{:.2f}"),
        ("JSON round trip", "json_roundtrip_us", "{:.1f}"),
        ("snapshot bytes", "snapshot_bytes", "{:,}"),
    ]
    for title, _, _ in columns:
        table.add_column(title, justify="right")
    for row in result["rows"]:
        table.add_row(*(spec.format(row[key]) for _, key, spec in columns))
    console.print(table)
    for key, value in result.items():
        if key not in ("rows", "meta"):
            console.print(f"{key}: {value:.2f}")


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
