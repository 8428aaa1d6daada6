"""Print the `gpu` extra's requirement for one package, as pyproject.toml states it.

`make install-gpu` installs vLLM and flash-attn on their own, in order, before the rest of the
extra; this keeps their versions in one place (pyproject.toml).

Usage: `python scripts/gpu_pin.py vllm` prints `vllm==0.29.0`.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def gpu_pin(name: str) -> str:
    """The `gpu` extra's requirement string for `name` (case and -/_ insensitive).

    The extras it includes (`trace-rl[gpu-sdpa]`) are searched too.

    Raises:
        SystemExit: the extra has no requirement for `name`.
    """
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    key = re.sub(r"[-_.]+", "-", name).lower()
    for requirement in _expanded(extras, "gpu"):
        found = re.match(r"[A-Za-z0-9._-]+", requirement)
        if found and re.sub(r"[-_.]+", "-", found.group(0)).lower() == key:
            return requirement
    raise SystemExit(f"the gpu extra of {PYPROJECT} has no requirement for {name!r}")


def _expanded(extras: dict[str, list[str]], name: str) -> list[str]:
    """The extra's requirements, with its `trace-rl[other]` references replaced by theirs."""
    out = []
    for requirement in extras[name]:
        nested = re.fullmatch(r"trace-rl\[([a-z0-9-]+)\]", requirement)
        out += _expanded(extras, nested.group(1)) if nested else [requirement]
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/gpu_pin.py PACKAGE")
    print(gpu_pin(sys.argv[1]))
