"""The tree-rollout engine: one `trace_alloc.Executor` over any `PolicyBackend` and forkable env.

`run_step` (trace_alloc.driver) runs the ask-tell loop; this engine is its `execute` callback.
One step goes like this:

1. `start(task_ids)` resets one fork of the env per prompt, encodes the prompt once
   (`EpisodeCodec`) and parks the reset episode in the engine's *store* under a snapshot id;
   the returned `Prompt`s carry that id, so every tree's root can be continued.
2. Each wave, `__call__(trees, requests)` takes every request (`tree_index`, `node_id`, `n`),
   forks the parked episode of that node `n` times (the env is forked in O(1) and the token
   stream is copied, so a continuation starts from exactly the anchor's prefix tokens), and
   plays *all* live episodes of the wave together, one batched `generate` per turn across
   prompts (`harness.rollout.episodes.advance`). With a backend that runs requests concurrently
   (`ConcurrentPolicyBackend`, e.g. OpenRLHF's Ray engines) the episodes are not in lockstep:
   whichever actions come back are stepped together and sent their next turn at once, while
   slower ones are still being generated.
3. After every turn that does not end an episode, the episode (env + token stream) is parked
   again under a fresh snapshot id, which the turn's `trace_alloc.Turn.snapshot_id` records:
   that is where Stage 2 may fork later.
4. Observations are appended as the token ids the codec made when they arrived; nothing is
   re-tokenised, and the tree's `segments(leaf)` give back exactly the sequence the policy saw.

The engine meters what it ran (generated tokens, generate calls, wall time); the driver meters
the budget from the returned turns (leaves, generated tokens, tool calls), so equal budget is
enforced by the driver, the same way for every allocator.

The store lives for one step: `start` clears it. It holds live Python objects (envs share
their read-only task set and retriever), never pickles, and costs O(turns) token copies.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from harness.errors import RolloutError
from harness.policies.base import ConcurrentPolicyBackend, PolicyBackend, SamplingParams
from harness.rollout.episodes import (
    EpisodeCodec,
    LiveEpisode,
    PlayedTurn,
    advance,
    apply_turn,
    ready_for_turn,
    start_episodes,
)
from trace_alloc import (
    Allocator,
    BudgetLimit,
    Executor,
    Predictor,
    Prompt,
    Rollout,
    RolloutRequest,
    RolloutTree,
    StepResult,
    Turn,
    run_step,
    tree_advantages,
)
from trace_alloc.advantages import LeafAdvantage

__all__ = ["EngineStats", "RolloutError", "TreeRolloutEngine", "failed_leaves", "leaves_to_train"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """What the engine ran since it was built (or since `reset_stats`)."""

    n_generated_tokens: int = 0
    """Action tokens the backend produced."""
    n_generate_calls: int = 0
    """Batched `generate` calls (one per turn of a wave)."""
    n_rollouts: int = 0
    """Finished rollouts (leaves) returned."""
    generate_s: float = 0.0
    """Wall time inside the engine's waves (generation and env steps)."""

    @property
    def tokens_per_s(self) -> float:
        """Generated tokens per second of wave wall time."""
        return self.n_generated_tokens / self.generate_s if self.generate_s > 0 else 0.0


