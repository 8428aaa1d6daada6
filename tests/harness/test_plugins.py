"""`harness.plugins.load_plugin`: a user's `MODULE:CLASS`, built and checked, or a clear error."""

from __future__ import annotations

import pytest

from harness.errors import PluginError
from harness.plugins import load_plugin, parse_kwargs
from harness.training import AllocConfig, TaskSource, TrainConfig
from trace_alloc import Allocator, Uniform


def test_a_class_is_imported_built_with_its_kwargs_and_checked():
    allocator = load_plugin("trace_alloc:Uniform", Allocator, kwargs={"group_size": 3}, flag="-a")
    assert allocator == Uniform(group_size=3)


@pytest.mark.parametrize(
    ("spec", "kwargs", "message"),
    [
        ("trace_alloc.Uniform", {}, "expected MODULE:CLASS"),
        ("no_such_module_here:Rule", {}, "no module named 'no_such_module_here'"),
        ("trace_alloc:NoSuchRule", {}, "has no attribute 'NoSuchRule'"),
        ("trace_alloc:__doc__", {}, "is a str, not a class"),
        ("trace_alloc:Uniform", {"size": 3}, "cannot build it with {'size': 3}"),
        (
            "trace_alloc:BudgetLimit",
            {},
            "BudgetLimit does not follow the Allocator protocol: it lacks ask",
        ),
    ],
)
def test_each_mistake_names_what_went_wrong(spec, kwargs, message):
    with pytest.raises(PluginError, match=message.replace("(", r"\(").replace("{", r"\{")):
        load_plugin(spec, Allocator, kwargs=kwargs, flag="--allocator")


def test_a_task_source_is_checked_against_its_protocol():
    with pytest.raises(
        PluginError, match="the TaskSource protocol: it lacks corpus, fixed_ids, seed"
    ):
        load_plugin("trace_alloc:Uniform", TaskSource, flag="--task-source")


@pytest.mark.parametrize(
    ("text", "message"), [("{x: 1}", "is not JSON"), ("[1, 2]", "must be a JSON object")]
)
def test_keyword_arguments_must_be_a_json_object(text, message):
    with pytest.raises(PluginError, match=message):
        parse_kwargs(text, flag="--allocator-kwargs")


def test_the_config_refuses_kwargs_without_a_class_and_bad_json_at_parse_time():
    with pytest.raises(PluginError, match="--allocator-kwargs needs --allocator"):
        TrainConfig(allocator_kwargs='{"n": 1}')
    with pytest.raises(PluginError, match="--task-source-kwargs needs --task-source"):
        TrainConfig(task_source_kwargs='{"n": 1}')
    with pytest.raises(PluginError, match="is not JSON"):
        TrainConfig(allocator="trace_alloc:Uniform", allocator_kwargs="{n: 1}")


def test_without_a_flag_the_named_allocator_is_built():
    config = TrainConfig(alloc=AllocConfig.of("uniform", group_size=4))
    assert config.build_allocator(config.alloc) == Uniform(group_size=4)
    mine = TrainConfig(allocator="trace_alloc:Uniform", allocator_kwargs='{"group_size": 2}')
    assert mine.build_allocator(mine.alloc) == Uniform(group_size=2)
