"""The shipped scripts: HotpotQA prompt files the trainer reads, and a Qwen3-8B launch command
whose every flag passes OpenRLHF 0.11.2's parser and the tree trainer's checks (on CPU, with
--check-only; the run itself needs GPUs)."""

from __future__ import annotations

import itertools
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from envs import QATask

ROOT = Path(__file__).resolve().parents[3]
LAUNCH = ROOT / "scripts" / "train_qwen3_8b_hotpotqa.sh"


def _env(**extra: str) -> dict[str, str]:
    """This interpreter's venv, running this checkout's code (the venv may hold another's)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TQDM_DISABLE="1", PYTHONPATH=str(ROOT))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["VENV"] = str(Path(sys.executable).parent.parent)
    env.update(extra)
    return env


def _bare_env(**extra: str) -> dict[str, str]:
    """A shell without an activated venv: no tracerl on PATH, no VIRTUAL_ENV, no VENV."""
    return {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp"), **extra}


def _fake_venv(folder: Path) -> Path:
    """A venv whose `bin/tracerl` records its arguments (one per line) in `bin/tracerl.args`."""
    tracerl = folder / "bin" / "tracerl"
    tracerl.parent.mkdir(parents=True)
    tracerl.write_text('#!/bin/sh\nprintf \'%s\\n\' "$@" > "$0.args"\n')
    tracerl.chmod(tracerl.stat().st_mode | stat.S_IXUSR)
    return folder


def _launch_copy(repo: Path) -> Path:
    """The launch script copied into `repo/scripts`: it finds its repository from its own path."""
    (repo / "scripts").mkdir(parents=True)
    return Path(shutil.copy(LAUNCH, repo / "scripts"))


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
    command = shlex.split(done.stdout)
    venv_bin = Path(sys.executable).parent
    assert command[:4] == [str(venv_bin / "ray"), "job", "submit", "--address=http://head:8265"]
    # the job's runtime env (workers need it), then the venv's own tracerl by absolute path
    # (the entrypoint starts in a working directory of Ray's, outside the repository)
    runtime_env = json.loads(command[4].removeprefix("--runtime-env-json="))
    assert runtime_env["env_vars"]["VLLM_NO_USAGE_STATS"] == "1" and command[5] == "--"
    assert command[6] == str(venv_bin / "tracerl")
    assert command[7:10] == ["train", "--backend", "openrlhf"]
    ours, theirs = command[: command.index("--", 6)], command[command.index("--", 6) + 1 :]
    assert ours[ours.index("--alloc.name") + 1] == "trace" and "--seed" in ours
    flags = dict(itertools.pairwise(theirs))  # each flag -> the word after it
    assert flags["--actor.num_nodes"] == "2" and flags["--vllm.num_engines"] == "8"


def test_the_printed_submit_line_starts_the_run_not_another_check(tmp_path):
    venv = _fake_venv(tmp_path / "venv")
    done = subprocess.run(
        ["bash", str(LAUNCH), "--check-only", "--seed", "1", "--rehearse-steps", "2"],
        capture_output=True,
        text=True,
        env=_bare_env(VENV=str(venv), SUBMIT_ADDRESS="http://head:8265", NODES="2"),
        timeout=60,
        check=True,
    )
    checked = (venv / "bin" / "tracerl.args").read_text().splitlines()
    assert checked[:3] == ["train", "--backend", "openrlhf"] and "--check-only" in checked
    [line] = [x for x in done.stdout.splitlines() if x.startswith("would submit: ")]
    submitted = shlex.split(line.removeprefix("would submit: "))
    assert submitted[submitted.index("--") + 1] == str(venv / "bin" / "tracerl")
    assert "--check-only" not in submitted and "--rehearse-steps" not in submitted
    # the script's own flags end with --seed 0; of ours only --seed 1 is left (not the 2)
    assert submitted[: submitted.index("--alloc.name")][-4:] == ["--seed", "0", "--seed", "1"]
    # the run without --check-only submits that very line
    run = subprocess.run(
        ["bash", str(LAUNCH), "--seed", "1"],
        capture_output=True,
        text=True,
        env=_bare_env(VENV=str(venv), SUBMIT_ADDRESS="http://head:8265", NODES="2", PRINT_ONLY="1"),
        timeout=60,
        check=True,
    )
    assert shlex.split(run.stdout) == submitted


def test_without_an_activated_venv_the_script_runs_the_repositorys_own_tracerl(tmp_path):
    launch = _launch_copy(tmp_path / "repo")
    venv = _fake_venv(tmp_path / "repo" / ".venv")
    subprocess.run(
        ["bash", str(launch), "--check-only"],
        capture_output=True,
        text=True,
        env=_bare_env(),
        cwd=tmp_path,
        timeout=60,
        check=True,
    )
    assert "--check-only" in (venv / "bin" / "tracerl.args").read_text().splitlines()


def test_without_a_venv_the_script_says_which_venv_has_no_tracerl(tmp_path):
    launch = _launch_copy(tmp_path / "repo")
    done = subprocess.run(
        ["bash", str(launch), "--check-only"],
        capture_output=True,
        text=True,
        env=_bare_env(),
        cwd=tmp_path,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and done.stdout == ""
    [line] = done.stderr.splitlines()
    assert f"no tracerl in the venv {tmp_path / 'repo' / '.venv'}" in line
    assert "make install-gpu" in line and "VENV" in line
    # an activated venv without tracerl is named as well
    other = subprocess.run(
        ["bash", str(launch), "--check-only"],
        capture_output=True,
        text=True,
        env=_bare_env(VIRTUAL_ENV=str(tmp_path / "other")),
        timeout=60,
        check=False,
    )
    assert other.returncode == 1 and f"no tracerl in the venv {tmp_path / 'other'}" in other.stderr


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
def test_the_qwen3_launch_flags_pass_openrlhfs_parser_and_the_tree_checks(tmp_path):
    for name in ("train.jsonl", "eval.jsonl"):
        (tmp_path / name).touch()
    (tmp_path / "index").mkdir()
    done = subprocess.run(
        ["bash", str(LAUNCH), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(
            DATA=str(tmp_path), RETRIEVER=str(tmp_path / "index"), SUBMIT_ADDRESS="http://head:8265"
        ),
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Qwen/Qwen3-8B: Trace allocator" in done.stdout
    assert "256 prompts and 3072 leaves per step" in done.stdout
    assert "multiple of 512" in done.stdout and "4 vLLM engines x TP2" in done.stdout
    # with SUBMIT_ADDRESS: checked here, and the submit it would make (the run) is printed
    ray = Path(sys.executable).parent / "ray"
    [submit] = [line for line in done.stdout.splitlines() if line.startswith("would submit: ")]
    assert submit.startswith(f"would submit: {ray} job submit --address=http://head:8265")
    assert "--check-only" not in submit


@pytest.mark.slow  # imports OpenRLHF in a fresh interpreter (30-60 s here)
def test_check_only_refuses_what_a_two_node_cluster_would(tmp_path):
    done = subprocess.run(
        ["bash", str(LAUNCH), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(NODES="2", TP="3", DATA=str(tmp_path / "missing")),
        timeout=600,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    reasons = lines[lines.index("tracerl train: the run's layout would fail:") + 1 :]
    assert all(r.startswith("- ") for r in reasons)  # every failure, one line each
    for fragment in (
        f"--data.prompt_dataset {tmp_path}/missing/train.jsonl does not exist",
        "http://127.0.0.1:8000 is a loopback address, but the run has 2 nodes",
        "--vllm.tensor_parallel_size 3 does not divide the 8 GPUs per node",
    ):
        assert sum(fragment in r for r in reasons) == 1, (fragment, reasons)


@pytest.mark.slow  # OpenRLHF's parser, then 3 tree steps of the tiny policy on CPU (1-2 min)
def test_the_gpu_smoke_checks_its_flags_and_rehearses_steps_that_keep_leaves(tmp_path):
    smoke = LAUNCH.parent / "gpu_smoke.sh"
    done = subprocess.run(
        ["bash", str(smoke), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(RUN=str(tmp_path / "smoke"), PYTHON=sys.executable),
        cwd=tmp_path,  # the script finds the repository and its venv itself
        timeout=900,
        check=False,
    )
    log = (tmp_path / "smoke" / "smoke.log").read_text()
    assert done.returncode == 0, done.stdout + log[-3000:]
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("GPU SMOKE: CHECKED"), done.stdout
    assert "ZeRO-3" in done.stdout and "1 vLLM engines" in done.stdout  # as the 8B run
    assert "doctor: PASS" in done.stdout  # the machine checks ran; on CPU the GPU ones skip
    assert "openrlhf 0.11.2" in done.stdout  # the versions it ran with
    # the environment is the shipped policy's own (tiny_policy.json), not SearchQAConfig's
    assert "env: 8 turns, 2 documents of at most 240 characters" in done.stdout
    steps = [line for line in lines if line.startswith("rehearsal step")]
    assert len(steps) == 3
    signal = [int(line.split(" leaves, ")[1].split(" with signal")[0]) for line in steps]
    assert sum(signal) > 0, steps  # with Search-R1's defaults the policy kept none


def test_the_gpu_smoke_says_which_python_is_missing(tmp_path):
    smoke = LAUNCH.parent / "gpu_smoke.sh"
    done = subprocess.run(
        ["bash", str(smoke), "--check-only"],
        capture_output=True,
        text=True,
        env=_env(RUN=str(tmp_path / "smoke"), PYTHON=str(tmp_path / "no-venv" / "python")),
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    [line] = done.stdout.strip().splitlines()
    assert line.startswith("GPU SMOKE: FAIL (no Python at") and "make install-gpu" in line
