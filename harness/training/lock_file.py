"""The committed lock files: the exact package sets an install is made from, and drift against them.

`requirements/cpu.lock` is the set `make install` builds the CPU venv from (every package pinned
with its hashes; `make lock` re-resolves it on purpose); `requirements/gpu.lock` is the resolved
set of the GPU install, which `make install-gpu` takes as constraints and `tracerl doctor`
compares the installed versions with. Both are pip requirement files (`name==version` lines with
`--hash` continuations), so pip and uv read them as they are.

>>> lock = parse_lock("numpy==2.3.4 \\\\\\n    --hash=sha256:00\\nTorch==2.13.0+cpu\\n")
>>> lock
{'numpy': '2.3.4', 'torch': '2.13.0+cpu'}
>>> drift(lock, {"numpy": "2.3.4", "torch": "2.14.1"})
[Drift(name='torch', locked='2.13.0+cpu', installed='2.14.1')]
"""

from __future__ import annotations

import importlib.metadata
import re
import sysconfig
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Drift", "drift", "installed_versions", "parse_lock", "read_lock"]

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)")


@dataclass(frozen=True, slots=True)
class Drift:
    """A locked package whose installed version is another one (`installed` None: not installed)."""

    name: str
    locked: str
    installed: str | None


def canonical(name: str) -> str:
    """A distribution name as PEP 503 compares it: `Foo_Bar.baz` -> `foo-bar-baz`."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_lock(text: str) -> dict[str, str]:
    """The `name==version` pins of a lock file's text, by canonical name.

    Raises:
        ValueError: a requirement line that is not an exact `==` pin (a lock pins everything).
    """
    pins: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith(("#", "--hash", "-")):
            continue
        match = _PIN.match(line)
        if match is None:
            raise ValueError(f"lock line {number} is not an exact pin (name==version): {line!r}")
        pins[canonical(match.group(1))] = match.group(2)
    return pins


def read_lock(path: Path) -> dict[str, str]:
    """`parse_lock` of a file, naming the file in its errors."""
    try:
        return parse_lock(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise ValueError(f"cannot read the lock file {path}: {error.strerror}") from error
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from error


def installed_versions() -> dict[str, str]:
    """The distributions installed in this interpreter's site-packages, by canonical name.

    Only site-packages: setuptools puts its vendored copies (packaging, jaraco, ...) on `sys.path`
    once it is imported, and they are not installed packages.
    """
    paths = list(dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib")))
    versions: dict[str, str] = {}
    for dist in importlib.metadata.distributions(path=paths):
        name = dist.metadata["Name"]
        if name:
            versions[canonical(name)] = dist.version
    return versions


def drift(lock: Mapping[str, str], installed: Mapping[str, str]) -> list[Drift]:
    """The locked packages installed at another version or not at all, by name."""
    return [
        Drift(name, version, installed.get(name))
        for name, version in sorted(lock.items())
        if installed.get(name) != version
    ]
