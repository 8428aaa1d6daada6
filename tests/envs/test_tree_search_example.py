"""The worked example examples/tree_search.py runs, and its tree search beats greedy."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from env_fakes import SMALL

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tree_search.py"


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location("tree_search_example", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_tree_search_finds_answers_greedy_misses(example):
    result = example.main(example.Args(n_questions=20, budget=60, seed=3, world=SMALL))
    assert result["n_questions"] == 20
    assert result["tree_em"] > result["greedy_em"]
    assert result["tree_only"] >= 3
    assert result["tree_steps_per_question"] <= 60
    assert result["greedy_steps_per_question"] <= 6


def test_found_paths_replay_on_a_fresh_env(example, small_world, small_retriever):
    from envs import SearchQAEnv

    env = SearchQAEnv(small_world.tasks, small_retriever, max_turns=6)
    fresh = SearchQAEnv(small_world.tasks, small_retriever, max_turns=6)
    solved = 0
    for task_id in small_world.tasks.ids[:15]:
        outcome = example.best_first(env, task_id, budget=60)
        if not outcome.solved:
            continue
        solved += 1
        fresh.reset(options={"task_id": task_id})
        for action in outcome.actions:
            _, reward, terminated, _, _ = fresh.step(action)
        assert terminated and reward == 1.0
    assert solved > 0
