"""Smoke test of benchmarks/perf/env_fork.py: it runs and its last stdout line is its JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_env_fork_benchmark_quick_json():
    run = subprocess.run(
        [sys.executable, "-m", "benchmarks.perf.env_fork", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    result = json.loads(run.stdout.splitlines()[-1])
    for key in ("deepcopy_over_fork_depth8", "replay_over_fork_depth8", "fork_depth16_over_depth1"):
        assert result[key] > 0
    rows = {row["depth"]: row for row in result["rows"]}
    assert sorted(rows) == [1, 4, 8, 16]
    assert rows[16]["snapshot_bytes"] > rows[1]["snapshot_bytes"]
    assert result["meta"]["python"]
