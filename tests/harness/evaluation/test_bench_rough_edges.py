"""The rough edges of issue 14, each fixed: clear one-line errors, fast failures, honest help."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.qa_datasets.errors import DatasetFormatError, DatasetUnavailable
from envs.qa_datasets.loaders import load_file, load_named
from harness.evaluation.bench import bench, corpus

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def qa_file(tmp_path: Path) -> Path:
    path = tmp_path / "nq" / "test.jsonl"
    path.parent.mkdir()
    path.write_text(json.dumps({"id": "q", "question": "who?", "golden_answers": ["x"]}) + "\n")
    document = {"id": "0", "contents": '"Acme"\nAcme makes widgets.'}
    (tmp_path / "corpus.jsonl").write_text(json.dumps(document) + "\n")
    return path


def test_a_bad_model_path_is_one_clear_error(qa_file: Path, caplog) -> None:
    args = ["--agent", "transformers", "--model", "/no/such/model", "--data-file", str(qa_file)]
    corpus_file = qa_file.parent.parent / "corpus.jsonl"
    assert bench([*args, "--corpus", str(corpus_file), "--no-progress"]) == 2
    assert "--model /no/such/model: no such model folder" in caplog.text


def test_a_data_file_that_is_a_folder_says_so(qa_file: Path) -> None:
    with pytest.raises(DatasetFormatError, match=r"is a folder \(it holds test.jsonl\)"):
        load_file(qa_file.parent)


def test_corpus_refuses_to_overwrite_without_overwrite(tmp_path: Path, caplog) -> None:
    source = tmp_path / "hp.jsonl"
    record = {
        "_id": "a1", "question": "q?", "answer": "x", "type": "bridge", "level": "easy",
        "context": [["T", [" x is here."]], ["U", [" y."]]],
        "supporting_facts": [["T", 0]],
    }  # fmt: skip
    source.write_text(json.dumps(record) + "\n")
    args = ["--data-file", str(source), "--out", str(tmp_path / "c"), "--index", "none"]
    assert corpus(args) == 0
    first = (tmp_path / "c" / "corpus.jsonl").stat().st_mtime_ns
    assert corpus(args) == 2
    assert "already exists; pass --overwrite" in caplog.text
    assert (tmp_path / "c" / "corpus.jsonl").stat().st_mtime_ns == first
    assert corpus([*args, "--overwrite"]) == 0


def test_an_unreachable_hub_fails_in_seconds(
    monkeypatch: pytest.MonkeyPatch, refused_port: int
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    for proxy in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(proxy, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{refused_port}")
    start = time.perf_counter()
    with pytest.raises(DatasetUnavailable, match=r"cannot connect to 127\.0\.0\.1"):
        load_named("hotpotqa")
    assert time.perf_counter() - start < 10  # was ~28 s of `datasets` retries


def test_help_shows_each_default_once_and_imports_no_torch() -> None:
    env = {**os.environ, "COLUMNS": "400", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    code = (
        "import sys\n"
        "from harness.evaluation.bench import bench\n"
        "try:\n    bench(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('TORCH', 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300
    )
    assert "--protocol" in proc.stdout and "--resume" in proc.stdout
    assert not re.search(r"\(default[^)]*\)\W*\(default:", proc.stdout)
    assert "TORCH False" in proc.stdout  # `import torch` made `bench --help` take 5.6 s


def test_the_readme_env_example_searches_for_its_own_question() -> None:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Journey 2: fork an environment for tree search", 1)[1]
    code = section.split("```python", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    question = namespace["env"].unwrapped.task.question
    first_query = re.search(r"<search> (.+?) </search>", code).group(1)
    subject = first_query.rsplit(" ", 1)[0]  # "<name> father"
    assert subject in question
    assert namespace["obs"].count(subject) >= 1


def test_a_bad_epsilon_is_refused_at_parse_time_without_suggesting_resume():
    from harness.evaluation.bench import BenchConfig

    for bad in (2.0, -0.1, float("nan")):
        with pytest.raises(ValueError, match=r"--epsilon .*must be in \[0, 1\]") as caught:
            BenchConfig(epsilon=bad)
        assert "--resume" not in str(caught.value)
    with pytest.raises(ValueError, match="--limit 0"):  # the data arguments' own check still runs
        BenchConfig(limit=0)
