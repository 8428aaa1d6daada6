"""The shape of the house: import arrows, faces, the largest functions and files, the suite.

    python scripts/house_stats.py [ROOT] [--json] [--time-tests]

ROOT (default: this repository) may be any checkout, so two commits compare side by side
(`git archive COMMIT | tar -x -C /tmp/old && python scripts/house_stats.py /tmp/old`). An arrow
"back up" is an import the layering table of docs/style.md §2.1 does not allow, or one between
the two trainers (`harness.openrlhf.*` importing `harness.training.trainer`, or the harness
importing `harness.openrlhf.*` anywhere but the `tracerl` router).

An arrow "up a floor" (the floors: trace_alloc and retrieval, then envs, then harness, then
benchmarks) is an import, or a module-path string such as `"harness.evaluation.bench:bench"`, in a
package that names a package on a higher floor. A package's face is the `__all__` of its
`__init__.py` (and of each sub-package's). The suite's size is pytest's collected count;
`--time-tests` also runs `make test` in ROOT and times it (minutes: opt-in).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

PACKAGES = ("envs", "retrieval", "trace_alloc", "harness", "benchmarks")
ALLOWED = {
    "trace_alloc": set(),
    "retrieval": set(),
    "envs": {"retrieval"},
    "harness": {"envs", "retrieval", "trace_alloc"},
    "benchmarks": {"envs", "retrieval", "trace_alloc", "harness"},
}
FLOOR = {"trace_alloc": 0, "retrieval": 0, "envs": 1, "harness": 2, "benchmarks": 3}
LIBRARY = ("envs", "retrieval", "trace_alloc", "harness")
# a whole string that names a module of ours, optionally with `:attribute`
MODULE_PATH = re.compile(r"(envs|retrieval|trace_alloc|harness|benchmarks)(\.\w+)+(:\w+)?")


def _module(root: Path, path: Path) -> str:
    return ".".join(path.relative_to(root).with_suffix("").parts)


def _imports(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _module_strings(tree: ast.Module) -> list[str]:
    """String literals that are a whole module path (`"harness.evaluation.bench:bench"`)."""
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and MODULE_PATH.fullmatch(node.value)]  # fmt: skip


def _up_a_floor(package: str, target: str) -> bool:
    top = target.split(".")[0]
    return top in FLOOR and FLOOR[top] > FLOOR[package]


def _all_size(tree: ast.Module) -> int | None:
    """The number of names in a module's literal `__all__` (None when it has none)."""
    size: int | None = None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign | ast.AugAssign):
            targets, value = [node.target], node.value
        else:
            continue
        if not any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            continue
        names = len(value.elts) if isinstance(value, ast.List | ast.Tuple) else 0
        size = (size or 0) + names if isinstance(node, ast.AugAssign) else names
    return size


def faces(root: Path) -> dict[str, int]:
    """Public names of each package's face: the `__all__` of every `__init__.py` (0: none)."""
    out: dict[str, int] = {}
    for package in PACKAGES:
        for init in sorted((root / package).rglob("__init__.py")):
            name = _module(root, init.parent / "x.py").removesuffix(".x")
            out[name] = _all_size(ast.parse(init.read_text(encoding="utf-8"))) or 0
    return out


def count_tests(root: Path) -> int | None:
    """Tests pytest collects in ROOT with its own configuration (None if collection fails)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        capture_output=True, text=True, cwd=root, check=False,
    )  # fmt: skip
    found = re.search(r"(\d+) tests? collected", done.stdout)
    return int(found.group(1)) if found and done.returncode == 0 else None


def time_tests(root: Path) -> float | None:
    """Wall seconds of `make test` in ROOT (None if it fails: a failing suite has no time)."""
    start = time.perf_counter()
    done = subprocess.run(["make", "-C", str(root), "test"], check=False)
    return round(time.perf_counter() - start, 1) if done.returncode == 0 else None


def _lines(path: Path) -> int | None:
    return len(path.read_text(encoding="utf-8").splitlines()) if path.is_file() else None


def stats(root: Path) -> dict[str, object]:
    """Import edges between packages, arrows back up, function sizes and lines per package."""
    edges: Counter[tuple[str, str]] = Counter()
    back_up: list[str] = []
    functions: list[tuple[int, str]] = []
    files: list[tuple[int, str]] = []
    up_imports: list[str] = []
    up_strings: list[str] = []
    lines: dict[str, int] = {}
    for package in PACKAGES:
        lines[package] = 0
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines[package] += len(text.splitlines())
            files.append((len(text.splitlines()), str(path.relative_to(root))))
            tree = ast.parse(text)
            name = _module(root, path)
            up_strings += [
                f"{name} -> {s}" for s in _module_strings(tree) if _up_a_floor(package, s)
            ]
            up_imports += [f"{name} -> {t}" for t in _imports(tree) if _up_a_floor(package, t)]
            for target in _imports(tree):
                top = target.split(".")[0]
                if top in PACKAGES and top != package:
                    edges[(package, top)] += 1
                    if top not in ALLOWED[package]:
                        back_up.append(f"{name} -> {target}")
                trainers = (
                    name.startswith("harness.openrlhf.") and target == "harness.training.trainer"
                )
                router = name == "benchmarks.cli"
                into_openrlhf = target.startswith("harness.openrlhf.")
                inside = name.startswith("harness.") and not name.startswith("harness.openrlhf.")
                if trainers or (into_openrlhf and inside and not router):
                    back_up.append(f"{name} -> {target}")
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    size = (node.end_lineno or node.lineno) - node.lineno + 1
                    functions.append((size, f"{name}.{node.name}"))
    functions.sort(reverse=True)
    library_functions = [(n, f) for n, f in functions if f.split(".")[0] in LIBRARY]
    library_files = sorted((f for f in files if f[1].split("/")[0] in LIBRARY), reverse=True)
    return {
        "edges": {f"{a} -> {b}": n for (a, b), n in sorted(edges.items())},
        "arrows_back_up": sorted(set(back_up)),
        "largest_functions": [{"lines": n, "function": f} for n, f in functions[:10]],
        "functions_over_150_lines": sum(n > 150 for n, _ in functions),
        "train_lines": next(
            (n for n, f in functions if f == "harness.training.trainer.train"), None
        ),
        "lines_per_package": lines,
        "arrows_up_a_floor": {"imports": sorted(up_imports), "strings": sorted(up_strings)},
        "arrows_up_a_floor_count": len(up_imports) + len(up_strings),
        "public_names_per_face": faces(root),
        "largest_library_function": {
            "lines": library_functions[0][0],
            "function": library_functions[0][1],
        },
        "largest_library_file": {"lines": library_files[0][0], "file": library_files[0][1]},
        "results_md_lines": _lines(root / "benchmarks" / "RESULTS.md"),
        "decisions_md_lines": _lines(root / "docs" / "decisions.md"),
        "tests_collected": count_tests(root),
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a not in ("--json", "--time-tests")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    result = stats(root)
    result["make_test_seconds"] = time_tests(root) if "--time-tests" in sys.argv else None
    for key, value in result.items():
        print(f"{key}: {json.dumps(value, indent=1)}")
    if "--json" in sys.argv:
        print(json.dumps(result, sort_keys=True))
