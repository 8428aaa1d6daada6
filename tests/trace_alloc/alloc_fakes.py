"""Fakes for the allocation tests: a tiny martingale engine and a fixed predictor."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from trace_alloc import Prompt, Rollout, RolloutRequest, RolloutTree, Turn


class FixedPredictor:
    """Predicts a fixed probability per history (looked up by exact text, else `default`)."""

    def __init__(self, table: Mapping[str, float] | None = None, default: float = 0.5) -> None:
        self.table = dict(table or {})
        self.default = default
        self.updates = 0

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        return np.array([self.table.get(h, self.default) for h in histories], dtype=np.float64)

    def update(
        self, histories: Sequence[str], targets: np.ndarray, **_: np.ndarray | None
    ) -> dict[str, float]:
        self.updates += 1
        return {"n": float(len(histories))}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"default": np.array([self.default])}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.default = float(state["default"][0])


class MartingaleExecutor:
    """Each prompt has a success probability; each search turn moves it as a Beta martingale.

    The latent probability is stored in `turn.info["v"]`; a rollout searches `n_turns - 1`
    times (turn i costs `tokens_per_turn` tokens and one tool call) and then answers.
    """

    def __init__(
        self,
        p_root: Mapping[str, float],
        *,
        seed: int = 0,
        n_turns: int = 3,
        tokens_per_turn: int = 5,
        concentration: float = 4.0,
    ) -> None:
        self.p_root = dict(p_root)
        self.rng = np.random.default_rng(seed)
        self.n_turns = n_turns
        self.tokens_per_turn = tokens_per_turn
        self.concentration = concentration
        self.calls = 0

    def __call__(
        self, trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest]
    ) -> list[list[Rollout]]:
        self.calls += 1
        out = []
        for r in requests:
            tree = trees[r.tree_index]
            node = tree.nodes[r.node_id]
            v0 = self.p_root[tree.prompt_id] if node.turn is None else node.turn.info["v"]
            out.append([self._rollout(v0, node.depth) for _ in range(r.n)])
        return out

    def _rollout(self, v: float, depth: int) -> Rollout:
        turns = []
        for d in range(depth + 1, self.n_turns):
            a, b = self.concentration * v, self.concentration * (1 - v)
            v = float(self.rng.beta(a, b)) if 0 < v < 1 else v
            turns.append(
                Turn(
                    action_text=f" search{d}",
                    action_token_ids=tuple(range(self.tokens_per_turn)),
                    action_logprobs=tuple(-v for _ in range(self.tokens_per_turn)),
                    observation_text=f" obs{round(v, 1)}",
                    observation_token_ids=(7, 7),
                    n_tool_calls=1,
                    info={"v": v},
                )
            )
        reward = float(self.rng.random() < v)
        turns.append(
            Turn(
                action_text=" answer",
                action_token_ids=tuple(range(self.tokens_per_turn)),
                action_logprobs=tuple(-0.1 for _ in range(self.tokens_per_turn)),
                info={"v": reward},
            )
        )
        return Rollout(turns=tuple(turns), reward=reward)


def make_pool(n: int, seed: int = 0) -> tuple[list[Prompt], dict[str, float]]:
    """n prompts with U-shaped success probabilities."""
    rng = np.random.default_rng(seed)
    p = rng.beta(0.5, 0.5, size=n)
    prompts = [Prompt(prompt_id=f"q{i}", text=f"question {i}") for i in range(n)]
    return prompts, {f"q{i}": float(p[i]) for i in range(n)}
