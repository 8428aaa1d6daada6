"""Typed errors of the allocation package.

Each error also inherits the nearest builtin, so a generic `except ValueError` still catches it.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable

__all__ = [
    "AllocError",
    "BudgetExceededError",
    "ExecutionError",
    "TreeFormatError",
    "UnknownNameError",
]


class AllocError(Exception):
    """Base class of every trace_alloc error."""


class UnknownNameError(AllocError, KeyError):
    """A strategy or mode name that is not registered; the message lists the valid ones."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]) -> None:
        valid = sorted(valid)
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        self.message = f"unknown {kind} {name!r}.{hint} Valid names: {', '.join(valid)}."
        super().__init__(self.message)

    def __str__(self) -> str:  # KeyError would repr() the message
        return self.message


class TreeFormatError(AllocError, ValueError):
    """A tree (or its JSON) is malformed: the message names the field and the value."""


class BudgetExceededError(AllocError, ValueError):
    """An allocator asked for more leaves than the exact (leaf-currency) budget has left."""


class ExecutionError(AllocError, RuntimeError):
    """A rollout executor broke its contract (wrong number of rollouts, bad rewards, ...)."""
