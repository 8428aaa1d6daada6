"""The docs show the types a user writes or builds as the code has them.

A protocol documented as a Python block (`Predictor`, `Featurizer` in docs/trace_alloc.md) has
the code's parameters, names and kinds (keyword-only ones after `*`); every call of a
keyword-only value type in the docs' code blocks (`Turn`, `Prompt`, `Rollout`, `Hit`, ...) names
each argument, and names only fields the type has.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import trace_alloc
from retrieval import Hit
from trace_alloc import Prompt, Rollout, RolloutRequest, Turn

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PROTOCOLS = {"Predictor": trace_alloc.Predictor, "Featurizer": trace_alloc.base.Featurizer}
VALUE_TYPES = {"Turn": Turn, "Prompt": Prompt, "Rollout": Rollout, "Hit": Hit,
               "RolloutRequest": RolloutRequest}  # fmt: skip
_BLOCK = re.compile(r"```python\n(.*?)```", re.S)


def _python_blocks() -> list[tuple[str, str]]:
    return [
        (path.name, block)
        for path in DOCS
        for block in _BLOCK.findall(path.read_text(encoding="utf-8"))
    ]


def _signature(fn: ast.FunctionDef) -> list[tuple[str, str]]:
    args = fn.args
    return [(a.arg, "positional") for a in [*args.posonlyargs, *args.args]] + [
        (a.arg, "keyword") for a in args.kwonlyargs
    ]


def _code_signature(method: object) -> list[tuple[str, str]]:
    kinds = {inspect.Parameter.KEYWORD_ONLY: "keyword"}
    return [
        (p.name, kinds.get(p.kind, "positional"))
        for p in inspect.signature(method).parameters.values()  # type: ignore[arg-type]
    ]


def _documented_protocols() -> dict[str, ast.ClassDef]:
    found = {}
    for _, block in _python_blocks():
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name in PROTOCOLS:
                found[node.name] = node
    return found


def test_the_documented_protocols_are_found():
    assert set(_documented_protocols()) == set(PROTOCOLS)


@pytest.mark.parametrize("name", sorted(PROTOCOLS))
def test_a_documented_protocol_has_the_codes_signatures(name):
    documented = _documented_protocols()[name]
    protocol = PROTOCOLS[name]
    for fn in documented.body:
        if isinstance(fn, ast.FunctionDef):
            code = _code_signature(getattr(protocol, fn.name))
            assert _signature(fn) == code, f"docs' {name}.{fn.name} differs from the code's"


def _calls() -> list[tuple[str, str, ast.Call]]:
    """Every call of a `VALUE_TYPES` name in the docs' Python blocks that parse."""
    out = []
    for where, block in _python_blocks():
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            named = isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            if named and node.func.id in VALUE_TYPES:  # type: ignore[attr-defined]
                out.append((where, node.func.id, node))  # type: ignore[attr-defined]
    return out


def test_the_docs_build_the_value_types():
    assert {"Turn", "Prompt", "Rollout"} <= {name for _, name, _ in _calls()}


def test_documented_value_types_are_built_by_keyword_with_their_fields():
    for where, name, call in _calls():
        fields = {f.name for f in dataclasses.fields(VALUE_TYPES[name])}  # type: ignore[arg-type]
        assert not call.args, f"{where}: {name}(...) passes an argument by position"
        named = {k.arg for k in call.keywords}
        assert named <= fields, f"{where}: {name} has no field(s) {named - fields}"


def test_the_comment_form_of_a_hit_is_keyword_too():
    """A hit shown in a comment (`# [Hit(...)]`) names its fields like a call would.

    (docs/ only: README.md is the lead's to edit.)
    """
    for path in DOCS[1:]:
        for shown in re.findall(r"Hit\(([^)]*)\)", path.read_text(encoding="utf-8")):
            if shown and shown != "...":
                assert all("=" in part for part in shown.split(",")), f"{path.name}: Hit({shown})"


def test_the_extending_pages_member_tables_match_the_protocols():
    """docs/extending.md lists each protocol's methods as `name(args)`: the code's parameters."""
    from envs import Tool
    from harness.policies import PolicyBackend
    from harness.training import TaskSource

    owners = (trace_alloc.Allocator, TaskSource, PolicyBackend, Tool)
    text = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(\w+)\(([^)]*)\)[^`]*` \|", text, re.M)
    checked = set()
    for name, args in rows:
        owner = next((o for o in owners if name in vars(o)), None)
        assert owner is not None, f"docs/extending.md documents {name}(), which no protocol has"
        documented = [a.strip() for a in args.split(",") if a.strip() not in ("", "*")]
        code = [n for n, _ in _code_signature(getattr(owner, name)) if n != "self"]
        assert documented == code, f"docs/extending.md: {name}({args}) but the code has {code}"
        checked.add(name)
    assert {"ask", "train_indices", "corpus", "seed", "parse", "run"} <= checked
