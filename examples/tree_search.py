"""Best-first tree search over `env.fork()`: find answers that one greedy rollout misses.

A scripted proposal policy suggests a few actions at each node (search a name it has just
read, or answer with it) with prior probabilities. The greedy rollout always takes the most
likely action and gets one try. The tree search keeps a frontier of forked envs ordered by the
path's log-prior, expands the most likely node by forking its env once per proposal, and stops
at the first leaf with reward 1 (the env's EM reward is the verifier, as in RL rollouts) or
when its budget of env steps is spent. Forks are O(1), so a node costs one `fork()` plus one
`step()`; nothing is replayed.

Run: `python examples/tree_search.py --n-questions 60 --budget 40`.
"""

from __future__ import annotations

import heapq
import itertools
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import tyro

from envs import SearchQAEnv, World, WorldConfig, make_synthetic_env

_NAME = re.compile(r"[A-Z][\w'-]*(?:\s+(?:of\s+(?:the\s+)?|the\s+)?[A-Z][\w'-]*)*")
_NOT_NAMES = {"Doc", "Title", "The", "He", "She", "It", "His", "Her", "Born", "Directed", "After"}


@dataclass(frozen=True)
class Proposal:
    action: str
    prior: float


def names_in(text: str) -> list[str]:
    """Capitalised names, most frequent first (first seen wins a tie)."""
    counts = Counter(m.group(0) for m in _NAME.finditer(text) if m.group(0) not in _NOT_NAMES)
    return [name for name, _ in counts.most_common()]


def propose(
    question: str, observation: str | None, searched: frozenset[str], depth: int, k: int = 3
) -> list[Proposal]:
    """A scripted policy: search or answer one of the top-k names of the last observation.

    At the root it searches the names in the question. Deeper, the answer share of the prior
    grows with depth; names are weighted by rank (1/2, 1/3, 1/6 for three names).
    """
    if observation is None:
        names = [n for n in names_in(question) if n not in _NOT_NAMES] or [question]
        return [Proposal(f"<search> {n} </search>", 1 / len(names[:k])) for n in names[:k]]
    candidates = [n for n in names_in(observation) if n not in searched and n not in question][:k]
    if not candidates:
        return [Proposal("<answer> unknown </answer>", 1.0)]
    rank_weights = [1 / (r + 2) for r in range(len(candidates))]
    total = sum(rank_weights)
    p_answer = min(0.8, 0.3 * depth)
    proposals = []
    for name, weight in zip(candidates, rank_weights, strict=True):
        proposals.append(Proposal(f"<search> {name} </search>", (1 - p_answer) * weight / total))
        proposals.append(Proposal(f"<answer> {name} </answer>", p_answer * weight / total))
    return sorted(proposals, key=lambda p: -p.prior)


@dataclass
class Outcome:
    solved: bool
    actions: tuple[str, ...]
    n_env_steps: int


@dataclass(order=True)
class _Node:
    cost: float  # -log prior of the path
    order: int
    env: SearchQAEnv = field(compare=False)
    observation: str | None = field(compare=False)
    searched: frozenset[str] = field(compare=False)
    actions: tuple[str, ...] = field(compare=False)


def _searched_name(action: str) -> str | None:
    return action[len("<search> ") : -len(" </search>")] if action.startswith("<search>") else None


def greedy(env: SearchQAEnv, task_id: str) -> Outcome:
    """One rollout that always takes the most likely proposal."""
    _, info = env.reset(options={"task_id": task_id})
    question = info["question"]
    observation, searched, actions = None, frozenset(), ()
    while True:
        action = propose(question, observation, searched, len(actions))[0].action
        observation, reward, terminated, truncated, _ = env.step(action)
        actions += (action,)
        name = _searched_name(action)
        searched = searched | {name} if name else searched
        if terminated or truncated:
            return Outcome(float(reward) >= 1.0, actions, len(actions))


def best_first(env: SearchQAEnv, task_id: str, *, budget: int) -> Outcome:
    """Best-first search over forks until a rewarded leaf or `budget` env steps."""
    _, info = env.reset(options={"task_id": task_id})
    question = info["question"]
    order = itertools.count()
    frontier = [_Node(0.0, next(order), env, None, frozenset(), ())]
    n_steps = 0
    while frontier and n_steps < budget:
        node = heapq.heappop(frontier)
        proposals = propose(question, node.observation, node.searched, len(node.actions))
        for proposal, child in zip(proposals, node.env.fork(len(proposals)), strict=True):
            observation, reward, terminated, truncated, _ = child.step(proposal.action)
            n_steps += 1
            actions = (*node.actions, proposal.action)
            if terminated and float(reward) >= 1.0:
                return Outcome(True, actions, n_steps)
            if not (terminated or truncated):
                name = _searched_name(proposal.action)
                searched = node.searched | {name} if name else node.searched
                cost = node.cost - math.log(proposal.prior)
                heapq.heappush(
                    frontier, _Node(cost, next(order), child, observation, searched, actions)
                )
            if n_steps >= budget:
                break
    return Outcome(False, (), n_steps)


@dataclass
class Args:
    n_questions: int = 60
    """how many of the world's questions to try"""
    budget: int = 40
    """env steps the tree search may spend per question"""
    seed: int = 0
    """world seed"""
    max_turns: int = 6
    """actions per episode"""
    world: WorldConfig = field(default_factory=WorldConfig)
    """the world's size and difficulty"""


def main(args: Args) -> dict[str, float]:
    world = World.generate(args.seed, args.world)
    env = make_synthetic_env(args.seed, args.world, max_turns=args.max_turns)
    task_ids = world.tasks.ids[:: max(1, len(world.tasks) // args.n_questions)][: args.n_questions]
    greedy_runs = [greedy(env, t) for t in task_ids]
    tree_runs = [best_first(env, t, budget=args.budget) for t in task_ids]
    n = len(task_ids)
    return {
        "n_questions": n,
        "greedy_em": sum(o.solved for o in greedy_runs) / n,
        "tree_em": sum(o.solved for o in tree_runs) / n,
        "tree_only": sum(
            t.solved and not g.solved for g, t in zip(greedy_runs, tree_runs, strict=True)
        ),
        "greedy_steps_per_question": sum(o.n_env_steps for o in greedy_runs) / n,
        "tree_steps_per_question": sum(o.n_env_steps for o in tree_runs) / n,
    }


if __name__ == "__main__":
    for key, value in main(tyro.cli(Args)).items():
        print(f"{key}: {value:.3g}")
