"""Demonstrations for the warm start: the noisy oracle played through the env, piece by piece.

A demonstration is recorded from the env itself (prompt, each action, each observation), so its
text is exactly what the policy will see and emit at RL time; `encode_demo` then tokenises it
with the same `EpisodeCodec` the episode runner uses.

Loss weights per token: 1 on the oracle's correct actions, 0 on its deliberate mistakes (a
wrong query, or a wrong final answer: the policy should learn to recover, not to err), and a
small LM weight (default 0.1) on the prompt and observations.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from envs import OracleAgent, SearchQAConfig, SearchQAEnv, World
from envs.tasks import QATask
from harness.rollout.episodes import EpisodeCodec, question_kind
from retrieval.bm25 import BM25Retriever

__all__ = ["Demo", "DemoPiece", "EncodedDemo", "collect_demos", "encode_demo"]

Role = Literal["prompt", "action", "observation"]


@dataclass(frozen=True, slots=True)
class DemoPiece:
    """One piece of a demonstration's text."""

    role: Role
    text: str
    learn: bool = False
    """True for an action the policy should imitate."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Demo:
    """One oracle episode, as the env and the oracle produced it."""

    task_id: str
    kind: str
    pieces: tuple[DemoPiece, ...]
    em: float

    @property
    def text(self) -> str:
        """The whole episode text."""
        return "".join(p.text for p in self.pieces)


@dataclass(frozen=True, slots=True)
class EncodedDemo:
    """A demonstration as token ids with per-token loss weights."""

    token_ids: tuple[int, ...]
    weights: tuple[float, ...]
    """1 on tokens to imitate, 0 on masked actions, the LM weight on prompt and observations."""
    action_mask: tuple[bool, ...]
    """True on action tokens (imitated or masked): what the policy itself would generate."""


def collect_demos(
    world: World,
    tasks: Sequence[QATask],
    settings: SearchQAConfig,
    *,
    epsilon: float,
    n_variants: int = 1,
    seed: int = 0,
    retriever: BM25Retriever | None = None,
) -> list[Demo]:
    """Play the noisy oracle through the env on each task, `n_variants` times.

    Args:
        world: The world the tasks come from (the oracle reads its decompositions).
        tasks: The questions.
        settings: The env the policy will meet.
        epsilon: The oracle's noise rate (wrong queries and wrong answers).
        n_variants: Episodes per task, each with its own noise draw.
        seed: Seeds the noise (variant v uses seed + v).
        retriever: The world's BM25 index (built here when None).

    Returns:
        The demonstrations, task by task.
    """
    retriever = retriever or BM25Retriever.build(world.documents)
    env = settings.make_env(tasks, retriever)
    demos = []
    for variant in range(n_variants):
        oracle = OracleAgent(world, epsilon=epsilon, seed=seed + variant)
        for task in tasks:
            demos.append(_play(env, oracle, world, task))
    return demos


def _play(env: SearchQAEnv, oracle: OracleAgent, world: World, task: QATask) -> Demo:
    plan = world.decomposition(task.task_id)
    good_queries = {s.query for s in plan.steps} | {s.subject for s in plan.steps}
    prompt, info = env.reset(options={"task_id": task.task_id})
    oracle.reset(prompt, info)
    pieces = [DemoPiece("prompt", prompt)]
    observation = prompt
    while True:
        action = oracle.act(observation, info)
        observation, _, terminated, truncated, info = env.step(action)
        if info["action_kind"] == "search":
            learn = info_query(action) in good_queries
        else:  # the answer: imitate it only when it is right
            learn = bool(info.get("em", 0.0))
        pieces.append(DemoPiece("action", action, learn))
        if terminated or truncated:
            break
        pieces.append(DemoPiece("observation", observation))
    return Demo(
        task_id=task.task_id,
        kind=question_kind(task.question_type, task.n_hops),
        pieces=tuple(pieces),
        em=float(info.get("em", 0.0)),
    )


def info_query(action: str) -> str:
    """The query of a `<search> q </search>` action text.

    >>> info_query("<search> Sky of Ash director </search>")
    'Sky of Ash director'
    """
    return action.split("<search>", 1)[-1].split("</search>", 1)[0].strip()


def encode_demo(demo: Demo, codec: EpisodeCodec, *, lm_weight: float = 0.1) -> EncodedDemo:
    """Token ids and loss weights of a demonstration, laid out as the episode runner lays them.

    Args:
        demo: The demonstration.
        codec: The same codec the episode runner uses.
        lm_weight: Loss weight on prompt and observation tokens (0 masks them out).
    """
    ids: list[int] = []
    weights: list[float] = []
    mask: list[bool] = []
    for piece in demo.pieces:
        if piece.role == "prompt":
            piece_ids = codec.encode_prompt(piece.text)
        else:
            piece_ids = codec.encode_text(piece.text)
        weight = (1.0 if piece.learn else 0.0) if piece.role == "action" else lm_weight
        ids.extend(piece_ids)
        weights.extend([weight] * len(piece_ids))
        mask.extend([piece.role == "action"] * len(piece_ids))
    return EncodedDemo(tuple(ids), tuple(weights), tuple(mask))
