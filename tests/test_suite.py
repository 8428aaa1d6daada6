"""How the suite runs (tests/xdist_groups.py): under `make test`'s xdist flags, a module fixture
and the shared Ray fixture are each built once per run, in one worker, while the tests that use
them still spread over both workers' queues."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

pytest.importorskip("xdist")

# Each fixture appends the worker that built it to a file: one line = built once per run.
CONFTEST = """
import os
import pytest
from xdist_groups import pytest_collection_modifyitems  # noqa: F401

def built(name):
    with open(os.environ["BUILT_LOG"], "a") as log:
        log.write(f"{name} {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.fixture(scope="session")
def ray_local():
    built("ray")
"""
RAY_MODULE = """
import pytest

@pytest.mark.parametrize("i", range(4))
def test_uses_ray(ray_local, i):
    pass

@pytest.mark.parametrize("i", range(4))
def test_free(i):
    pass
"""
POLICY_MODULE = """
import pytest
from conftest import built

@pytest.fixture(scope="module")
def policy():
    built("policy")

@pytest.mark.parametrize("i", range(6))
def test_uses_the_policy(policy, i):
    pass
"""


def test_a_shared_fixture_is_built_once_per_run_under_loadgroup(tmp_path: Path) -> None:
    for name, text in {
        "conftest.py": CONFTEST,
        "test_ray_a.py": RAY_MODULE,
        "test_ray_b.py": RAY_MODULE,
        "test_policy.py": POLICY_MODULE,
    }.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    log = tmp_path / "built.log"
    path = [str(TESTS), str(tmp_path), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, BUILT_LOG=str(log), PYTHONPATH=os.pathsep.join(path))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2",
         "--dist", "loadgroup", "-c", os.devnull, "--rootdir", str(tmp_path), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "22 passed" in done.stdout
    built = sorted(line.split()[0] for line in log.read_text().splitlines())
    assert built == ["policy", "ray"], log.read_text()
