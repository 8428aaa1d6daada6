"""The experiment's equal-token comparisons, on small synthetic result records."""

from __future__ import annotations

import math

import pytest

from benchmarks.research.experiment import _paired_tokens, _tokens_to_grpo_final


def record(label: str, seed: int, ems: list[float], tokens: list[float], series="tokens"):
    """A run summary as `main` builds it: evaluations after steps 1..n, cumulative tokens."""
    return {
        "group": "main",
        "series": series,
        "label": label,
        "seed": seed,
        "evals": {str(i + 1): {"heldout": {"em": em}} for i, em in enumerate(ems)},
        "tokens_by_step": tokens,
    }


def runs_of(*records):
    return {f"{r['series']}-{r['label']}-{r['seed']}": r for r in records}


def test_paired_tokens_compares_each_seed_at_equal_tokens():
    runs = runs_of(
        record("trace", 0, [0.30, 0.40], [100, 200]),
        record("uniform", 0, [0.25, 0.30], [100, 200]),
        record("trace", 1, [0.32, 0.44], [100, 200]),
        record("uniform", 1, [0.26, 0.36], [100, 200]),
        record("trace", 2, [0.31, 0.41], [100, 200]),
        record("uniform", 2, [0.24, 0.30], [100, 200]),
    )
    out = _paired_tokens(runs, 0.2, "trace")
    assert out is not None
    assert out["diffs"] == pytest.approx([0.10, 0.08, 0.11])
    assert out["diff"] == pytest.approx(0.29 / 3)
    assert 0 < out["p"] < 0.05  # a consistent gain over three seeds
    assert _paired_tokens(runs, 0.2, "random_tree") is None


def test_paired_tokens_interpolates_when_one_method_spent_less():
    """GRPO stopped at 150 tokens: TRACE is read off its curve at 150, not at its end."""
    runs = runs_of(
        record("trace", 0, [0.3, 0.5], [100, 200], series="leaves"),
        record("uniform", 0, [0.3, 0.4], [100, 150], series="leaves"),
    )
    out = _paired_tokens(runs, 0.2, "trace")
    assert out is not None and out["series"] == "leaves"
    assert out["diffs"] == pytest.approx([0.4 - 0.4])  # 0.3 + 0.2 · 0.5 = 0.4 against 0.4
    assert math.isnan(out["p"])  # one seed: no test


def test_tokens_to_grpo_final_is_the_crossing_over_grpos_tokens():
    runs = runs_of(
        record("trace", 0, [0.30, 0.50], [100, 200]),
        record("trace", 1, [0.40, 0.50], [100, 200]),
        record("uniform", 0, [0.25, 0.40], [100, 200]),
        record("uniform", 1, [0.25, 0.40], [100, 200]),
    )
    # seed-mean TRACE curve: (0, 0.2), (100, 0.35), (200, 0.5); GRPO ends at 0.40 after 200
    assert _tokens_to_grpo_final(runs, 0.2, "trace") == pytest.approx((100 + 100 / 3) / 200)
    slow = runs_of(
        record("trace", 0, [0.21, 0.30], [100, 200]),
        record("uniform", 0, [0.25, 0.40], [100, 200]),
    )
    assert _tokens_to_grpo_final(slow, 0.2, "trace") is None  # never reaches it
    assert _tokens_to_grpo_final(slow, 0.2, "dynamic_sampling") is None


def test_tokens_to_grpo_final_uses_only_the_seeds_both_ran():
    """DAPO on seed 0 only must be read against GRPO's seed 0, not GRPO's mean over 0-1."""
    runs = runs_of(
        record("dynamic_sampling", 0, [0.30, 0.40], [100, 200]),
        record("uniform", 0, [0.30, 0.40], [100, 200]),
        record("uniform", 1, [0.10, 0.20], [100, 200]),  # a weak seed DAPO did not run
    )
    # identical curves on the shared seed: GRPO's final EM is reached at GRPO's own cost
    assert _tokens_to_grpo_final(runs, 0.2, "dynamic_sampling") == pytest.approx(1.0)
