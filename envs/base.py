"""Protocols of the envs package: what a scripted agent and a forkable env look like."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, Self, runtime_checkable

from envs.snapshot import AnySnapshot

__all__ = ["ForkableEnv", "ScriptedPolicy"]


@runtime_checkable
class ScriptedPolicy(Protocol):
    """A policy that acts through the env API only, one action text per turn.

    The runner calls `reset` with the prompt and info of `env.reset`, then `act` with each
    observation (the prompt first) and its info, and steps the env with the returned text. It
    plays one episode at a time; `harness.evaluation.ScriptedAgent` adapts it to the one agent
    protocol evaluation plays, the batched `harness.evaluation.Agent`.
    """

    def reset(self, prompt: str, info: Mapping[str, Any]) -> None:
        """Start an episode."""
        ...

    def act(self, observation: str, info: Mapping[str, Any]) -> str:
        """The next action text, e.g. "<search> Acme founder </search>"."""
        ...


@runtime_checkable
class ForkableEnv(Protocol):
    """An env (or wrapper chain) with the fork trio of docs/design.md §3."""

    def snapshot(self) -> AnySnapshot:
        """The whole state as an immutable, JSON-serialisable value."""
        ...

    def restore(self, snap: AnySnapshot) -> None:
        """Return to the state `snap` describes."""
        ...

    def fork(self, n: int = 1) -> list[Self]:
        """`n` independent copies at the current state."""
        ...
