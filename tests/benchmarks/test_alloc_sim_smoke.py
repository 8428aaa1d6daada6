"""Smoke test of the allocation simulation benchmark on a tiny budget (CleanRL style)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAIN = ("uniform", "dynamic_sampling", "prompt_predictor", "random_tree", "entropy_tree", "trace")


@pytest.mark.slow
def test_alloc_sim_quick_prints_its_figures_as_the_last_json_line(tmp_path):
    picture = tmp_path / "sim.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.research.alloc_sim",
            "--quick",
            "--json",
            "--no-progress",
            "--plot",
            str(picture),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    assert set(result["effective_ratio"]) == set(MAIN)
    assert set(result["mixed_prefix_anchors"]) == set(MAIN)
    assert set(result["contrast_per_leaf"]) == set(MAIN)  # the headline (issue 20)
    for key in ("trace_over_uniform", "trace_over_dynamic_sampling_tokens",
                "trace_over_uniform_contrast", "trace_over_uniform_share",
                "trace_over_uniform_mixed_prompts", "trace_over_equal_prompts_share"):  # fmt: skip
        assert result[key] > 0
    assert 0.0 <= result["root_auc_after_epoch1"] <= 1.0
    single = result["single_pass"]  # the second row: no question recurs
    assert single["n_questions"] >= 4 * 32 and single["trace_over_uniform_share"] > 0
    assert set(single["effective_ratio"]) == {"uniform", "trace", "uniform[equal prompts]"}
    leaves = result["table"]["leaves"]
    # equal budget is enforced: every allocator spends exactly the leaf budget every step
    assert {row["leaves"] for row in leaves.values()} == {result["budget"]["leaves_per_step"]}
    assert all(row["final_carry"] == 0 for row in leaves.values())
    tokens = result["table"]["tokens"]
    per_step = result["budget"]["tokens_per_step"]
    for row in tokens.values():  # token budgets are exact in aggregate, up to the final carry
        assert row["tokens"] * 4 == pytest.approx(4 * per_step + row["final_carry"])
    assert leaves["uniform"]["mixed_prefix_anchors"] == 0  # flat groups have no prefix anchors
    assert picture.read_bytes()[:4] == b"\x89PNG"
    assert "budget in leaves" in proc.stderr
