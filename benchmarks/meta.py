"""The metadata every benchmark records beside its figures, and the record it is written into."""

from __future__ import annotations

import datetime as dt
import json
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


def machine_description(note: str = "") -> str:
    """The CPU, its cores, Python and the load average now, plus `note` (who else used the box)."""
    meta = run_meta()
    load = ""
    loadavg = Path("/proc/loadavg")
    if loadavg.is_file():
        load = f", load average {loadavg.read_text().split()[0]} at the start"
    text = f"{meta['cpu']}, {meta['n_cpus']} CPUs, Python {meta['python']}{load}"
    return f"{text}; {note}" if note else text


def write_record(
    path: Path,
    result: dict[str, Any],
    *,
    command: str,
    notes: list[str] | None = None,
    **fields: str,
) -> None:
    """Write `result` (a benchmark's `--json` object) as a record that RESULTS.md renders.

    The record holds the command line, the date, the machine and the commit beside the figures;
    `fields` adds the rendering's `section`, `title`, `measures` and `machine`, `notes` the prose
    a reader needs beside the figures (docs/style.md §2.8; `python -m benchmarks.records`).
    """
    meta = run_meta()
    record = {
        "schema_version": 1,
        "command": command,
        "date": meta["date"],
        "machine": machine_description(),
        "commit": meta["commit"],
        "provenance": "written by `benchmarks.records run`",
        **fields,
        "notes": notes or [],
        "result": result,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
