"""The import table of the packages and of benchmarks' rooms.

Why the rooms: docs/decisions.md, "`benchmarks/` in three rooms"; the table: docs/style.md §2.1.
"""

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
# benchmarks' rooms -> the rooms (and shared top-level modules) each may import
ROOMS: dict[str, set[str]] = {
    "benchmarks.qa": {"benchmarks.qa"},
    "benchmarks.perf": {"benchmarks.perf", "benchmarks.qa", "benchmarks.meta"},
    "benchmarks.research": {"benchmarks.research", "benchmarks.qa", "benchmarks.meta"},
    "benchmarks.meta": set(),
    # RESULTS.md from the records (benchmarks/results/*.json); writes them with benchmarks.meta
    "benchmarks.records": {"benchmarks.meta"},
    # the old command `python -m benchmarks.experiment` (CHANGELOG.md): an alias, nothing more
    "benchmarks.experiment": {"benchmarks.experiment", "benchmarks.research"},
}
# where a `tracerl` command may point: the libraries and the research runs (the demo), never a
# speed script (those are `python -m benchmarks.perf.NAME`)
COMMAND_TARGETS = ("envs", "retrieval", "harness", "benchmarks.qa", "benchmarks.research")
# third-party modules trace_alloc must never touch: it stays pure numpy
TRACE_ALLOC_FORBIDDEN = {"torch", "transformers", "httpx", "socket", "requests", "vllm", "ray"}


def _imported_modules(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            # `from benchmarks import qa` names a module too
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def _imported_roots(path: Path) -> set[str]:
    return {module.split(".")[0] for module in _imported_modules(path)}


def _room(module: str) -> str | None:
    """The room of a `benchmarks` module name (`benchmarks.qa.cli` -> `benchmarks.qa`)."""
    return next((r for r in ROOMS if module == r or module.startswith(r + ".")), None)


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


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_the_scripts_the_tests_or_the_examples(package: str) -> None:
    """They sit beside the packages, outside the install: an import of them works only in a
    checkout (and a test helper belongs in a fixture, not in the library)."""
    outside = {"scripts", "tests", "examples", "conftest"}
    violations = [
        f"{path.relative_to(ROOT)} imports {root}"
        for path in _modules(package)
        for root in _imported_roots(path) & outside
    ]
    assert not violations, "imports from outside the packages:\n" + "\n".join(violations)


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_benchmarks_room_imports_only_what_its_row_allows(room: str) -> None:
    folder = ROOT / room.replace(".", "/")
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    assert paths and all(p.is_file() for p in paths), f"{room} has no modules"
    violations = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in paths
        for module in _imported_modules(path)
        if (target := _room(module)) is not None and target not in ROOMS[room]
    ]
    assert not violations, "benchmarks room violations:\n" + "\n".join(violations)


def test_every_benchmarks_module_lives_in_a_room() -> None:
    loose = [
        str(path.relative_to(ROOT))
        for path in _modules("benchmarks")
        if path.name != "__init__.py"
        and _room(".".join(path.relative_to(ROOT).with_suffix("").parts)) is None
    ]
    assert not loose, f"modules outside benchmarks' rooms (see ROOMS): {loose}"


def test_every_command_resolves_to_a_function_where_the_table_allows() -> None:
    from harness.cli import COMMANDS

    problems = []
    for name, (target, _) in COMMANDS.items():
        module, function = target.split(":")
        if not any(module == t or module.startswith(t + ".") for t in COMMAND_TARGETS):
            problems.append(f"{name}: {module} is not under {COMMAND_TARGETS}")
            continue
        path = ROOT / (module.replace(".", "/") + ".py")
        if not path.is_file():
            problems.append(f"{name}: no module file {path.relative_to(ROOT)}")
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if function not in functions:
            problems.append(f"{name}: {module} defines no function {function}")
    assert not problems, "tracerl commands that do not resolve:\n" + "\n".join(problems)


def test_the_two_trainers_share_harness_modules_but_do_not_import_each_other() -> None:
    """harness.openrlhf builds on the harness; the harness (but the `tracerl` router) does not
    import it, and it does not import the CPU trainer: shared pieces live in harness.config,
    harness.metrics_log and harness.openrlhf_compat."""
    violations = []
    for path in _modules("harness"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules = _imported_modules(path)
        if name.startswith("harness.openrlhf."):
            violations += [f"{name} imports {m}" for m in modules if m == "harness.trainer"]
        elif name != "harness.cli":
            violations += [
                f"{name} imports {m}" for m in modules if m.startswith("harness.openrlhf.")
            ]
    assert not violations, "arrows between the trainers:\n" + "\n".join(violations)


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


def test_the_checker_sees_a_room_crossing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from benchmarks import research\nfrom benchmarks.perf.env_fork import Args\n")
    rooms = {_room(m) for m in _imported_modules(bad)} - {None}
    assert rooms == {"benchmarks.research", "benchmarks.perf"}
    assert not rooms <= ROOMS["benchmarks.qa"]


def _top_level_work(source: str) -> list[str]:
    """Top-level statements of a module that do something when it is imported.

    Allowed: imports, definitions, assignments to names, the docstring, and the `__main__` and
    `TYPE_CHECKING` blocks. A call at top level, or an assignment into something else
    (`os.environ["X"] = ...`), is work.
    """
    guards = {"__name__ == '__main__'", "TYPE_CHECKING"}
    work = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Import | ast.ImportFrom | ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        if isinstance(node, ast.ClassDef):
            continue
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) for t in node.targets):
            continue
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            continue
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            continue
        if isinstance(node, ast.If) and ast.unparse(node.test) in guards:
            continue
        if isinstance(node, ast.Assert):
            continue  # a check of the module's own tables (qa_datasets' FORMATS)
        work.append(f"{node.lineno}: {ast.unparse(node).splitlines()[0]}")
    return work


def test_importing_a_benchmark_module_runs_nothing() -> None:
    """The doctest run imports every module: a script's work waits for `__main__`."""
    work = [
        f"{path.relative_to(ROOT)}:{line}"
        for path in _modules("benchmarks")
        for line in _top_level_work(path.read_text(encoding="utf-8"))
    ]
    assert not work, "module-level work in benchmarks:\n" + "\n".join(work)


def test_the_side_effect_check_sees_module_level_work() -> None:
    source = (
        '"""doc"""\nimport os\nX: int = 1\nos.environ["A"] = "1"\nprint(X)\n'
        'if __name__ == "__main__":\n    print(2)\n'
    )
    assert _top_level_work(source) == ["4: os.environ['A'] = '1'", "5: print(X)"]


def _public_definitions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return {n.name for n in tree.body if isinstance(n, kinds) and not n.name.startswith("_")}


def test_no_public_name_is_defined_in_two_packages() -> None:
    """One name per concept (docs/style.md §2.2): `EvalConfig` means one thing everywhere.

    Inside one package a command function may share its implementation's name, and every
    benchmark script has its `Args`, `main` and `print_table`; `main` is every entry point's.
    """
    where: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in _modules(package):
            for name in _public_definitions(path):
                where.setdefault(name, set()).add(package)
    where.pop("main", None)  # a module's entry point (`tracerl`'s, each script's)
    reused = {name: sorted(p) for name, p in where.items() if len(p) > 1}
    assert not reused, f"names defined in more than one package: {reused}"
