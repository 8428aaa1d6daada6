"""The determinism benchmark's comparison: NaN equals NaN, timings aside, anything else counts."""

from __future__ import annotations

import math

from benchmarks.perf.determinism import metric_differences


def test_nan_equals_nan_and_timings_are_left_out():
    a = [{"step": 1, "stage2/flip_brier": math.nan, "stage2/p_flip": [], "perf/step_s": 1.0}]
    b = [{"step": 1, "stage2/flip_brier": math.nan, "stage2/p_flip": [], "perf/step_s": 9.0}]
    assert a != b  # what a plain comparison of two logs says: NaN is not NaN
    assert metric_differences(a, b) == []


def test_a_changed_value_a_missing_key_or_a_missing_step_is_named_in_step_order():
    a = [{"step": 1, "x": 1.0, "l": [0.5, math.nan]}, {"step": 2, "x": 2.0, "y": 1}]
    b = [{"step": 1, "x": 1.0, "l": [0.5, 0.25]}, {"step": 2, "x": 2.5}]
    assert metric_differences(a, b) == [(1, "l"), (2, "x"), (2, "y")]
    assert metric_differences(a, b[:1]) == [(1, "l"), (2, "<steps logged>")]
