"""Import-only stand-in for Ray (see ../README.md): everything runs in the calling process."""

from __future__ import annotations

from typing import Any

__version__ = "0.0.0+trace-rl-stand-in"


def remote(*args: Any, **kwargs: Any) -> Any:
    """`@ray.remote` and `@ray.remote(num_gpus=1)`: the class or function, unchanged."""
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda target: target


def get(refs: Any, timeout: float | None = None) -> Any:
    """Values are their own references here."""
    return refs


def put(value: Any) -> Any:
    """Values are their own references here."""
    return value


def cancel(ref: Any) -> None:
    """Nothing runs in the background, so nothing can be cancelled."""


def get_gpu_ids() -> list[int]:
    """The one process has the one device."""
    return [0]


def is_initialized() -> bool:
    """There is no Ray cluster to be part of."""
    return False


class exceptions:  # Ray's module name
    """`ray.exceptions`."""

    class GetTimeoutError(TimeoutError):
        """Never raised: `get` does not wait."""


from . import _private, util  # noqa: E402, F401  (ray.util, ray._private)
