"""No measured figure in a docstring or comment of the code (docs/style.md §2.3).

A figure measured on one machine on one day ("takes 0.3 s", "EM 0.54", "+0.22") ages: the code
moves on and the comment keeps saying it. Measured figures live in benchmarks/RESULTS.md, with
their command and date; a docstring or comment points there, to a section by its title.
Defaults, limits, formulas and the outputs of doctest examples are not measurements and pass.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_UNIT_TIME = r"(?:ms|us|µs|s|sec|seconds?|min|minutes?|h|hours?)"
_NUM = r"\d[\d.,]*(?:\s?-\s?\d[\d.,]*)?"
MEASURED = re.compile(
    "|".join(
        [
            # "takes 0.3 s", "took 26 of a 30 s cold start", "spends about 30 s", "measured at 0.85"
            rf"\b(?:took|takes|taking|spends?|spent|lasts?|lasted)\s+(?:about\s+|~\s?|roughly\s+|"
            rf"under\s+|over\s+|only\s+)?{_NUM}\s?(?:{_UNIT_TIME}|%|x|×|of\b)",
            rf"\bmeasured\s+(?:at|as)\s+~?{_NUM}",
            # "(~1 ms)", "about 0.05 s", "under 15 minutes": an approximate duration
            rf"(?:~\s?|\babout\s+|\broughly\s+|\bunder\s+){_NUM}\s?{_UNIT_TIME}\b",
            # "15-25 min on 2 cores", "0.48 us a candidate ... on one idle core"
            rf"{_NUM}\s?{_UNIT_TIME}\s+on\s+(?:\d+|one|two)\s+(?:idle\s+|busy\s+|loaded\s+)?cores?\b",
            # "(25.8 s for 128 KB)": a decimal duration in an aside
            rf"\(\s?\d+\.\d+\s?{_UNIT_TIME}\b",
            # "~50x cheaper", "2.0x faster"
            r"\b\d+(?:\.\d+)?\s?[x×]\s+(?:faster|slower|cheaper|costlier|more|fewer|less)\b",
            # "EM 0.54", "EM of .83", "differed by 0.11"
            r"\bEM\s+(?:of\s+|at\s+|was\s+|=\s*)?[+−-]?\d*\.\d+",
            r"\bdiffered\s+by\s+[+−-]?\d",
            # "+0.22", "−0.4": a signed gain (a hyphen-minus is too common to read as one)
            r"(?<![\w.(\[,=])[+−]\d+\.\d+\b",
        ]
    )
)
CODE_SPAN = re.compile(r"`[^`]*`")


def _library_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [ROOT / p for p in out if not p.startswith("tests/") and (ROOT / p).is_file()]


def _prose_lines(source: str) -> list[tuple[int, str]]:
    """(line number, text) of every comment and docstring line, doctest examples left out."""
    lines: list[tuple[int, str]] = []
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            lines.append((tok.start[0], tok.string))
    for node in ast.walk(ast.parse(source)):
        body = getattr(node, "body", None)
        for stmt in body if isinstance(body, list) else []:
            if not (
                isinstance(stmt, ast.Expr)
                and isinstance(stmt.value, ast.Constant)
                and isinstance(stmt.value.value, str)
            ):
                continue
            in_example = False
            for offset, text in enumerate(stmt.value.value.split("\n")):
                stripped = text.strip()
                if stripped.startswith(">>>"):
                    in_example = True
                elif not stripped:
                    in_example = False
                if not in_example:
                    lines.append((stmt.lineno + offset, text))
    return lines


def measured_figures(path: Path, source: str) -> list[str]:
    """Each comment or docstring line of `source` that quotes a measured figure."""
    rel = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    found = []
    for number, text in _prose_lines(source):
        m = MEASURED.search(CODE_SPAN.sub("``", text))
        if m:
            found.append(f"{rel}:{number}: {m.group(0)!r} in {text.strip()!r}")
    return found


def test_no_measured_figures_in_docstrings_or_comments() -> None:
    problems = []
    for path in _library_files():
        problems += measured_figures(path, path.read_text(encoding="utf-8"))
    assert not problems, (
        f"{len(problems)} measured figures in code prose; point to a section of "
        "benchmarks/RESULTS.md instead:\n" + "\n".join(problems)
    )


def test_the_check_sees_measured_figures_and_passes_defaults() -> None:
    measured = [
        "# building the index takes 0.3 s here",
        '"""The warm start reaches EM 0.54 on world 5000."""',
        "# the stream run gains +0.22 over the warm start",
        '"""Importing torch took 26 of a 30 s cold start."""',
        "# Text builds a per-character index (~1 ms)",
        '"""Rebuild from scratch (15-25 min on 2 cores)."""',
        '"""Search-R1\'s regex is quadratic (25.8 s for 128 KB)."""',
        '"""Sparse products are ~50x cheaper."""',
        '"""int8 agreement with fp32 measured at 0.85 on MiniLM."""',
        '"""Two seeds\' EM differed by 0.11 that way."""',
    ]
    for line in measured:
        assert measured_figures(ROOT / "x.py", line + "\n"), line
    defaults = [
        "retrieval_deadline_s: float = 10.0  # a hung server costs a step 10 s, not 120 s",
        '"""The most one step may spend on retrieval (default 10 s)."""',
        '"""Retries: 4 attempts x 30 s by default."""',
        '"""`0.412 [0.371, 0.455]` (or `+0.120 [...]` with `signed`)."""',
        '"""Mean and the lower end of its two-sided 95 % t interval, in EM points."""',
        '"""Stage 2 gain q^K (1 - q); clipped to [0.01, 0.99]."""',
        '"""A mean.\n\n    >>> mean([0.5, 1.0])\n    +0.75\n    """',
        "x = f(y)  # (B, T) log-probs, 1e-6 floor",
    ]
    for line in defaults:
        assert measured_figures(ROOT / "x.py", line + "\n") == [], line
