"""The shipped scripts: HotpotQA prompt files the trainer reads, and a Qwen3-8B launch command
whose every flag passes OpenRLHF 0.11.2's parser and the tree trainer's checks (on CPU, with
--check-only; the run itself needs GPUs)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs import QATask

ROOT = Path(__file__).resolve().parents[3]
LAUNCH = ROOT / "scripts" / "train_qwen3_8b_hotpotqa.sh"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra)
    return env


def test_prepare_hotpotqa_writes_one_task_per_line(shared_data, tmp_path):
    hotpot = shared_data / "hotpotqa"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "prepare_hotpotqa.py"),
            *("--out", str(tmp_path)),
            *("--train-file", str(hotpot / "hotpot_dev_distractor.rpt_sample500.hf.jsonl")),
            *("--eval-file", str(hotpot / "hotpot_dev_distractor.rpt_sample300.hf.jsonl")),
            *("--eval-limit", "25", "--json"),
        ],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=300,
        check=True,
    )
    counts = json.loads(done.stdout.splitlines()[-1])
    assert (counts["train"], counts["eval"], counts["overlap"]) == (500, 25, 0)
    rows = [json.loads(line) for line in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert len(rows) == 500
    tasks = [QATask.from_json(json.loads(row["task"])) for row in rows]
    assert len({t.task_id for t in tasks}) == 500
    for row, task in zip(rows, tasks, strict=True):
        assert row["prompt"] == task.question and row["datasource"] == "hotpotqa"
        assert task.golden_answers and task.paragraphs == ()  # context dropped by default
    assert {t.question_type for t in tasks} == {"bridge", "comparison"}


def test_multi_node_runs_go_through_ray_job_submit():
    done = subprocess.run(
        ["bash", str(LAUNCH), "--seed", "1"],
        capture_output=True,
        text=True,
        env=_env(PRINT_ONLY="1", SUBMIT_ADDRESS="http://head:8265", NODES="2"),
        timeout=60,
        check=True,
    )
    command = done.stdout.split()
    assert command[:5] == ["ray", "job", "submit", "--address=http://head:8265", "--"]
    assert command[5:9] == ["tracerl", "train", "--backend", "openrlhf"]
    ours, theirs = command[: command.index("--", 5)], command[command.index("--", 5) + 1 :]
    assert ours[ours.index("--alloc.name") + 1] == "trace" and "--seed" in ours
    flags = dict(itertools.pairwise(theirs))  # each flag -> the word after it
    assert flags["--actor.num_nodes"] == "2" and flags["--vllm.num_engines"] == "8"


def test_every_path_the_launch_script_passes_is_absolute_and_the_model_has_a_home(tmp_path):
    # Ray runs the trainer and model actors in working directories of their own: a relative
    # path (and OpenRLHF's default ./ckpt for the final model) would land elsewhere
    done = subprocess.run(
        ["bash", str(LAUNCH)],
        capture_output=True,
        text=True,
        env=_env(PRINT_ONLY="1", RUN="runs/x"),
        cwd=tmp_path,
        timeout=60,
        check=True,
    )
    command = done.stdout.split()
    flags = dict(itertools.pairwise(command))
    for flag in (
        "--run-dir",
        "--data.prompt_dataset",
        "--eval.dataset",
        "--ckpt.path",
        "--ckpt.output_dir",
        "--logger.tensorboard_dir",
    ):
        assert flags[flag].startswith("/"), (flag, flags[flag])
    assert flags["--run-dir"] == str(tmp_path / "runs" / "x")
    assert flags["--ckpt.output_dir"] == str(tmp_path / "runs" / "x" / "model")


@pytest.mark.slow  # imports OpenRLHF in a fresh interpreter (30-60 s here)
def test_the_qwen3_launch_flags_pass_openrlhfs_parser_and_the_tree_checks():
    done = subprocess.run(
        ["bash", str(LAUNCH), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Qwen/Qwen3-8B: Trace allocator" in done.stdout
    assert "256 prompts and 3072 leaves per step" in done.stdout
    assert "multiple of 512" in done.stdout and "4 vLLM engines x TP2" in done.stdout


@pytest.mark.slow  # imports OpenRLHF in a fresh interpreter (30-60 s here)
def test_the_gpu_smoke_flags_pass_openrlhfs_parser_and_the_tree_checks(tmp_path):
    smoke = LAUNCH.parent / "gpu_smoke.sh"
    done = subprocess.run(
        ["bash", str(smoke), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(RUN=str(tmp_path / "smoke"), POLICY=str(tmp_path / "policy")),
        cwd=LAUNCH.parent.parent,
        timeout=600,
        check=False,
    )
    log = (tmp_path / "smoke" / "smoke.log").read_text()
    assert done.returncode == 0, done.stdout + log[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith("GPU SMOKE: CHECKED"), done.stdout
    assert "ZeRO-2" in done.stdout and "1 vLLM engines" in done.stdout
