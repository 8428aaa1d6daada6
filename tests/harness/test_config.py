"""One config for both trainers: the allocators' own settings, round trips, old run directories."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest
import tyro

from envs import SearchQAConfig
from harness.errors import ResumeError
from harness.openrlhf.config import TreeTrainConfig
from harness.training.config import (
    AdvantageConfig,
    AllocatorSettings,
    AllocConfig,
    EvalConfig,
    LossConfig,
    PredictorConfig,
    RolloutConfig,
    TaskConfig,
    TrainConfig,
    config_from_dict,
    load_config,
    renamed_flags,
)
from trace_alloc import ConstantPredictor, MemoryPredictor, MLPPredictor, Trace
from trace_alloc.allocators import ALLOCATORS


def test_every_allocator_has_its_own_dataclass_as_a_field():
    hints = {f.name: f.type for f in dataclasses.fields(AllocatorSettings)}
    assert set(hints) == set(ALLOCATORS)
    settings = AllocatorSettings()
    for name, cls in ALLOCATORS.items():
        assert type(getattr(settings, name)) is cls


def _another_value(value: object) -> str:
    """A value other than an allocator field's default that the allocator accepts."""
    if value is None:
        return "3"
    if isinstance(value, int):
        return str(value + 1)
    if isinstance(value, float):
        return str(value / 2)
    return "uniform" if value == "active" else "active"  # stage1 / stage2


@pytest.mark.parametrize("cls", [TrainConfig, TreeTrainConfig])
def test_every_field_of_every_allocator_is_a_flag_of_both_trainers(cls):
    n_fields = 0
    for name, allocator in ALLOCATORS.items():
        for f in dataclasses.fields(allocator):
            value = getattr(allocator(), f.name)
            flag = f"--alloc.{name}.{f.name}".replace("_", "-")
            if isinstance(value, bool):  # tyro's --x / --no-x
                other = str(not value)
                given = [flag.replace(f"{name}.", f"{name}.no-") if value else flag]
            else:
                other = _another_value(value)
                given = [flag, other]
            config = tyro.cli(cls, args=["--alloc.name", name, *given])
            assert str(getattr(config.alloc.build(), f.name)) == other, (cls, given)
            n_fields += 1
    assert n_fields >= 20  # Trace alone has 9


def test_tracerl_train_sets_trace_min_per_prompt_prefer_unmixed_and_the_flip_floor():
    # pooling is off unless asked for; the flip floor is on, over the posterior on the tree's
    # own outcomes (docs/decisions.md, "Stage 2")
    default = tyro.cli(TrainConfig, args=["--alloc.name", "trace"]).alloc.build()
    assert default.prefer_unmixed is False
    assert default.min_flip_prob == 0.2 and default.prefix_prior == 1.0
    argv = ["--alloc.name", "trace", "--alloc.trace.min-per-prompt", "2",
            "--alloc.trace.prefer-unmixed", "--alloc.trace.min-flip-prob", "0.1",
            "--alloc.trace.prefix-prior", "None"]  # fmt: skip
    config = tyro.cli(TrainConfig, args=argv)
    assert config.alloc.build() == Trace(
        min_per_prompt=2, prefer_unmixed=True, min_flip_prob=0.1, prefix_prior=None
    )
    assert config.alloc.uses_predictor


def test_a_field_of_another_allocator_is_an_error_not_a_silent_no_op(capsys):
    with pytest.raises(ValueError, match=r"--alloc.trace.continuations-per-rollout does not apply"):
        AllocConfig(name="uniform", trace=Trace(continuations_per_rollout=2))
    assert AllocConfig.of("uniform", group_size=4).build().group_size == 4
    with pytest.raises(SystemExit):
        tyro.cli(TrainConfig, args=["--alloc.dynamic-sampling.batch-size", "3"])
    assert "--alloc.dynamic-sampling.batch-size does not apply to allocator 'trace'" in " ".join(
        capsys.readouterr().err.split()
    ).replace("│ ", "")


def test_config_survives_its_json_round_trip(tmp_path: Path):
    config = TrainConfig(
        run_dir=tmp_path,
        eval=EvalConfig(every=3),
        task=TaskConfig(questions="hard"),
        alloc=AllocConfig.of("trace", min_per_prompt=2, stage2="uniform"),
    )
    again = config_from_dict(TrainConfig, json.loads(json.dumps(config.to_json())))
    assert again == config
    (tmp_path / "config.json").write_text(json.dumps(config.to_json()))
    assert load_config(tmp_path) == config


