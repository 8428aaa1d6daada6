"""A policy carries its protocol: `policy_protocol.json`, and `tracerl bench` playing it."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest

from envs import SearchQAConfig, World, WorldConfig
from envs.qa_datasets.errors import BenchmarkError
from harness.evaluation.bench import BenchConfig, run_bench, with_policy_protocol
from harness.policies.policy_protocol import PROTOCOL_FILE, PolicyProtocol, read_policy_protocol
from harness.tiny_policy.pipeline import ARTIFACTS_FILE, SHIPPED_DIR

SHIPPED = str(SHIPPED_DIR)


def test_the_shipped_policy_carries_the_protocol_its_record_names():
    protocol = read_policy_protocol(SHIPPED_DIR)
    record = json.loads((SHIPPED_DIR / ARTIFACTS_FILE).read_text())["config"]
    assert (SHIPPED_DIR / PROTOCOL_FILE).is_file()
    assert protocol is not None
    assert protocol.env_kwargs() == {"protocol": "trace-rl", **record["env"]}
    assert protocol.world == WorldConfig(sentences_per_doc=1, questions_per_kind=40)
    assert protocol.world_seed == record["world_seed"] == 0


def test_a_record_without_the_file_is_read_from_tiny_policy_json(tmp_path):
    shutil.copy(SHIPPED_DIR / ARTIFACTS_FILE, tmp_path / ARTIFACTS_FILE)
    assert read_policy_protocol(tmp_path) == read_policy_protocol(SHIPPED_DIR)


def test_a_folder_without_a_protocol_keeps_todays_bench(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a Search-R1 checkpoint: weights only
    assert read_policy_protocol(tmp_path) is None
    config = BenchConfig(agent=("transformers",), model=str(tmp_path))
    assert with_policy_protocol(config) == (config, None)
    assert config.env_settings() == SearchQAConfig()  # the env's own defaults


def test_a_broken_protocol_file_is_refused_naming_it(tmp_path):
    (tmp_path / PROTOCOL_FILE).write_text('{"schema_version": 1, "protocol": "x"}')
    with pytest.raises(BenchmarkError, match=f"--model: .*{PROTOCOL_FILE}"):
        with_policy_protocol(BenchConfig(agent=("transformers",), model=str(tmp_path)))


def test_bench_plays_the_policys_protocol_by_default(caplog):
    caplog.set_level(logging.INFO)
    config, record = with_policy_protocol(BenchConfig(agent=("transformers",), model=SHIPPED))
    assert (config.top_k, config.max_turns, config.max_doc_chars) == (2, 8, 240)
    assert config.prompt_template == "Question: {question}\n" and config.protocol == "trace-rl"
    assert config.world == WorldConfig(sentences_per_doc=1, questions_per_kind=40)
    assert record is not None and record["overrides"] == [] and record["differences"] == []
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    named, _ = with_policy_protocol(
        BenchConfig(dataset=("synthetic",), agent=("transformers",), model=SHIPPED)
    )
    assert named.world == config.world  # `--dataset synthetic` is the same world


def test_a_flag_overrides_one_field_and_one_warning_names_each_difference(caplog):
    caplog.set_level(logging.INFO)
    given = BenchConfig(
        agent=("transformers",),
        model=SHIPPED,
        top_k=3,
        max_doc_chars=2000,
        world=WorldConfig(questions_per_kind=30),
    )
    config, record = with_policy_protocol(given)
    assert (config.top_k, config.max_turns, config.max_doc_chars) == (3, 8, 2000)
    assert config.world == WorldConfig(sentences_per_doc=1, questions_per_kind=30)
    assert record is not None
    assert record["overrides"] == [
        "--top-k 3",
        "--max-doc-chars 2000",
        "--world.questions-per-kind 30",
    ]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for name in ("top_k: policy 2, played 3", "max_doc_chars", "world.questions_per_kind"):
        assert name in warnings[0]
    assert any("override: --top-k 3" in r.getMessage() for r in caplog.records)


def test_the_bench_run_records_and_plays_the_policys_env(tmp_path):
    config = BenchConfig(
        agent=("transformers",),
        model=SHIPPED,
        world_seed=5000,
        limit=2,
        out=tmp_path / "bench",
        progress=False,
    )
    result = run_bench(config)
    env = result.meta["env"]
    assert (env["top_k"], env["max_turns"], env["max_doc_chars"]) == (2, 8, 240)
    assert result.meta["policy_protocol"]["source"] == SHIPPED
    assert result.meta["retriever"]["n_documents"] == len(
        World.generate(5000, WorldConfig(sentences_per_doc=1, questions_per_kind=40)).documents
    )


def test_the_protocol_file_round_trips(tmp_path):
    protocol = PolicyProtocol(
        protocol="search-r1",
        prompt_template="Q: {question}",
        top_k=3,
        max_turns=5,
        max_doc_chars=2000,
    )
    protocol.write(tmp_path)
    assert read_policy_protocol(tmp_path) == protocol
    assert dataclasses.replace(protocol, top_k=4).differences(protocol.env_kwargs()) == [
        "top_k: policy 4, played 3"
    ]
