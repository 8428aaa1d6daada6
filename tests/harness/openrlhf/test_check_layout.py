"""`--check-only` checks values, not only flags: what a 2-node cluster would refuse is refused
here, on CPU, before anything starts."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.openrlhf.launcher import check_layout, parse_args, refuse_failures
from harness.training.doctor import Probes


def layout(
    tmp_path: Path,
    *,
    retriever: str | None = None,
    ours: tuple[str, ...] = (),
    mounts: str | None = None,
    weights: bool = True,
    **flags: str,
) -> list[str]:
    """The failed and warned checks of a launch over a local model, prompts and index.

    The run writes under `tmp_path`, which the mount table (`mounts`) puts on NFS by default.
    """
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    heads = {"num_attention_heads": 32, "num_key_value_heads": 8}
    (model / "config.json").write_text(json.dumps(heads))
    if weights:
        (model / "model.safetensors").touch()
    (tmp_path / "train.jsonl").touch()
    (tmp_path / "index").mkdir(exist_ok=True)
    values = {
        "--actor.model_name_or_path": str(model),
        "--data.prompt_dataset": str(tmp_path / "train.jsonl"),
        "--vllm.num_engines": "8",
        "--rollout.max_new_tokens": "64",
        "--rollout.batch_size": "8",
        "--rollout.n_samples_per_prompt": "4",
        "--train.batch_size": "32",
        "--rollout.micro_batch_size": "2",
        "--actor.num_gpus_per_node": "8",
        "--vllm.tensor_parallel_size": "2",
        "--ckpt.path": str(tmp_path / "run" / "ckpt"),
        "--ckpt.output_dir": str(tmp_path / "run" / "model"),
        **flags,
    }
    argv = ["--retriever", retriever or str(tmp_path / "index"), "--run-dir", str(tmp_path / "run")]
    argv += [*ours, "--", *(item for pair in values.items() for item in pair)]
    config, args = parse_args(argv)
    table = mounts or f"/dev/sda1 / ext4 rw 0 0\nsrv:/export {tmp_path} nfs4 rw 0 0"
    dead = dataclasses.replace(Probes.local(), health=_refused, mounts=lambda: table)
    return [f"{c.status} {c.name}: {c.detail}" for c in check_layout(config, args, dead)
            if c.status != "ok"]  # fmt: skip


def _refused(url: str) -> dict[str, str]:
    raise ConnectionError(f"{url}: connection refused")


def test_a_layout_that_would_run_passes(tmp_path):
    assert layout(tmp_path) == []


def test_a_missing_prompt_file_and_model_are_refused(tmp_path):
    found = layout(
        tmp_path,
        **{
            "--data.prompt_dataset": str(tmp_path / "none" / "train.jsonl"),
            "--actor.model_name_or_path": "/no/such/model",
        },
    )
    assert any(f.startswith("fail data: --data.prompt_dataset") for f in found)
    assert any(f.startswith("fail model: /no/such/model does not exist") for f in found)


def test_a_loopback_retriever_is_refused_on_two_nodes(tmp_path):
    found = layout(
        tmp_path,
        retriever="http://127.0.0.1:8000",
        **{"--actor.num_nodes": "2", "--ref.num_nodes": "2", "--vllm.num_engines": "16"},
    )
    assert found == ["fail retriever: http://127.0.0.1:8000 is a loopback address, but the run "
                     "has 2 nodes: the trainer's node may not be this one"]  # fmt: skip


def test_a_model_folder_without_weights_is_refused(tmp_path):
    assert layout(tmp_path, weights=False) == [
        f"fail model: {tmp_path / 'model'} has config.json but no weights (no *.safetensors, "
        "*.bin or *.index.json)"
    ]


def test_on_two_nodes_a_run_folder_on_this_nodes_own_disk_is_refused(tmp_path):
    two_nodes = {"--actor.num_nodes": "2", "--ref.num_nodes": "2", "--vllm.num_engines": "16"}
    local = "/dev/sda1 / ext4 rw 0 0"  # tmp_path, and the run's folders, on the root disk
    found = layout(tmp_path, mounts=local, **two_nodes)
    assert [f.split(" is on ")[0] for f in found] == [
        f"fail shared disk: --run-dir {tmp_path / 'run'}",
        f"fail shared disk: --ckpt.path {tmp_path / 'run' / 'ckpt'}",
        f"fail shared disk: --ckpt.output_dir {tmp_path / 'run' / 'model'}",
    ]
    assert all("/ (ext4), this node's own disk, but the run has 2 nodes" in f for f in found)
    assert layout(tmp_path, mounts=local, ours=("--shared-fs", "ext4"), **two_nodes) == []
    assert layout(tmp_path, **two_nodes) == []  # tmp_path on NFS: every node sees it
    assert layout(tmp_path, mounts=local) == []  # one node: its own disk is fine


def test_a_retriever_that_does_not_answer_fails_here_and_warns_elsewhere(tmp_path):
    [loopback] = layout(tmp_path, retriever="http://127.0.0.1:8000")
    assert loopback.startswith("fail retriever: no answer from http://127.0.0.1:8000/health")
    [remote] = layout(tmp_path, retriever="http://10.0.0.7:8000")
    assert remote.startswith("warn retriever: no answer")  # this machine may be off its network


def test_tensor_parallel_must_divide_the_gpus_per_node_and_the_heads(tmp_path):
    found = layout(tmp_path, **{"--vllm.tensor_parallel_size": "3", "--vllm.num_engines": "1"})
    assert any("does not divide the 8 GPUs per node" in f for f in found)
    assert any("does not split" in f and "32 attention heads" in f for f in found)


def test_failures_become_one_error_with_a_line_per_failure_and_its_fix(tmp_path):
    config, args = parse_args(
        ["--retriever", "http://127.0.0.1:9", "--", "--actor.model_name_or_path", "/no/model",
         "--data.prompt_dataset", "/no/p.jsonl", "--vllm.num_engines", "1",
         "--rollout.max_new_tokens", "8", "--actor.num_gpus_per_node", "1",
         "--train.batch_size", "128"]
    )  # fmt: skip
    dead = dataclasses.replace(Probes.local(), health=_refused)
    with pytest.raises(HarnessError) as info:
        refuse_failures(check_layout(config, args, dead), "the run's layout")
    header, *reasons = str(info.value).splitlines()
    assert header == "the run's layout would fail:" and info.value.reasons == tuple(
        r.removeprefix("- ") for r in reasons
    )
    assert [r.split(":")[0] for r in reasons] == ["- model", "- retriever", "- data"]
    assert all(" -> " in r for r in reasons)  # each failure with its fix
