"""The launcher's argument plumbing: trace-rl's flags through tyro, OpenRLHF's through OpenRLHF's
own parser (never re-declared), defaults for what the tree trainer needs, and one clear error for
settings it cannot use."""

from __future__ import annotations

import pytest

from benchmarks.cli import main
from harness.errors import HarnessError
from harness.openrlhf.launcher import (
    REWARD_PLACEHOLDER,
    check_openrlhf_args,
    parse_args,
    parse_openrlhf_args,
    split_argv,
)
from trace_alloc import Uniform

BASE = [
    *("--actor.model_name_or_path", "/models/x", "--data.prompt_dataset", "p.jsonl"),
    *("--vllm.num_engines", "1", "--rollout.max_new_tokens", "64"),
    *("--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4"),
    *("--train.batch_size", "8", "--actor.num_gpus_per_node", "1"),
]


def test_split_at_the_first_double_dash():
    assert split_argv(["--seed", "1", "--", "--a", "--", "b"]) == (
        ["--seed", "1"],
        ["--a", "--", "b"],
    )
    assert split_argv([]) == ([], [])


def test_both_halves_parse_and_openrlhf_gets_the_tree_defaults():
    config, args = parse_args(
        ["--seed", "3", "--alloc.name", "uniform", "--alloc.uniform.group-size", "4", "--", *BASE]
    )
    assert config.seed == 3 and config.alloc.build() == Uniform(group_size=4)
    assert args.actor.model_name_or_path == "/models/x"
    assert args.rollout.batch_size == 4 and args.train.batch_size == 8
    assert (args.data.input_key, args.data.label_key) == ("prompt", "task")
    assert args.reward.remote_url == [REWARD_PLACEHOLDER]
    assert args.algo.advantage.estimator == "reinforce"
    # OpenRLHF's own post-processing ran (it fills eps_clip_low_high from eps_clip)
    assert args.actor.eps_clip_low_high == (0.2, 0.2)


def test_user_values_win_over_defaults_and_stray_flags_reach_openrlhf():
    _, args = parse_args(["--data.label_key=my_task", "--", *BASE, "--data.input_key", "q"])
    assert (args.data.input_key, args.data.label_key) == ("q", "my_task")


def test_openrlhf_rejects_unknown_flags_with_its_own_usage(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_openrlhf_args([*BASE, "--no.such_flag", "1"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --no.such_flag" in capsys.readouterr().err


def test_help_after_the_double_dash_is_openrlhfs(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_openrlhf_args(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--actor.model_name_or_path" in out and "--vllm.enable_prefix_caching" in out


def test_unusable_settings_are_all_named_in_one_error():
    args = parse_openrlhf_args(
        [
            *BASE,
            *("--algo.advantage.estimator", "gae", "--algo.dynamic_filtering_enable"),
            *("--reward.overlong_buffer_len", "64", "--train.async_enable"),
            *("--train.batch_size", "12", "--rollout.micro_batch_size", "8"),
        ]
    )
    with pytest.raises(HarnessError) as exc:
        check_openrlhf_args(args)
    message = str(exc.value)
    flags = ("gae", "dynamic_filtering_enable", "overlong_buffer_len", "async_enable")
    for flag in (*flags, "--train.batch_size 12 must be a multiple"):
        assert flag in message


def test_required_flags_are_asked_for():
    args = parse_openrlhf_args(["--rollout.batch_size", "4", "--rollout.n_samples_per_prompt", "4"])
    with pytest.raises(HarnessError) as exc:
        check_openrlhf_args(args)
    message = str(exc.value)
    for flag in ("model_name_or_path", "prompt_dataset", "num_engines", "max_new_tokens"):
        assert flag in message
    check_openrlhf_args(parse_openrlhf_args(BASE))  # the complete set passes


def test_our_config_refuses_a_token_budget_without_a_size(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_args(["--budget.currency", "tokens", "--", *BASE])
    assert exc.value.code == 2
    assert "--budget.per-step" in capsys.readouterr().err


def test_the_flags_are_named_as_in_the_cpu_trainer_and_the_old_names_still_work(caplog):
    config, _ = parse_args(
        ["--loss.advantage", "grpo", "--budget.currency", "tokens", "--budget.per-step", "900",
         "--", *BASE]
    )  # fmt: skip
    assert (config.loss.advantage, config.budget.currency, config.budget.per_step) == (
        "grpo", "tokens", 900
    )  # fmt: skip
    with caplog.at_level("WARNING"):
        old, _ = parse_args(
            ["--advantage", "grpo", "--currency=tokens", "--tokens_per_step", "900", "--", *BASE]
        )
    assert old == config
    assert "--advantage is deprecated: use --loss.advantage" in caplog.text
    assert "--tokens_per_step is deprecated: use --budget.per-step" in caplog.text


@pytest.mark.parametrize(("nodes", "gpus"), [(3, 8), (2, 6)], ids=["3x8", "2x6"])
def test_the_command_line_prints_every_reason_of_a_refusal_one_line_each(nodes, gpus, capsys):
    # the 8B script's batch sizes on a layout whose rank count x 4 does not divide 512
    layout = [
        *("--actor.num_nodes", str(nodes), "--actor.num_gpus_per_node", str(gpus)),
        *("--ref.num_nodes", str(nodes), "--ref.num_gpus_per_node", str(gpus)),
        *("--vllm.num_engines", str(nodes * gpus // 2), "--vllm.tensor_parallel_size", "2"),
        *("--rollout.batch_size", "256", "--rollout.n_samples_per_prompt", "12"),
        *("--train.batch_size", "512", "--rollout.micro_batch_size", "4"),
    ]
    argv = ["train", "--backend", "openrlhf", "--", *BASE, *layout, "--train.async_enable"]
    assert main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [
        "tracerl train: OpenRLHF flags the tree trainer cannot use:",
        "- --train.async_enable is not supported by the tree trainer (synchronous)",
        f"- --train.batch_size 512 must be a multiple of --rollout.micro_batch_size x actor "
        f"ranks = 4 x {nodes * gpus}: then the zero-weight fillers that round a step's leaf "
        "count up never make up a whole optimizer step (whose loss would divide by zero tokens)",
    ]
