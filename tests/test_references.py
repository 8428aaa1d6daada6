"""Every reference in the repository resolves inside it (docs/style.md §2.3 and §4).

Code, docs and tests point at files (`docs/training.md`, `benchmarks/perf/env_fork.py`), at
sections of the design and style pages (`docs/design.md §3`) and at decisions, by title
(`docs/decisions.md, "One objective"`). A clone has nothing else, so each must exist here.
Decisions are cited by their exact title, never by number: numbers were assigned when branches
merged and drifted, and a title that was folded into another entry must fail, not half-match.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUFFIXES = {".py", ".md", ".toml", ".sh", ".cfg", ".ini", ".yaml", ".yml"}
NAMES = {"Makefile", "run"}  # .ci/run
TOP_DIRS = ("envs", "retrieval", "trace_alloc", "harness", "benchmarks", "tests", "docs", "scripts")
TOP_DIRS += ("examples", ".ci")
FILE_EXT = r"(?:md|py|toml|sh|json|jsonl|png|txt|cfg|yaml|yml|safetensors|csv)"
# a path into the repository: starts at a top-level folder, ends in a file name
REPO_PATH = re.compile(
    rf"(?<![\w/.$~-])((?:{'|'.join(re.escape(d) for d in TOP_DIRS)})/[\w./-]*?[\w-]\.{FILE_EXT})"
    r"(?![\w/*])"
)
# any Markdown file named in prose (`STYLE.md`, `research/peers.md`, `decisions.md`)
MD_NAME = re.compile(r"(?<![\w/.$~<-])((?:\.\./)*(?:[\w-]+/)*[\w-]+\.md)\b")
MD_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
SECTION = re.compile(r"\b(design|style)\.md §(\d+(?:\.\d+)?)")
DECISION_NUMBER = re.compile(r"\bD\d{1,2}\b")  # (ruff's D105 and the like have three digits)
DECISION_TITLE = re.compile(r'decisions\.md\)?,?\s+"([^"]+)"((?:,?\s+and\s+"[^"]+")*)')
MORE_TITLES = re.compile(r'"([^"]+)"')
# a section of the results page by (the start of) its heading, as `RESULTS.md, "Wiki scale"`
RESULTS_TITLE = re.compile(r'RESULTS\.md\)?,?\s+"([^"]+)"((?:,?\s+and\s+"[^"]+")*)')
DECISION_HEADING = re.compile(r"^## (.+)$", re.M)
# files a run writes (`runs/x/report.md`, `OUT/report.md`, `compare.md`, `experiment-NAME.md`):
# not references
OUTPUT = re.compile(r"^(?:runs/|OUT/|run_dir/)|^(?:report|compare)\.md$|NAME")
# what no file may cite: pages that live outside the repository
FOREIGN = re.compile(r"\bDESIGN(?:\.md)? ?§|\.\./shared\b")


def _git_files(*patterns: str) -> list[str]:
    """The repository's files (tracked, or new and not ignored), as paths relative to ROOT."""
    return subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", *patterns],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()


def _tracked_files() -> list[Path]:
    paths = [ROOT / p for p in _git_files()]
    return [
        p
        for p in paths
        if p.is_file()
        and (p.suffix in SUFFIXES or p.name in NAMES)
        and "benchmarks/results" not in p.as_posix()  # run outputs record what ran, verbatim
        and p != Path(__file__).resolve()  # its own examples of bad references
    ]


def _sections(page: Path) -> set[str]:
    """Section numbers of a page: `## 2. ...` gives "2", `### 2.1 ...` gives "2.1"."""
    text = page.read_text(encoding="utf-8")
    return set(re.findall(r"^#{2,3} (\d+(?:\.\d+)?)\.? ", text, flags=re.M))


def results_sections(results_md: str) -> list[str]:
    """The text of every heading of benchmarks/RESULTS.md, `#` marks stripped."""
    return [h.strip() for h in re.findall(r"^#{1,4} (.+)$", results_md, flags=re.M)]


def decision_titles(decisions_md: str) -> list[str]:
    """The title of each entry: every `## Title` heading, in order."""
    return [title.strip() for title in DECISION_HEADING.findall(decisions_md)]


