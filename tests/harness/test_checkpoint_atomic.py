"""`write_dir_atomic`: a checkpoint directory is replaced whole or not at all."""

from __future__ import annotations

import pytest

from harness.training.checkpoint import write_dir_atomic


def test_a_write_that_dies_midway_leaves_the_previous_directory_whole(tmp_path):
    final = tmp_path / "global_step4"
    write_dir_atomic(final, lambda d: (d / "state.json").write_text("old"))

    def dies(d):
        (d / "state.json").write_text("half")
        raise KeyboardInterrupt  # killed between two files

    with pytest.raises(KeyboardInterrupt):
        write_dir_atomic(final, dies)
    assert (final / "state.json").read_text() == "old"
    assert sorted(p.name for p in final.iterdir()) == ["state.json"]
    write_dir_atomic(final, lambda d: (d / "predictor.npz").write_bytes(b"new"))  # clears debris
    assert sorted(p.name for p in final.iterdir()) == ["predictor.npz"]
    assert not (tmp_path / ".global_step4.tmp").exists()


# -- issue 25: pruning by step number, and one-line errors for broken checkpoints ------------


def _save(run_dir, step, keep=2):
    import numpy as np
    import torch

    from harness.training.checkpoint import save_checkpoint

    return save_checkpoint(
        run_dir,
        step,
        model={"w": torch.ones(2)},
        optimizer={},
        predictor={"a": np.zeros(1)},
        state={},
        keep=keep,
    )


def test_pruning_keeps_the_checkpoint_just_written_whatever_newer_directories_exist(tmp_path):
    from harness.training.checkpoint import latest_checkpoint, load_checkpoint

    _save(tmp_path, 5)
    _save(tmp_path, 20)  # a leftover of a run killed before latest.json moved on
    (tmp_path / "checkpoints" / "latest.json").write_text('{"step": 5, "path": "step_000005"}')
    written = _save(tmp_path, 10, keep=1)
    assert latest_checkpoint(tmp_path) == written and load_checkpoint(written).step == 10
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_000010", "step_000020"]  # 5 pruned; the newer leftover left alone


def test_pruning_orders_by_step_number_not_by_name(tmp_path):
    for step in (999_999, 1_000_000):
        _save(tmp_path, step, keep=1)  # step_1000000 sorts before step_999999 by name
    names = sorted(p.name for p in (tmp_path / "checkpoints").glob("step_*"))
    assert names == ["step_1000000"]


@pytest.mark.parametrize(
    ("pointer", "message"),
    [
        ('["step_000001"]', "holds no 'path' naming a step_"),
        ('{"step": 3, "path": "step_000003"}', "which is missing or incomplete"),
        ('{"step": 1, "path": "../../etc"}', "holds no 'path' naming a step_"),
        ("{not json", "is not a checkpoint pointer"),
    ],
)
def test_a_bad_pointer_is_one_checkpoint_error_that_says_what_to_do(tmp_path, pointer, message):
    from harness.training.checkpoint import CheckpointError, latest_checkpoint

    _save(tmp_path, 1)
    (tmp_path / "checkpoints" / "latest.json").write_text(pointer)
    with pytest.raises(CheckpointError, match=message) as caught:
        latest_checkpoint(tmp_path)
    assert "start a new --run-dir" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("name", ["model.pt", "optimizer.pt", "rng.pt", "predictor.npz"])
def test_a_truncated_checkpoint_file_is_one_checkpoint_error(tmp_path, name):
    from harness.training.checkpoint import CheckpointError, load_checkpoint

    path = _save(tmp_path, 1)
    data = (path / name).read_bytes()
    (path / name).write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or not one") as caught:
        load_checkpoint(path)
    assert "\n" not in str(caught.value)


# -- issue 42: a full disk inside torch.save is "No space left on device", not an internal error


def test_a_full_disk_inside_torch_save_is_reported_as_one(tmp_path, monkeypatch):
    import errno
    import shutil
    from collections import namedtuple

    import torch

    from benchmarks.cli import error_line, is_user_error
    from harness.training.checkpoint import latest_checkpoint

    _save(tmp_path, 1)
    real_save = torch.save

    def full(obj, path, *args, **kwargs):  # what torch's zip writer raised on a full tmpfs
        if str(path).endswith("optimizer.pt"):
            path.write_bytes(b"PK" * 100)
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 897024")
        return real_save(obj, path, *args, **kwargs)

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(torch, "save", full)
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(1 << 30, 1 << 30, 4096))
    with pytest.raises(OSError) as caught:
        _save(tmp_path, 2)
    assert caught.value.errno == errno.ENOSPC
    assert is_user_error(caught.value)  # one line, exit 2: no "(an internal error ...)"
    assert "No space left on device" in error_line(caught.value)
    assert "optimizer.pt" in error_line(caught.value)
    assert latest_checkpoint(tmp_path).name == "step_000001"  # the previous one stays
    # with room on the disk, the failed write is still an OSError naming the file
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(1 << 40, 0, 1 << 40))
    with pytest.raises(OSError, match=r"cannot write .*optimizer\.pt") as caught:
        _save(tmp_path, 2)
    assert caught.value.errno == errno.EIO
