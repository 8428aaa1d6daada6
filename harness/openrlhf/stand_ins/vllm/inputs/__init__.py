"""`vllm.inputs`."""

from __future__ import annotations

from typing import Any


def TokensPrompt(**kwargs: Any) -> dict[str, Any]:  # vLLM's name
    """A prompt is its fields."""
    return dict(kwargs)
