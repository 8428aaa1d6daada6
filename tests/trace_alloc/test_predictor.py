"""The default predictor: cold start, learning, exploration floor, checkpoints; calibration."""

from __future__ import annotations

import numpy as np
import pytest

from trace_alloc import AllocError, Predictor
from trace_alloc.calibration import calibration_report
from trace_alloc.predictor import ConstantPredictor, HashedNgramFeaturizer, MLPPredictor


def world(seed: int, n: int):
    """Histories whose success depends on two keyword families; names are noise."""
    rng = np.random.default_rng(seed)
    easy = [f"easy{i}" for i in range(20)]
    hard = [f"hard{i}" for i in range(20)]
    histories, outcomes = [], []
    for _ in range(n):
        is_easy = rng.random() < 0.5
        words = rng.choice(easy if is_easy else hard, 3)
        histories.append(f"question about {' '.join(words)} named x{rng.integers(10**9)}")
        outcomes.append(float(rng.random() < (0.85 if is_easy else 0.15)))
    return histories, np.array(outcomes)


@pytest.mark.parametrize(("hidden", "lr"), [(0, 3e-2), (16, 3e-3)])
def test_predictor_learns_and_generalises_to_unseen_histories(hidden, lr):
    pred = MLPPredictor(HashedNgramFeaturizer(dim=1024), hidden=hidden, lr=lr, seed=1)
    assert isinstance(pred, Predictor)
    test_h, test_y = world(99, 400)
    cold = calibration_report(pred.predict(test_h), test_y)
    assert np.allclose(pred.predict(test_h), 0.5)  # cold start: the prior
    for step in range(15):
        h, y = world(step, 200)
        diag = pred.update(h, y)
    assert diag["loss_after"] < diag["loss_before"] + 1e-9
    warm = calibration_report(pred.predict(test_h), test_y)
    assert warm.auc > 0.8 and warm.brier < cold.brier - 0.05


def test_far_histories_are_shrunk_towards_the_prior():
    pred = MLPPredictor(HashedNgramFeaturizer(dim=1024), hidden=0, lr=3e-2, seed=0)
    for step in range(15):
        pred.update(*world(step, 200))
    familiar = pred.predict(["question about easy1 easy2 easy3 named x1"])[0]
    alien = pred.predict(["zzz qqq vvv www uuu"])[0]
    assert familiar > 0.7
    assert abs(alien - 0.5) < 0.05


def test_state_dict_round_trip_resumes_exactly():
    a = MLPPredictor(HashedNgramFeaturizer(dim=256), hidden=8, seed=3)
    a.update(*world(0, 100))
    b = MLPPredictor(HashedNgramFeaturizer(dim=256), hidden=8, seed=7)
    b.load_state_dict({k: v.copy() for k, v in a.state_dict().items()})
    h, y = world(1, 50)
    assert np.array_equal(a.predict(h), b.predict(h))
    a.update(h, y)
    b.update(h, y)  # same generator state: same shuffles, same weights
    assert np.array_equal(a.predict(h), b.predict(h))
    for v in a.state_dict().values():
        assert isinstance(v, np.ndarray) and v.dtype != object


@pytest.mark.parametrize("sizes", [(10, 7, 13, 5), (3, 11, 10, 9), (2, 10, 6, 12)])
def test_a_resumed_predictor_is_bit_identical_after_any_step(sizes, tmp_path):
    """Resume from every step, through the checkpoint's npz: every array equals, bit for bit.

    Short updates leave half of a generator word buffered (a bounded draw below 2**32 uses 32
    bits); the saved state must carry it, or the resumed run shuffles differently.
    """
    from trace_alloc.memory import MemoryPredictor

    def build(seed: int) -> MemoryPredictor:
        text = MLPPredictor(HashedNgramFeaturizer(dim=256), hidden=8, batch_size=4, seed=seed)
        return MemoryPredictor(text)

    steps = [world(10 + i, n) for i, n in enumerate(sizes)]
    for resume_at in range(1, len(steps)):
        straight, resumed = build(3), build(3)
        for h, y in steps[:resume_at]:
            resumed.update(h, y, is_root=np.arange(len(h)) % 2 == 0)
        np.savez(tmp_path / "p.npz", **resumed.state_dict())
        resumed = build(8)  # a fresh process: other initial weights, overwritten by the load
        with np.load(tmp_path / "p.npz") as data:
            resumed.load_state_dict({k: data[k] for k in data.files})
        for h, y in steps[resume_at:]:
            resumed.update(h, y, is_root=np.arange(len(h)) % 2 == 0)
        for h, y in steps:
            straight.update(h, y, is_root=np.arange(len(h)) % 2 == 0)
        a, b = straight.state_dict(), resumed.state_dict()
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and np.array_equal(a[key], b[key]), (resume_at, key)


