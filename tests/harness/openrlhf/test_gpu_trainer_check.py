"""`tracerl gpu-check` (harness/openrlhf/gpu_check.py) on CPU: its Ray and vLLM stand-ins, its
orchestration and every check of trace-rl's side, with an in-process CPU actor standing in for
the DeepSpeed `PolicyModelActor` (which calls CUDA directly). The GPU run itself is documented
in docs/openrlhf.md and has not been made yet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
STAND_INS = ROOT / "harness" / "openrlhf" / "stand_ins"
STAGES = ["trace_step", "actor", "experience", "ppo_step", "weight_gather", "checkpoint"]


def _run(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [sys.executable, "-m", "benchmarks.cli", "gpu-check", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=timeout,
        check=False,
    )


@pytest.mark.slow  # a TRACE step of the tiny policy and two PPO steps on CPU (about a minute)
def test_every_stage_passes_on_cpu_with_the_stand_ins(tmp_path):
    done = _run("--out", str(tmp_path), "--device", "cpu", "--stand-ins", "always")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("GPU TRAINER CHECK: PASS")
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["passed"] and list(report["stages"]) == STAGES
    assert report["versions"]["stand_ins"] is True
    assert report["versions"]["ray"] is not None  # installed here, and still stood in for
    trace, experience, ppo = (report["stages"][s] for s in ("trace_step", "experience", "ppo_step"))
    assert trace["leaves"] == 16 and trace["leaves_with_signal"] > 0
    assert trace["fillers"] >= 1  # the filler path ran
    assert experience["mean_logprob_gap"] < 1e-4  # float32 on both sides here
    assert ppo["parameters_moved"] > 0 and ppo["policy_loss"] != 0.0
    assert report["stages"]["weight_gather"]["tensors"] == report["stages"]["actor"]["tensors"]


def test_the_stand_ins_give_openrlhf_the_names_it_imports(tmp_path):
    probe = (
        "import sys; sys.path.insert(0, sys.argv[1]); "
        "import ray, vllm; "
        "from ray.util.placement_group import PlacementGroup; "
        "from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy; "
        "from vllm.inputs import TokensPrompt; from vllm.utils import random_uuid; "
        "C = ray.remote(num_gpus=1)(type('C', (), {})); assert ray.remote(C) is C; "
        "assert ray.get(ray.put(3)) == 3 and ray.get_gpu_ids() == [0]; "
        "assert vllm.SamplingParams(n=2).n == 2 and TokensPrompt(prompt_token_ids=[1]); "
        "print(ray.__version__, vllm.__version__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(STAND_INS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.split() == ["0.0.0+trace-rl-stand-in", "0.29.0"]


def _script():  # the check's module
    from harness.openrlhf import gpu_check

    return gpu_check


def test_any_exception_in_a_stage_is_a_fail_line_with_the_stage():
    check = _script()

    def real_ray_get():
        raise TypeError("Attempting to call get on the value 3, which is not an ray.ObjectRef.")

    with pytest.raises(check.CheckFailed) as info:
        check.run_stage("experience", real_ray_get)
    assert str(info.value) == (
        "experience: TypeError: Attempting to call get on the value 3, which is not an "
        "ray.ObjectRef."
    )
    assert check.GpuCheckArgs(out=Path("x")).stand_ins == "always"  # one process by design


def test_the_machine_checks_come_first_and_skip_the_gpu_ones_on_cpu():
    check = _script()
    found = check.toolchain("cpu")
    assert found["driver"] == found["nvcc"] == found["gpus"] == "skip"
    assert found["python"] == "ok"
