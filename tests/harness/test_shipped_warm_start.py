"""The warm start shipped with the package: it loads, matches the recipe, and init_model uses it."""

from __future__ import annotations

import dataclasses
import json

import torch
from transformers import AutoModelForCausalLM

from harness.tiny_policy import PolicyArtifacts, TinyPolicyConfig, init_model
from harness.tiny_policy.config import ENV_RECIPE_FIELDS
from harness.tiny_policy.pipeline import ARTIFACTS_FILE, SHIPPED_DIR

RECORD = SHIPPED_DIR / ARTIFACTS_FILE


def test_the_shipped_files_match_the_codes_recipe_hash():
    record = json.loads(RECORD.read_text())
    assert record["config_hash"] == TinyPolicyConfig().config_hash, (
        "the shipped warm start was built from another recipe: rebuild it with "
        "`tracerl init-model --force --run-dir runs/shipped` and copy "
        "runs/shipped/tiny_policy/policy/ to harness/tiny_policy/warm_start/ (README)"
    )
    assert TinyPolicyConfig.from_json(record["config"]) == TinyPolicyConfig()


def test_the_shipped_model_and_tokenizer_load_and_run():
    artifacts = PolicyArtifacts.from_json(json.loads(RECORD.read_text()), SHIPPED_DIR)
    model = AutoModelForCausalLM.from_pretrained(SHIPPED_DIR)
    tokenizer = artifacts.load_tokenizer()
    assert model.config.vocab_size == len(tokenizer)
    ids = tokenizer("Question: Where was the director of The Hollow Window born?\n")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits  # (1, T, V)
    assert logits.shape == (1, len(ids), len(tokenizer)) and torch.isfinite(logits).all()
    assert set(artifacts.evals) == {"heldout_greedy", "heldout_sampled", "unseen_sampled"}


def test_init_model_copies_the_shipped_warm_start_instead_of_training(tmp_path):
    artifacts = init_model(TinyPolicyConfig(), tmp_path)
    assert artifacts.shipped and artifacts.reused
    copied = artifacts.policy_dir / "model.safetensors"
    assert copied.read_bytes() == (SHIPPED_DIR / "model.safetensors").read_bytes()
    again = init_model(TinyPolicyConfig(), tmp_path)  # now the run directory's own cache
    assert again.reused and not again.shipped


def test_another_recipe_is_built_not_taken_from_the_shipped_files(tmp_path, tiny_recipe):
    artifacts = init_model(tiny_recipe, tmp_path)
    assert not artifacts.shipped and not artifacts.reused
    assert artifacts.config_hash == tiny_recipe.config_hash != TinyPolicyConfig().config_hash


def test_the_recorded_hash_is_the_hash_of_the_recorded_recipe():
    record = json.loads(RECORD.read_text())
    assert TinyPolicyConfig.from_json(record["config"]).config_hash == record["config_hash"]
    # the env is recorded by its recipe fields; the other SearchQAConfig fields at their defaults
    # stay out of the record, so the shipped hash did not change when the env type did
    assert set(record["config"]["env"]) == set(ENV_RECIPE_FIELDS)
    assert TinyPolicyConfig().to_json()["env"] == record["config"]["env"]


def test_an_env_setting_outside_the_recipe_enters_the_hash_once_changed():
    base = TinyPolicyConfig()
    changed = dataclasses.replace(base, env=dataclasses.replace(base.env, protocol="search-r1"))
    assert changed.config_hash != base.config_hash
    assert changed.to_json()["env"]["protocol"] == "search-r1"
    assert TinyPolicyConfig.from_json(changed.to_json()) == changed
