"""`write_dir_atomic`: a checkpoint directory is replaced whole or not at all."""

from __future__ import annotations

import pytest

from harness.checkpoint import write_dir_atomic


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
