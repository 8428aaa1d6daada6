"""A bench run is never lost: a used --out is refused, the final write is atomic, --json on a
stopped run prints the partial figures, and --sample draws a stratified subset."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

import harness.evaluation.bench as cli
from envs.errors import RetrievalFailedError
from envs.qa_datasets.errors import BenchmarkError
from harness.evaluation.bench import DataArgs, bench, load_data


def _args(out: Path, *extra: str) -> list[str]:
    return ["--agent", "naive", "--limit", "6", "--no-progress", "--out", str(out), *extra]


def test_a_folder_holding_a_run_is_refused_in_one_line_and_kept(tmp_path, capsys, caplog):
    out = tmp_path / "bench"
    assert bench(_args(out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert bench(_args(out, "--limit", "2")) == 2  # the default --out: the usual second run
    message = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(message) == 1 and "\n" not in message[0]
    assert "--resume" in message[0] and "--overwrite" in message[0] and str(out) in message[0]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing touched
    assert bench(_args(out, "--limit", "2", "--overwrite")) == 0
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 2


def test_a_kill_during_the_final_write_keeps_every_finished_episode(tmp_path, monkeypatch):
    out = tmp_path / "bench"
    real_open = Path.open

    class Killed(BaseException):
        """Stands for SIGKILL: nothing after it runs."""

    class DiesAfterOneLine:
        def __init__(self, handle):
            self.handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.handle.close()

        def write(self, text):
            self.handle.write(text[: len(text) // 3])  # part of the final file, then the kill
            self.handle.flush()
            raise Killed

    def opener(self, mode="r", *args, **kwargs):
        handle = real_open(self, mode, *args, **kwargs)
        if "trajectories" in self.name and mode == "w":  # the final rewrite, not the stream
            return DiesAfterOneLine(handle)
        return handle

    real_write = cli.write_reports

    def write_reports(*args, **kwargs):
        monkeypatch.setattr(Path, "open", opener)
        return real_write(*args, **kwargs)

    monkeypatch.setattr(cli, "write_reports", write_reports)
    with pytest.raises(Killed):
        bench(_args(out))
    monkeypatch.setattr(Path, "open", real_open)
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    assert len(lines) == 6 and all(json.loads(line)["task_id"] for line in lines)


def test_json_on_a_stopped_run_prints_the_partial_figures(tmp_path, monkeypatch, capsys):
    real_evaluate = cli.evaluate

    def failing(*args, on_episode, **kwargs):
        def count(record) -> None:
            on_episode(record)
            count.n += 1
            if count.n == 4:
                raise RetrievalFailedError("the retriever failed")

        count.n = 0
        return real_evaluate(*args, on_episode=count, **kwargs)

    monkeypatch.setattr(cli, "evaluate", failing)
    capsys.readouterr()
    assert bench(_args(tmp_path / "out", "--json")) == 1
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["overall"]["naive"]["n"] == 4
    assert last["partial"]["n_done"] == 4 and last["partial"]["n_total"] == 6


def _kinds(args: DataArgs) -> Counter:
    tasks = load_data(args).dataset.tasks
    return Counter((t.question_type, t.n_hops) for t in tasks)


def test_sample_draws_a_seeded_subset_stratified_by_question_type():
    every = _kinds(DataArgs())
    n_all = sum(every.values())
    sampled = _kinds(DataArgs(sample=60))
    assert sum(sampled.values()) == 60
    for kind, n in every.items():  # each kind keeps its share, to within the rounding
        assert abs(sampled[kind] - 60 * n / n_all) < 1
    first = [t.task_id for t in load_data(DataArgs(limit=60)).dataset.tasks]
    assert len({t.split("-")[0] for t in first}) < len(every)  # what --limit gives instead
    ids = [t.task_id for t in load_data(DataArgs(sample=60)).dataset.tasks]
    assert ids == [t.task_id for t in load_data(DataArgs(sample=60)).dataset.tasks]
    other = [t.task_id for t in load_data(DataArgs(sample=60, sample_seed=1)).dataset.tasks]
    assert ids != other


def test_sample_refuses_more_than_there_are_and_a_limit_beside_it():
    with pytest.raises(BenchmarkError, match="--sample 100000: there are only"):
        load_data(DataArgs(sample=100_000))
    with pytest.raises(ValueError, match="not with --limit"):
        DataArgs(sample=5, limit=5)


def test_a_trajectory_line_stores_each_text_up_to_its_cap_and_names_it(tmp_path: Path) -> None:
    """A runaway reply cannot make a line huge; the line still reads back, scores intact."""
    from harness.evaluation.runs import EpisodeStream, read_finished
    from harness.rollout.evaluation import EpisodeRecord, TurnLog

    turn = TurnLog(action="a" * 300_000, observation="o" * 50, kind="invalid", valid=False,
                   n_tokens=9, finish_reason="length")  # fmt: skip
    record = EpisodeRecord(
        task_id="q", dataset="d", question="?", golden_answers=("x",), question_type="t",
        n_hops=1, answer=None, em=0.0, sub_em=0.0, f1=0.0, end="max_turns", n_tool_calls=0,
        n_tokens=9, retrieved_doc_ids=(), supporting_doc_ids=(), turns=(turn, turn),
    )  # fmt: skip
    path = tmp_path / "trajectories.jsonl"
    stream = EpisodeStream(path, append=False, max_text_chars=1_000)
    stream.write("agent", record)
    stream.close()
    line = path.read_text("utf-8")
    assert len(line) < 3_000  # two turns of 1,000 characters and their notes
    back = read_finished(path)["agent"]["q"]
    assert back.turns[0].action.startswith("a" * 1_000)
    assert "299,000 more characters not stored" in back.turns[0].action
    assert "max_text_chars=1,000" in back.turns[0].action
    assert back.turns[0].observation == "o" * 50  # under the cap: as it was
    assert back.n_tokens == 9 and back.end == "max_turns"
