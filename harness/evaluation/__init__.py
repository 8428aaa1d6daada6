"""The `tracerl bench` library: QA datasets, agents, evaluation, reports and statistics.

The front door for Python callers; `tracerl bench` is `run_bench` behind a command line:

    from harness.evaluation import BenchConfig, run_bench

    result = run_bench(BenchConfig(agent=("oracle",), limit=20, out=Path("runs/bench")))
    print(result.reports[0].overall.em)  # the scripted oracle on 20 synthetic questions

- **questions**: `load_named` (a registry name: HotpotQA, 2Wiki, MuSiQue, NQ, ...), `load_file`
  (FlashRAG, Search-R1 parquet, the datasets' own JSON, `tracerl world` exports), or
  `load_data(DataArgs(...))` for what `--dataset`/`--data-file` name;
- **agents**: `ScriptedAgent`, `PolicyAgent` (a local backend), `HTTPAgent` (an
  OpenAI-compatible endpoint), `DecompositionOracle`, or `make_agent` from `AgentArgs`;
- **evaluation**: `evaluate(agent, env_factory, tasks)` plays the episodes and returns a
  `Report` (EM / sub-EM / F1, per dataset, question type and hop count);
  `evaluate_policy_dir` evaluates a local transformers policy on given questions;
- **a whole run**: `run_bench(BenchConfig(...))` loads, indexes, evaluates and writes the report
  files, resumably;
- **statistics**: `bootstrap_mean`, `paired_difference`, `per_question_mean` (95 % intervals over
  questions), `t_interval` (over seeds).
"""

from envs.qa_datasets.errors import (
    BenchmarkError,
    DatasetFormatError,
    DatasetUnavailable,
    NoParagraphsError,
    UnknownBenchmarkNameError,
)
from envs.qa_datasets.loaders import DATASETS, LoadedDataset, load_file, load_named
from harness.evaluation.agents import (
    Agent,
    AgentAction,
    DecompositionOracle,
    HTTPAgent,
    PolicyAgent,
    ScriptedAgent,
)
from harness.evaluation.bench import (
    AgentArgs,
    BenchConfig,
    BenchResult,
    DataArgs,
    LoadedData,
    load_data,
    make_agent,
    run_bench,
)
from harness.evaluation.evaluation import (
    EpisodeRecord,
    Metrics,
    Report,
    evaluate,
    evaluate_policy_dir,
)
from harness.evaluation.report import write_reports
from harness.evaluation.stats import (
    Estimate,
    bootstrap_mean,
    paired_difference,
    per_question_mean,
    t_interval,
)

__all__ = [
    "DATASETS",
    "Agent",
    "AgentAction",
    "AgentArgs",
    "BenchConfig",
    "BenchResult",
    "BenchmarkError",
    "DataArgs",
    "DatasetFormatError",
    "DatasetUnavailable",
    "DecompositionOracle",
    "EpisodeRecord",
    "Estimate",
    "HTTPAgent",
    "LoadedData",
    "LoadedDataset",
    "Metrics",
    "NoParagraphsError",
    "PolicyAgent",
    "Report",
    "ScriptedAgent",
    "UnknownBenchmarkNameError",
    "bootstrap_mean",
    "evaluate",
    "evaluate_policy_dir",
    "load_data",
    "load_file",
    "load_named",
    "make_agent",
    "paired_difference",
    "per_question_mean",
    "run_bench",
    "t_interval",
    "write_reports",
]
