"""The metadata every benchmark records beside its figures: date, commit, CPU, Python, argv."""

from __future__ import annotations

import datetime as dt
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_meta() -> dict[str, Any]:
    """Date, commit, CPU, Python and argv of this run."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=Path(__file__).parent,
        ).stdout.strip()
    except OSError:
        commit = ""
    cpu = platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [ln.split(":", 1)[1].strip() for ln in cpuinfo.read_text().splitlines()
                 if ln.startswith("model name")]  # fmt: skip
        cpu = names[0] if names else cpu
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        "cpu": cpu,
        "n_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "argv": sys.argv,
    }
