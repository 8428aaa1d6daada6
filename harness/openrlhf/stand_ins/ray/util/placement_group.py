"""`ray.util.placement_group`: the names OpenRLHF imports; making a group needs real Ray."""

from __future__ import annotations

from typing import Any


class PlacementGroup:
    """Type name only."""


def placement_group(*args: Any, **kwargs: Any) -> PlacementGroup:
    """Refused: the one-process check places nothing."""
    raise RuntimeError("the Ray stand-in makes no placement groups; install ray for a real run")