def _flat(text: str) -> str:
    """One line of prose: comment markers and line breaks inside a citation removed."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def reference_problems(
    path: Path,
    text: str,
    *,
    root: Path,
    titles: list[str],
    sections: dict[str, set[str]],
    results: list[str],
    md_names: set[str],
) -> list[str]:
    """Every unresolvable reference in one file's text, as `file:line: what`.

    `md_names` are the names of the repository's Markdown files (a bare `decisions.md` in prose
    resolves against them).
    """
    rel = path.relative_to(root).as_posix()
    problems: list[str] = []

    def where(offset: int) -> str:
        return f"{rel}:{text.count(chr(10), 0, offset) + 1}"

    for m in FOREIGN.finditer(text):
        problems.append(f"{where(m.start())}: {m.group(0)!r} names a page outside the repository")
    for m in REPO_PATH.finditer(text):
        if not (root / m.group(1)).exists() and not (path.parent / m.group(1)).exists():
            problems.append(f"{where(m.start())}: no file {m.group(1)}")
    for m in MD_NAME.finditer(text):
        name = m.group(1)
        if OUTPUT.search(name):
            continue
        if name.startswith("../") or "/" in name:
            ok = (path.parent / name).exists() or (root / name).exists()
        else:
            ok = name in md_names
        if not ok:
            problems.append(f"{where(m.start())}: no Markdown file {name} in the repository")
    if path.suffix == ".md":
        for m in MD_LINK.finditer(text):
            target = m.group(1)
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (path.parent / target).exists():
                problems.append(f"{where(m.start())}: link to missing {target}")
    for m in SECTION.finditer(text):
        page, number = m.groups()
        if number not in sections[page]:
            problems.append(f"{where(m.start())}: docs/{page}.md has no section §{number}")
    for m in DECISION_NUMBER.finditer(text):
        problems.append(
            f"{where(m.start())}: decision cited by number ({m.group(0)}); cite its title: "
            f'docs/decisions.md, "<title>"'
        )
    for m in DECISION_TITLE.finditer(text):
        cited = [m.group(1), *MORE_TITLES.findall(m.group(2) or "")]
        for title in cited:
            title = _flat(title)
            if title not in titles:
                problems.append(f"{where(m.start())}: no decision titled {title!r}")
    for m in RESULTS_TITLE.finditer(text):
        for title in [m.group(1), *MORE_TITLES.findall(m.group(2) or "")]:
            title = _flat(title)
            if not any(heading.startswith(title) for heading in results):
                problems.append(f"{where(m.start())}: no section of RESULTS.md titled {title!r}")
    return problems


@pytest.fixture(scope="module")
def context() -> dict:
    decisions = (ROOT / "docs" / "decisions.md").read_text(encoding="utf-8")
    return {
        "root": ROOT,
        "titles": decision_titles(decisions),
        "results": results_sections(
            (ROOT / "benchmarks" / "RESULTS.md").read_text(encoding="utf-8")
        ),
        "sections": {
            "design": _sections(ROOT / "docs" / "design.md"),
            "style": _sections(ROOT / "docs" / "style.md"),
        },
        # once, from git: walking the tree for every file (the venv included) took minutes
        "md_names": {Path(p).name for p in _git_files("*.md")},
    }


def test_every_reference_resolves_inside_the_repository(context: dict) -> None:
    problems = []
    for path in _tracked_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        problems += reference_problems(path, text, **context)
    assert not problems, f"{len(problems)} unresolvable references:\n" + "\n".join(problems)


def test_decision_headings_have_unique_titles(context: dict) -> None:
    titles = context["titles"]
    assert len(titles) == len(set(titles)), titles
    assert "Root solver" in titles and "Stage 2" in titles, titles  # the headings are read


# --- the checker itself can fail -----------------------------------------------------------


def _check(tmp_path: Path, text: str, context: dict, name: str = "docs/x.md") -> list[str]:
    path = ROOT / name  # resolved against the real repository, written nowhere
    return reference_problems(path, text, **context)


def test_the_checker_sees_a_missing_file(tmp_path: Path, context: dict) -> None:
    assert _check(tmp_path, "see docs/training.md and harness/training/trainer.py", context) == []
    problems = _check(tmp_path, "see docs/nothing_here.md and harness/gone.py", context)
    assert any("nothing_here.md" in p for p in problems)
    assert any("harness/gone.py" in p for p in problems)


def test_the_checker_sees_pages_outside_the_repository(tmp_path: Path, context: dict) -> None:
    text = "as DESIGN §3 says; STYLE.md §2; research/peers.md §1; ../shared/data/x.jsonl"
    problems = _check(tmp_path, text, context)
    assert any("DESIGN §" in p for p in problems)
    assert any("STYLE.md" in p for p in problems)
    assert any("research/peers.md" in p for p in problems)
    assert any("../shared" in p for p in problems)


def test_the_checker_sees_a_missing_section(tmp_path: Path, context: dict) -> None:
    assert _check(tmp_path, "the fork law (docs/design.md §3)", context) == []
    problems = _check(tmp_path, "docs/design.md §9 and docs/style.md §9.9", context)
    assert len(problems) == 2


def test_the_checker_sees_decisions_cited_by_number_or_wrong_title(
    tmp_path: Path, context: dict
) -> None:
    good = 'docs/decisions.md, "One objective"; decisions.md "Root solver" and "Stage 2"'
    assert _check(tmp_path, good, context) == []
    assert _check(tmp_path, "as decided (docs/decisions.md D13)", context)
    problems = _check(tmp_path, 'docs/decisions.md, "The predictor forgets"', context)
    assert problems == [
        "docs/x.md:1: no decision titled 'The predictor forgets'",
    ]
    # a title broken over two comment lines is read as one
    wrapped = 'x  # docs/decisions.md, "Per-question\n    # memory"'
    assert _check(tmp_path, wrapped, context, name="harness/x.py") == []


def test_the_checker_fails_on_a_stale_or_partial_title(tmp_path: Path, context: dict) -> None:
    # titles of entries that were folded into topics, and a prefix of a live title
    stale = [
        "Budget density and Stage 2's placement",
        "Stage 2's flip prediction",
        "The predictor remembers each question",
        "Stage",
    ]
    for title in stale:
        text = f'x (docs/decisions.md, "{title}")'
        assert _check(tmp_path, text, context) == [f"docs/x.md:1: no decision titled {title!r}"]
    chained = 'decisions.md, "Root solver" and "Prefix solver"'
    assert _check(tmp_path, chained, context) == ["docs/x.md:1: no decision titled 'Prefix solver'"]


def test_the_checker_sees_a_missing_results_section(tmp_path: Path, context: dict) -> None:
    good = 'benchmarks/RESULTS.md, "Predictor design" and "Allocation"'
    assert _check(tmp_path, good, context) == []
    problems = _check(tmp_path, 'x (benchmarks/RESULTS.md, "Issue 19: the old run")', context)
    assert problems == ["docs/x.md:1: no section of RESULTS.md titled 'Issue 19: the old run'"]
