"""`benchmarks.research.stream_vs_world`: the comparison paired over seeds, and its arguments."""

from __future__ import annotations

import pytest
from scipy import stats

from benchmarks.research.stream_vs_world import StreamVsWorldArgs, compare


def _evaluation(em: dict[str, float]) -> dict[str, dict[str, object]]:
    return {
        name: {"per_question": em, "by_kind": {"bridge-2hop": sum(em.values()) / len(em)}}
        for name in ("unseen", "fact_disjoint")
    }


def test_compare_pairs_the_arms_seed_by_seed_with_a_t_interval():
    warm = _evaluation({"q1": 0.0, "q2": 0.5})  # EM 0.25
    stream = {0: {"q1": 1.0, "q2": 0.5}, 1: {"q1": 0.5, "q2": 0.5}, 2: {"q1": 1.0, "q2": 1.0}}
    world = {0: {"q1": 0.5, "q2": 0.5}, 1: {"q1": 0.5, "q2": 0.0}, 2: {"q1": 0.5, "q2": 1.0}}
    runs = {
        "stream": {s: _evaluation(em) for s, em in stream.items()},
        "world": {s: _evaluation(em) for s, em in world.items()},
    }
    out = compare(warm, runs, (0, 1, 2))["unseen"]
    assert out["warm_start_em"] == 0.25 and out["n_questions"] == 2
    assert out["em_by_seed"] == {"stream": [0.75, 0.5, 1.0], "world": [0.5, 0.25, 0.75]}
    assert out["gain_by_seed"]["stream"] == [0.5, 0.25, 0.75]
    diff = out["stream_minus_world"]
    assert diff["mean"] == pytest.approx(0.25) and diff["n"] == 3
    assert diff["low"] == diff["high"] == pytest.approx(0.25)  # the same gap on every seed
    # a gap that varies by seed gets the t interval over the seeds, not over questions
    runs["world"][1] = _evaluation({"q1": 0.0, "q2": 0.0})
    diff = compare(warm, runs, (0, 1, 2))["unseen"]["stream_minus_world"]
    diffs = [0.25, 0.5, 0.25]
    half = stats.t.ppf(0.975, 2) * stats.sem(diffs)
    assert diff["mean"] == pytest.approx(1 / 3)
    assert (diff["low"], diff["high"]) == pytest.approx((1 / 3 - half, 1 / 3 + half))


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"seeds": (0,)}, "two or more distinct seeds"), ({"steps": 0}, "--steps must be")],
)
def test_arguments_that_cannot_give_a_comparison_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        StreamVsWorldArgs(**fields)