def test_a_run_directory_of_the_old_layout_reads_as_the_same_config(tmp_path: Path):
    new = TrainConfig(run_dir=tmp_path, alloc=AllocConfig.of("trace", continuations_per_rollout=0,
                                                             stage1="uniform"))  # fmt: skip
    old = new.to_json()
    knobs = ["group_size", "max_per_prompt", "continuations_per_rollout", "stage1", "stage2",
             "explore_frac", "p_clip", "batch_size", "wave_groups", "target", "roots_per_prompt",
             "expansions_per_iteration", "iterations", "penalty"]  # fmt: skip
    old["alloc"] = {"name": "trace", **dict.fromkeys(knobs)}
    old["alloc"] |= {"continuations_per_rollout": 0, "stage1": "uniform"}
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config(tmp_path) == new
    old["alloc"] = {"name": "uniform", **dict.fromkeys(knobs), "penalty": 0.3}
    (tmp_path / "config.json").write_text(json.dumps(old))
    with pytest.raises(ResumeError, match="start a new --run-dir"):
        load_config(tmp_path)


def test_both_trainers_build_the_predictor_the_config_names():
    constant = PredictorConfig(kind="constant", prior=0.3).build(seed=0)
    assert isinstance(constant, ConstantPredictor) and constant.p == 0.3
    remembering = PredictorConfig(prior_strength=3.0).build(seed=0)
    assert isinstance(remembering, MemoryPredictor) and remembering.prior_strength == 3.0
    assert isinstance(remembering.text_model, MLPPredictor)
    assert isinstance(PredictorConfig(memory=False).build(seed=0), MLPPredictor)


def test_both_trainers_take_the_same_allocator_and_predictor_types():
    cpu, gpu = typing.get_type_hints(TrainConfig), typing.get_type_hints(TreeTrainConfig)
    assert cpu["alloc"] is gpu["alloc"] is AllocConfig
    assert cpu["predictor"] is gpu["predictor"] is PredictorConfig


def test_each_concept_has_one_flag_and_one_type_in_both_trainers():
    cpu, gpu = typing.get_type_hints(TrainConfig), typing.get_type_hints(TreeTrainConfig)
    assert issubclass(cpu["loss"], gpu["loss"]) and gpu["loss"] is AdvantageConfig
    assert typing.get_type_hints(TaskConfig)["env"] is gpu["env"] is SearchQAConfig
    cpu_currency = typing.get_type_hints(cpu["budget"])["currency"]
    assert cpu_currency == typing.get_type_hints(gpu["budget"])["currency"]
    flags = ["--loss.advantage", "grpo", "--budget.currency", "tokens", "--budget.per-step", "900"]
    ours = tyro.cli(TrainConfig, args=flags)
    theirs = tyro.cli(TreeTrainConfig, args=flags)
    assert ours.loss.advantage == theirs.loss.advantage == "grpo"
    assert (ours.budget.currency, ours.budget.per_step) == ("tokens", 900)
    assert (theirs.budget.currency, theirs.budget.per_step) == ("tokens", 900)
    assert LossConfig().advantage == AdvantageConfig().advantage  # one default


def test_old_flag_names_are_read_as_the_new_ones_with_a_warning(caplog):
    with caplog.at_level("WARNING"):
        argv = renamed_flags(["--advantage", "treerl", "--currency=tokens", "--seed", "1"])
    assert argv == ["--loss.advantage", "treerl", "--budget.currency=tokens", "--seed", "1"]
    assert caplog.text.count("is deprecated") == 2
    assert renamed_flags(["--tokens-per-step", "5"]) == ["--budget.per-step", "5"]


def test_held_out_episodes_sample_at_the_rollout_temperature_unless_told_otherwise(tmp_path):
    rollout = RolloutConfig(temperature=0.7)
    assert EvalConfig().temperature_for(rollout) == 0.7
    assert EvalConfig(temperature=0).temperature_for(rollout) == 0  # greedy
    config = tyro.cli(TrainConfig, args=["--rollout.temperature", "0.6"])
    assert config.eval.temperature_for(config.rollout) == 0.6
    old = TrainConfig(run_dir=tmp_path).to_json()
    old["eval"]["temperature"] = 1.0  # a run directory written before the default followed
    (tmp_path / "config.json").write_text(json.dumps(old))
    assert load_config(tmp_path).eval.temperature_for(rollout) == 1.0
