"""`ray.util.scheduling_strategies`: the name OpenRLHF imports."""

from __future__ import annotations

from typing import Any


class PlacementGroupSchedulingStrategy:
    """Accepts and ignores its arguments."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass
