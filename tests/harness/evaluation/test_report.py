"""Report files: JSON, Markdown, trajectories JSONL and the plot, written and read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.evaluation.report import markdown_report, markdown_table, write_reports
from harness.rollout.evaluation import EpisodeRecord, Report, TurnLog


def _episode(task_id: str, em: float, searches: int, qtype: str) -> EpisodeRecord:
    return EpisodeRecord(
        task_id=task_id,
        dataset="musique",
        question=f"{task_id}?",
        golden_answers=("x", "y"),
        question_type=qtype,
        n_hops=int(qtype[0]),
        answer="x" if em else "z",
        em=em,
        sub_em=em,
        f1=em,
        end="answer",
        n_tool_calls=searches,
        n_tokens=7 * searches,
        retrieved_doc_ids=("p-1",),
        supporting_doc_ids=("p-1", "p-2"),
        turns=tuple(
            TurnLog(
                action="<search> q </search>",
                observation="\n<information>Doc 1(Title: T) t</information>\n",
                kind="search",
                valid=True,
                n_tokens=7,
                finish_reason="stop",
            )
            for _ in range(searches)
        ),
    )


@pytest.fixture
def reports() -> list[Report]:
    a = Report(
        agent="oracle",
        episodes=(_episode("1", 1.0, 2, "2hop"), _episode("2", 1.0, 3, "3hop1")),
        meta={"agent": {"backend": "scripted"}},
    )
    b = Report(
        agent="naive",
        episodes=(_episode("1", 0.0, 1, "2hop"), _episode("2", 1.0, 1, "3hop1")),
        meta={"agent": {"backend": "scripted"}},
    )
    return [a, b]


def test_written_files_parse_and_hold_the_numbers(tmp_path: Path, reports: list[Report]) -> None:
    meta = {"command": "tracerl bench --x", "seed": 3, "dataset": {"name": "musique"}}
    paths = write_reports(reports, tmp_path / "out", meta=meta)
    payload = json.loads(paths["json"].read_text())
    assert payload["schema_version"] == 1 and payload["meta"]["seed"] == 3
    naive = payload["reports"][1]
    assert naive["agent"] == "naive"
    assert naive["overall"]["em"] == 0.5 and naive["overall"]["n"] == 2
    assert naive["by_type"]["musique/2hop"]["em"] == 0.0
    assert naive["by_hops"]["musique/3-hop"]["em"] == 1.0
    assert payload["reports"][0]["overall"]["searches_hist"] == {"2": 1, "3": 1}
    assert payload["reports"][0]["overall"]["recall"] == 0.5

    lines = [json.loads(line) for line in paths["trajectories"].read_text().splitlines()]
    assert [(x["agent"], x["task_id"]) for x in lines] == [
        ("oracle", "1"),
        ("oracle", "2"),
        ("naive", "1"),
        ("naive", "2"),
    ]
    first = dict(lines[0])
    first.pop("agent")
    assert EpisodeRecord.from_json(first) == reports[0].episodes[0]

    markdown = paths["markdown"].read_text()
    assert "tracerl bench --x" in markdown
    assert "| naive | musique/2hop | 1 | 0.000 |" in markdown
    for title in ("## Overall", "## Per dataset", "## Per question type", "## Per hop count"):
        assert title in markdown

    png = paths["plot"].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5_000


def test_markdown_table_has_one_row_per_agent_and_group(reports: list[Report]) -> None:
    table = markdown_table(reports, "type").splitlines()
    assert len(table) == 2 + 2 * 2  # header, rule, 2 agents x 2 types
    assert table[0].startswith("| agent | type | n | EM |")
    assert all(line.count("|") == table[0].count("|") for line in table)


def test_markdown_report_without_meta(reports: list[Report]) -> None:
    assert markdown_report(reports, {}).startswith("# tracerl bench")


def test_agent_names_must_be_unique(tmp_path: Path, reports: list[Report]) -> None:
    with pytest.raises(ValueError, match="unique"):
        write_reports([reports[0], reports[0]], tmp_path, meta={})
    with pytest.raises(ValueError, match="no reports"):
        write_reports([], tmp_path, meta={})
