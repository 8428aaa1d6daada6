"""Wrappers that keep state, and helpers that snapshot, restore and fork a whole wrapper chain.

A wrapper that keeps state across steps (a budget meter, a time limit) must be part of every
snapshot, or a restored env would not behave like the original. Such a wrapper subclasses
`ForkableWrapper` and exposes its state as JSON through `wrapper_state`/`load_wrapper_state`;
the base class nests that state around the inner env's snapshot. `snapshot(env)`,
`restore(env, snap)` and `fork(env, n)` walk the chain and raise `UnforkableWrapperError`
naming the first wrapper that cannot do its part. Gymnasium's own `PassiveEnvChecker` and
`OrderEnforcing` keep state too, which is why our ids are registered without them.
"""

from __future__ import annotations

import copy
import json
from typing import Any, Self, SupportsFloat

import gymnasium as gym

from envs.errors import SnapshotError, UnforkableWrapperError
from envs.snapshot import AnySnapshot, WrapperSnapshot, short_repr

__all__ = ["BudgetMeter", "ForkableWrapper", "fork", "restore", "snapshot"]


def _unforkable(env: Any) -> UnforkableWrapperError:
    name = type(env).__name__
    if isinstance(env, gym.Wrapper):
        spec_id = env.spec.id if env.spec is not None else "ID"
        return UnforkableWrapperError(
            f"{name} in the wrapper chain keeps state that it cannot snapshot; make it an "
            "envs.ForkableWrapper, or build the env without it. Gymnasium's checkers "
            "(OrderEnforcing, PassiveEnvChecker) go with gym.make(dataclasses.replace("
            f"gym.spec({spec_id!r}), order_enforce=False, disable_env_checker=True))"
        )
    return UnforkableWrapperError(f"{name} has no snapshot/restore/fork; it cannot be forked")


def snapshot(env: gym.Env[Any, Any]) -> AnySnapshot:
    """Snapshot an env and every wrapper around it.

    Raises:
        UnforkableWrapperError: a wrapper in the chain is not a `ForkableWrapper`, or the
            innermost env has no `snapshot`.
    """
    if isinstance(env, ForkableWrapper):
        return env.snapshot()
    if isinstance(env, gym.Wrapper) or not hasattr(env, "snapshot"):
        raise _unforkable(env)
    snap: AnySnapshot = env.snapshot()
    return snap


def restore(env: gym.Env[Any, Any], snap: AnySnapshot) -> None:
    """Restore an env and every wrapper around it from `snapshot(env)`'s result.

    Raises:
        UnforkableWrapperError: as `snapshot`.
        SnapshotError: the snapshot does not fit the chain; `err.field` says where.
    """
    if isinstance(env, ForkableWrapper):
        env.restore(snap)
    elif isinstance(env, gym.Wrapper) or not hasattr(env, "restore"):
        raise _unforkable(env)
    else:
        env.restore(snap)


def fork(env: gym.Env[Any, Any], n: int = 1) -> list[Any]:
    """`n` independent copies of an env and its wrapper chain, at the current state.

    Raises:
        UnforkableWrapperError: as `snapshot`.
    """
    if isinstance(env, ForkableWrapper):
        return env.fork(n)
    if isinstance(env, gym.Wrapper) or not hasattr(env, "fork"):
        raise _unforkable(env)
    forks: list[Any] = env.fork(n)
    return forks


class ForkableWrapper(gym.Wrapper[str, str, str, str]):
    """Base class of wrappers that keep state and snapshot it.

    A subclass keeps all of its mutable state in what `wrapper_state` returns (a fresh,
    JSON-safe dict) and `load_wrapper_state` reads back; everything else on it must be
    read-only configuration, which forks share.
    """

    def wrapper_state(self) -> dict[str, Any]:
        """This wrapper's own mutable state, as a fresh JSON-safe dict."""
        return {}

    def load_wrapper_state(self, state: dict[str, Any]) -> None:
        """Set this wrapper's state from `wrapper_state`'s form.

        Raises:
            SnapshotError: the state is malformed.
        """

    def snapshot(self) -> WrapperSnapshot:
        """This wrapper's state around the inner chain's snapshot."""
        return WrapperSnapshot(
            wrapper=type(self).__name__,
            state=json.dumps(self.wrapper_state(), sort_keys=True),
            inner=snapshot(self.env),
        )

    def restore(self, snap: AnySnapshot) -> None:
        """Restore the inner chain, then this wrapper's state.

        Raises:
            SnapshotError: `snap` was not taken from a chain with this wrapper here.
        """
        if not isinstance(snap, WrapperSnapshot) or snap.wrapper != type(self).__name__:
            got = snap.wrapper if isinstance(snap, WrapperSnapshot) else "a bare env"
            raise SnapshotError(
                f"snapshot was taken from {got}, but this chain has {type(self).__name__} here",
                field="wrapper",
            )
        try:
            state = json.loads(snap.state)
        except (ValueError, RecursionError) as err:  # RecursionError: nested too deeply
            raise SnapshotError(f"wrapper state is not JSON: {err!r:.300}", field="state") from err
        copy.copy(self).load_wrapper_state(
            state
        )  # validate first, so a bad snapshot changes nothing
        restore(self.env, snap.inner)
        self.load_wrapper_state(state)

    def fork(self, n: int = 1) -> list[Self]:
        """`n` copies of this wrapper, each around its own fork of the inner chain."""
        state = json.dumps(self.wrapper_state())
        clones = []
        for inner in fork(self.env, n):
            clone = copy.copy(self)  # shares configuration; the state is re-loaded below
            clone.env = inner
            clone.load_wrapper_state(json.loads(state))
            clones.append(clone)
        return clones


