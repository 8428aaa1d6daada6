"""Bootstrap intervals over questions, paired before/after differences, the demo's sentence."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from harness.evaluation.demo import summary_sentence
from harness.evaluation.stats import bootstrap_mean, paired_difference, per_question_mean


def test_per_question_mean_averages_each_questions_samples():
    records = [SimpleNamespace(task_id=q, em=e) for q, e in [("a", 1), ("a", 0), ("b", 1)]]
    assert per_question_mean(records) == {"a": 0.5, "b": 1.0}


def test_interval_contains_the_mean_and_shrinks_with_more_questions():
    rng = np.random.default_rng(0)
    small = bootstrap_mean(rng.random(20))
    large = bootstrap_mean(rng.random(2000))
    assert small.low <= small.mean <= small.high
    assert large.low <= large.mean <= large.high
    assert large.half_width < small.half_width / 5


def test_a_constant_sample_has_a_point_interval():
    est = bootstrap_mean([0.25] * 10)
    assert (est.mean, est.low, est.high, est.n) == (0.25, 0.25, 0.25, 10)
    with pytest.raises(ValueError, match="no values"):
        bootstrap_mean([])


def test_paired_difference_detects_a_shift_that_unpaired_noise_would_hide():
    rng = np.random.default_rng(1)
    before = {f"q{i}": float(v) for i, v in enumerate(rng.random(60))}
    after = {q: v + 0.05 for q, v in before.items()}  # every question +5 points
    gain = paired_difference(before, after)
    assert gain.mean == pytest.approx(0.05)
    assert gain.low == pytest.approx(0.05) and gain.high == pytest.approx(0.05)
    noisy = {q: v + 0.05 + rng.normal(0, 0.1) for q, v in before.items()}
    gain = paired_difference(before, noisy)
    assert gain.low < gain.mean < gain.high


def test_paired_difference_refuses_different_questions():
    with pytest.raises(ValueError, match="different questions"):
        paired_difference({"a": 0.0}, {"b": 1.0})


def _record(
    unseen: tuple[float, float, float],
    facts: tuple[float, float, float],
    decoy: tuple[float, float] = (0.02, 0.01),
) -> dict:
    def side(g):
        mean, low, high = g
        return {
            "before": {"mean": 0.4},
            "after": {"mean": 0.4 + mean},
            "gain": {"mean": mean, "low": low, "high": high},
        }

    before, after = decoy
    return {
        "sets": {
            "unseen": side(unseen),
            "fact_disjoint": side(facts),
            "decoy": {"before": {"mean": before}, "after": {"mean": after}},
        },
        "rl_steps": 60,
        "times": {"train_s": 420.0},
    }


def test_summary_sentence_leads_with_the_unseen_world_gain_and_says_if_it_is_significant():
    text = summary_sentence(_record((0.12, 0.05, 0.19), (0.02, -0.03, 0.07)))
    assert text.startswith(
        "TRACE RL on 60 freshly generated worlds (7.0 min) raised unseen-world EM from 0.400 "
        "to 0.520 (+0.120, 95 % CI [+0.050, +0.190])"
    )
    assert "it raised fact-disjoint EM from 0.400 to 0.420 (+0.020" in text
    assert "not significant), and behind a decoy corpus answered 0.020 -> 0.010" in text
    worse = summary_sentence(_record((-0.1, -0.15, -0.05), (0.0, 0.0, 0.0)))
    assert "lowered unseen-world EM" in worse and "left fact-disjoint EM" in worse
