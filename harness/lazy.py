"""Faces that import their torch-based modules on first use.

A room's face (`harness/<room>/__init__.py`) lists its public names; the ones whose modules
import torch, transformers or DeepSpeed at the top are loaded when first read, so that importing
the face (and every command's `--help`) stays fast. The names are also imported under
`TYPE_CHECKING` in the face, so type checkers and readers see them as ordinary imports.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(package: str, modules: Mapping[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for `package` that imports `name` from `modules[name]` on first use.

    >>> getattr_ = lazy_names("harness.example", {"dumps": "json"})
    >>> getattr_("dumps").__name__
    'dumps'
    >>> getattr_("loads")
    Traceback (most recent call last):
    ...
    AttributeError: module 'harness.example' has no attribute 'loads'
    """

    def __getattr__(name: str) -> Any:
        if name not in modules:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(modules[name]), name)

    return __getattr__
