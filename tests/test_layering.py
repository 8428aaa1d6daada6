"""The floors, the rooms and the front door: who may import (or name) whom.

Floors (packages), bottom up: `trace_alloc` and `retrieval`, `envs`, `harness`, `benchmarks`.
Nothing names a higher floor: no import, and no `"module:function"` or `"package.module"`
string (the form a command table or a lazy loader resolves). Inside `harness`, rooms with faces
(`harness/<room>/__init__.py`) follow the same rule (`HARNESS_ROOMS`); `benchmarks` uses them
only through their faces. The front door (`benchmarks.cli`, `benchmarks.demo`) sits on top:
nothing imports it. Why: docs/decisions.md, "Rooms and layering"; the table: docs/style.md §2.1.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("envs", "retrieval", "trace_alloc", "harness", "benchmarks")

# package -> trace-rl packages it may import (or name in a module-path string)
ALLOWED: dict[str, set[str]] = {
    "trace_alloc": set(),
    "retrieval": set(),
    "envs": {"retrieval"},
    "harness": {"envs", "retrieval", "trace_alloc"},
    "benchmarks": {"envs", "retrieval", "trace_alloc", "harness"},
}
# harness's rooms -> the rooms each may import; every room may import the shared modules
HARNESS_ROOMS: dict[str, set[str]] = {
    "harness.policies": set(),
    "harness.rollout": {"harness.policies"},
    "harness.tiny_policy": {"harness.policies", "harness.rollout"},
    "harness.training": {"harness.policies", "harness.rollout", "harness.tiny_policy"},
    "harness.openrlhf": {"harness.policies", "harness.rollout", "harness.training"},
    "harness.evaluation": {
        "harness.policies",
        "harness.rollout",
        "harness.tiny_policy",
        "harness.training",
    },
}
HARNESS_SHARED = {"harness.errors", "harness.lazy", "harness.plugins"}
# benchmarks' rooms -> the rooms (and shared top-level modules) each may import
ROOMS: dict[str, set[str]] = {
    "benchmarks.perf": {"benchmarks.perf", "benchmarks.meta"},
    "benchmarks.research": {"benchmarks.research", "benchmarks.meta"},
    "benchmarks.meta": set(),
    # RESULTS.md from the records (benchmarks/results/*.json); writes them with benchmarks.meta
    "benchmarks.records": {"benchmarks.meta"},
    # the old command `python -m benchmarks.experiment` (CHANGELOG.md): an alias, nothing more
    "benchmarks.experiment": {"benchmarks.experiment", "benchmarks.research"},
    # the front door: the `tracerl` table and the main job's command
    "benchmarks.cli": set(),
    "benchmarks.demo": set(),
}
FRONT_DOOR = ("benchmarks.cli", "benchmarks.demo")
# the one module that imports the front door: it runs every command's bad input through
# `main` in process, as the console script does (a subprocess per case would cost a Python
# start each); it measures the door, and nothing imports it but the reliability benchmark
FRONT_DOOR_CALLERS = {"benchmarks.perf.bad_inputs"}
# third-party modules trace_alloc must never touch: it stays pure numpy
TRACE_ALLOC_FORBIDDEN = {"torch", "transformers", "httpx", "socket", "requests", "vllm", "ray"}
# a string that is a module path: `harness.training.cli:train`, `benchmarks.qa.qa_datasets`
_MODULE_PATH = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+(:[A-Za-z_][A-Za-z0-9_]*)?")


def _imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function (lazy imports count)."""
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


