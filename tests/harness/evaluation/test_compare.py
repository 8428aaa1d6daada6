"""`tracerl bench compare` on real `tracerl bench` runs of the scripted agents."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.evaluation.bench import bench
from harness.evaluation.runs import read_finished
from harness.evaluation.stats import paired_difference


def _run(out: Path, *args: str) -> Path:
    assert bench(["--out", str(out), "--no-progress", *args]) == 0
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("compare")
    first = _run(root / "first", "--agent", "oracle", "naive", "--limit", "40")
    second = _run(root / "second", "--agent", "oracle", "--epsilon", "0.5", "--limit", "30")
    return first, second


def test_compare_prints_paired_intervals_on_the_shared_questions(runs, tmp_path, capsys) -> None:
    first, second = runs
    out = tmp_path / "cmp"
    assert bench(["compare", str(first), str(second), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "first/oracle" in printed and "second/oracle" in printed and "(reference)" in printed
    result = json.loads((out / "compare.json").read_text())
    overall = result["overall"]["all"]
    assert [r["agent"] for r in overall] == ["first/oracle", "first/naive", "second/oracle"]
    assert {r["n"] for r in overall} == {30}  # the 30 questions all three played
    # the naive row's EM difference is the paired bootstrap of the same episodes
    episodes = read_finished(first / "trajectories.jsonl")
    shared = {t for t in read_finished(second / "trajectories.jsonl")["oracle"]}
    ref = {t: r.em for t, r in episodes["oracle"].items() if t in shared}
    naive = {t: r.em for t, r in episodes["naive"].items() if t in shared}
    expected = paired_difference(ref, naive)
    got = overall[1]["em_diff"]
    assert got["mean"] == pytest.approx(expected.mean) and got["low"] == pytest.approx(expected.low)
    assert got["mean"] < 0 and got["high"] < 0  # the oracle knows the answers; naive does not
    assert overall[0]["em_diff"] is None
    assert overall[1]["tool_calls"] > 0 and overall[1]["latency_p50_s"] is None  # no endpoint
    # the same rows per dataset and per question kind, each summing to the shared questions
    assert sum(rows[0]["n"] for rows in result["kind"].values()) == 30
    assert list(result["dataset"]) == ["synthetic"]
    assert f"{expected.mean:+.3f} [{expected.low:.3f}, {expected.high:.3f}]" in printed
    assert (out / "compare.png").stat().st_size > 10_000
    assert (out / "compare.md").read_text().startswith("# tracerl bench compare")


def test_compare_refuses_runs_with_no_question_in_common(tmp_path, capsys) -> None:
    train = _run(tmp_path / "train", "--agent", "naive", "--split", "train", "--limit", "5")
    test = _run(tmp_path / "test", "--agent", "naive", "--split", "test", "--limit", "5")
    capsys.readouterr()
    assert bench(["compare", str(train), str(test), "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "share no question" in err[0] and "train/naive" in err[0]
    assert not (tmp_path / "cmp").exists()
