"""`tracerl bench` flags as Search-R1 and vLLM users spell them."""

from __future__ import annotations

import pytest
import tyro

from envs.qa_datasets.errors import BenchmarkError
from harness.evaluation.bench import BenchConfig, flag_pairs, run_bench


def _parse(*argv: str) -> BenchConfig:
    return tyro.cli(BenchConfig, args=flag_pairs(list(argv), ("chat_template",)))


def test_chat_template_is_a_flag_pair_and_stays_unset_by_default():
    assert _parse("--chat-template", "--limit", "2").chat_template is True
    assert _parse("--limit", "2", "--chat-template").chat_template is True
    assert _parse("--no-chat-template").chat_template is False
    assert _parse("--chat-template", "False").chat_template is False  # the old spelling
    assert _parse().chat_template is None


def test_topk_is_search_r1s_spelling_of_top_k():
    assert _parse("--topk", "5").top_k == 5 == _parse("--top-k", "5").top_k


def test_prompt_template_file_sets_the_prompt(tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Answer this: {question}\n", encoding="utf-8")
    config = BenchConfig(
        agent=("naive",), limit=1, progress=False, out=tmp_path / "out", prompt_template_file=prompt
    )
    result = run_bench(config)
    first = result.reports[0].episodes[0]
    assert (
        result.meta["env"]["prompt_sha256"]
        != run_bench(
            BenchConfig(agent=("naive",), limit=1, progress=False, out=tmp_path / "plain")
        ).meta["env"]["prompt_sha256"]
    )
    assert first.task_id
    with pytest.raises(BenchmarkError, match="not both"):
        run_bench(
            BenchConfig(prompt_template="{question}", prompt_template_file=prompt, out=tmp_path)
        )
    missing = tmp_path / "nope.txt"
    with pytest.raises(BenchmarkError, match=f"--prompt-template-file {missing}"):
        run_bench(BenchConfig(prompt_template_file=missing, out=tmp_path / "x"))


def test_endpoint_errors_name_the_flags_not_the_python_fields(tmp_path, caplog):
    from harness.evaluation.bench import bench

    args = ["--agent", "openai", "--model", "m", "--max-retries", "-1", "--out", str(tmp_path)]
    assert bench(args) == 2
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "--max-retries" in errors[0] and "max_retries" not in errors[0]
