"""The issue-20 summary of an experiment record, and runs read back from an earlier record."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from benchmarks.research.experiment import ExperimentConfig, _recorded_runs, _summary


def _run(label, series, seed, em, group="main", **health):
    return {"group": group, "series": series, "label": label, "seed": seed, "em": em, **health}


def test_summary_pairs_seeds_and_gives_the_lower_end_of_the_t_interval():
    diffs = [0.02, 0.05, -0.01]
    runs = {}
    for seed, d in enumerate(diffs):
        runs[f"u{seed}"] = _run("uniform", "leaves", seed, 0.70, effective_ratio_first8=0.3)
        runs[f"t{seed}"] = _run("trace", "leaves", seed, 0.70 + d, effective_ratio=0.6,
                                flips_per_continuation=0.25, top_tree_share=0.2,
                                max_leaves_per_tree=10 + seed)  # fmt: skip
    runs["n2"] = _run("trace-M16-N2", "leaves", 0, 0.61, group="budget")
    runs["extra"] = _run("trace", "leaves", 9, 0.99)  # no GRPO partner: not paired
    summary = _summary(runs, ExperimentConfig())
    mean = 100 * sum(diffs) / 3
    low = mean - stats.t.ppf(0.975, 2) * 100 * stats.sem(diffs)
    assert summary["trace_minus_grpo_leaves"] == pytest.approx(mean)
    assert summary["trace_minus_grpo_leaves_ci_low"] == pytest.approx(low)
    assert summary["trace_minus_grpo_tokens"] is None  # no token series: not measured
    assert summary["trace_minus_dapo_tokens_ci_low"] is None
    assert summary["grpo_effective_ratio_first8"] == pytest.approx(0.3)
    assert summary["trace_max_leaves_per_tree"] == 12
    assert summary["n2_min_seed_em"] == pytest.approx(61.0)
    assert summary["seeds"] == [0, 1, 2, 9]


def test_recorded_runs_are_read_at_the_experiments_step(tmp_path):
    def at(em, fresh):
        return {"heldout": {"em": em, "f1": em}, "fresh_world": {"em": fresh, "f1": fresh}}

    record = {"runs": {"main-leaves-uniform-s0": {
        **_run("uniform", "leaves", 0, 0.75), "cell": "main/leaves/uniform",
        "evals": {"8": at(0.6, 0.5), "16": at(0.7, 0.55), "32": at(0.75, 0.6)},
        "effective_ratio_by_step": [1.0] * 8 + [0.5] * 24,
        "leaves_by_step": list(range(48, 48 * 33, 48)),
        "tokens_by_step": list(range(1000, 33000, 1000)),
        "brier": 0.2,
    }}}  # fmt: skip
    path = tmp_path / "old.json"
    path.write_text(json.dumps(record))
    config = ExperimentConfig(seeds=(0,), steps=16, eval_at=(16,), reuse_from=path,
                              reuse_methods=("uniform",))  # fmt: skip
    run = _recorded_runs(config)["main-leaves-uniform-s0"]
    assert run["em"] == 0.7 and run["fresh_em"] == 0.55
    assert run["effective_ratio"] == pytest.approx(0.75)  # (8 · 1 + 8 · 0.5) / 16
    assert run["effective_ratio_first8"] == 1.0
    assert run["total_tokens"] == 16000 and set(run["evals"]) == {"8", "16"}
    assert run["brier"] is None  # a whole-run mean cannot be cut at step 16
    with pytest.raises(ValueError, match="not evaluated at step 12"):
        _recorded_runs(ExperimentConfig(seeds=(0,), steps=12, eval_at=(12,), reuse_from=path,
                                        reuse_methods=("uniform",)))  # fmt: skip
    assert math.isfinite(run["em"])
