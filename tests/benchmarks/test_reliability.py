"""The reliability benchmark: its smoke run, and the parser of Hypothesis's statistics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.perf.reliability import parse_statistics

ROOT = Path(__file__).resolve().parents[2]

STATISTICS = """\
============================ Hypothesis Statistics =============================
tests/envs/test_snapshot_validation.py::test_a_mutated_snapshot_restores:

  - during generate phase (11.46 seconds):
    - Typical runtimes: ~ 1-40 ms, of which ~ 0-25 ms in data generation
    - 200 passing, 0 failing, and 3 invalid test cases
    - Events:
      * 61.50%, refused (turns)
      * 38.50%, restored
      * 5.48%, Retried draw from text() to satisfy filter

  - Stopped because settings.max_examples=200
"""


def test_parse_statistics_reads_cases_and_outcome_events():
    stats = parse_statistics(STATISTICS)
    assert stats == {
        "test_a_mutated_snapshot_restores": {
            "passing": 200,
            "failing": 0,
            "events": {"refused (turns)": 61.5, "restored": 38.5},
        }
    }


@pytest.mark.slow
def test_quick_run_gets_a_4xx_for_every_bad_body_and_bounds_a_hung_step():
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.perf.reliability", "--quick", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["bad_bodies"]["all_4xx"], result["bad_bodies"]["statuses"]
    assert result["bad_bodies"]["good_request_after"] == 200
    assert result["hung_server"]["causes"] == ["RetrieverUnavailable"]
    assert result["hung_server"]["worst_step_s"] < result["hung_server"]["retry_budget_s"]
    assert result["snapshot_mutations_total"] == 500  # --quick: the one attack it runs
    assert result["snapshot_mutations_untyped_errors"] == 0, result["attacks"]["snapshots"]


def test_the_issue_42_attacks_find_no_hang_and_no_false_pass(tmp_path: Path):
    from benchmarks.perf import races
    from retrieval import BM25Retriever

    hangs = races.forged_rng_hangs()
    assert hangs["hangs"] == 0 and hangs["outcomes"] == {"refused": hangs["n_states"]}
    bm25_dir = tmp_path / "bm25"
    BM25Retriever.build(races._bm25_docs(40)).save(bm25_dir)
    verify = races.verify_false_passes(tmp_path / "verify", bm25_dir)
    assert verify["false_passes"] == [], verify["cases"]
    assert all(case["code"] == 1 for case in verify["cases"].values())
