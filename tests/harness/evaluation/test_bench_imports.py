"""`tracerl bench` plays episodes: it loads no training room and no `trace_alloc` (issue 40)."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from benchmarks.cli import resolve
resolve("bench")
loaded = sorted(m for m in sys.modules if m == "trace_alloc" or m.startswith(("trace_alloc.",
                "harness.training", "harness.rollout.engine", "harness.evaluation.demo")))
print(",".join(loaded))
"""


def test_tracerl_bench_imports_neither_trace_alloc_nor_the_training_room():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == ""


def test_the_faces_still_hand_out_the_lazy_names():
    from harness.evaluation import DemoConfig
    from harness.rollout import TreeRolloutEngine
    from harness.rollout.engine import TreeRolloutEngine as direct

    assert TreeRolloutEngine is direct and DemoConfig.__module__ == "harness.evaluation.demo"
