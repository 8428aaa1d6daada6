"""A predictor that generalises and remembers: the text model Ṽψ plus each question's history.

TRACE's Ṽψ reads text only, so a question whose difficulty is not written in its words stays a
coin flip at the root however often it recurs. `MemoryPredictor` keeps Ṽψ as the shared text
model (it still generalises to unseen questions and serves every prefix) and adds, per question,
the outcomes of its own past bare rollouts:

- **Per-question memory.** For a root history x with s successes in n past bare rollouts
  (each weighted by `decay` per step since it was observed, because the policy moves), the
  prediction is the posterior mean of a Beta prior with mean Ṽψ(x) and strength k,

      p(x) = (k Ṽψ(x) + s) / (k + n),

  so a question never seen is the text model's guess and a question seen often is its own
  recent success rate. Prefixes are the text model's alone.
- **Replay buffer of roots.** Each step brings one root per active prompt against hundreds of
  prefixes; the last `replay_size` root examples are replayed into every text-model update
  (their weights decayed like the memory), so the root head keeps learning across steps.
- **Leaf weights.** Every example is weighted by the outcomes behind it (a root with 8 bare
  rollouts counts 8 times a prefix with one leaf).

It is an extension of the paper in the spirit of history-based prompt selection (PCL's on-policy
value model, GRESO's per-prompt history of zero-variance groups); docs/decisions.md,
"Per-question memory".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from trace_alloc.base import Predictor
from trace_alloc.errors import AllocError
from trace_alloc.predictor import check_examples

__all__ = ["MemoryPredictor"]


class MemoryPredictor:
    """Ṽψ(history) as a Beta prior, updated by each question's own decayed bare-rollout outcomes.

    Implements `trace_alloc.base.Predictor`. Roots are recognised by their history text (a
    root's history is its prompt text), so the allocators need no change.

    >>> from trace_alloc.predictor import HashedNgramFeaturizer, MLPPredictor
    >>> pred = MemoryPredictor(MLPPredictor(HashedNgramFeaturizer(dim=64)), prior_strength=2.0)
    >>> _ = pred.update(["Q?"], np.array([0.0]), weights=np.array([6]), is_root=np.array([True]))
    >>> round(float(pred.predict(["Q?"])[0]), 3) < 0.2  # 6 failures outweigh a prior of 2
    True
    """

    def __init__(
        self,
        text_model: Predictor,
        *,
        prior_strength: float = 2.0,
        decay: float = 0.95,
        replay_size: int = 2048,
    ) -> None:
        """Wrap a text model.

        Args:
            text_model: the shared Ṽψ over histories (e.g. `MLPPredictor`).
            prior_strength: k, how many bare rollouts the text model's prediction is worth.
            decay: weight kept per step by a past outcome (memory and replay), in (0, 1].
            replay_size: root examples kept for replay (0: no replay).
        """
        if prior_strength <= 0 or not 0 < decay <= 1 or replay_size < 0:
            raise ValueError(
                f"MemoryPredictor(prior_strength={prior_strength}, decay={decay}, "
                f"replay_size={replay_size}): need prior_strength > 0, 0 < decay <= 1, "
                "replay_size >= 0"
            )
        self.text_model = text_model
        self.prior_strength = prior_strength
        self.decay = decay
        self.replay_size = replay_size
        self._clock = 0  # updates so far: the memory's time axis
        self._index: dict[str, int] = {}  # root history -> row of the memory arrays
        self._keys: list[str] = []
        self._successes = np.zeros(0)  # decayed to `_seen`
        self._trials = np.zeros(0)
        self._seen = np.zeros(0, dtype=np.int64)  # clock of the last update of each row
        self._replay_h: list[str] = []
        self._replay_y = np.zeros(0)
        self._replay_w = np.zeros(0)
        self._replay_t = np.zeros(0, dtype=np.int64)

    # --- Predictor protocol ---

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """The text model's p, moved towards each remembered question's own success rate."""
        p = np.asarray(self.text_model.predict(histories), dtype=np.float64)
        s, n = self.memory(histories)
        k = self.prior_strength
        return np.asarray((k * p + s) / (k + n))

    def update(
        self,
        histories: Sequence[str],
        targets: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        is_root: np.ndarray | None = None,
    ) -> dict[str, float]:
        """One step: remember the roots' outcomes, then train the text model with replay.

        Args:
            histories: node histories (roots and prefixes).
            targets: success rate per node (a root's: its bare rollouts' mean reward).
            weights: outcomes behind each target (1 each if None).
            is_root: which nodes are roots (none if None: nothing is remembered).

        Returns:
            The text model's diagnostics plus `n_replayed` and `n_remembered` (questions in
            memory).

        Raises:
            AllocError: lengths differ, a target is outside [0, 1] or a weight is negative.
        """
        y, w = check_examples(histories, targets, weights)
        roots = np.zeros(len(y), dtype=bool) if is_root is None else np.asarray(is_root, bool)
        if roots.shape != y.shape:
            raise AllocError(f"is_root has shape {roots.shape}, need {y.shape}")
        self._clock += 1
        root_h = [h for h, r in zip(histories, roots, strict=True) if r]
        self._remember(root_h, y[roots].astype(np.float64), w[roots])
        # replayed roots of earlier steps, weighted like the memory (the policy has moved since)
        age = self._clock - self._replay_t
        replay_w = self._replay_w * self.decay**age
        all_h = [*histories, *self._replay_h]
        all_y = np.concatenate([y, self._replay_y])
        all_w = np.concatenate([w, replay_w])
        fit = self.text_model.update(all_h, all_y, weights=all_w, is_root=None)
        self._push_replay(root_h, y[roots].astype(np.float64), w[roots])
        return {
            **fit,
            "n_replayed": float(age.size),
            "n_remembered": float(len(self._keys)),
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """The text model's state (prefixed `text.`), the memory and the replay buffer."""
        state = {f"text.{k}": v for k, v in self.text_model.state_dict().items()}
        state |= {
            "memory.clock": np.array([self._clock], dtype=np.int64),
            "memory.keys": np.array(self._keys, dtype=str),
            "memory.successes": self._successes.copy(),
            "memory.trials": self._trials.copy(),
            "memory.seen": self._seen.copy(),
            "replay.histories": np.array(self._replay_h, dtype=str),
            "replay.targets": self._replay_y.copy(),
            "replay.weights": self._replay_w.copy(),
            "replay.clock": self._replay_t.copy(),
        }
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore `state_dict` output.

        Raises:
            AllocError: a missing key (e.g. a state saved by a predictor without memory).
        """
        missing = sorted(
            k for k in self.state_dict() if not k.startswith("text.") and k not in state
        )
        if missing:
            raise AllocError(f"predictor state lacks {missing}; was it saved by MemoryPredictor?")
        self.text_model.load_state_dict(
            {k.removeprefix("text."): v for k, v in state.items() if k.startswith("text.")}
        )
        self._clock = int(state["memory.clock"][0])
        self._keys = [str(k) for k in state["memory.keys"]]
        self._index = {k: i for i, k in enumerate(self._keys)}
        self._successes = np.asarray(state["memory.successes"], dtype=np.float64).copy()
        self._trials = np.asarray(state["memory.trials"], dtype=np.float64).copy()
        self._seen = np.asarray(state["memory.seen"], dtype=np.int64).copy()
        self._replay_h = [str(h) for h in state["replay.histories"]]
        self._replay_y = np.asarray(state["replay.targets"], dtype=np.float64).copy()
        self._replay_w = np.asarray(state["replay.weights"], dtype=np.float64).copy()
        self._replay_t = np.asarray(state["replay.clock"], dtype=np.int64).copy()

    # --- the memory ---

    def memory(self, histories: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Decayed past successes and bare rollouts of each history (0, 0 if not a known root)."""
        rows = np.array([self._index.get(h, -1) for h in histories], dtype=np.int64)
        known = rows >= 0
        s, n = np.zeros(len(histories)), np.zeros(len(histories))
        factor = self.decay ** (self._clock - self._seen[rows[known]])
        s[known] = self._successes[rows[known]] * factor
        n[known] = self._trials[rows[known]] * factor
        return s, n

    def _remember(self, histories: list[str], rate: np.ndarray, trials: np.ndarray) -> None:
        """Decay each question's memory to now and add this step's bare-rollout outcomes."""
        new = [h for h in dict.fromkeys(histories) if h not in self._index]
        for h in new:
            self._index[h] = len(self._keys)
            self._keys.append(h)
        grow = len(new)
        self._successes = np.concatenate([self._successes, np.zeros(grow)])
        self._trials = np.concatenate([self._trials, np.zeros(grow)])
        self._seen = np.concatenate([self._seen, np.full(grow, self._clock, dtype=np.int64)])
        for h, r, n in zip(histories, rate, trials, strict=True):
            i = self._index[h]
            factor = self.decay ** (self._clock - self._seen[i])
            self._successes[i] = self._successes[i] * factor + r * n
            self._trials[i] = self._trials[i] * factor + n
            self._seen[i] = self._clock

    def _push_replay(self, histories: list[str], rate: np.ndarray, weight: np.ndarray) -> None:
        """Append this step's roots to the replay buffer, dropping the oldest beyond its size."""
        keep = self.replay_size
        if not keep:
            return
        clock = np.full(len(histories), self._clock, dtype=np.int64)
        self._replay_h = [*self._replay_h, *histories][-keep:]
        self._replay_y = np.concatenate([self._replay_y, rate])[-keep:]
        self._replay_w = np.concatenate([self._replay_w, weight])[-keep:]
        self._replay_t = np.concatenate([self._replay_t, clock])[-keep:]
