"""Forkable Gymnasium search/QA environments and the synthetic multi-hop world.

Importing this package registers two environment ids (with the shared-memory guard of
`envs.spaces`, the package's only import-time side effects):

- `trace_rl/SearchQA-v0`: `gymnasium.make("trace_rl/SearchQA-v0", tasks=..., retriever=...)`;
- `trace_rl/SyntheticMultiHop-v0`: self-contained, `gymnasium.make(..., world_seed=0)`.

Both are registered without `TimeLimit` (turn limits live in the env, inside its snapshots),
`OrderEnforcing` and `PassiveEnvChecker` (both keep state a snapshot would miss; the env
enforces order itself, and `check_env` runs in the tests).

This face holds what a user calls or implements (`Tool`, for a tool next to search); the text
protocol (`envs.protocol`), the tools' helpers (`envs.tools`: `ToolResult`, `ToolContext`,
`SearchTool`, `CalculatorTool`), the reward helpers (`envs.rewards`), the snapshot internals
(`envs.snapshot`) and `WorldSplit` (`envs.synthetic`) are imported from their modules.
"""

import gymnasium as gym

from envs.agents import NaiveAgent, OracleAgent, run_agent, run_episode
from envs.base import ForkableEnv
from envs.errors import (
    EnvConfigError,
    EnvError,
    EpisodeStateError,
    RetrievalFailedError,
    SnapshotError,
    SnapshotMismatchError,
    UnknownTaskError,
)
from envs.rewards import score_answer
from envs.search_qa import SearchQAConfig, SearchQAEnv
from envs.snapshot import EnvSnapshot, snapshot_from_dict, snapshot_from_json
from envs.synthetic import World, WorldConfig
from envs.synthetic.env import make_synthetic_env
from envs.tasks import Paragraph, QATask, TaskSet
from envs.tools import Tool, ToolCall
from envs.wrappers import BudgetMeter, ForkableWrapper, fork, restore, snapshot

__all__ = [
    "BudgetMeter",
    "EnvConfigError",
    "EnvError",
    "EnvSnapshot",
    "EpisodeStateError",
    "ForkableEnv",
    "ForkableWrapper",
    "NaiveAgent",
    "OracleAgent",
    "Paragraph",
    "QATask",
    "RetrievalFailedError",
    "SearchQAConfig",
    "SearchQAEnv",
    "SnapshotError",
    "SnapshotMismatchError",
    "TaskSet",
    "Tool",
    "ToolCall",
    "UnknownTaskError",
    "World",
    "WorldConfig",
    "fork",
    "make_synthetic_env",
    "restore",
    "run_agent",
    "run_episode",
    "score_answer",
    "snapshot",
    "snapshot_from_dict",
    "snapshot_from_json",
]

_REGISTERED = {
    "trace_rl/SearchQA-v0": "envs.search_qa:SearchQAEnv",
    "trace_rl/SyntheticMultiHop-v0": "envs.synthetic.env:make_synthetic_env",
}
for _env_id, _entry_point in _REGISTERED.items():
    if _env_id not in gym.registry:
        gym.register(
            id=_env_id,
            entry_point=_entry_point,
            max_episode_steps=None,
            order_enforce=False,
            disable_env_checker=True,
        )