class TreeRolloutEngine:
    """Runs rollout requests from prompt roots and from turn prefixes, batched across prompts.

    Implements `trace_alloc.Executor`. Use it through `run_step` (this class's method, or
    `trace_alloc.run_step` with `execute=engine` after `engine.start`).

    Args:
        backend: The policy (any `PolicyBackend`: transformers, vLLM, OpenRLHF's engines).
        env: A forkable search/QA env (or wrapper chain) whose task set holds every prompt.
            It is the engine's env factory: it is forked, never stepped itself.
        codec: Encodes prompts and observations into the policy's token ids.
        sampling: Sampling settings for every turn; its `seed` is replaced per turn by one
            drawn from the engine's generator.
        max_total_tokens: An episode whose stream plus one more action would exceed this ends
            unanswered (the model's context); None for no limit.
        seed: Seeds the engine's generator (the per-turn sampling seeds).
        batch_tool_calls: Send all searches of a turn of the wave to the retriever in one
            batched call (`harness.rollout.episodes.prefetch_searches`); False: one call per
            episode.
        snapshot_prefix: Starts every snapshot id; data-parallel ranks each take their own
            (`harness.training.distributed.ShardedExecutor` routes a fork to the rank that parked
            it).
        lockstep: Play every episode of a wave turn by turn together (one batched `generate`
            per turn). None: only when the backend cannot run requests concurrently (it is not
            a `ConcurrentPolicyBackend`). Either way a wave runs exactly its requests, so the
            budget and the forks are the same; what changes is who waits for whom.

    Example:
        >>> engine = TreeRolloutEngine(backend, env, codec, sampling=sampling)  # doctest: +SKIP
        >>> result = engine.run_step(make_allocator("trace"), task_ids, budget=BudgetLimit(
        ...     currency="leaves", per_step=64), rng=rng, predictor=predictor)  # doctest: +SKIP
    """

    def __init__(
        self,
        backend: PolicyBackend,
        env: gym.Env[str, str],
        codec: EpisodeCodec,
        *,
        sampling: SamplingParams,
        max_total_tokens: int | None = None,
        seed: int = 0,
        batch_tool_calls: bool = True,
        snapshot_prefix: str = "s",
        lockstep: bool | None = None,
    ) -> None:
        if max_total_tokens is not None and max_total_tokens <= sampling.max_new_tokens:
            raise ValueError(
                f"max_total_tokens={max_total_tokens} leaves no room for a prompt and one "
                f"action of max_new_tokens={sampling.max_new_tokens}"
            )
        self.backend = backend
        self.env = env
        self.codec = codec
        self.sampling = sampling
        self.max_total_tokens = max_total_tokens
        self.batch_tool_calls = batch_tool_calls
        self.snapshot_prefix = snapshot_prefix
        concurrent = isinstance(backend, ConcurrentPolicyBackend)
        if lockstep is False and not concurrent:
            raise ValueError(
                f"lockstep=False needs a backend that runs requests concurrently (submit/wait); "
                f"{type(backend).__name__} generates one batch at a time"
            )
        self.lockstep = not concurrent if lockstep is None else lockstep
        self.rng = np.random.default_rng(seed)
        self._store: dict[str, LiveEpisode] = {}
        self._n_parked = 0
        self._step_tag = 0
        self._stats = EngineStats()

    # --- the per-step store ---

    def start(self, task_ids: Sequence[str]) -> list[Prompt]:
        """Reset one episode per task id and park it; returns the prompts for `run_step`.

        Clears the store of the previous step.

        Args:
            task_ids: The candidate pool, in sampling order (ids must be distinct).

        Raises:
            RolloutError: a duplicate id, or a prompt that leaves no room for an action.
        """
        if len(set(task_ids)) != len(task_ids):
            raise RolloutError(f"the pool has duplicate task ids: {sorted(task_ids)[:10]}")
        self._store.clear()
        self._step_tag += 1
        prompts = []
        for episode in start_episodes(self.env, task_ids, self.codec):
            if self._no_room(episode):
                raise RolloutError(
                    f"the prompt of task {episode.task_id!r} has {len(episode.token_ids)} "
                    f"tokens: no room for an action of {self.sampling.max_new_tokens} within "
                    f"max_total_tokens={self.max_total_tokens}"
                )
            prompts.append(
                Prompt(
                    prompt_id=episode.task_id,
                    text=str(episode.info.get("question", "")),
                    token_ids=tuple(episode.token_ids),
                    snapshot_id=self._park(episode),
                )
            )
        return prompts

    def clear(self) -> None:
        """Drop every parked episode (the end of a step)."""
        self._store.clear()

    @property
    def n_parked(self) -> int:
        """Episodes parked in the store (one per root and per non-final turn so far)."""
        return len(self._store)

    def parked(self, snapshot_id: str) -> LiveEpisode:
        """A fork of the episode parked under `snapshot_id` (for tests and tools).

        Raises:
            RolloutError: no such snapshot in this step's store.
        """
        return self._lookup(snapshot_id).fork(1)[0]

    def _park(self, episode: LiveEpisode) -> str:
        self._n_parked += 1
        snapshot_id = f"{self.snapshot_prefix}{self._step_tag}.{self._n_parked}"
        self._store[snapshot_id] = episode.fork(1)[0]  # never stepped: forks start from it
        return snapshot_id

    def _lookup(self, snapshot_id: str | None) -> LiveEpisode:
        if snapshot_id is None or snapshot_id not in self._store:
            raise RolloutError(
                f"no parked episode under snapshot id {snapshot_id!r}: the store holds this "
                "step's roots and turns only (call start() with the step's pool first)"
            )
        return self._store[snapshot_id]

    def _no_room(self, episode: LiveEpisode) -> bool:
        limit = self.max_total_tokens
        return limit is not None and len(episode.token_ids) + self.sampling.max_new_tokens > limit

    # --- the Executor ---

    def __call__(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> list[list[Rollout]]:
        """Run every request to the end, all episodes of the wave batched together.

        Returns:
            For each request in order, `request.n` rollouts that start below its node.

        Raises:
            RolloutError: a request names a node without a parked episode, or an anchor
                with no room left in the context.
        """
        start = time.perf_counter()
        runs: list[tuple[LiveEpisode, int]] = []  # (episode, turns it had at its anchor)
        for request in requests:
            tree = trees[request.tree_index]
            node = tree.nodes[request.node_id]
            snapshot_id = tree.root_snapshot_id if node.turn is None else node.turn.snapshot_id
            anchor = self._lookup(snapshot_id)
            if self._no_room(anchor):
                raise RolloutError(
                    f"node {request.node_id} of tree {tree.prompt_id!r} has no room for another "
                    f"action within max_total_tokens={self.max_total_tokens}"
                )
            runs += [(episode, len(anchor.turns)) for episode in anchor.fork(request.n)]
        # per episode, the snapshot id parked after each new turn (None once it has ended)
        snapshot_ids: list[list[str | None]] = [[] for _ in runs]
        play = self._play_in_lockstep if self.lockstep else self._play_concurrently
        n_tokens, n_calls = play(runs, snapshot_ids)
        results: list[list[Rollout]] = []
        position = 0
        for request in requests:
            group = []
            for _ in range(request.n):
                episode, base = runs[position]
                group.append(_rollout(episode, base, snapshot_ids[position]))
                position += 1
            results.append(group)
        self._stats = EngineStats(
            n_generated_tokens=self._stats.n_generated_tokens + n_tokens,
            n_generate_calls=self._stats.n_generate_calls + n_calls,
            n_rollouts=self._stats.n_rollouts + len(runs),
            generate_s=self._stats.generate_s + time.perf_counter() - start,
        )
        return results

    def _park_new_turns(
        self, runs: Sequence[tuple[LiveEpisode, int]], snapshot_ids: list[list[str | None]]
    ) -> None:
        """Park every episode that played a turn since its last parking (None once it ended)."""
        for (episode, base), ids in zip(runs, snapshot_ids, strict=True):
            if len(ids) < len(episode.turns) - base:
                ids.append(None if episode.done else self._park(episode))

    def _turn_sampling(self) -> SamplingParams:
        """The sampling of one generate call or submission, its seed drawn from the engine's."""
        return dataclasses.replace(self.sampling, seed=int(self.rng.integers(2**31)))

    def _play_in_lockstep(
        self, runs: Sequence[tuple[LiveEpisode, int]], snapshot_ids: list[list[str | None]]
    ) -> tuple[int, int]:
        """Turn by turn, every live episode together; returns (tokens, generate calls)."""
        episodes = [episode for episode, _ in runs]
        n_tokens = n_calls = 0
        while not all(e.done for e in episodes):
            n_tokens += advance(
                self.backend,
                episodes,
                self.codec,
                self._turn_sampling(),
                max_total_tokens=self.max_total_tokens,
                batch_tool_calls=self.batch_tool_calls,
            )
            n_calls += 1
            self._park_new_turns(runs, snapshot_ids)
        return n_tokens, n_calls

    def _play_concurrently(
        self, runs: Sequence[tuple[LiveEpisode, int]], snapshot_ids: list[list[str | None]]
    ) -> tuple[int, int]:
        """Every episode at its own pace; returns (tokens, submissions).

        Whatever has finished when the engine looks is stepped together (its searches in one
        batched retrieval call) and sent its next turn in one submission, so a slow action
        holds up only its own episode.
        """
        backend: Any = self.backend  # a ConcurrentPolicyBackend (checked in __init__)
        pending: dict[Any, LiveEpisode] = {}  # request handle -> the episode it continues
        n_tokens = n_calls = 0

        def submit(episodes: Sequence[LiveEpisode]) -> None:
            nonlocal n_calls
            sampling = self._turn_sampling()
            live = ready_for_turn(episodes, sampling, self.max_total_tokens)
            if live:
                handles = backend.submit([e.token_ids for e in live], sampling)
                pending.update(zip(handles, live, strict=True))
                n_calls += 1

        submit([episode for episode, _ in runs])
        while pending:
            finished = backend.wait(list(pending))
            live = [pending.pop(handle) for handle, _ in finished]
            n_tokens += apply_turn(
                live,
                [completion for _, completion in finished],
                self.codec,
                self.sampling,
                max_total_tokens=self.max_total_tokens,
                batch_tool_calls=self.batch_tool_calls,
            )
            self._park_new_turns(runs, snapshot_ids)
            submit(live)
        return n_tokens, n_calls

    # --- one step ---

    def run_step(
        self,
        allocator: Allocator,
        task_ids: Sequence[str],
        *,
        budget: BudgetLimit,
        rng: np.random.Generator,
        predictor: Predictor | None = None,
        carry: float = 0.0,
        tokens_per_leaf: float | None = None,
        execute: Executor | None = None,
        flip_calibration: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> StepResult:
        """Start the pool, let `trace_alloc.run_step` spend the budget, clear the store.

        Args:
            allocator: The strategy (`trace_alloc.make_allocator(name, ...)`).
            task_ids: The candidate pool, in sampling order.
            budget: The per-step limit, in leaves or generated tokens, and the wave cap.
            rng: The allocator's generator.
            predictor: Ṽψ, for allocators that use one.
            carry: The previous step's `StepResult.carry`.
            tokens_per_leaf: Token-currency estimate for the first wave.
            execute: What runs the waves (default: this engine); a wrapper around it such as
                `harness.training.distributed.ShardedExecutor`.
            flip_calibration: Maps Stage 2's raw flip chances to calibrated ones.

        Returns:
            The driver's `StepResult`: the trees, the trees to train on, spend and carry.
        """
        prompts = self.start(task_ids)
        try:
            return run_step(
                allocator,
                prompts,
                execute=self if execute is None else execute,
                budget=budget,
                rng=rng,
                predictor=predictor,
                carry=carry,
                tokens_per_leaf=tokens_per_leaf,
                flip_calibration=flip_calibration,
            )
        finally:
            self.clear()

    # --- meters and state ---

    @property
    def stats(self) -> EngineStats:
        """Totals since construction or the last `reset_stats`."""
        return self._stats

    def reset_stats(self) -> EngineStats:
        """Return the totals and start counting from zero."""
        stats, self._stats = self._stats, EngineStats()
        return stats

    def rng_state(self) -> dict[str, Any]:
        """The generator's state as a JSON-safe dict (for checkpoints)."""
        return dict(self.rng.bit_generator.state)

    def set_rng_state(self, state: dict[str, Any]) -> None:
        """Restore `rng_state` output.

        Raises:
            RolloutError: the state is not a PCG64 state.
        """
        if state.get("bit_generator") != "PCG64":
            raise RolloutError(f"engine rng state must be PCG64, got {state.get('bit_generator')}")
        self.rng.bit_generator.state = state


def _rollout(episode: LiveEpisode, base: int, snapshot_ids: list[str | None]) -> Rollout:
    """The turns an episode played after its anchor, as a `Rollout` with its final reward."""
    played = episode.turns[base:]
    if not played:
        raise RolloutError(
            f"an episode of task {episode.task_id!r} ended before its first action (no room "
            "within max_total_tokens)"
        )
    end = _end_reason(played[-1])
    # searches so far at the anchor: the reset info has none, a turn's info counts them all
    calls_before = int(episode.turns[base - 1].info.get("n_tool_calls", 0)) if base else 0
    turns = []
    for i, t in enumerate(played):
        calls = int(t.info.get("n_tool_calls", 0))
        last = i == len(played) - 1
        turns.append(
            _turn(t, None if last else snapshot_ids[i], calls - calls_before, end if last else None)
        )
        calls_before = calls
    reward = episode.reward
    if not 0.0 <= reward <= 1.0:
        raise RolloutError(
            f"task {episode.task_id!r} ended with reward {reward}; TRACE needs rewards in [0, 1] "
            "(use the env's 'em', 'f1' or 'f1_threshold' reward)"
        )
    return Rollout(turns=tuple(turns), reward=reward)


def _end_reason(last: PlayedTurn) -> str:
    """How an episode ended: an answer, the env's turn limit, the model's context, or a fault."""
    info = last.info
    if info.get("failed"):
        return "failed"  # a retrieval that failed after its retries (episodes.advance)
    if "answer" in info:
        return "answer"
    if int(info.get("turn_idx", 0)) >= int(info.get("max_turns", 1 << 30)):
        return "max_turns"
    return "context"  # the env would have gone on; the token stream could not


def _turn(played: PlayedTurn, snapshot_id: str | None, n_tool_calls: int, end: str | None) -> Turn:
    """A tree node for one played turn; `end` is set on the leaf only."""
    info = played.info
    extra: dict[str, Any] = {
        "finish_reason": played.completion.finish_reason,
        "valid_action": bool(info.get("valid_action", False)),
        "action_kind": info.get("action_kind"),
        "turn_idx": int(info.get("turn_idx", 0)),
    }
    if end is not None:
        extra["end"] = end
        if "em" in info:
            extra["em"] = float(info["em"])
            extra["f1"] = float(info.get("f1", 0.0))
    return Turn(
        action_text=played.completion.text,
        action_token_ids=tuple(played.completion.token_ids),
        action_logprobs=tuple(played.completion.logprobs),
        observation_text=played.observation,
        observation_token_ids=played.observation_ids,
        snapshot_id=snapshot_id,
        n_tool_calls=n_tool_calls,
        info=extra,
    )


def failed_leaves(tree: RolloutTree) -> frozenset[int]:
    """The leaves of `tree` whose episode a fault ended (`end == "failed"`).

    Such an episode stopped because a retrieval still failed after the retriever's own retries
    (`harness.rollout.episodes.apply_turn`); its reward 0 says nothing about the policy.
    """
    return frozenset(
        leaf
        for leaf in tree.leaves()
        if (turn := tree.nodes[leaf].turn) is not None and turn.info.get("end") == "failed"
    )


def leaves_to_train(trees: Sequence[RolloutTree], mode: str) -> tuple[list[LeafAdvantage], int]:
    """The leaves both trainers train on, and how many failed ones were left out.

    Failed leaves (`failed_leaves`) are excluded from the advantages as if never sampled: trained
    as reward 0 they would push the policy away from whatever preceded the fault, usually a
    search, whenever the retriever is flaky. Of the rest, only leaves with a non-zero advantage
    are kept (they alone carry a gradient; docs/decisions.md, "One objective").

    Args:
        trees: The trees the allocator keeps for training.
        mode: The tree advantage (`trace_alloc.tree_advantages`).

    Returns:
        `(leaves with signal, failed leaves excluded)`.
    """
    failed = [failed_leaves(tree) for tree in trees]
    leaves = tree_advantages(trees, mode, exclude=failed)
    return [a for a in leaves if a.has_signal], sum(len(f) for f in failed)
