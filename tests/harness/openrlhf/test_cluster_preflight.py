"""The launcher's multi-node parts on a local Ray: the doctor as one pinned task per node, and the
trainer actor pinned to the driver's node. One node here; on a cluster the same calls go to each."""

from __future__ import annotations

import platform

import pytest

from harness.errors import HarnessError
from harness.openrlhf.launcher import driver_node_strategy, preflight_nodes
from harness.training.doctor import Target

pytestmark = pytest.mark.slow  # a local Ray (shared by the session's Ray tests)


def test_every_node_answers_the_preflight_and_a_failure_names_its_node(ray_local, tmp_path):
    preflight_nodes(Target(checkpoint_dir=tmp_path))  # CPU node: the GPU checks skip
    with pytest.raises(HarnessError) as info:
        preflight_nodes(Target(checkpoint_dir=tmp_path, data=tmp_path / "missing"))
    node = platform.node()  # the node the task ran on: this machine, named as compare_nodes does
    assert str(info.value).startswith(f"the cluster's preflight would fail:\n- {node}: data:")


def test_the_trainer_actor_lands_on_the_drivers_node(ray_local):
    @ray_local.remote(num_cpus=0)
    class Where:
        def node(self) -> str:
            return ray_local.get_runtime_context().get_node_id()

    actor = Where.options(scheduling_strategy=driver_node_strategy()).remote()
    assert ray_local.get(actor.node.remote()) == ray_local.get_runtime_context().get_node_id()
