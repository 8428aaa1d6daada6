"""`tracerl bench` as Search-R1 / FlashRAG users run it (issue 14): the search-r1 protocol,
FlashRAG folder names, per-dataset limits, resumable and partial runs, honest report rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.evaluation.bench import bench

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


def _naive_args(flashrag: Path, out: Path, *extra: str) -> list[str]:
    files = [str(flashrag / "flashrag" / n / "test.jsonl") for n in QUESTIONS]
    corpus = str(flashrag / "wiki18.jsonl")
    run = ["--agent", "naive", "--out", str(out), "--no-progress", *extra]
    return ["--data-file", *files, "--corpus", corpus, *run]


def test_flashrag_folders_name_the_datasets_and_the_console_shows_them(
    flashrag: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = flashrag / "out"
    assert bench(_naive_args(flashrag, out, "--limit", "2")) == 0
    by_dataset = json.loads((out / "report.json").read_text())["reports"][0]["by_dataset"]
    assert {k: v["n"] for k, v in by_dataset.items()} == {"nq": 2, "bamboogle": 2}
    printed = capsys.readouterr().out
    assert "tracerl bench: per dataset" in printed
    assert "retrieval: BM25Retriever over" in printed and "3 documents, top-3" in printed
    assert "acc is sub-EM, FlashRAG's `acc`" in printed


def test_name_is_given_once_per_file(flashrag: Path) -> None:
    out = flashrag / "named"
    assert bench([*_naive_args(flashrag, out), "--name", "nq-open", "bb"]) == 0
    by_dataset = json.loads((out / "report.json").read_text())["reports"][0]["by_dataset"]
    assert set(by_dataset) == {"nq-open", "bb"}
    with pytest.raises((ValueError, SystemExit)):
        bench([*_naive_args(flashrag, out), "--name", "only-one"])


def test_limit_counts_per_dataset_across_its_files(flashrag: Path) -> None:
    rows = QUESTIONS["nq"]
    parts = []
    for i, chunk in enumerate((rows[:1], rows[1:])):
        folder = flashrag / f"split{i}" / "nq"
        folder.mkdir(parents=True)
        lines = [json.dumps({"id": r[0], "question": r[1], "golden_answers": r[2]}) for r in chunk]
        (folder / "dev.jsonl").write_text("\n".join(lines) + "\n")
        parts.append(str(folder / "dev.jsonl"))
    out = flashrag / "limited"
    args = ["--data-file", *parts, "--corpus", str(flashrag / "wiki18.jsonl"), "--agent", "naive"]
    assert bench([*args, "--limit", "2", "--out", str(out), "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())["reports"][0]
    assert report["by_dataset"]["nq"]["n"] == 2  # not 1 + 2 = 3 (a limit per file)


def test_an_oracle_without_a_plan_is_refused(
    flashrag: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = _naive_args(flashrag, flashrag / "oracle")
    args[args.index("naive")] = "oracle"
    assert bench(args) == 2
    assert "no question has a plan" in caplog.text


def _comparable(report: dict) -> dict:
    """A report without what two runs into two folders must differ in: time, --out."""
    meta = {k: v for k, v in report["meta"].items() if k not in ("created_at", "command")}
    meta["config"] = {k: v for k, v in meta["config"].items() if k != "out"}
    return {**report, "meta": meta}


def test_a_failed_run_writes_a_partial_report_and_resume_finishes_it_identically(
    flashrag: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import harness.evaluation.bench as cli
    from envs.errors import RetrievalFailedError

    fresh = flashrag / "fresh"
    assert bench(_naive_args(flashrag, fresh)) == 0
    real_evaluate = cli.evaluate

    def failing(*args, on_episode, **kwargs):  # the retriever dies after three episodes
        def count(record) -> None:
            on_episode(record)
            failing.n += 1
            if failing.n == 3:
                raise RetrievalFailedError("the retriever failed: connection refused")

        return real_evaluate(*args, on_episode=count, **kwargs)

    failing.n = 0
    monkeypatch.setattr(cli, "evaluate", failing)
    out = flashrag / "stopped"
    capsys.readouterr()
    assert bench(_naive_args(flashrag, out)) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stopped after 3 of 5 episodes" in err[0] and "--resume" in err[0]
    partial = json.loads((out / "report.json").read_text())
    assert partial["meta"]["partial"]["n_done"] == 3
    assert partial["reports"][0]["overall"]["n"] == 3
    assert "PARTIAL REPORT" in (out / "report.md").read_text()
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 3

    monkeypatch.setattr(cli, "evaluate", real_evaluate)
    with (out / "trajectories.jsonl").open("a") as handle:
        handle.write('{"agent": "naive", "task_id": "nq-')  # a line cut by a kill
    assert bench([*_naive_args(flashrag, out), "--resume"]) == 0
    resumed = json.loads((out / "report.json").read_text())
    uninterrupted = json.loads((fresh / "report.json").read_text())
    assert _comparable(resumed) == _comparable(uninterrupted)
    assert resumed["meta"]["command"] == uninterrupted["meta"]["command"].replace(
        "/fresh ", "/stopped "
    )  # without --resume: the command of the run
    markdown = (fresh / "report.md").read_text().replace("/fresh ", "/stopped ")
    assert (out / "report.md").read_text() == markdown
    assert (out / "trajectories.jsonl").read_text() == (fresh / "trajectories.jsonl").read_text()


def test_resume_refuses_another_command_or_an_empty_folder(
    flashrag: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = flashrag / "run"
    assert bench([*_naive_args(flashrag, out), "--resume"]) == 2
    assert "holds no run to resume" in caplog.text
    assert bench(_naive_args(flashrag, out, "--limit", "1")) == 0
    assert bench([*_naive_args(flashrag, out), "--resume"]) == 2
    assert "differs in --limit" in caplog.text


def test_recall_against_a_server_with_other_ids_is_unknown_not_zero() -> None:
    from harness.evaluation.bench import _mark_unknown_recall
    from harness.evaluation.report import markdown_table
    from harness.rollout.evaluation import EpisodeRecord, Report

    class Server:  # like HTTPRetriever: no local documents
        index_id = "http-x"

    episode = EpisodeRecord(
        task_id="q", dataset="d", question="?", golden_answers=("a",), question_type="t",
        n_hops=2, answer="a", em=1.0, sub_em=1.0, f1=1.0, end="answer", n_tool_calls=1,
        n_tokens=0, retrieved_doc_ids=("17", "4"), supporting_doc_ids=("p-0123456789abcdef",),
        turns=(),
    )  # fmt: skip
    reports = [Report(agent="x", episodes=(episode,))]
    assert reports[0].overall.recall == 0.0  # what the old code reported
    assert _mark_unknown_recall(reports, Server())
    assert reports[0].overall.recall is None
    assert markdown_table(reports, "overall").splitlines()[-1].endswith("| – |")


def test_run_bench_is_the_command_from_python_stoppable_and_resumable(tmp_path: Path) -> None:
    import shlex

    import tyro

    from envs.errors import RetrievalFailedError
    from harness.evaluation import BenchConfig, EpisodeRecord, run_bench

    config = BenchConfig(agent=("naive",), limit=6, progress=False, out=tmp_path / "full")
    seen: list[tuple[str, str]] = []
    full = run_bench(config, on_episode=lambda agent, r: seen.append((agent, r.task_id)))
    assert full.finished and full.loop_s > 0
    assert seen == [("naive", e.task_id) for e in full.reports[0].episodes]
    assert len(seen) == 6 and (tmp_path / "full" / "report.json").is_file()
    # the report records the command that gives this config
    command = shlex.split(full.meta["command"])
    assert command[:2] == ["tracerl", "bench"]
    assert tyro.cli(BenchConfig, args=command[2:]) == config

    def fail_after_two(agent: str, record: EpisodeRecord, n=[0]) -> None:  # noqa: B006
        n[0] += 1
        if n[0] == 2:
            raise RetrievalFailedError("the retriever failed")

    stopped_config = BenchConfig(agent=("naive",), limit=6, progress=False, out=tmp_path / "cut")
    stopped = run_bench(stopped_config, on_episode=fail_after_two)
    assert not stopped.finished and "stopped after 2 of 6 episodes" in stopped.failure
    assert json.loads((tmp_path / "cut" / "report.json").read_text())["meta"]["partial"]
    resumed = run_bench(BenchConfig(agent=("naive",), limit=6, progress=False,
                                    out=tmp_path / "cut", resume=True))  # fmt: skip
    assert resumed.finished
    assert [e.to_json() for e in resumed.reports[0].episodes] == [
        e.to_json() for e in full.reports[0].episodes
    ]


# -- issue 25: a torn last line at any byte, a corrupt middle line in one line ---------------


def test_resume_survives_a_last_line_cut_at_any_byte_even_inside_a_character(
    flashrag: Path,
) -> None:
    from benchmarks.cli import main

    fresh = flashrag / "fresh"
    assert main(["bench", *_naive_args(flashrag, fresh)]) == 0
    whole = (fresh / "trajectories.jsonl").read_bytes()
    last_start = whole.rstrip(b"\n").rfind(b"\n") + 1
    umlaut = whole.index("ü".encode(), last_start)  # "Zürich" is written as UTF-8, not \u00fc
    for cut in (umlaut + 1, last_start + 1, len(whole) - 1):
        out = flashrag / f"cut{cut}"
        assert main(["bench", *_naive_args(flashrag, out)]) == 0
        (out / "trajectories.jsonl").write_bytes(whole[:cut])
        assert main(["bench", *_naive_args(flashrag, out), "--resume"]) == 0
        assert (out / "trajectories.jsonl").read_bytes() == whole


def test_a_corrupt_middle_line_is_one_line_naming_it_and_no_traceback(
    flashrag: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from benchmarks.cli import main

    out = flashrag / "run"
    assert main(["bench", *_naive_args(flashrag, out)]) == 0
    lines = (out / "trajectories.jsonl").read_bytes().split(b"\n")
    lines[1] = lines[1][:10] + b"\xff\xfe" + lines[1][12:]  # not UTF-8 any more
    (out / "trajectories.jsonl").write_bytes(b"\n".join(lines))
    capsys.readouterr()
    assert main(["bench", *_naive_args(flashrag, out), "--resume"]) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "trajectories.jsonl:2 is not an episode" in errors[0]
    assert "\n" not in errors[0] and "Traceback" not in capsys.readouterr().err
