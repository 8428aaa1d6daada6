from __future__ import annotations

import json

from envs.cli import demo_env, world

SMALL_FLAGS = [
    "--world.n-countries", "3", "--world.n-cities", "8", "--world.n-people", "40",
    "--world.n-films", "6", "--world.n-books", "4", "--world.n-companies", "3",
    "--world.n-universities", "3", "--world.n-distractors", "4", "--world.questions-per-kind", "2",
]  # fmt: skip


def test_demo_env_prints_em_per_question_type(capsys):
    assert demo_env(["--seed", "1", *SMALL_FLAGS]) == 0
    out = capsys.readouterr().out
    assert "bridge (2 hops)" in out and "comparison (2 hops)" in out and "naive" in out
    all_row = next(line for line in out.splitlines() if "│ all" in line)
    oracle_em = float(all_row.split("│")[3].split("/")[0])
    assert oracle_em == 1.0


def test_world_exports_corpus_questions_and_an_index(tmp_path, capsys):
    assert world(["--out", str(tmp_path), "--seed", "2", "--index", *SMALL_FLAGS]) == 0
    assert (tmp_path / "corpus.jsonl").is_file() and (tmp_path / "bm25" / "manifest.json").is_file()
    first = json.loads((tmp_path / "questions.jsonl").read_text().splitlines()[0])
    assert first["golden_answers"] and first["decomposition"]["steps"]
    assert "questions" in capsys.readouterr().out
