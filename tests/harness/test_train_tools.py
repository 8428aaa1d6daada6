"""`tracerl train --tool MODULE:CLASS`: the env's tools next to search, from the command line."""

from __future__ import annotations

import json

import pytest
import tyro

from envs import QATask, TaskSet
from envs.errors import EnvConfigError
from harness.training.config import TrainConfig, config_from_dict, tool_flags
from harness.training.task_sources import TaskCorpus
from retrieval.base import Document
from retrieval.bm25 import BM25Retriever

CALC = "envs.tools:CalculatorTool"


def _corpus() -> TaskCorpus:
    tasks = TaskSet([QATask(task_id="q", question="What is 6 times 7?", golden_answers=("42",))])
    retriever = BM25Retriever.build([Document(doc_id="d", title="Six", text="Six is a number.")])
    return TaskCorpus(name="toy", tasks=tasks, retriever=retriever)


def test_a_tool_flag_reaches_the_trainers_envs_and_its_saved_config() -> None:
    config = tyro.cli(TrainConfig, args=tool_flags(["--tool", CALC, "--steps", "3"]))
    assert config.task.env.tools == (CALC,) and config.steps == 3
    env = _corpus().make_env(config.task.env)
    prompt, _ = env.reset(seed=0)
    assert env.tool_names == ("search", "calc") and "<calc> expression </calc>" in prompt
    assert env.step("<calc> 6 * 7 </calc>")[0] == "\n<result>42</result>\n"
    saved = json.loads(json.dumps(config.to_json()))  # what the run folder keeps
    assert config_from_dict(TrainConfig, saved) == config


def test_a_tool_flag_naming_no_tool_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        tyro.cli(TrainConfig, args=tool_flags(["--tool", "calc"]))
    err = " ".join(capsys.readouterr().err.split())  # tyro wraps its box's lines
    assert "tool 'calc': expected MODULE:CLASS" in err
    config = tyro.cli(TrainConfig, args=tool_flags(["--tool", "no_such_module_x:Calc"]))
    with pytest.raises(EnvConfigError, match="cannot import no_such_module_x"):
        _corpus().make_env(config.task.env)  # the trainer builds its envs before any step
