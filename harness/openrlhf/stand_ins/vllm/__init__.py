"""Import-only stand-in for vLLM (see ../README.md): the names OpenRLHF's modules import."""

from __future__ import annotations

from typing import Any

__version__ = "0.29.0"  # the version OpenRLHF 0.11.2 pins; it reads it to pick NCCL settings


class SamplingParams:
    """Holds its keyword arguments as attributes."""

    def __init__(self, **kwargs: Any) -> None:
        self.__dict__.update(kwargs)
