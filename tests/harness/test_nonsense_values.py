"""Issue 42: values that were accepted and did nothing sensible are refused at parse time."""

from __future__ import annotations

import pytest

from harness.training.config import TrainConfig
from harness.training.doctor import Target


def test_keeping_no_checkpoint_is_refused() -> None:
    with pytest.raises(ValueError, match="--keep-checkpoints 0: must be >= 1"):
        TrainConfig(keep_checkpoints=0)
    with pytest.raises(ValueError, match="--torch-threads 0"):
        TrainConfig(torch_threads=0)
    assert TrainConfig(keep_checkpoints=1, torch_threads=1).keep_checkpoints == 1


def test_a_run_of_no_nodes_is_refused() -> None:
    with pytest.raises(ValueError, match="--nodes 0: must be >= 1"):
        Target(nodes=0)
