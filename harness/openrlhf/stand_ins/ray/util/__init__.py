"""`ray.util`: placement groups and scheduling strategies (names only)."""

from . import placement_group, scheduling_strategies  # noqa: F401
