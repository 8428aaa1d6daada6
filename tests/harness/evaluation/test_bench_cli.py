"""`tracerl bench` and `tracerl corpus`, called in-process as the CLI table does."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from harness.evaluation.bench import bench, corpus


def test_bench_without_arguments_runs_the_scripted_agents_on_the_synthetic_world(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)  # the default --out is runs/bench, under the working directory
    assert bench([]) == 0  # in-process; tests/benchmarks/test_cli.py runs `tracerl bench` itself
    assert "tracerl bench: overall" in capsys.readouterr().out
    out = tmp_path / "runs" / "bench"
    payload = json.loads((out / "report.json").read_text())
    oracle, naive = payload["reports"]
    assert (oracle["agent"], naive["agent"]) == ("oracle", "naive")
    assert oracle["overall"]["n"] == naive["overall"]["n"] == payload["meta"]["dataset"]["n_tasks"]
    assert oracle["overall"]["em"] > 0.9 > 0.2 > naive["overall"]["em"]
    assert {"synthetic/bridge", "synthetic/comparison"} <= set(oracle["by_type"])
    meta = payload["meta"]
    assert meta["dataset"]["sources"][0]["kind"] == "synthetic"
    assert meta["retriever"]["index_id"].startswith("bm25-")
    assert meta["env"]["max_turns"] == 4 and meta["seed"] == 0
    assert oracle["meta"]["agent"]["policy"] == "envs.OracleAgent"
    n_lines = len((out / "trajectories.jsonl").read_text().splitlines())
    assert n_lines == 2 * oracle["overall"]["n"]
    assert (out / "report.png").stat().st_size > 5_000
    assert "| oracle | synthetic/bridge |" in (out / "report.md").read_text()


def test_bench_is_reproducible(tmp_path: Path) -> None:
    outputs = []
    for name in ("a", "b"):
        args = ["--limit", "25", "--agent", "naive", "--out", str(tmp_path / name), "--no-progress"]
        assert bench(args) == 0
        outputs.append((tmp_path / name / "trajectories.jsonl").read_text())
    assert outputs[0] == outputs[1]


def _expected_counts(shared_data: Path) -> dict[tuple[str, str], int]:
    """Question types of the shared HotpotQA, MuSiQue and 2Wiki files, read straight from JSON."""
    seen: dict[str, tuple[str, str]] = {}
    for path in sorted((shared_data / "hotpotqa").iterdir()):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            seen[record.get("_id", record.get("id"))] = ("hotpotqa", record["type"])
    for path in sorted((shared_data / "musique").iterdir()):
        text = path.read_text()
        records = (
            json.loads(text)
            if text.lstrip().startswith("[")
            else map(json.loads, text.splitlines())
        )
        for record in records:
            seen[record["id"]] = ("musique", record["id"].split("__")[0])
    for line in (
        (shared_data / "2wikimultihopqa/2wiki_dev.migres164.jsonl").read_text().splitlines()
    ):
        record = json.loads(line)
        seen[record["_id"]] = ("2wikimultihopqa", record["type"])
    return dict(collections.Counter(seen.values()))


@pytest.mark.slow
def test_real_data_corpus_index_and_bench(
    tmp_path: Path, shared_data: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    files = [
        *sorted((shared_data / "hotpotqa").iterdir()),
        *sorted((shared_data / "musique").iterdir()),
        shared_data / "2wikimultihopqa/2wiki_dev.migres164.jsonl",
    ]
    # in-process: the same functions `tracerl corpus` / `tracerl bench` run
    assert corpus(["--data-file", *map(str, files), "--out", str(tmp_path / "c")]) == 0
    args = ["--data-file", *map(str, files), "--index", str(tmp_path / "c" / "bm25"),
            "--agent", "naive", "oracle", "--out", str(tmp_path / "out"), "--no-progress",
            "--json"]  # fmt: skip
    assert bench(args) == 0
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert set(summary["overall"]) == {"naive", "oracle"}

    payload = json.loads((tmp_path / "out" / "report.json").read_text())
    expected = _expected_counts(shared_data)
    n_total = sum(expected.values())
    # unique dev questions (docs/benchmarks.md, "The real dev samples")
    assert n_total == 975 + 292 + 164
    for report in payload["reports"]:
        counts = {tuple(k.split("/", 1)): v["n"] for k, v in report["by_type"].items()}
        assert counts == expected
        assert report["overall"]["n"] == n_total
        assert {k: v["n"] for k, v in report["by_dataset"].items()} == {
            "hotpotqa": 975,
            "musique": 292,
            "2wikimultihopqa": 164,
        }
        assert report["overall"]["n_recall"] == n_total  # every task's supporting ids are indexed
    naive, oracle = payload["reports"]
    # the oracle follows MuSiQue's decompositions (one search per hop, at most max_turns - 1)
    assert oracle["by_hops"]["musique/2-hop"]["searches"] == 2.0
    assert oracle["by_hops"]["musique/4-hop"]["searches"] == 3.0
    assert (
        oracle["overall"]["em"] == 1.0 and oracle["overall"]["recall"] > naive["overall"]["recall"]
    )
    assert naive["overall"]["searches"] == 1.0 and naive["overall"]["em"] < 0.2
    # 9,572 + 4,543 + 1,294 unique paragraphs per dataset, 10 of them in two datasets
    assert payload["meta"]["retriever"]["manifest"]["n_documents"] == 15_399
    sources = payload["meta"]["dataset"]["sources"]
    hashes = {Path(s["location"]).name: s["sha256"] for s in sources}
    assert hashes["musique_ans_v1.0_dev.kag100.json"] == (
        "7ee7b3f9533586b38d8ebe579dcb8d3daa8f52600b7777a6daa085ccac470467"  # the file's sha256
    )


def test_bench_on_a_dataset_without_paragraphs_needs_a_retriever(
    tmp_path: Path, shared_data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    args = ["--data-file", str(shared_data / "bamboogle/bamboogle.csv"), "--out", str(tmp_path)]
    assert bench(args) == 2
    assert "has no paragraphs" in caplog.text and "wiki-18" in caplog.text


def test_bench_reports_fact_disjoint_questions_and_the_decoy_check(tmp_path: Path) -> None:
    facts = tmp_path / "facts"
    args = ["--split", "fact_disjoint", "--agent", "oracle", "--no-progress", "--out", str(facts)]
    assert bench(args) == 0
    payload = json.loads((facts / "report.json").read_text())
    (oracle,) = payload["reports"]
    assert oracle["overall"]["n"] > 0 and oracle["overall"]["em"] > 0.9  # its corpus answers them
    assert "split fact_disjoint" in payload["meta"]["dataset"]["sources"][0]["location"]
    # the decoy: the training questions over another world's documents. An agent that knows the
    # answers (the oracle follows its plan to the gold answer) still scores; one that reads
    # what it retrieved cannot
    decoy = tmp_path / "decoy"
    args = ["--split", "train", "--corpus-world-seed", "5100", "--limit", "60", "--no-progress"]
    assert bench([*args, "--out", str(decoy)]) == 0
    payload = json.loads((decoy / "report.json").read_text())
    oracle, naive = payload["reports"]
    assert "world 5100's documents" in payload["meta"]["retriever"]["corpus"]
    assert naive["overall"]["em"] <= 0.05 < 0.5 < oracle["overall"]["em"]


def test_bench_unknown_dataset_suggests_names(caplog: pytest.LogCaptureFixture) -> None:
    assert bench(["--dataset", "musiqe"]) == 2
    assert "Did you mean 'musique'" in caplog.text


def test_bench_rejects_two_retrievers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    args = ["--index", str(tmp_path), "--corpus", str(tmp_path / "c.jsonl"), "--out", str(tmp_path)]
    assert bench(args) == 2
    assert "at most one of --index, --corpus, --retriever-url, --corpus-world-seed" in caplog.text
