"""Run keys: a cached run is reused only under its key; `records verify` reruns a record's runs."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.meta import KEY_FILE, claim_run_dir, keyed_run, run_key
from benchmarks.records import main as records_main
from envs import WorldConfig
from harness.tiny_policy import tiny_env_config
from harness.tiny_policy.pipeline import ARTIFACTS_FILE, SHIPPED_DIR
from harness.training import (
    AllocConfig,
    BudgetConfig,
    OptimConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
)

WORLD = WorldConfig(n_countries=2, n_cities=4, n_people=30, n_films=3, n_books=2, n_companies=2,
                    n_universities=1, n_distractors=2, questions_per_kind=1, sentences_per_doc=1,
                    max_hops=2)  # fmt: skip


@pytest.fixture(scope="module")
def policy(tmp_path_factory) -> Path:
    """The shipped warm start's weights, free of its world (no `tiny_policy.json`)."""
    out = tmp_path_factory.mktemp("policy") / "policy"
    shutil.copytree(SHIPPED_DIR, out)
    (out / ARTIFACTS_FILE).unlink()
    return out


def tiny_config(run_dir: Path, policy: Path, seed: int = 0) -> TrainConfig:
    return TrainConfig(
        run_dir=run_dir,
        policy=policy,
        steps=2,
        seed=seed,
        checkpoint_every=1,
        progress=False,
        tensorboard=False,
        torch_threads=1,
        task=TaskConfig(
            world=WORLD,
            env=dataclasses.replace(tiny_env_config(), max_turns=3),
            train_split="all",
            eval_split="test",
        ),
        alloc=AllocConfig.of("trace", continuations_per_rollout=1, explore_frac=0.0),
        budget=BudgetConfig(per_step=8, pool_size=2),
        rollout=RolloutConfig(max_new_tokens=16, max_total_tokens=512),
        optim=OptimConfig(lr=1e-3, micro_batch_size=8),
    )


def test_the_key_covers_allocator_defaults_and_the_start_policy_not_where_the_run_goes(
    tmp_path, policy
):
    base = tiny_config(tmp_path / "a", policy)
    key = run_key(base.to_json())
    assert run_key(dataclasses.replace(base, run_dir=tmp_path / "b", steps=9).to_json()) == key
    other_default = AllocConfig.of("trace", continuations_per_rollout=1, explore_frac=0.0,
                                   min_per_prompt=2)  # fmt: skip
    assert run_key(dataclasses.replace(base, alloc=other_default).to_json()) != key
    assert run_key(dataclasses.replace(base, torch_threads=2).to_json()) != key
    changed = tmp_path / "changed"
    shutil.copytree(policy, changed)
    (changed / "config.json").write_text((changed / "config.json").read_text() + " ")
    assert run_key(dataclasses.replace(base, policy=changed).to_json()) != key


def test_a_run_of_another_key_is_moved_aside_never_resumed(tmp_path):
    run_dir = tmp_path / "run"
    assert claim_run_dir(run_dir, "k1")["key"] == "k1"
    (run_dir / "metrics.jsonl").write_text("{}\n")
    assert claim_run_dir(run_dir, "k1")["key"] == "k1"  # the same key keeps its run
    assert (run_dir / "metrics.jsonl").is_file()
    claim_run_dir(run_dir, "k2")
    assert not (run_dir / "metrics.jsonl").exists()
    assert (tmp_path / "run.stale-k1" / "metrics.jsonl").is_file()
    assert json.loads((run_dir / KEY_FILE).read_text())["key"] == "k2"
    unkeyed = tmp_path / "old"
    unkeyed.mkdir()
    (unkeyed / "metrics.jsonl").write_text("{}\n")  # a run from before keys
    claim_run_dir(unkeyed, "k3")
    assert (tmp_path / "old.stale-unkeyed" / "metrics.jsonl").is_file()


@pytest.mark.slow
def test_verify_reruns_a_tiny_record_and_names_the_row_that_mixes_two_runs(
    tmp_path, policy, capsys
):
    a = keyed_run(tiny_config(tmp_path / "runs" / "a", policy, seed=0))
    b = keyed_run(tiny_config(tmp_path / "runs" / "b", policy, seed=1))
    assert a["fingerprint"]["weights"] != b["fingerprint"]["weights"]
    assert a["code"] == b["code"] and a["key"] != b["key"]  # one code, two settings
    # row 1 claims run a's settings but holds run b's results: what a mixed cache leaves
    mixed = b | {"train_config": a["train_config"], "key": a["key"]}
    record = tmp_path / "record.json"
    record.write_text(json.dumps({"runs": [a, mixed]}))
    work = tmp_path / "verify"
    assert records_main(["verify", str(record), "--sample", "2", "--work", str(work)]) == 1
    out = capsys.readouterr().out.splitlines()  # the trainer's own lines, then each report
    reports = [json.loads(line) for line in out if line.startswith('{"run"')]
    assert [(r["run"], r["same"]) for r in reports] == [(0, True), (1, False)]
    assert reports[0]["key_today"] == a["key"]
    assert reports[1]["first_step_tokens_differ"] in (1, 2)


def test_verify_refuses_a_record_without_keyed_runs(tmp_path, capsys):
    record = tmp_path / "old.json"
    record.write_text(json.dumps({"runs": [{"run": {"seed": 0}, "evals": {}}]}))
    assert records_main(["verify", str(record)]) == 2
    assert "no run with a key" in capsys.readouterr().err
