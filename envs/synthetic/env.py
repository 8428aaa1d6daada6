"""`make_synthetic_env`: a self-contained search env over a generated world (no files needed)."""

from __future__ import annotations

from typing import Any, Literal

from envs.errors import EnvConfigError
from envs.search_qa import SearchQAEnv
from envs.synthetic.config import WorldConfig
from envs.synthetic.world import World
from retrieval.bm25 import BM25Retriever

__all__ = ["SyntheticSplit", "make_synthetic_env"]

SyntheticSplit = Literal["all", "train", "dev", "test", "test_entities"]


def make_synthetic_env(
    world_seed: int = 0,
    world_config: WorldConfig | None = None,
    *,
    split: SyntheticSplit = "all",
    max_turns: int = 8,
    **env_kwargs: Any,
) -> SearchQAEnv:
    """Generate a world, index it with BM25, and return a `SearchQAEnv` over its questions.

    This is the entry point of `trace_rl/SyntheticMultiHop-v0`. The same `world_seed` and
    config always give the same world (rebuild it with `World.generate(world_seed, config)`
    to drive an `OracleAgent`).

    Args:
        world_seed: the world's seed.
        world_config: its size and difficulty (the defaults when None).
        split: which questions the env asks (`World.split()` with its defaults).
        max_turns: actions per episode; 8 leaves room for 4-hop questions and a re-query.
        **env_kwargs: passed to `SearchQAEnv` (top_k, reward, ...).

    Raises:
        EnvConfigError: a bad world config or split name.
    """
    world = World.generate(world_seed, world_config or WorldConfig())
    if split == "all":
        tasks = world.tasks
    elif split in ("train", "dev", "test", "test_entities"):
        tasks = getattr(world.split(), split)
    else:
        raise EnvConfigError(f"split={split!r}: choose all, train, dev, test or test_entities")
    retriever = BM25Retriever.build(world.documents)
    return SearchQAEnv(tasks, retriever, max_turns=max_turns, **env_kwargs)