def test_a_state_saved_without_the_generator_buffer_still_loads():
    a = MLPPredictor(HashedNgramFeaturizer(dim=64), hidden=4, seed=1)
    old = a.state_dict() | {"rng": a.state_dict()["rng"][:4]}  # as checkpoints before the fix
    b = MLPPredictor(HashedNgramFeaturizer(dim=64), hidden=4, seed=2)
    b.load_state_dict(old)
    assert np.array_equal(b.state_dict()["rng"], a.state_dict()["rng"])  # fresh: empty buffer


def test_load_rejects_a_mismatched_state():
    a = MLPPredictor(HashedNgramFeaturizer(dim=256), hidden=8)
    b = MLPPredictor(HashedNgramFeaturizer(dim=128), hidden=8)
    with pytest.raises(AllocError, match="shape"):
        b.load_state_dict(a.state_dict())
    with pytest.raises(AllocError, match="lacks"):
        b.load_state_dict({})


def test_update_rejects_bad_targets():
    pred = MLPPredictor(HashedNgramFeaturizer(dim=64))
    with pytest.raises(AllocError, match="target"):
        pred.update(["a", "b"], np.array([0.5, 1.5]))
    with pytest.raises(AllocError, match="target"):
        pred.update(["a"], np.array([0.5, 0.5]))


def test_featurizer_is_deterministic_and_reads_head_and_tail():
    f = HashedNgramFeaturizer(dim=512, head_words=3, tail_words=2)
    a = f.featurize(["one two three four five six"])
    assert np.array_equal(a, f.featurize(["one two three four five six"]))
    # a change in the middle (neither head nor tail) is invisible; one in the tail is not
    assert np.array_equal(a, f.featurize(["one two three nine five six"]))
    assert not np.array_equal(a, f.featurize(["one two three four five seven"]))
    with pytest.raises(ValueError, match="dim"):
        HashedNgramFeaturizer(dim=2)


def test_calibration_report_on_known_values():
    perfect = calibration_report(np.array([1.0, 0.0]), np.array([1.0, 0.0]))
    assert perfect.brier == 0.0 and perfect.auc == 1.0 and perfect.brier_skill == 1.0
    coin = calibration_report(np.full(4, 0.5), np.array([1.0, 0.0, 1.0, 0.0]))
    assert coin.brier == 0.25 and coin.auc == 0.5 and coin.bin_p == (0.5,) and coin.bin_y == (0.5,)
    one_sided = calibration_report(np.array([0.3, 0.4]), np.array([1.0, 1.0]))
    assert np.isnan(one_sided.auc)
    soft = calibration_report(np.array([0.2, 0.8]), np.array([0.5, 0.5]), np.array([2, 2]))
    leafwise = calibration_report(np.array([0.2, 0.2, 0.8, 0.8]), np.array([1.0, 0, 1, 0]))
    assert soft.brier == pytest.approx(leafwise.brier) and soft.auc == pytest.approx(leafwise.auc)
    assert set(soft.to_dict()) >= {"brier", "auc", "reliability"}


def test_the_constant_predictor_is_the_predictor_off_ablation():
    predictor = ConstantPredictor(0.3)
    assert isinstance(predictor, Predictor)
    predictor.update(["a", "b"], np.array([1.0, 1.0]))
    assert predictor.predict(["a", "b", "c"]).tolist() == [0.3, 0.3, 0.3]
    other = ConstantPredictor(0.5)
    other.load_state_dict(predictor.state_dict())
    assert other.predict(["x"]).tolist() == [0.3]
