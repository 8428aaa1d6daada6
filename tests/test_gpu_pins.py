"""The `gpu` extra can resolve: its pins (and the base requirements the extra installs with)
intersect what openrlhf 0.11.2 declares in its installed metadata.

openrlhf 0.11.2 pins `transformers==5.15.0`; the base requirement used to be
`transformers>=5.16.1,<5.20`, so `pip install -e '.[gpu]'` could not resolve. This test reads
both sides from their sources of truth (pyproject.toml; openrlhf's `Requires-Dist`)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"
PINNED = ("transformers", "deepspeed", "ray", "vllm", "flash-attn")
"""What openrlhf pins exactly and the issue names: the extra must state each of them."""


def intersect(a: SpecifierSet, b: SpecifierSet) -> bool:
    """Whether some version satisfies both sets (tested on every version either one names,
    and their neighbours, which is exact for the ==, >=, <=, <, > and ~= bounds used here)."""
    if not str(a) or not str(b):
        return True
    candidates = set()
    for spec in [*a, *b]:
        v = Version(spec.version.replace(".*", ""))
        major, minor, micro = ([*v.release, 0, 0])[:3]
        candidates |= {v, Version(f"{major}.{minor}.{micro + 1}"), Version(f"{major}.{minor + 1}")}
    return any(
        a.contains(v, prereleases=True) and b.contains(v, prereleases=True) for v in candidates
    )


def ours() -> dict[str, list[Requirement]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    extras = project["optional-dependencies"]
    found: dict[str, list[Requirement]] = {}
    for text in [*project["dependencies"], *extras["gpu"], *extras["gpu-sdpa"], *extras["train"]]:
        requirement = Requirement(text)
        if canonicalize_name(requirement.name) != "trace-rl":
            found.setdefault(canonicalize_name(requirement.name), []).append(requirement)
    return found


def openrlhf_requirements() -> list[Requirement]:
    try:
        declared = importlib.metadata.requires("openrlhf") or []
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("openrlhf is not installed (its metadata is the other side of the check)")
    out = []
    for text in declared:
        requirement = Requirement(text)
        # the unconditional ones, and the `vllm` extra the gpu extra asks for
        if requirement.marker is None or requirement.marker.evaluate({"extra": "vllm"}):
            out.append(requirement)
    return out


def test_openrlhf_is_the_version_the_integration_is_written_against():
    from harness.openrlhf.launcher import OPENRLHF_VERSION

    [pin] = [r for r in ours()["openrlhf"]]
    assert pin.specifier == SpecifierSet(f"=={OPENRLHF_VERSION}")
    assert "vllm" in pin.extras


def test_every_shared_requirement_intersects_openrlhfs():
    mine = ours()
    theirs = openrlhf_requirements()
    assert theirs, "openrlhf declares no requirements?"
    clashes = []
    for requirement in theirs:
        for own in mine.get(canonicalize_name(requirement.name), []):
            if not intersect(own.specifier, requirement.specifier):
                clashes.append(f"ours {own} vs openrlhf's {requirement}")
    assert not clashes, "the gpu extra cannot resolve:\n" + "\n".join(clashes)


def test_the_extra_states_openrlhfs_exact_pins_itself():
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    gpu = {
        canonicalize_name(Requirement(t).name): Requirement(t)
        for t in [*extras["gpu"], *extras["gpu-sdpa"]]
    }
    # the flash-attn-free route is the gpu extra minus OpenRLHF (installed --no-deps) and flash-attn
    assert "trace-rl[gpu-sdpa]" in extras["gpu"]
    assert {canonicalize_name(Requirement(t).name) for t in extras["gpu"]} == {
        "trace-rl",
        "openrlhf",
        "flash-attn",
    }
    theirs = {canonicalize_name(r.name): r for r in openrlhf_requirements()}
    for name in PINNED:
        assert name in gpu, f"the gpu extra does not pin {name}"
        assert gpu[name].specifier == theirs[name].specifier, (gpu[name], theirs[name])


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [
        (">=5.16.1,<5.20", "==5.15.0", False),  # the old clash
        (">=5.15,<5.20", "==5.15.0", True),
        (">=0.19", "==0.19.6", True),
        (">=2.50", "==2.55.0", True),
        ("<2.50", "==2.55.0", False),
        ("", "==1.0", True),
    ],
)
def test_intersect(a, b, expected):
    assert intersect(SpecifierSet(a), SpecifierSet(b)) is expected
