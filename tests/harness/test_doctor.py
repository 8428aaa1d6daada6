"""`tracerl doctor`: each fault a first cluster run meets is caught with a one-line fix.

Faults are injected as a user's machine would show them: fake `nvidia-smi`, `nvcc` and `gcc`
binaries on a PATH of their own, a fake environment, a dead retriever port, missing paths.
"""

from __future__ import annotations

import dataclasses
import json
import stat
from pathlib import Path

import pytest

from benchmarks.cli import main
from harness.training.doctor import (
    Check,
    Probes,
    Target,
    compare_nodes,
    format_report,
    node_report,
    run_checks,
)


def fake_bin(folder: Path, name: str, stdout: str) -> None:
    """An executable `name` in `folder` that prints `stdout` and exits 0."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{stdout}'\n")  # a builtin: PATH is the fakes
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def gpu_box(folder: Path, *, driver: str = "580.65.06", nvcc: str = "13.0") -> Path:
    """A PATH with a driver, nvcc, gcc 12 and ninja, as a ready GPU node shows them."""
    fake_bin(folder, "nvidia-smi", "")
    (folder / "nvidia-smi").write_text(  # one answer per query the doctor makes
        '#!/bin/sh\ncase "$1" in\n'
        f"  --query-gpu=driver_version) echo {driver} ;;\n"
        "  *) echo '0, 500, 143771'; echo '1, 400, 143771' ;;\nesac\n"
    )
    fake_bin(folder, "nvcc", f"Cuda compilation tools, release {nvcc}, V{nvcc}.88")
    fake_bin(folder, "gcc", "12")
    fake_bin(folder, "ninja", "1.11.1")
    return folder


SHARED_ROOT = "srv:/export / nfs4 rw 0 0"
"""A mount table in which everything is on NFS: the checks do not depend on this machine's disks."""


def probes(path: Path, *, torch_cuda: str | None = "13.0", **changes: object) -> Probes:
    base = Probes.local({"PATH": str(path)})
    changes = {"mounts": lambda: SHARED_ROOT, **changes}
    return dataclasses.replace(base, torch_cuda=lambda: torch_cuda, **changes)  # type: ignore[arg-type]


def by_name(checks: list, name: str):  # type: ignore[no-untyped-def]
    return next(c for c in checks if c.name == name)


def test_a_ready_gpu_node_passes_every_toolchain_check(tmp_path):
    checks = run_checks(probes(gpu_box(tmp_path / "bin")), Target(require_gpu=True))
    for name in ("gcc", "ninja", "driver", "nvcc", "gpus"):
        assert by_name(checks, name).status == "ok", by_name(checks, name).line()


# (fault, how it is injected, the check that must catch it, a fragment of its fix)
FAULTS = [
    ("old driver", {"driver": "535.104.05"}, {}, "driver", "upgrade the driver to >= 580"),
    ("CUDA 12 nvcc", {"nvcc": "12.4"}, {}, "nvcc", "install the CUDA 13.0 toolkit"),
    ("no ninja", {"drop": "ninja"}, {}, "ninja", "export PATH="),
    ("python 3.10", {"python": (3, 10)}, {}, "python", "install python3.11"),
    ("no Python.h", {"python_header": Path("/nowhere/Python.h")}, {}, "python", "-dev"),
    ("gcc 9", {"gcc": "9"}, {}, "gcc", "install gcc >= 10"),
    (
        "loopback retriever, 2 nodes",
        {},
        {"retriever": "http://127.0.0.1:8000", "nodes": 2},
        "retriever",
        "--host 0.0.0.0",
    ),
    ("dead retriever", {}, {"retriever": "DEAD"}, "retriever", "tracerl serve-retriever"),
    ("missing model path", {}, {"model": "/no/such/model"}, "model", "MODEL="),
    ("missing data folder", {}, {"data": Path("/no/such/data")}, "data", "prepare_hotpotqa"),
    ("disk nearly full", {"disk_free": lambda p: 10**9}, {}, "disk", "larger volume"),
]


