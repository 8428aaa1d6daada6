"""benchmarks/perf/rollout_cost.py: the smoke run prints its figures, the JSON last on stdout."""

from __future__ import annotations

import json
import math

import pytest

from benchmarks.perf import rollout_cost


@pytest.mark.slow
def test_quick_run_prints_tokens_per_leaf_ratios_and_throughput_as_the_last_line(capsys):
    assert rollout_cost.cli(["--quick", "--json"]) == 0
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    per_leaf = result["tokens_per_leaf"]
    assert set(per_leaf) == {"linear", "trace", "trace_n2", "trace_n6", "random_tree"}
    assert all(v > 0 for v in per_leaf.values())
    assert result["tree_over_linear_tokens_per_leaf"] == pytest.approx(
        per_leaf["trace"] / per_leaf["linear"]
    )
    # forks start below the root: at equal leaves, branching generates fewer tokens per leaf
    assert result["random_tree_over_linear_tokens_per_leaf"] < 1.0
    assert math.isfinite(result["tokens_per_s"]["transformers"])
    assert result["tokens_per_s"]["transformers"] > 0
    assert result["leaves"] == 16 and result["repeats"] == 1  # --quick
