"""The xdist groups of the suite: tests that share a costly thing run in one worker.

`make test` runs the suite on every core (pytest-xdist, `--dist loadgroup`). Each worker is its
own process with its own session, so a session or module fixture is built once per worker that
needs it. A test that shares a costly process-wide thing with others is put in one xdist group
with them, so that thing is built in one worker, once per run:

- a session fixture named in `SHARED_FIXTURE_GROUPS`: the local Ray (its workers import vLLM) and
  the engines on it;
- a module-scoped fixture defined in the test module itself (a trained policy, a vLLM engine, a
  server): the module's tests that use it form one group, named after the module.

tests/conftest.py imports the hook; tests/test_suite.py checks that the groups hold under xdist.
"""

from __future__ import annotations

import pytest

SHARED_FIXTURE_GROUPS = {"ray_local": "ray", "fake_engines": "ray"}


def xdist_group(item: pytest.Item) -> str | None:
    """The group of `item` under `--dist loadgroup`, or None to schedule it on its own."""
    info = getattr(item, "_fixtureinfo", None)  # doctest items have none
    if info is None:
        return None
    for name in info.names_closure:
        if name in SHARED_FIXTURE_GROUPS:
            return SHARED_FIXTURE_GROUPS[name]
    for name in info.names_closure:
        for fixturedef in info.name2fixturedefs.get(name, ()):
            # a fixture's baseid is the node id of where it is defined: a module's ends in .py
            if fixturedef.scope == "module" and fixturedef.baseid.endswith(".py"):
                return fixturedef.baseid
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook turns the marks into groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = xdist_group(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
