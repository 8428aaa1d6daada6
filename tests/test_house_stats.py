"""`scripts/house_stats.py`: the figures issue 34 measures, on a small house built here."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("house_stats", ROOT / "scripts" / "house_stats.py")
assert _spec is not None and _spec.loader is not None
house_stats = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(house_stats)


def write(root: Path, folder: str, name: str, text: str) -> None:
    # folder and file apart: tests/test_references.py reads "folder/name.py" as a repository path
    path = root / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


@pytest.fixture(scope="module")
def house(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp_path = tmp_path_factory.mktemp("house")
    for package in house_stats.PACKAGES:
        write(tmp_path, package, "__init__.py", "")
    write(tmp_path, "envs", "__init__.py", '__all__ = ["a", "b"]\n__all__ += ["c"]\n')
    write(tmp_path, "harness/rollout", "__init__.py", "__all__: list[str] = ['x']\n")
    # a table of commands one floor down that names rooms above it, and a real import up
    write(tmp_path, "harness", "cli.py", 'TABLE = {"bench": "benchmarks.qa.cli:bench"}\n')
    write(tmp_path, "envs", "loader.py", 'import harness.rollout\nLOADER = "harness.io:load"\n')
    # down a floor, and text that only mentions a module: not arrows
    write(tmp_path, "benchmarks", "cli.py", 'T = {"train": "harness.cli:train"}\n')
    write(tmp_path, "retrieval", "doc.py", '"""See harness.cli for the command table."""\n')
    body = "".join(f"    x{i} = {i}\n" for i in range(6))
    small = "def small() -> None:\n    pass\n"
    write(tmp_path, "trace_alloc", "big.py", f"def big() -> None:\n{body}\n\n{small}")
    write(tmp_path, "benchmarks", "huge.py", "def huge() -> None:\n" + "    pass\n" * 40)
    write(tmp_path, "benchmarks", "RESULTS.md", "# R\n\nthree\n")
    write(tmp_path, "docs", "decisions.md", "# D\n\n")
    two_tests = "def test_a():\n    pass\n\n\ndef test_b():\n    pass\n"
    write(tmp_path, "tests", "test_two.py", two_tests)
    return tmp_path


@pytest.fixture(scope="module")
def result(house: Path) -> dict[str, object]:
    return house_stats.stats(house)


def test_arrows_up_a_floor_count_module_path_strings_and_imports(result: dict) -> None:
    assert result["arrows_up_a_floor"] == {
        "imports": ["envs.loader -> harness.rollout"],
        "strings": ["envs.loader -> harness.io:load", "harness.cli -> benchmarks.qa.cli:bench"],
    }
    assert result["arrows_up_a_floor_count"] == 3


def test_faces_count_the_names_of_every_package_and_room_all(result: dict) -> None:
    faces = result["public_names_per_face"]
    assert faces["envs"] == 3 and faces["harness.rollout"] == 1
    assert faces["harness"] == 0 and faces["trace_alloc"] == 0


def test_the_largest_function_and_file_are_the_library_s_not_the_benchmarks(result: dict) -> None:
    assert result["largest_library_function"] == {"lines": 7, "function": "trace_alloc.big.big"}
    big = "/".join(("trace_alloc", "big.py"))
    assert result["largest_library_file"] == {"lines": 11, "file": big}
    assert result["largest_functions"][0]["function"] == "benchmarks.huge.huge"


def test_records_line_counts_and_the_collected_tests(result: dict, house: Path) -> None:
    assert (result["results_md_lines"], result["decisions_md_lines"]) == (3, 2)
    assert result["tests_collected"] == 2
    assert house_stats.count_tests(house / "docs") is None  # nothing to collect: no count


def test_time_tests_times_make_test_and_a_failing_suite_has_no_time(tmp_path: Path) -> None:
    write(tmp_path, ".", "Makefile", "test:\n\tsleep 0.2\n")
    seconds = house_stats.time_tests(tmp_path)
    assert seconds is not None and 0.2 <= seconds < 30
    write(tmp_path, ".", "Makefile", "test:\n\tfalse\n")
    assert house_stats.time_tests(tmp_path) is None


def test_the_command_line_prints_the_new_figures_as_its_last_json_line(house: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "house_stats.py"), str(house), "--json"],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["make_test_seconds"] is None  # only --time-tests runs the suite
    assert result["arrows_up_a_floor_count"] == 3 and result["tests_collected"] == 2
