"""Moved: the one-GPU trainer check is `tracerl gpu-check` (harness/openrlhf/gpu_check.py).

This launcher runs it for the command lines written before the move
(`python scripts/gpu_trainer_check.py --out OUT [--device cuda|cpu]`): it imports nothing of
trace-rl, it starts `python -m harness.openrlhf.gpu_check` with the same arguments, from the
repository root.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    root = str(Path(__file__).resolve().parents[1])
    path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = root if not path else f"{root}{os.pathsep}{path}"
    os.execv(sys.executable, [sys.executable, "-m", "harness.openrlhf.gpu_check", *sys.argv[1:]])
