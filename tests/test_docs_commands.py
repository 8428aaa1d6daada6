"""Every documented command runs as written: each `tracerl ...` and `make ...` line in a code block
of README.md and docs/*.md parses (flags and values), in process, and the test runner starts
both ways (`pytest` and `python -m pytest`)."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tyro
import tyro.extras

from benchmarks.cli import resolve

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = {
    # the documented stand-ins, and what a reader puts there
    "$DEV_SAMPLES": "/data/dev",
    "$D": "/data/dev",
    "POLICY": "harness/tiny_policy/warm_start",
    "MODEL": "harness/tiny_policy/warm_start",
    "DIR": "runs/dir",
}
_COMMAND = re.compile(r"^(?:[A-Z_]+=\S+\s+)*(?:\.venv/bin/)?(tracerl|make)(?=\s|$)\s*(.*)$")


@dataclass(frozen=True)
class Documented:
    where: str
    tool: str
    args: list[str]

    def __str__(self) -> str:
        return f"{self.where}: {self.tool} {shlex.join(self.args)}"


def documented_commands() -> list[Documented]:
    """Every `tracerl`/`make` line in a fenced code block (continuations joined, comments cut).

    A usage synopsis (`[flags]`) is not a command and is left out.
    """
    found = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").splitlines()
        in_block, i = False, 0
        while i < len(lines):
            line = lines[i].strip()
            if line.startswith("```"):
                in_block = not in_block
            elif in_block:
                start = i
                while line.endswith("\\") and i + 1 < len(lines):
                    i += 1
                    line = line[:-1] + " " + lines[i].strip()
                match = _COMMAND.match(line)
                if match and "[" not in match.group(2):
                    text = match.group(2)
                    for name, value in PLACEHOLDERS.items():
                        text = re.sub(rf"{re.escape(name)}\b", value, text)
                    args = shlex.split(text, comments=True)
                    where = f"{path.relative_to(ROOT)}:{start + 1}"
                    found.append(Documented(where, match.group(1), args))
            i += 1
    return found


class _Parsed(Exception):
    """Raised once the command's flags are parsed: nothing else runs."""


def _parse_only(monkeypatch: pytest.MonkeyPatch) -> None:
    real_cli, real_sub = tyro.cli, tyro.extras.subcommand_cli_from_dict

    def cli(*args: Any, **kwargs: Any) -> Any:
        real_cli(*args, **kwargs)
        raise _Parsed

    def sub(*args: Any, **kwargs: Any) -> Any:
        real_sub(*args, **kwargs)
        raise _Parsed

    monkeypatch.setattr(tyro, "cli", cli)
    monkeypatch.setattr(tyro.extras, "subcommand_cli_from_dict", sub)


COMMANDS = documented_commands()


def test_the_docs_document_commands():
    assert len(COMMANDS) >= 60, len(COMMANDS)
    assert {c.args[0] for c in COMMANDS if c.tool == "tracerl"} >= {"bench", "train", "index"}


@pytest.mark.parametrize("command", [c for c in COMMANDS if c.tool == "tracerl"], ids=str)
def test_every_documented_tracerl_command_parses(command, monkeypatch, capsys):
    _parse_only(monkeypatch)
    name, rest = command.args[0], command.args[1:]
    with pytest.raises((_Parsed, SystemExit)) as outcome:
        resolve(name)(rest)
    if outcome.type is SystemExit:
        pytest.fail(f"{command} does not parse: {capsys.readouterr().err[-1500:]}")


def test_every_documented_make_target_exists():
    targets = {c.args[0] for c in COMMANDS if c.tool == "make" and c.args}
    assert targets, "no make command documented"
    known = set(re.findall(r"^([a-z][\w-]*):", (ROOT / "Makefile").read_text(), re.MULTILINE))
    assert targets <= known, targets - known


def test_pytest_starts_as_the_console_script_too():
    # `pytest` does not put the repository root on sys.path: without the config's `pythonpath`,
    # tests/envs/ is imported as a namespace package `envs` and shadows the real one
    script = Path(sys.executable).with_name("pytest")
    if not script.is_file():
        pytest.skip(f"no pytest console script beside {sys.executable}")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    test = "tests/envs/test_snapshot_world.py"
    proc = subprocess.run(
        [str(script), "--collect-only", "-q", "-p", "no:cacheprovider", test],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
