"""Data-parallel CPU training: the pieces in one process, then real `torchrun` runs on 2 ranks.

The 2-rank tests launch `python -m torch.distributed.run` (torchrun) on gloo: DeepSpeed and
transformers start in every rank, so each takes tens of seconds on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.perf.data_parallel import RENDEZVOUS_VARIABLES
from harness.errors import ResumeError
from harness.training.distributed import Ranks, ShardedExecutor, check_same_across_ranks, deal
from harness.training.trainer import _rank_engine_rng
from trace_alloc import RolloutRequest

ROOT = Path(__file__).resolve().parents[2]
WARM_START = ROOT / "harness" / "tiny_policy" / "warm_start"


def _trees(snapshots: list[list[str | None]]) -> list[SimpleNamespace]:
    """Stand-in trees: node k of tree i has the turn snapshot `snapshots[i][k]` (k=0: root)."""
    return [
        SimpleNamespace(
            nodes=[
                SimpleNamespace(turn=None if s is None else SimpleNamespace(snapshot_id=s))
                for s in row
            ]
        )
        for row in snapshots
    ]


def test_forks_go_to_the_rank_holding_their_anchor_and_roots_even_out_the_load():
    trees = _trees([[None, "r1s1.4"], [None, "r0s1.2"]])
    executor = ShardedExecutor(engine=None, ranks=Ranks(0, 2))  # type: ignore[arg-type]
    executor._owner = {"r1s1.4": 1, "r0s1.2": 0}
    requests = [
        RolloutRequest(tree_index=0, node_id=0, n=3),
        RolloutRequest(tree_index=0, node_id=1, n=4),  # parked on rank 1
        RolloutRequest(tree_index=1, node_id=1, n=1),  # parked on rank 0
        RolloutRequest(tree_index=1, node_id=0, n=2),
    ]
    shares = executor.shares(trees, requests)
    assert shares[1] == [0, 4] and shares[2] == [1, 0]
    # 5 roots onto loads (1, 4): 3 to rank 0 first, then one each
    assert shares[0] == [3, 0] and shares[3] == [1, 1]
    assert [sum(s) for s in shares] == [r.n for r in requests]  # every rollout runs exactly once
    # the same on the other rank: every rank computes the same split
    other = ShardedExecutor(engine=None, ranks=Ranks(1, 2))  # type: ignore[arg-type]
    other._owner = dict(executor._owner)
    assert other.shares(trees, requests) == shares


def test_dealing_partitions_the_leaves_by_length_and_is_the_identity_at_one_rank():
    items = ["ccc", "a", "bbbb", "dd", "eeeee"]
    shares = [deal(items, Ranks(r, 2), size=len) for r in range(2)]
    assert shares == [["a", "ccc", "eeeee"], ["dd", "bbbb"]]
    assert deal(items, Ranks(), size=len) == sorted(items, key=len)


def test_one_rank_checks_nothing_and_a_checkpoint_of_another_world_size_is_refused():
    check_same_across_ranks({"w": np.zeros(3)}, Ranks(), "predictor")  # no group: a no-op
    single = {"engine_rng": {"bit_generator": "PCG64", "n": 0}}
    assert _rank_engine_rng(single, Ranks()) == single["engine_rng"]
    pair = {**single, "engine_rng_by_rank": [{"n": 0}, {"n": 1}]}
    assert _rank_engine_rng(pair, Ranks(1, 2)) == {"n": 1}
    with pytest.raises(ResumeError, match="written by 1 rank"):
        _rank_engine_rng(single, Ranks(0, 2))
    with pytest.raises(ResumeError, match="written by 2 rank"):
        _rank_engine_rng(pair, Ranks())


def _env() -> dict[str, str]:
    # torchrun makes its own rendezvous: an inherited MASTER_PORT would point at this process's
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARIABLES}
    return env | {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_two_ranks_update_like_one_process_under_zero2_zero3_and_ddp():
    pytest.importorskip("deepspeed")
    from benchmarks.perf.data_parallel import Args, main

    figures = main(Args())["backends"]
    assert set(figures) == {"torch", "zero2", "zero3"}
    for name, f in figures.items():
        assert f["max_weight_change"] > 1e-3, name  # the weights moved: agreement means something
        assert f["max_weight_abs_diff"] < 1e-5, (name, f)
        assert f["max_metric_abs_diff"] < 1e-5, (name, f)  # losses, KL, entropy: global means
        assert f["max_grad_norm_rel_diff"] < 1e-4, (name, f)  # the ranks' gradients add up
        assert f["resumed_max_weight_abs_diff"] < 1e-6, (name, f)  # every rank's ZeRO state
        assert f["max_update_norm_rank_diff"] == 0.0, (name, f)  # ranks log one step size


def _torchrun_train(run_dir: Path, steps: int) -> None:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "benchmarks.cli",
        "train",
        "--policy",
        str(WARM_START),
        "--run-dir",
        str(run_dir),
        "--steps",
        str(steps),
        "--budget.per-step",
        "8",
        "--budget.pool-size",
        "4",
        "--optim.backend",
        "deepspeed",
        "--optim.zero-stage",
        "3",
        "--torch-threads",
        "1",
        "--no-progress",
        "--no-tensorboard",
    ]
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


@pytest.mark.slow
def test_a_two_rank_zero3_run_shards_rollouts_and_rank0_writes_whole_weights(tmp_path):
    # resuming such a run is checked piecewise (a full second launch costs ~40 s): every rank's
    # ZeRO partition by benchmarks.perf.data_parallel above, the engine streams by _rank_engine_rng
    pytest.importorskip("deepspeed")
    run_dir = tmp_path / "run"
    _torchrun_train(run_dir, 2)
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]  # rank 0 alone writes metrics
    for record in records:
        assert record["budget/leaves"] == 8  # the exact budget, over both ranks together
        by_rank = record["perf/rollouts_by_rank"]
        assert len(by_rank) == 2 and sum(by_rank) == 8 and min(by_rank) > 0
    checkpoint = run_dir / "checkpoints" / "step_000002"
    state = json.loads((checkpoint / "state.json").read_text())
    assert len(state["engine_rng_by_rank"]) == 2
    assert state["engine_rng_by_rank"][0] != state["engine_rng_by_rank"][1]  # own streams
    optimizer = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    assert len(optimizer["ranks"]) == 2  # each rank's ZeRO-3 partition
    # the saved policy is whole (gathered from both ranks) and equals the last checkpoint
    from transformers import AutoModelForCausalLM

    policy = AutoModelForCausalLM.from_pretrained(run_dir / "policy").state_dict()
    saved = torch.load(checkpoint / "model.pt", weights_only=True)
    start = AutoModelForCausalLM.from_pretrained(WARM_START).state_dict()
    for name, tensor in saved.items():
        assert tensor.numel() == start[name].numel() > 0, name
        torch.testing.assert_close(policy[name], tensor)
    assert any(not torch.equal(saved[n], start[n]) for n in saved)  # it trained


def test_a_rank_that_joined_torchruns_group_takes_it_down_at_exit(tmp_path):
    # exit handlers run last-registered first: the one registered before joining runs after
    # init_from_env's, and writes down whether the group is still up then
    script = tmp_path / "rank.py"
    script.write_text(
        "import atexit, os, torch.distributed as dist\n"
        "rank = os.environ['RANK']\n"
        f"out = {str(tmp_path)!r} + '/rank' + rank\n"
        "atexit.register(lambda: open(out, 'a').write(f'up at exit {dist.is_initialized()}'))\n"
        "from harness.training.distributed import init_from_env\n"
        "ranks = init_from_env()\n"
        "open(out, 'w').write(f'joined {ranks.rank}/{ranks.world_size}; ')\n"
    )
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc_per_node=2", str(script)]  # fmt: skip
    done = subprocess.run(command, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for rank in range(2):
        assert (tmp_path / f"rank{rank}").read_text() == f"joined {rank}/2; up at exit False"
