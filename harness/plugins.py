"""A user's class named as `MODULE:CLASS`: the one loader behind every plug point's flag.

`tracerl train --allocator my_rules:Greedy --allocator-kwargs '{"n": 4}'` and
`--task-source my_data:Questions` both come here (docs/extending.md). The class is imported,
called with the keyword arguments, and the object checked against the protocol it must follow,
so a typo, a missing attribute or a class that is not an allocator fails before any step runs,
with a message that names what was wrong.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
from collections.abc import Mapping
from typing import Any

from harness.errors import PluginError

__all__ = ["load_plugin", "parse_kwargs"]


def parse_kwargs(text: str, *, flag: str) -> dict[str, Any]:
    """The keyword arguments a `--...-kwargs` flag gives, as a dict.

    >>> parse_kwargs('{"group_size": 4}', flag="--allocator-kwargs")
    {'group_size': 4}

    Raises:
        PluginError: `text` is not a JSON object.
    """
    try:
        kwargs = json.loads(text)
    except json.JSONDecodeError as err:
        raise PluginError(f"{flag} {text!r} is not JSON ({err.msg}); e.g. '{{\"x\": 1}}'") from err
    if not isinstance(kwargs, dict):
        raise PluginError(f"{flag} {text!r} must be a JSON object of keyword arguments")
    return kwargs


def load_plugin(
    spec: str, protocol: type, *, kwargs: Mapping[str, Any] | None = None, flag: str
) -> Any:
    """Import `MODULE:CLASS`, build it with `kwargs`, and check it against `protocol`.

    Args:
        spec: `package.module:Name`, imported from `PYTHONPATH`, the installed packages, or
            the current directory.
        protocol: A `runtime_checkable` Protocol the built object must satisfy.
        kwargs: Keyword arguments for the class (none if None).
        flag: The flag that named it, for messages (`--allocator`).

    Returns:
        The built object.

    Raises:
        PluginError: the spec is not `MODULE:CLASS`, the module cannot be imported, it has no
            such attribute, the call fails on its arguments, or the object misses a member of
            `protocol`.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise PluginError(f"{flag} {spec!r}: expected MODULE:CLASS, e.g. my_package.rules:Greedy")
    try:
        module = _import(module_name)
    except ModuleNotFoundError as err:
        raise PluginError(
            f"{flag} {spec!r}: no module named {err.name!r} (is it on PYTHONPATH, or in the "
            "current directory?)"
        ) from err
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            public = sorted(n for n in vars(module) if not n.startswith("_"))
            raise PluginError(
                f"{flag} {spec!r}: module {module_name!r} has no attribute {attr!r} "
                f"(it has: {', '.join(public[:12]) or 'nothing public'})"
            )
        target = getattr(target, part)
    if not callable(target):
        raise PluginError(f"{flag} {spec!r}: {attr!r} is a {type(target).__name__}, not a class")
    try:
        obj = target(**dict(kwargs or {}))
    except TypeError as err:  # the user's constructor rejected the keyword arguments
        raise PluginError(f"{flag} {spec!r}: cannot build it with {kwargs or {}}: {err}") from err
    missing = [name for name in _members(protocol) if not hasattr(obj, name)]
    if missing or not isinstance(obj, protocol):
        raise PluginError(
            f"{flag} {spec!r}: {type(obj).__name__} does not follow the {protocol.__name__} "
            "protocol: it lacks "
            f"{', '.join(missing) or 'a member'} (docs/extending.md)"
        )
    return obj


def _import(name: str) -> Any:
    """Import `name`, from the current directory too (a console script's path lacks it)."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if here in sys.path or not (err.name and name.startswith(err.name)):
            raise
        sys.path.append(here)  # last: never shadows an installed module
        return importlib.import_module(name)


def _members(protocol: type) -> list[str]:
    """The names a `runtime_checkable` protocol requires, in a stable order."""
    names = getattr(protocol, "__protocol_attrs__", None)
    if names is None:  # Python < 3.12 keeps them private to typing
        from typing import _get_protocol_attrs  # type: ignore[attr-defined]

        names = _get_protocol_attrs(protocol)
    return sorted(names)
