"""Data-parallel agreement: the CPU trainer's update on 2 torchrun ranks against 1 process.

The trainer's update phase (`harness.training.trainer.update_policy`, with its dealing of leaves to
ranks, global token normalisation, weightless filler micro-batches and metric sums) runs on the
same fixed leaves twice: in one process, and under `torchrun --nproc_per_node 2` (gloo), for
each optimizer backend (`torch`: AdamW with DDP's gradient all-reduce; `zero2`, `zero3`:
DeepSpeed). Fixed leaves make the comparison independent of rollout sampling, which differs
between the two runs by design (each rank samples its own stream); the rollout sharding
(`harness.training.distributed.ShardedExecutor`) is measured by a real `torchrun` training run
instead (benchmarks/RESULTS.md).

Each run trains a small randomly initialised Qwen3 for `--steps` steps, each step on its own
`--leaves` random leaves (an odd count: the ranks get unequal shares, and one runs a filler),
with a KL term to the start policy. Reported per backend: the largest difference of any
reported loss / KL / entropy figure over the steps, of the gradient norm, and of any final
weight (1 vs 2 ranks); and, for the 2-rank run, the largest weight difference between an
uninterrupted run and one rebuilt from the first step's weights and optimizer state (the
checkpoint path: under ZeRO the state is every rank's partition).

Run: `python -m benchmarks.perf.data_parallel --json`.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import tyro

from benchmarks.meta import run_meta
from harness.training import (
    LossConfig,
    OptimConfig,
    Ranks,
    TrainConfig,
    all_gather,
    init_from_env,
    make_optimizer,
    openrlhf_losses,
    update_policy,
)
from trace_alloc.advantages import TokenAdvantages

BACKENDS: dict[str, tuple[str, int]] = {
    "torch": ("torch", 0),
    "zero2": ("deepspeed", 2),
    "zero3": ("deepspeed", 3),
}
"""Name -> (`--optim.backend`, `--optim.zero-stage`)."""

COMPARED = ("loss/policy", "loss/kl", "policy/entropy", "policy/clip_ratio", "policy/approx_kl",
            "policy/update_norm")  # fmt: skip
"""The per-step metrics compared between the runs (the gradient norm is reported apart)."""

RENDEZVOUS_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
"""torch.distributed's rendezvous, which a launched run (torchrun, or one process) makes anew."""
LR = 1e-2
VOCAB = 50


@dataclass
class Args:
    """Data-parallel agreement benchmark options."""

    backends: tuple[str, ...] = ("torch", "zero2", "zero3")
    """Any of torch, zero2, zero3."""
    steps: int = 2
    leaves: int = 13
    """Leaves per step (odd: unequal shares and a weightless filler micro-batch)."""
    micro_batch_size: int = 3
    kl_coef: float = 0.05
    nproc: int = 2
    timeout_s: float = 600.0
    """Per launch."""
    json: bool = False
    worker: Path | None = None
    """Internal: run as one rank of a launch and write the results under this directory."""


def tiny_model() -> torch.nn.Module:
    """A 1-layer Qwen3 of vocabulary 50, seeded: the same weights in every process."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=64,
    )
    return Qwen3ForCausalLM(config).float()


def fixed_leaves(step: int, n: int) -> list[TokenAdvantages]:
    """`n` random leaves of 6-24 tokens: a 3-token prompt, then actions and observations."""
    rng = np.random.default_rng([17, step])
    out = []
    for _ in range(n):
        length = int(rng.integers(6, 25))
        mask = rng.random(length) < 0.6
        mask[:3] = False  # the prompt
        advantage = float(rng.normal())
        out.append(
            TokenAdvantages(
                token_ids=rng.integers(1, VOCAB, length),
                action_mask=mask,
                advantages=np.where(mask, advantage, 0.0),
                logprobs=np.where(mask, -rng.random(length), 0.0),
            )
        )
    return out


def _train(name: str, args: Args, ranks: Ranks, steps: range, start: Any = None) -> Any:
    """Run `steps` of updates for backend `name`; returns (metrics, weights, optimizer state)."""
    backend, stage = BACKENDS[name]
    model = tiny_model()
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    if start is not None:
        model.load_state_dict(start[0])  # before ZeRO-3 partitions the weights
    optimizer = make_optimizer(model, backend=backend, zero_stage=stage, lr=LR)  # type: ignore[arg-type]
    if start is not None:
        optimizer.load_state_dict(start[1])
    config = replace(
        TrainConfig(),
        optim=OptimConfig(
            micro_batch_size=args.micro_batch_size,
            backend=backend,  # type: ignore[arg-type]
            zero_stage=stage,
        ),
        loss=LossConfig(kl_coef=args.kl_coef),
    )
    losses = openrlhf_losses()
    policy_loss = losses.PolicyLoss(clip_eps_low=0.2, clip_eps_high=0.28)
    metrics, states = [], []
    for step in steps:
        leaves = fixed_leaves(step, args.leaves)
        metrics.append(
            update_policy(
                optimizer,
                reference,
                policy_loss,
                losses,
                leaves,
                config,
                pad_id=0,
                lr=LR,
                ranks=ranks,
            )
        )
        states.append((_copied(optimizer.model_state_dict()), _copied(optimizer.state_dict())))
    return metrics, states


def _copied(value: Any) -> Any:
    """A copy of nested tensors: the torch optimizer's dicts hold the live tensors it updates."""
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _copied(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_copied(v) for v in value)
    return value


