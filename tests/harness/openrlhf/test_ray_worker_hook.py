"""Without flash-attn, OpenRLHF's model actors (Ray workers that never import trace-rl) still
import `openrlhf.models`: `ray.init` gets the flash-attn stand-in as every worker's set-up hook."""

from __future__ import annotations

import subprocess
import sys

import pytest

from harness.training.openrlhf_compat import SHIM_VERSION, flash_attn_installed

PROBE = """
import os, ray
from harness.openrlhf.launcher import ray_runtime_env
ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False,
         runtime_env=ray_runtime_env(os.environ))

@ray.remote
def probe():
    import sys
    installed_before_the_task = "flash_attn" in sys.modules
    import openrlhf.models.ring_attn_utils  # imports flash_attn's helpers at module level
    return sys.modules["flash_attn"].__version__, installed_before_the_task

print(*ray.get(probe.remote()))
ray.shutdown()
"""


@pytest.mark.slow  # a Ray cluster of one worker, which imports transformers and OpenRLHF
@pytest.mark.skipif(flash_attn_installed(), reason="flash-attn is installed: no stand-in needed")
def test_a_ray_worker_imports_openrlhf_models_through_the_stand_in():
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split()[-2:] == [SHIM_VERSION, "True"]
