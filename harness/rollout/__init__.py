"""harness's rollout room: playing a policy through forkable envs, one episode or a tree of them.

- **episodes** (`episodes.py`): `EpisodeCodec` (env text to token ids, never re-tokenised),
  `LiveEpisode` (a running episode that can fork), `start_episodes`, `advance` and
  `apply_turn` (one batched turn), `run_episodes` and `evaluate_policy` (whole episodes),
  `question_kind`;
- **the tree-rollout engine** (`engine.py`): `TreeRolloutEngine`, the `trace_alloc.Executor`
  over any `PolicyBackend`; `leaves_to_train` and `failed_leaves` sort its leaves;
- **featurizers** (`featurizers.py`): `MiniLMFeaturizer`, the predictor's sentence features.
"""

from harness.rollout.engine import (
    EngineStats,
    TreeRolloutEngine,
    failed_leaves,
    leaves_to_train,
)
from harness.rollout.episodes import (
    Episode,
    EpisodeCodec,
    LiveEpisode,
    PlayedTurn,
    PolicyEval,
    advance,
    apply_turn,
    evaluate_policy,
    question_kind,
    run_episodes,
    start_episodes,
)
from harness.rollout.featurizers import MiniLMFeaturizer

__all__ = [
    "EngineStats",
    "Episode",
    "EpisodeCodec",
    "LiveEpisode",
    "MiniLMFeaturizer",
    "PlayedTurn",
    "PolicyEval",
    "TreeRolloutEngine",
    "advance",
    "apply_turn",
    "evaluate_policy",
    "failed_leaves",
    "leaves_to_train",
    "question_kind",
    "run_episodes",
    "start_episodes",
]
