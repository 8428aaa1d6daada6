"""The package import table of STYLE.md §2.1, enforced by walking every module's imports."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "retrieval", "trace_alloc", "harness", "benchmarks")

# package -> trace-rl packages it may import
ALLOWED: dict[str, set[str]] = {
    "trace_alloc": set(),
    "retrieval": set(),
    "envs": {"retrieval"},
    "harness": {"envs", "retrieval", "trace_alloc"},
    "benchmarks": {"envs", "retrieval", "trace_alloc", "harness"},
}
# third-party modules trace_alloc must never touch: it stays pure numpy
TRACE_ALLOC_FORBIDDEN = {"torch", "transformers", "httpx", "socket", "requests", "vllm", "ray"}


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", PACKAGES)
def test_package_imports_only_what_its_row_allows(package: str) -> None:
    violations = []
    for path in _modules(package):
        for root in _imported_roots(path) & set(PACKAGES):
            if root != package and root not in ALLOWED[package]:
                violations.append(f"{path.relative_to(ROOT)} imports {root}")
    assert not violations, "layering violations:\n" + "\n".join(violations)


def test_trace_alloc_stays_pure() -> None:
    violations = [
        f"{path.relative_to(ROOT)} imports {root}"
        for path in _modules("trace_alloc")
        for root in _imported_roots(path) & TRACE_ALLOC_FORBIDDEN
    ]
    assert not violations, "trace_alloc must stay pure numpy:\n" + "\n".join(violations)


def test_the_checker_sees_a_forbidden_edge(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import harness\nfrom envs.tasks import QATask\n")
    assert _imported_roots(bad) == {"harness", "envs"}
