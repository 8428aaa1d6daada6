"""Typed errors of the envs package.

Each error also inherits the nearest builtin, so generic handlers (`except ValueError`) still
work. A policy's malformed action is never an error: it becomes an observation with
`info["valid_action"] = False`. These errors are for callers' and operators' mistakes.
"""

from __future__ import annotations

__all__ = [
    "ActionTypeError",
    "EnvConfigError",
    "EnvError",
    "EpisodeStateError",
    "RetrievalFailedError",
    "SnapshotError",
    "SnapshotMismatchError",
    "ToolArgumentError",
    "UnforkableWrapperError",
    "UnknownTaskError",
]


class EnvError(Exception):
    """Base class of every environment error."""


class EnvConfigError(EnvError, ValueError):
    """An environment or world was configured with invalid values."""


class ActionTypeError(EnvError, TypeError):
    """`step` was given something other than a string."""


class EpisodeStateError(EnvError, RuntimeError):
    """`step` was called with no episode running (before `reset`, or after it ended)."""


class UnknownTaskError(EnvError, KeyError):
    """`reset(options={"task_id": ...})` named a task that the env's task set does not hold."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class RetrievalFailedError(EnvError, RuntimeError):
    """The retriever raised or answered malformed results during a search.

    The env state is unchanged, so the same `step` can be retried. The retriever's own error is
    chained as `__cause__`.
    """


class SnapshotError(EnvError, ValueError):
    """A snapshot cannot be restored into this env, or is malformed.

    Attributes:
        field: the snapshot field that does not match (e.g. "task_id", "schema_version").
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class SnapshotMismatchError(SnapshotError):
    """A well-formed snapshot of an episode over other questions or another index.

    Its task id is not in this env's task set (a task id names its world or file), or, for an
    env built with `on_other_index="error"`, its index id is not the env's retriever's.
    """


class ToolArgumentError(EnvError, ValueError):
    """A tool's argument is not one it takes; the env makes it an invalid action, not an error."""


class UnforkableWrapperError(EnvError, TypeError):
    """A wrapper in the chain keeps state it cannot snapshot (it is not a `ForkableWrapper`)."""
