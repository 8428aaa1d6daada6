"""Typed errors of the harness package."""

from __future__ import annotations

__all__ = ["HarnessError"]


class HarnessError(Exception):
    """Base class of every harness error."""
