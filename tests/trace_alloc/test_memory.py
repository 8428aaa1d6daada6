"""The remembering predictor: memory update and decay, replay buffer, leaf weights, AUC split."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from trace_alloc import (
    AllocError,
    MemoryPredictor,
    Predictor,
    Prompt,
    Rollout,
    RolloutTree,
    Turn,
    learn_from_step,
)
from trace_alloc.predictor import HashedNgramFeaturizer, MLPPredictor


class RecordingText:
    """A text model that predicts a constant and records what it is trained on."""

    def __init__(self, p: float = 0.5) -> None:
        self.p = p
        self.calls: list[tuple[list[str], np.ndarray, np.ndarray]] = []

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        return np.full(len(histories), self.p)

    def update(
        self,
        histories: Sequence[str],
        targets: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        is_root: np.ndarray | None = None,
    ) -> dict[str, float]:
        assert weights is not None
        self.calls.append((list(histories), np.asarray(targets), np.asarray(weights)))
        return {"n": float(len(histories))}

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"p": np.array([self.p])}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        self.p = float(state["p"][0])


def roots(*pairs: tuple[str, float, int]) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    h = [p[0] for p in pairs]
    return (
        h,
        np.array([p[1] for p in pairs]),
        np.array([p[2] for p in pairs]),
        np.ones(len(h), bool),
    )


def test_memory_is_a_beta_posterior_around_the_text_model():
    pred = MemoryPredictor(RecordingText(0.5), prior_strength=4.0, decay=1.0)
    assert isinstance(pred, Predictor)
    assert pred.predict(["A?"])[0] == 0.5  # unseen: the text model
    h, y, w, r = roots(("A?", 0.25, 4))
    pred.update(h, y, weights=w, is_root=r)
    # (k μ + s) / (k + n) = (4 · 0.5 + 1) / (4 + 4)
    assert pred.predict(["A?", "B?", "A? <search>"]).tolist() == [3 / 8, 0.5, 0.5]
    pred.update(*roots(("A?", 1.0, 4))[:2], weights=np.array([4]), is_root=np.array([True]))
    assert pred.predict(["A?"])[0] == pytest.approx((2 + 5) / 12)


def test_memory_decays_as_the_policy_moves():
    pred = MemoryPredictor(RecordingText(0.5), prior_strength=2.0, decay=0.5)
    h, y, w, r = roots(("A?", 0.0, 8))
    pred.update(h, y, weights=w, is_root=r)
    assert pred.memory(["A?"]) == (pytest.approx([0.0]), pytest.approx([8.0]))
    pred.update(["other"], np.array([1.0]))  # a step in which A? is not seen
    s, n = pred.memory(["A?"])
    assert n[0] == pytest.approx(4.0)  # one step later: half the weight
    assert pred.predict(["A?"])[0] == pytest.approx(1.0 / 6.0)  # (2 · 0.5 + 0) / (2 + 4)
    pred.update(h, np.array([1.0]), weights=np.array([2]), is_root=r)
    s, n = pred.memory(["A?"])
    assert (s[0], n[0]) == pytest.approx((2.0, 4.0))  # 8 · 0.25 old + 2 new; 0 · 0.25 + 2


def test_replay_buffer_replays_earlier_roots_with_decayed_weights_and_keeps_its_size():
    text = RecordingText()
    pred = MemoryPredictor(text, decay=0.5, replay_size=3)
    pred.update(
        ["A?", "A? s1", "B?"],
        np.array([1.0, 1.0, 0.0]),
        weights=np.array([4, 2, 6]),
        is_root=np.array([True, False, True]),
    )
    assert text.calls[0][0] == ["A?", "A? s1", "B?"]  # nothing to replay yet
    pred.update(["C?"], np.array([0.5]), weights=np.array([2]), is_root=np.array([True]))
    h, y, w = text.calls[1]
    assert h == ["C?", "A?", "B?"]  # only roots are replayed, not the prefix
    assert y.tolist() == [0.5, 1.0, 0.0] and w.tolist() == [2.0, 2.0, 3.0]  # one step: × 0.5
    fit = pred.update(["D?"], np.array([0.0]), weights=np.array([2]), is_root=np.array([True]))
    assert text.calls[2][0] == ["D?", "A?", "B?", "C?"] and fit["n_replayed"] == 3
    pred.update(["E?"], np.array([0.0]), weights=np.array([2]), is_root=np.array([True]))
    assert text.calls[3][0] == ["E?", "B?", "C?", "D?"]  # the oldest root fell out


def test_state_dict_round_trip_keeps_memory_and_replay():
    def make() -> MemoryPredictor:
        return MemoryPredictor(MLPPredictor(HashedNgramFeaturizer(dim=64), hidden=4, seed=1))

    a = make()
    a.update(
        ["A?", "A? s", "B?"],
        np.array([1.0, 0.5, 0.0]),
        weights=np.array([3, 2, 4]),
        is_root=np.array([True, False, True]),
    )
    b = make()
    b.load_state_dict({k: np.array(v) for k, v in a.state_dict().items()})
    probe = ["A?", "B?", "A? s", "C?"]
    assert np.array_equal(a.predict(probe), b.predict(probe))
    for p in (a, b):
        p.update(["C?"], np.array([1.0]), weights=np.array([2]), is_root=np.array([True]))
    assert np.array_equal(a.predict(probe), b.predict(probe))
    with pytest.raises(AllocError, match="memory"):
        make().load_state_dict({k: v for k, v in a.state_dict().items() if "memory" not in k})


def test_bad_inputs_are_named():
    pred = MemoryPredictor(RecordingText())
    with pytest.raises(AllocError, match="weight"):
        pred.update(["A?"], np.array([1.0]), weights=np.array([-1.0]))
    with pytest.raises(AllocError, match="is_root"):
        pred.update(["A?"], np.array([1.0]), is_root=np.array([True, False]))
    with pytest.raises(ValueError, match="decay"):
        MemoryPredictor(RecordingText(), decay=0.0)


def test_leaf_weights_equal_repeating_the_example():
    """A root with 3 outcomes pulls like three copies of it (one full-batch Adam step)."""

    def make() -> MLPPredictor:
        return MLPPredictor(HashedNgramFeaturizer(dim=128), hidden=4, epochs=1, seed=2)

    weighted, repeated = make(), make()
    weighted.update(["easy one", "hard one"], np.array([1.0, 0.0]), weights=np.array([3, 1]))
    repeated.update(["easy one"] * 3 + ["hard one"], np.array([1.0, 1.0, 1.0, 0.0]))
    probe = ["easy one", "hard one", "easy two"]
    assert np.allclose(weighted.predict(probe), repeated.predict(probe), atol=1e-5)
    unweighted = make()
    unweighted.update(["easy one", "hard one"], np.array([1.0, 0.0]))
    assert not np.allclose(weighted.predict(probe), unweighted.predict(probe), atol=1e-5)


def _t(text: str) -> Turn:
    return Turn(action_text=text, action_token_ids=(1,), observation_text=" obs")


def test_learn_from_step_scores_roots_and_prefixes_apart_and_before_learning():
    """Roots ranked right, prefixes ranked wrong: the split shows both; the pool hides it."""
    trees = []
    for name, reward in (("win", 1.0), ("lose", 0.0), ("win2", 1.0), ("lose2", 0.0)):
        tree = RolloutTree.from_prompt(Prompt(prompt_id=name, text=f"{name}?"))
        for _ in range(2):
            tree.add_rollout(0, Rollout(turns=(_t(" s"), _t(" a")), reward=reward))
        trees.append(tree)

    class Scorer(RecordingText):
        def predict(self, histories: Sequence[str]) -> np.ndarray:
            assert not self.calls, "scored after learning"
            root = np.array([h.endswith("?") for h in histories])
            good = np.array([h.startswith("win") for h in histories])
            return np.where(root, np.where(good, 0.9, 0.1), np.where(good, 0.2, 0.8))

    scorer = Scorer()
    metrics = learn_from_step(scorer, trees)
    assert metrics["predictor/auc_root"] == 1.0
    assert metrics["predictor/auc_prefix"] == 0.0
    assert 0.0 < metrics["predictor/auc"] < 1.0
    assert metrics["predictor/n_roots"] == 4 and metrics["predictor/n_nodes"] == 12
    h, _, w = scorer.calls[0]  # then it learned every node, weighted by its outcomes
    assert len(h) == 12 and w.tolist() == [2, 1, 1] * 4
    assert learn_from_step(scorer, [RolloutTree.from_prompt(Prompt(prompt_id="e", text="e"))]) == {}