def _named_modules(path: Path) -> set[str]:
    """The modules that `path`'s module-path strings name (`"a.b:f"` -> `a.b`)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {
        node.value.split(":")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _MODULE_PATH.fullmatch(node.value)
    }


def _imported_roots(path: Path) -> set[str]:
    return {module.split(".")[0] for module in _imported_modules(path)}


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _room(module: str, rooms: dict[str, set[str]] | tuple[str, ...] = tuple(ROOMS)) -> str | None:
    """The room of a module name (`benchmarks.perf.env_fork` -> `benchmarks.perf`)."""
    return next((r for r in rooms if module == r or module.startswith(r + ".")), None)


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
def test_no_string_names_a_higher_floor(package: str) -> None:
    """A `"module:function"` string resolved at run time is an arrow too: it may not point up."""
    violations = [
        f"{path.relative_to(ROOT)} names {module}"
        for path in _modules(package)
        for module in _named_modules(path)
        if (root := module.split(".")[0]) in PACKAGES
        and root != package
        and root not in ALLOWED[package]
    ]
    assert not violations, "strings that point up a floor:\n" + "\n".join(violations)


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


@pytest.mark.parametrize("room", sorted(HARNESS_ROOMS))
def test_each_harness_room_imports_only_what_its_row_allows(room: str) -> None:
    """Imports and module-path strings both: a room never reaches up to a room above it."""
    paths = sorted((ROOT / room.replace(".", "/")).rglob("*.py"))
    assert paths, f"{room} has no modules"
    violations = [
        f"{path.relative_to(ROOT)} -> {module}"
        for path in paths
        for module in _imported_modules(path) | _named_modules(path)
        if _room(module, HARNESS_ROOMS) not in (None, room, *HARNESS_ROOMS[room])
    ]
    assert not violations, "harness room violations:\n" + "\n".join(violations)


def test_harness_rooms_form_no_cycle() -> None:
    order: list[str] = []
    while len(order) < len(HARNESS_ROOMS):
        ready = [r for r, below in HARNESS_ROOMS.items() if r not in order and below <= set(order)]
        assert ready, f"a cycle among {sorted(set(HARNESS_ROOMS) - set(order))}"
        order += sorted(ready)


def test_every_harness_module_lives_in_a_room() -> None:
    loose = [
        name
        for path in _modules("harness")
        if (name := _module_name(path)) not in {"harness", *HARNESS_SHARED}
        and _room(name, HARNESS_ROOMS) is None
    ]
    assert not loose, f"modules outside harness's rooms (see HARNESS_ROOMS): {loose}"


# the library packages below harness have faces too (their `__init__.py`); the rest of each
# package is importable from its own modules (`trace_alloc.solvers`, `envs.protocol`, ...)
LIBRARY_FACES = ("envs", "retrieval", "trace_alloc")


def test_each_face_is_small() -> None:
    """A face is what a newcomer reads first: about 30 names at most (harness's rooms and the
    library packages)."""
    sizes = {}
    for room in (*HARNESS_ROOMS, *LIBRARY_FACES):
        tree = ast.parse((ROOT / room.replace(".", "/") / "__init__.py").read_text())
        names = [
            ast.literal_eval(node.value)
            for node in tree.body
            if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        ]
        sizes[room] = len(names[0]) if names else None
    too_big = {face: n for face, n in sizes.items() if n is None or not 0 < n <= 32}
    assert not too_big, f"faces without `__all__` or over 32 names: {too_big}"


def test_benchmarks_imports_harness_only_through_room_faces() -> None:
    """`from harness.training import train`, never `from harness.training.trainer import ...`
    (the front door's command strings may name a room's `cli` module: imported only when run)."""
    violations = [
        f"{path.relative_to(ROOT)} imports from {module}"
        for path in _modules("benchmarks")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom | ast.Import)
        for module in (
            [node.module] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
        )
        if module
        and module.startswith("harness.")
        and module not in HARNESS_SHARED
        and module not in HARNESS_ROOMS
    ]
    assert not violations, "benchmarks reaches into harness modules:\n" + "\n".join(violations)


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_benchmarks_room_imports_only_what_its_row_allows(room: str) -> None:
    folder = ROOT / room.replace(".", "/")
    paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
    assert paths and all(p.is_file() for p in paths), f"{room} has no modules"
    violations = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in paths
        for module in _imported_modules(path)
        if (target := _room(module)) is not None
        and target not in ROOMS[room]
        and target != room
        and not (target in FRONT_DOOR and _module_name(path) in FRONT_DOOR_CALLERS)
    ]
    assert not violations, "benchmarks room violations:\n" + "\n".join(violations)


def test_nothing_imports_the_front_door() -> None:
    """The front door imports the rooms below it; no library module, script or example imports
    it back (the console script names `benchmarks.cli:main` in pyproject.toml)."""
    paths = [p for package in (*PACKAGES, "scripts", "examples") for p in _modules(package)]
    violations = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in paths
        if _module_name(path) not in FRONT_DOOR_CALLERS
        and _room(_module_name(path), FRONT_DOOR) is None
        for module in _imported_modules(path)
        if _room(module, FRONT_DOOR) is not None
    ]
    assert not violations, "imports of the front door:\n" + "\n".join(violations)
    scripts = (ROOT / "pyproject.toml").read_text()
    assert 'tracerl = "benchmarks.cli:main"' in scripts


def test_every_benchmarks_module_lives_in_a_room() -> None:
    loose = [
        str(path.relative_to(ROOT))
        for path in _modules("benchmarks")
        if path.name != "__init__.py" and _room(_module_name(path)) is None
    ]
    assert not loose, f"modules outside benchmarks' rooms (see ROOMS): {loose}"


def test_every_command_resolves_down_a_floor_or_into_the_front_door() -> None:
    from benchmarks.cli import COMMANDS, TRAINERS

    targets = {name: target for name, (target, _) in COMMANDS.items()}
    targets |= {f"train --backend {name}": target for name, target in TRAINERS.items()}
    problems = []
    for name, target in targets.items():
        module, function = target.split(":")
        below = module.split(".")[0] in ALLOWED["benchmarks"]
        if not (below or _room(module, FRONT_DOOR) is not None):
            problems.append(f"{name}: {module} is neither below benchmarks nor the front door")
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


def test_the_two_trainers_do_not_import_each_other() -> None:
    """harness.openrlhf builds on the training room; nothing else in the harness imports it
    (`tracerl train --backend` picks a trainer in the front door), and it does not import the
    CPU trainer: shared pieces live in harness.training's config, metrics_log, run_guard and
    openrlhf_compat."""
    violations = []
    for path in _modules("harness"):
        name = _module_name(path)
        modules = _imported_modules(path) | _named_modules(path)
        if name.startswith("harness.openrlhf"):
            violations += [f"{name} -> {m}" for m in modules if m == "harness.training.trainer"]
        else:
            violations += [f"{name} -> {m}" for m in modules if _room(m, ("harness.openrlhf",))]
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


def test_the_checker_sees_a_module_path_string(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text(
        '"""Docs name benchmarks.perf in prose; that is no arrow."""\n'
        'LOADER = "benchmarks.qa.qa_datasets:load_file"\n'
        'TABLE = {"x": ("harness.cli:main", "a command")}\n'
        'TEXT = "a sentence. with dots"\n'
    )
    assert _named_modules(bad) == {"benchmarks.qa.qa_datasets", "harness.cli"}


def test_the_checker_sees_a_room_crossing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from benchmarks import research\nfrom benchmarks.perf.env_fork import Args\n")
    rooms = {_room(m) for m in _imported_modules(bad)} - {None}
    assert rooms == {"benchmarks.research", "benchmarks.perf"}
    assert not rooms <= ROOMS["benchmarks.meta"]
    lazy = tmp_path / "lazy.py"
    lazy.write_text("def f():\n    from harness.evaluation import run_bench\n")
    assert _room("harness.evaluation", HARNESS_ROOMS) == "harness.evaluation"
    assert "harness.evaluation" not in HARNESS_ROOMS["harness.training"]
    assert "harness.evaluation" in _imported_modules(lazy)


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
