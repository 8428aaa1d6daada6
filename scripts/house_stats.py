"""The shape of the house: import arrows, the largest functions, lines per package.

    python scripts/house_stats.py [ROOT] [--json]

ROOT (default: this repository) may be any checkout, so two commits compare side by side
(`git archive COMMIT | tar -x -C /tmp/old && python scripts/house_stats.py /tmp/old`). An arrow
"back up" is an import the layering table of docs/style.md §2.1 does not allow, or one between
the two trainers (`harness.openrlhf.*` importing `harness.training.trainer`, or the harness
importing `harness.openrlhf.*` anywhere but the `tracerl` router).
"""

from __future__ import annotations

import ast
import json
import sys
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


def stats(root: Path) -> dict[str, object]:
    """Import edges between packages, arrows back up, function sizes and lines per package."""
    edges: Counter[tuple[str, str]] = Counter()
    back_up: list[str] = []
    functions: list[tuple[int, str]] = []
    lines: dict[str, int] = {}
    for package in PACKAGES:
        lines[package] = 0
        for path in sorted((root / package).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines[package] += len(text.splitlines())
            tree = ast.parse(text)
            name = _module(root, path)
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
    return {
        "edges": {f"{a} -> {b}": n for (a, b), n in sorted(edges.items())},
        "arrows_back_up": sorted(set(back_up)),
        "largest_functions": [{"lines": n, "function": f} for n, f in functions[:10]],
        "functions_over_150_lines": sum(n > 150 for n, _ in functions),
        "train_lines": next(
            (n for n, f in functions if f == "harness.training.trainer.train"), None
        ),
        "lines_per_package": lines,
    }


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--json"]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1]
    result = stats(root)
    for key, value in result.items():
        print(f"{key}: {json.dumps(value, indent=1)}")
    if "--json" in sys.argv:
        print(json.dumps(result, sort_keys=True))
