"""`benchmarks.meta.run_meta`: the metadata every benchmark's JSON carries."""

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.meta import run_meta

REPO = Path(__file__).resolve().parents[2]


def test_run_meta_names_this_commit_and_is_json_safe() -> None:
    meta = run_meta()
    assert set(meta) == {"date", "commit", "cpu", "n_cpus", "python", "argv"}
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    assert meta["commit"] == head
    assert meta["argv"] == sys.argv
    assert json.loads(json.dumps(meta)) == meta
