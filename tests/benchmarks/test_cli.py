"""`tracerl` itself: log records go to stderr, so stdout holds only a command's output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_logs_go_to_stderr_and_the_json_line_ends_stdout(tmp_path: Path) -> None:
    args = ["bench", "--limit", "2", "--no-progress", "--json", "--out", str(tmp_path)]
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "INFO" in done.stderr  # the command did log (the index it built, the files it wrote)
    assert "INFO" not in done.stdout
    assert json.loads(done.stdout.splitlines()[-1])["out"] == str(tmp_path)
