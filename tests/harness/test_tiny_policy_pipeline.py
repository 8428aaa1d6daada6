"""init_model end to end on a tiny budget: artifacts, cache reuse, rebuild on change, the CLI."""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil

import pytest
from transformers import AutoModelForCausalLM

from benchmarks.cli import main as tracerl
from envs import WorldConfig
from envs.tasks import QATask
from harness.policies.policy_protocol import PROTOCOL_FILE, PolicyProtocol, read_policy_protocol
from harness.tiny_policy import (
    DemonstrationConfig,
    ModelConfig,
    PolicyArtifacts,
    SFTConfig,
    TinyPolicyConfig,
    WarmStartEvalConfig,
    init_model,
    is_hard,
    load_artifacts,
    tiny_env_config,
)
from harness.tiny_policy.pipeline import ARTIFACTS_FILE

SMALL = TinyPolicyConfig(
    world=WorldConfig(
        n_countries=3,
        n_cities=8,
        n_people=60,
        n_films=8,
        n_books=6,
        n_companies=4,
        n_universities=3,
        n_distractors=5,
        sentences_per_doc=2,
        questions_per_kind=3,
    ),
    vocab_size=600,
    model=ModelConfig(hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128),
    demos=DemonstrationConfig(n_worlds=1, target_variants=1),
    sft=SFTConfig(max_steps=6, batch_size=4, warmup_steps=2, eval_from=3, eval_every=3),
    env=dataclasses.replace(tiny_env_config(), max_turns=4),
    eval=WarmStartEvalConfig(
        n_unseen_questions=4, n_dev_samples=1, n_samples=2, max_action_tokens=16
    ),
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    return run_dir, init_model(SMALL, run_dir)


def test_init_model_writes_a_loadable_policy_and_its_record(built):
    run_dir, artifacts = built
    assert not artifacts.reused
    assert artifacts.policy_dir == run_dir / "tiny_policy" / "policy"
    model = AutoModelForCausalLM.from_pretrained(artifacts.policy_dir)
    assert model.config.vocab_size == len(artifacts.load_tokenizer())
    record = json.loads((artifacts.policy_dir / ARTIFACTS_FILE).read_text())
    assert record["schema_version"] == 1 and record["config_hash"] == SMALL.config_hash
    assert [c["step"] for c in artifacts.sft["dev_curve"]] == [3, 6]
    assert artifacts.sft["selected_step"] in (3, 6)
    assert set(artifacts.evals) == {"heldout_greedy", "heldout_sampled", "unseen_sampled"}
    greedy, sampled = artifacts.evals["heldout_greedy"], artifacts.evals["heldout_sampled"]
    n_heldout = len(artifacts.split["test"]) + len(artifacts.split["test_entities"])
    assert greedy.n_episodes == n_heldout and greedy.temperature == 0.0
    assert sampled.n_episodes == 2 * n_heldout  # every held-out question, x2
    assert sampled.temperature == 1.0
    assert artifacts.evals["unseen_sampled"].n_episodes == 4 * 2  # 4 questions, x2
    assert artifacts.env_settings["top_k"] == SMALL.env.top_k
    assert (artifacts.policy_dir / PROTOCOL_FILE).is_file()  # the protocol beside the weights
    protocol = read_policy_protocol(artifacts.policy_dir)
    assert protocol == PolicyProtocol.of(SMALL.env, world_seed=SMALL.world_seed, world=SMALL.world)


def test_artifacts_round_trip_and_rebuild_the_env(built):
    run_dir, artifacts = built
    loaded = load_artifacts(run_dir)
    assert loaded.config == SMALL
    assert loaded.split == artifacts.split and loaded.evals == artifacts.evals
    env = loaded.make_env()
    prompt, _ = env.reset(options={"task_id": loaded.split["train"][0]})
    assert prompt.startswith("Question: ")
    assert env.config.max_turns == SMALL.env.max_turns
    assert set(loaded.split) == {"train", "dev", "test", "test_entities"}
    assert not set(loaded.split["train"]) & set(loaded.split["test"])


def test_a_second_call_reuses_the_cache(built, caplog):
    run_dir, first = built
    weights = first.policy_dir / "model.safetensors"
    before = weights.stat().st_mtime_ns
    with caplog.at_level(logging.INFO, logger="harness.tiny_policy.pipeline"):
        again = init_model(SMALL, run_dir)
    assert again.reused
    assert "reusing the cached tiny policy" in caplog.text
    assert weights.stat().st_mtime_ns == before
    assert again.evals == first.evals


def test_a_changed_config_rebuilds_the_policy_but_keeps_the_tokenizer(built, tmp_path, caplog):
    shutil.copytree(built[0] / "tiny_policy", tmp_path / "tiny_policy")
    changed = dataclasses.replace(
        SMALL, sft=dataclasses.replace(SMALL.sft, max_steps=3, eval_every=1)
    )
    with caplog.at_level(logging.INFO, logger="harness.tiny_policy.pipeline"):
        rebuilt = init_model(changed, tmp_path)
    assert not rebuilt.reused and rebuilt.config_hash != SMALL.config_hash
    assert "rebuilding" in caplog.text and "reusing the cached tokenizer" in caplog.text
    assert rebuilt.sft["n_steps"] == 3


def test_load_artifacts_without_a_policy_says_how_to_build_one(tmp_path):
    with pytest.raises(FileNotFoundError, match="tracerl init-model"):
        load_artifacts(tmp_path)


def test_a_record_of_another_schema_is_refused(built):
    _, artifacts = built
    record = artifacts.to_json() | {"schema_version": 99}
    with pytest.raises(ValueError, match="schema_version"):
        PolicyArtifacts.from_json(record, artifacts.policy_dir)


def test_config_json_round_trip_and_hash_sensitivity():
    assert TinyPolicyConfig.from_json(SMALL.to_json()) == SMALL
    assert TinyPolicyConfig().config_hash != SMALL.config_hash
    other = dataclasses.replace(SMALL, world_seed=1)
    assert other.config_hash != SMALL.config_hash and other.tokenizer_hash != SMALL.tokenizer_hash
    sft_only = dataclasses.replace(SMALL, sft=dataclasses.replace(SMALL.sft, lr=1e-4))
    assert sft_only.tokenizer_hash == SMALL.tokenizer_hash


def test_hard_kinds():
    def task(qtype: str, hops: int) -> QATask:
        return QATask(
            task_id="q", question="?", golden_answers=("a",), question_type=qtype, n_hops=hops
        )

    assert not is_hard(task("bridge", 2))
    assert (
        is_hard(task("bridge", 3))
        and is_hard(task("comparison", 2))
        and is_hard(task("inference", 2))
    )


def test_cli_init_model_builds_then_reports_the_cache(tmp_path, capsys):
    flags = [
        "init-model",
        "--run-dir",
        str(tmp_path),
        "--no-progress",
        "--policy.vocab-size",
        "600",
        "--policy.model.hidden-size",
        "64",
        "--policy.model.n-layers",
        "2",
        "--policy.model.n-kv-heads",
        "1",
        "--policy.model.intermediate-size",
        "128",
        "--policy.demos.n-worlds",
        "1",
        "--policy.demos.target-variants",
        "1",
        "--policy.sft.max-steps",
        "2",
        "--policy.sft.batch-size",
        "4",
        "--policy.sft.eval-from",
        "2",
        "--policy.eval.n-unseen-questions",
        "4",
        "--policy.eval.n-dev-samples",
        "1",
        "--policy.eval.n-samples",
        "1",
        "--policy.eval.max-action-tokens",
        "16",
        "--policy.env.max-turns",
        "4",
    ]
    flags += [
        f"--policy.world.{k.replace('_', '-')}={v}"
        for k, v in dataclasses.asdict(SMALL.world).items()
        if k != "question_kinds"
    ]
    assert tracerl(flags) == 0
    first = capsys.readouterr().out
    assert "all kinds" in first and "unseen world" in first and "(cached)" not in first
    assert tracerl(flags) == 0
    assert "(cached)" in capsys.readouterr().out
