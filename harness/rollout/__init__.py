"""harness's rollout room: playing a policy through forkable envs, one episode or a tree of them.

- **episodes** (`episodes.py`): `EpisodeCodec` (env text to token ids, never re-tokenised),
  `LiveEpisode` (a running episode that can fork), `start_episodes`, `advance` and
  `apply_turn` (one batched turn), `run_episodes` (whole episodes), `question_kind`;
- **agents and the evaluator** (`agent.py`, `evaluation.py`): the `Agent` protocol and
  `PolicyAgent` (a `PolicyBackend` behind it); `evaluate` plays one episode per question and
  scores it into a `Report`, and `evaluate_backend` is that for a policy backend: the one
  evaluator of the trainer's held-out curve, the demo's table and `tracerl bench` (faced by
  `harness.evaluation`);
- **the tree-rollout engine** (`engine.py`): `TreeRolloutEngine`, the `trace_alloc.Executor`
  over any `PolicyBackend`; `leaves_to_train` and `failed_leaves` sort its leaves;
- **featurizers** (`featurizers.py`): `MiniLMFeaturizer`, the predictor's sentence features.
"""

from typing import TYPE_CHECKING

from harness.lazy import lazy_names
from harness.rollout.episodes import (
    Episode,
    EpisodeCodec,
    LiveEpisode,
    PlayedTurn,
    advance,
    apply_turn,
    question_kind,
    run_episodes,
    start_episodes,
)
from harness.rollout.featurizers import MiniLMFeaturizer

if TYPE_CHECKING:
    from harness.rollout.engine import (
        EngineStats,
        TreeRolloutEngine,
        failed_leaves,
        leaves_to_train,
    )

__all__ = [
    "EngineStats",
    "Episode",
    "EpisodeCodec",
    "LiveEpisode",
    "MiniLMFeaturizer",
    "PlayedTurn",
    "TreeRolloutEngine",
    "advance",
    "apply_turn",
    "failed_leaves",
    "leaves_to_train",
    "question_kind",
    "run_episodes",
    "start_episodes",
]

# the engine imports trace_alloc: loaded on first use, so that playing episodes (`tracerl bench`)
# does not load the training side's allocation library
__getattr__ = lazy_names(
    __name__,
    {
        name: "harness.rollout.engine"
        for name in ("EngineStats", "TreeRolloutEngine", "failed_leaves", "leaves_to_train")
    },
)
