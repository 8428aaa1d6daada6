"""Typed errors of the envs package."""

from __future__ import annotations

__all__ = ["EnvError"]


class EnvError(Exception):
    """Base class of every environment error."""
