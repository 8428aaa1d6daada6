import numpy as np
import pytest

from trace_alloc import AllocError, FlipCalibrator


def test_without_data_the_calibration_is_the_identity():
    p = np.array([0.01, 0.2, 0.5, 0.9])
    np.testing.assert_allclose(FlipCalibrator()(p), p)


def test_it_learns_that_its_chances_are_too_high():
    rng = np.random.default_rng(0)
    raw = rng.uniform(0.3, 0.8, size=2000)
    flipped = rng.random(2000) < raw - 0.2  # every chance overstates the flips by 0.2
    calibrator = FlipCalibrator()
    calibrator.observe(raw.tolist(), flipped.tolist())
    brier_raw = np.mean((raw - flipped) ** 2)
    brier = np.mean((calibrator(raw) - flipped) ** 2)
    assert brier < brier_raw - 0.02
    assert calibrator(np.array([0.6]))[0] == pytest.approx(0.4, abs=0.05)


def test_the_prior_keeps_a_few_flips_from_moving_it_far():
    calibrator = FlipCalibrator(prior_strength=20.0)
    calibrator.observe([0.6, 0.6], [0, 0])
    assert calibrator(np.array([0.6]))[0] > 0.5


def test_the_window_forgets_old_continuations():
    calibrator = FlipCalibrator(prior_strength=1.0, window=100)
    calibrator.observe([0.5] * 100, [1] * 100)
    calibrator.observe([0.5] * 100, [0] * 100)  # the window now holds only these
    assert calibrator.n_observed == 100
    assert calibrator(np.array([0.5]))[0] < 0.1


def test_state_round_trips_and_an_old_checkpoint_leaves_it_fresh():
    calibrator = FlipCalibrator()
    calibrator.observe([0.7, 0.4, 0.6], [0, 1, 0])
    restored = FlipCalibrator()
    restored.load_state_dict({"predictor.other": np.zeros(1), **calibrator.state_dict()})
    assert (restored.a, restored.b, restored.n_observed) == (
        calibrator.a,
        calibrator.b,
        calibrator.n_observed,
    )
    fresh = FlipCalibrator()
    fresh.load_state_dict({"param.w": np.zeros(2)})  # written before the calibrator
    assert (fresh.a, fresh.b, fresh.n_observed) == (1.0, 0.0, 0)


def test_bad_observations_are_refused():
    calibrator = FlipCalibrator()
    with pytest.raises(AllocError, match="equal"):
        calibrator.observe([0.5, 0.5], [1])
    with pytest.raises(AllocError, match=r"\[0, 1\]"):
        calibrator.observe([1.5], [1])
    with pytest.raises(ValueError, match="prior_strength"):
        FlipCalibrator(prior_strength=0.0)
