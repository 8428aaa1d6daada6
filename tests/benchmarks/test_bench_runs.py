"""`tracerl bench` as Search-R1 / FlashRAG users run it (issue 14): the search-r1 protocol,
FlashRAG folder names, per-dataset limits, resumable and partial runs, honest report rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.cli import bench

QUESTIONS = {
    "nq": [
        ("nq-0", "who founded acme ltd", ["Ann Vole"]),
        ("nq-1", "where is acme ltd based", ["Zürich"]),
        ("nq-2", "what does bob build", ["houses"]),
    ],
    "bamboogle": [
        ("bb-0", "who built the house of the founder of acme", ["Bob"]),
        ("bb-1", "in which city was the founder of acme born", ["Bern"]),
    ],
}
CORPUS = [
    {"id": "0", "contents": '"Acme Ltd"\nAcme Ltd was founded by Ann Vole in Zürich.'},
    {"id": "1", "contents": '"Ann Vole"\nAnn Vole was born in Bern. Bob built her house.'},
    {"id": "2", "contents": '"Bob"\nBob builds houses.'},
]


@pytest.fixture
def flashrag(tmp_path: Path) -> Path:
    """A FlashRAG_datasets-style folder (`<name>/test.jsonl`) and a wiki-18-style corpus."""
    for name, rows in QUESTIONS.items():
        folder = tmp_path / "flashrag" / name
        folder.mkdir(parents=True)
        lines = [
            json.dumps({"id": i, "question": q, "golden_answers": a}) + "\n" for i, q, a in rows
        ]
        (folder / "test.jsonl").write_text("".join(lines), encoding="utf-8")
    (tmp_path / "wiki18.jsonl").write_text(
        "".join(json.dumps(line) + "\n" for line in CORPUS), encoding="utf-8"
    )
    return tmp_path


def _trajectories(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]


def test_protocol_search_r1_shows_search_r1_text_and_takes_its_turn_count(flashrag: Path) -> None:
    out = flashrag / "out"
    args = ["--data-file", str(flashrag / "flashrag/nq/test.jsonl"), "--corpus"]
    args += [str(flashrag / "wiki18.jsonl"), "--agent", "naive", "--protocol", "search-r1"]
    assert bench([*args, "--out", str(out), "--no-progress"]) == 0
    meta = json.loads((out / "report.json").read_text())["meta"]
    assert meta["env"]["protocol"] == "search-r1" and meta["env"]["max_turns"] == 5
    first = _trajectories(out)[0]["turns"][0]
    assert first["observation"].startswith('\n\n<information>Doc 1(Title: "')
    assert first["observation"].endswith("</information>\n\n")