class BudgetMeter(ForkableWrapper):
    """Meters tool calls, retrieved documents, steps and episodes over the wrapper's lifetime.

    Budgets are what equal-cost comparisons count (docs/design.md §1); `info["budget"]` carries the
    running totals after every reset and step. With `max_tool_calls`, the episode in which the
    budget runs out is truncated after that step.

    Args:
        env: the env to meter (its info must carry "action_kind" and "retrieved_doc_ids").
        max_tool_calls: total tool calls allowed over the lifetime (each tool's `cost`; one per
            search), or None for no limit.
    """

    def __init__(self, env: gym.Env[str, str], *, max_tool_calls: int | None = None) -> None:
        super().__init__(env)
        if max_tool_calls is not None and max_tool_calls < 1:
            raise ValueError(f"max_tool_calls={max_tool_calls}: must be >= 1 or None")
        self.max_tool_calls = max_tool_calls
        self.n_tool_calls = 0
        self.n_retrieved_docs = 0
        self.n_steps = 0
        self.n_episodes = 0
        self._n_docs_in_episode = 0

    @property
    def exhausted(self) -> bool:
        """True once the tool-call budget is spent."""
        return self.max_tool_calls is not None and self.n_tool_calls >= self.max_tool_calls

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Reset the inner env and count an episode."""
        obs, info = self.env.reset(seed=seed, options=options)
        self.n_episodes += 1
        self._n_docs_in_episode = len(info.get("retrieved_doc_ids", ()))
        info["budget"] = self.wrapper_state()
        return obs, info

    def step(self, action: str) -> tuple[str, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the inner env, count what it spent, and truncate once the budget is spent."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.n_steps += 1
        # the action's cost in tool calls (an env that does not say counts one per search)
        self.n_tool_calls += int(info.get("tool_cost", info.get("action_kind") == "search"))
        n_docs = len(info.get("retrieved_doc_ids", ()))
        self.n_retrieved_docs += n_docs - self._n_docs_in_episode
        self._n_docs_in_episode = n_docs
        truncated = truncated or (self.exhausted and not terminated)
        info["budget"] = self.wrapper_state()
        return obs, reward, terminated, truncated, info

    def wrapper_state(self) -> dict[str, Any]:
        """The counters."""
        return {
            "n_tool_calls": self.n_tool_calls,
            "n_retrieved_docs": self.n_retrieved_docs,
            "n_steps": self.n_steps,
            "n_episodes": self.n_episodes,
            "n_docs_in_episode": self._n_docs_in_episode,
        }

    def load_wrapper_state(self, state: dict[str, Any]) -> None:
        """Set the counters.

        Raises:
            SnapshotError: a counter is missing or not a non-negative integer.
        """
        values = {}
        for key in (
            "n_tool_calls",
            "n_retrieved_docs",
            "n_steps",
            "n_episodes",
            "n_docs_in_episode",
        ):
            value = state.get(key) if isinstance(state, dict) else None
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise SnapshotError(
                    f"BudgetMeter state {key}={short_repr(value)} is not a count", field="state"
                )
            values[key] = value
        self.n_tool_calls = values["n_tool_calls"]
        self.n_retrieved_docs = values["n_retrieved_docs"]
        self.n_steps = values["n_steps"]
        self.n_episodes = values["n_episodes"]
        self._n_docs_in_episode = values["n_docs_in_episode"]
