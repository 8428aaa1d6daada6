"""harness's evaluation room: agents, evaluation, `run_bench`, reports and statistics.

The face for Python callers; `tracerl bench` is `run_bench` behind a command line:

    from harness.evaluation import BenchConfig, run_bench

    result = run_bench(BenchConfig(agent=("oracle",), limit=20, out=Path("runs/bench")))
    print(result.reports[0].overall.em)  # the scripted oracle on 20 synthetic questions

- **questions**: `load_data(DataArgs(...))` for what `--dataset`/`--data-file` name (the
  loaders and formats themselves are `envs.qa_datasets`);
- **agents**: `ScriptedAgent`, `PolicyAgent` (a local backend), `HTTPAgent` (an
  OpenAI-compatible endpoint), `DecompositionOracle`, or `make_agent` from `AgentArgs`; for
  `--protocol tools` and `react`, `harness.evaluation.tool_agents`' `ToolCallAgent` and
  `ReActAgent`;
- **evaluation**: `evaluate(agent, env_factory, tasks)` plays the episodes and returns a
  `Report` (EM / sub-EM / F1, per dataset, question type and hop count);
  `evaluate_backend` evaluates a policy backend (the trainer's curve, the demo's table) and
  `evaluate_policy_dir` a transformers policy folder with it; `PolicyEval` summarises a report;
- **a whole run**: `run_bench(BenchConfig(...))` loads, indexes, evaluates and writes the report
  files, resumably (`read_finished` reads a run's finished episodes back); `corpus` is
  `tracerl corpus`;
- **the main job** (`tracerl demo`): `run_demo(DemoConfig(...))`, and the pieces research runs
  reuse: `demo_test_sets`, `demo_train_config`, `evaluate_test_sets`, `train_or_reuse`;
- **statistics**: `bootstrap_mean`, `paired_difference`, `per_question_mean` (95 % intervals over
  questions), `t_interval` (over seeds).
"""

from typing import TYPE_CHECKING

from harness.evaluation.agents import DecompositionOracle, HTTPAgent, ScriptedAgent
from harness.evaluation.bench import (
    AgentArgs,
    BenchConfig,
    BenchResult,
    DataArgs,
    corpus,
    load_data,
    make_agent,
    run_bench,
)
from harness.evaluation.report import write_reports
from harness.evaluation.runs import read_finished
from harness.evaluation.stats import (
    bootstrap_mean,
    paired_difference,
    per_question_mean,
    t_interval,
)
from harness.lazy import lazy_names
from harness.rollout.agent import Agent, PolicyAgent
from harness.rollout.evaluation import (
    EpisodeRecord,
    PolicyEval,
    Report,
    evaluate,
    evaluate_backend,
    evaluate_policy_dir,
)

if TYPE_CHECKING:
    from harness.evaluation.demo import (
        DemoConfig,
        demo_test_sets,
        demo_train_config,
        evaluate_test_sets,
        kind_em,
        run_demo,
        train_or_reuse,
    )

__all__ = [
    "Agent",
    "AgentArgs",
    "BenchConfig",
    "BenchResult",
    "DataArgs",
    "DecompositionOracle",
    "DemoConfig",
    "EpisodeRecord",
    "HTTPAgent",
    "PolicyAgent",
    "PolicyEval",
    "Report",
    "ScriptedAgent",
    "bootstrap_mean",
    "corpus",
    "demo_test_sets",
    "demo_train_config",
    "evaluate",
    "evaluate_backend",
    "evaluate_policy_dir",
    "evaluate_test_sets",
    "kind_em",
    "load_data",
    "make_agent",
    "paired_difference",
    "per_question_mean",
    "read_finished",
    "run_bench",
    "run_demo",
    "t_interval",
    "train_or_reuse",
    "write_reports",
]

# the demo trains (the training room, trace_alloc): loaded on first use, so that `tracerl bench`
# imports neither
__getattr__ = lazy_names(
    __name__,
    {
        name: "harness.evaluation.demo"
        for name in ("DemoConfig", "demo_test_sets", "demo_train_config", "evaluate_test_sets",
                     "kind_em", "run_demo", "train_or_reuse")
    },
)  # fmt: skip
