"""Smoke test of the decode-loop benchmark (own loop vs HF generate) on a tiny budget."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_transformers_decode_quick_prints_its_figures_as_the_last_json_line():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.perf.transformers_decode", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        timeout=600,
    )
    result = json.loads(proc.stdout.splitlines()[-1])
    for mode in ("sampled", "greedy"):
        row = result[mode]
        assert row["own_loop_tokens_per_s"] > 0 and row["hf_generate_tokens_per_s"] > 0
        assert row["own_over_hf"] > 0
    assert result["meta"]["n_prefixes"] == 8