def worker(args: Args) -> None:
    """One rank: every backend, an uninterrupted run and one resumed after the first step."""
    assert args.worker is not None
    torch.set_num_threads(1)
    ranks = init_from_env()
    for name in args.backends:
        t0 = time.perf_counter()
        metrics, states = _train(name, args, ranks, range(args.steps))
        _, resumed = _train(name, args, ranks, range(1, args.steps), states[0])
        # every rank must log the same step size, not its own share's
        norms = all_gather([m["policy/update_norm"] for m in metrics], ranks)
        if ranks.is_main:
            torch.save(
                {
                    "metrics": metrics,
                    "weights": states[-1][0],
                    "resumed_weights": resumed[-1][0],
                    "update_norms_by_rank": norms,
                    "world_size": ranks.world_size,
                    "wall_s": time.perf_counter() - t0,
                },
                args.worker / f"{name}.pt",
            )


def _launch(command: list[str], args: Args) -> float:
    # the launched run makes its own rendezvous: none of this process's may leak into it
    env = {k: v for k, v in os.environ.items() if k not in RENDEZVOUS_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.timeout_s)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    return time.perf_counter() - start


def _worker_argv(args: Args, out: Path) -> list[str]:
    return [
        "-m",
        "benchmarks.perf.data_parallel",
        "--worker",
        str(out),
        "--backends",
        *args.backends,
        "--steps",
        str(args.steps),
        "--leaves",
        str(args.leaves),
        "--micro-batch-size",
        str(args.micro_batch_size),
        "--kl-coef",
        str(args.kl_coef),
    ]


def main(args: Args) -> dict[str, Any]:
    """Launch one process and `torchrun --nproc_per_node N`, then compare their results."""
    with tempfile.TemporaryDirectory() as tmp:
        one, many = Path(tmp) / "one", Path(tmp) / "many"
        one.mkdir()
        many.mkdir()
        one_s = _launch([sys.executable, *_worker_argv(args, one)], args)
        # torchrun is `python -m torch.distributed.run`; --standalone picks a free port
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        many_s = _launch(
            [*torchrun, f"--nproc_per_node={args.nproc}", *_worker_argv(args, many)], args
        )
        figures: dict[str, Any] = {}
        for name in args.backends:
            a = torch.load(one / f"{name}.pt")
            b = torch.load(many / f"{name}.pt")
            assert a["world_size"] == 1 and b["world_size"] == args.nproc
            figures[name] = {
                "max_metric_abs_diff": max(
                    abs(x[k] - y[k])
                    for x, y in zip(a["metrics"], b["metrics"], strict=True)
                    for k in COMPARED
                ),
                "max_grad_norm_rel_diff": max(
                    abs(x["policy/grad_norm"] - y["policy/grad_norm"]) / abs(x["policy/grad_norm"])
                    for x, y in zip(a["metrics"], b["metrics"], strict=True)
                ),
                "max_weight_abs_diff": _max_diff(a["weights"], b["weights"]),
                "max_weight_change": _max_diff(a["weights"], tiny_model().state_dict()),
                "resumed_max_weight_abs_diff": _max_diff(b["weights"], b["resumed_weights"]),
                "max_update_norm_rank_diff": max(
                    max(step) - min(step) for step in zip(*b["update_norms_by_rank"], strict=True)
                ),
                "losses_1proc": [m["loss/policy"] for m in a["metrics"]],
                "losses_2proc": [m["loss/policy"] for m in b["metrics"]],
                "wall_s": {"1proc": a["wall_s"], f"{args.nproc}proc": b["wall_s"]},
            }
    return {
        "backends": figures,
        "launch_wall_s": {"1proc": one_s, f"{args.nproc}proc": many_s},
        "args": {k: str(v) for k, v in asdict(args).items()},
        "meta": run_meta(),
    }


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a if a[k].numel())


if __name__ == "__main__":
    parsed = tyro.cli(Args)
    if parsed.worker is not None:
        worker(parsed)
        sys.exit(0)
    result = main(parsed)
    if parsed.json:
        print(json.dumps(result))
    else:
        for backend, numbers in result["backends"].items():
            print(backend, {k: v for k, v in numbers.items() if k.startswith("max")})