@pytest.mark.parametrize(
    ("fault", "inject", "target", "name", "fix"), FAULTS, ids=[f[0] for f in FAULTS]
)
def test_each_fault_is_caught_with_its_one_line_fix(
    tmp_path, refused_port, fault, inject, target, fix, name
):
    inject = dict(inject)
    folder = gpu_box(
        tmp_path / "bin", driver=inject.pop("driver", "580.65.06"), nvcc=inject.pop("nvcc", "13.0")
    )
    if "drop" in inject:
        (folder / inject.pop("drop")).unlink()
    if "gcc" in inject:
        fake_bin(folder, "gcc", inject.pop("gcc"))
    if target.get("retriever") == "DEAD":
        target = {**target, "retriever": f"http://127.0.0.1:{refused_port}"}
    checks = run_checks(probes(folder, **inject), Target(require_gpu=True, **target))
    failed = [c for c in checks if c.status == "fail"]
    assert [c.name for c in failed] == [name], format_report(checks)
    assert fix in failed[0].fix and "\n" not in failed[0].line()


def test_a_model_folder_without_its_weights_is_refused(tmp_path):
    model = tmp_path / "Qwen3-8B"
    model.mkdir()
    (model / "config.json").write_text("{}")
    target = Target(model=str(model))

    def check() -> Check:
        return by_name(run_checks(probes(tmp_path), target), "model")

    assert check().status == "fail" and "has config.json but no weights" in check().detail
    assert f"hf download ID --local-dir {model}" in check().fix
    shards = {f"model-0000{i}-of-00002.safetensors" for i in (1, 2)}
    weight_map = {f"layer.{i}": name for i, name in enumerate(sorted(shards))}
    (model / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    (model / "model-00001-of-00002.safetensors").touch()
    assert check().status == "fail" and "lacks 1 of the 2 shards" in check().detail
    assert "model-00002-of-00002.safetensors" in check().detail
    (model / "model-00002-of-00002.safetensors").touch()
    assert check().status == "ok"
    unsharded = tmp_path / "tiny"
    unsharded.mkdir()
    (unsharded / "config.json").write_text("{}")
    (unsharded / "pytorch_model.bin").touch()
    assert (
        by_name(run_checks(probes(tmp_path), Target(model=str(unsharded))), "model").status == "ok"
    )


def _table(*mounts: tuple[Path | str, str]) -> str:
    """A /proc/mounts text: `/` on ext4, then each (point, type), a space written as \\040."""
    lines = ["/dev/sda1 / ext4 rw 0 0"]
    lines += [
        f"dev {str(point).replace(' ', chr(92) + '040')} {kind} rw 0 0" for point, kind in mounts
    ]
    return "\n".join(lines)


def test_the_disk_check_names_the_mount_that_holds_the_checkpoints_and_a_missing_folder(tmp_path):
    shared = tmp_path / "shared dir"
    (shared / "runs").mkdir(parents=True)
    box = probes(tmp_path, mounts=lambda: _table((shared, "nfs4")), disk_free=lambda p: 600e9)
    disk = by_name(run_checks(box, Target(checkpoint_dir=shared / "runs")), "disk")
    assert (disk.status, disk.detail) == (
        "ok", f"600 GB free on {shared} (nfs4), which holds {shared / 'runs'}"
    )  # fmt: skip
    # the shared volume is not mounted: its folder is missing, and what would hold it is `/`
    gone = tmp_path / "absent" / "runs"
    disk = by_name(run_checks(box, Target(checkpoint_dir=gone)), "disk")
    assert disk.status == "warn" and disk.detail.startswith(f"{gone} does not exist; ")
    assert f"on {tmp_path.resolve().anchor} (ext4), which would hold it" in disk.detail
    small = by_name(run_checks(box, Target(checkpoint_dir=gone, min_disk_gb=700)), "disk")
    assert small.status == "fail" and "does not exist" in small.detail
    assert "the run needs 700 GB" in small.detail and "mounted" in small.fix


def test_several_nodes_refuse_a_checkpoint_folder_on_this_nodes_own_disk(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    table = _table((shared, "lustre"))
    local = Target(checkpoint_dir=tmp_path / "runs", nodes=2)
    found = by_name(run_checks(probes(tmp_path, mounts=lambda: table), local), "shared disk")
    assert found.status == "fail" and "on / (ext4), this node's own disk" in found.detail
    assert "--shared-fs ext4" in found.fix and "\n" not in found.line()
    ok = [
        dataclasses.replace(local, checkpoint_dir=shared / "runs" / "ckpt"),  # not made yet
        dataclasses.replace(local, shared_fs=("ext4",)),  # the override
        dataclasses.replace(local, nodes=1),
    ]
    statuses = [by_name(run_checks(probes(tmp_path, mounts=lambda: table), t), "shared disk").status
                for t in ok]  # fmt: skip
    assert statuses == ["ok", "ok", "skip"]
    blind = by_name(run_checks(probes(tmp_path, mounts=lambda: None), local), "shared disk")
    assert blind.status == "warn" and "no mount table" in blind.detail


def test_a_hub_model_id_is_a_warning_that_names_the_local_copy(tmp_path):
    target = Target(model="Qwen/Qwen3-8B")
    check = by_name(run_checks(probes(tmp_path), target), "model")
    assert check.status == "warn" and "every rank" in check.detail and "MODEL=" in check.fix
    offline = dataclasses.replace(probes(tmp_path), environ={"HF_HUB_OFFLINE": "1"})
    assert "cache must hold it" in by_name(run_checks(offline, target), "model").detail


def test_a_retriever_with_another_index_fails(tmp_path):
    served = probes(tmp_path, health=lambda url: {"index_id": "wiki18-e5"})
    target = Target(retriever="http://10.0.0.5:8000", index_id="wiki18-bm25")
    check = by_name(run_checks(served, target), "retriever")
    assert check.status == "fail" and "wiki18-e5" in check.detail
    assert (
        by_name(run_checks(served, Target(retriever="http://10.0.0.5:8000")), "retriever").status
        == "ok"
    )


def test_without_a_gpu_the_gpu_checks_skip_unless_a_gpu_is_required(tmp_path):
    cpu = probes(tmp_path, torch_cuda=None)
    checks = run_checks(cpu, Target())
    assert {by_name(checks, n).status for n in ("driver", "nvcc", "gpus")} == {"skip"}
    assert all("no GPU" in by_name(checks, n).detail for n in ("driver", "nvcc", "gpus"))
    required = run_checks(cpu, Target(require_gpu=True))
    assert {by_name(required, n).status for n in ("driver", "nvcc", "gpus")} == {"fail"}


def test_another_process_on_a_gpu_is_a_warning(tmp_path):
    folder = gpu_box(tmp_path / "bin")
    (folder / "nvidia-smi").write_text("#!/bin/sh\necho '0, 90000, 143771'\n")
    check = by_name(run_checks(probes(folder), Target()), "gpus")
    assert check.status == "warn" and "GPU 0 90000" in check.detail


def test_nodes_with_another_ray_or_their_own_failure_are_named():
    ok = {"node": "n1", "ray": "2.55.0", "checks": []}
    bad_ninja = {"name": "ninja", "status": "fail", "detail": "not on PATH", "fix": "export PATH"}
    reports = [ok, {"node": "n2", "ray": "2.60.0", "checks": [bad_ninja]}]
    found = compare_nodes("2.55.0", reports)
    assert [c.name for c in found] == ["n2: ray", "n2: ninja"]
    assert compare_nodes("2.55.0", [ok]) == []


def test_node_report_carries_this_nodes_checks(tmp_path):
    report = node_report(Target(checkpoint_dir=tmp_path))
    assert report["node"] and {c["name"] for c in report["checks"]} >= {"python", "ninja", "disk"}
    json.dumps(report)  # it travels back from a Ray task


def test_the_command_prints_json_and_fails_on_a_fault(tmp_path, capsys):
    assert main(["doctor", "--json", "--checkpoint-dir", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] and {c["name"] for c in report["checks"]} >= {"driver", "retriever"}
    code = main(["doctor", "--data", str(tmp_path / "none"), "--checkpoint-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 1 and "FAIL data" in out and out.rstrip().endswith(")")


def test_the_doctor_names_packages_installed_at_other_versions_than_the_lock(tmp_path):
    """A GPU venv is compared with requirements/gpu.lock; a CPU venv with requirements/cpu.lock."""
    from harness.training import doctor
    from harness.training.lock_file import read_lock

    gpu_lock = read_lock(doctor.LOCKS_DIR / "gpu.lock")
    cpu_lock = read_lock(doctor.LOCKS_DIR / "cpu.lock")
    moved = {**gpu_lock, "vllm": "0.0.1"}
    moved.pop("flash-attn")  # not installed (FLASH_ATTN=0): no drift
    found = doctor.check_lock(probes(tmp_path, version=moved.get), Target(require_gpu=True))
    assert found.status == "warn" and "1 packages differ from gpu.lock" in found.detail
    assert f"vllm 0.0.1 (locked {gpu_lock['vllm']})" in found.detail
    assert "make clean install-gpu" in found.fix
    exact = doctor.check_lock(probes(tmp_path, torch_cuda=None, version=cpu_lock.get), Target())
    assert exact.status == "ok" and "cpu.lock" in exact.detail
