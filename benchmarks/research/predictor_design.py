"""Which success predictor? Measured side by side on the same simulated nodes.

Question: which cheap design of Ṽψ(history) predicts the success probability of roots and turn
prefixes best, trained online, on questions it has mostly never seen?

Data: `benchmarks/research/alloc_sim.py`'s simulated agent (its default world), `random_tree`
rollouts (roots and randomly chosen prefixes, so the data does not depend on any predictor),
`--steps` steps of one pool each. Every design sees the same nodes in the same order and is scored
*before* it trains on each step (prequential: held-out nodes), against the simulator's true
success probability of each history (MSE to the truth) and against the observed outcomes (AUC,
weighted by leaves). Scores average the second half of the steps.

Designs: the default (hashed head+tail n-grams, MLP 64, MSE), logistic regression, soft
cross-entropy, a head-only encoding, no familiarity floor, and frozen MiniLM embeddings (head and
tail, `harness.rollout.featurizers.MiniLMFeaturizer`) with the MLP and with logistic regression.

Run: `python -m benchmarks.research.predictor_design --json` (`--quick` for a smoke test).
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import tyro
from rich.console import Console
from rich.table import Table
from tqdm import tqdm

from benchmarks.meta import run_meta
from benchmarks.research.alloc_sim import Args as SimArgs
from benchmarks.research.alloc_sim import SimExecutor, SimWorld
from trace_alloc import BudgetLimit, HashedNgramFeaturizer, MLPPredictor, make_allocator, run_step
from trace_alloc.base import Featurizer
from trace_alloc.calibration import calibration_report
from trace_alloc.tree import training_examples


@dataclass
class Args:
    """Predictor design benchmark options."""

    steps: int = 16
    """simulated steps (one pool of prompts each)"""
    leaves_per_step: int = 384
    """random_tree leaves per step"""
    minilm: bool = True
    """include the MiniLM designs (loads the packaged model; slower)"""
    seed: int = 0
    quick: bool = False
    """smoke test: 3 steps of 96 leaves, no MiniLM"""
    json: bool = False
    """print one JSON object as the last line of stdout"""
    progress: bool = True
    """progress bars on stderr"""

    def __post_init__(self) -> None:
        if self.quick:
            self.steps, self.leaves_per_step, self.minilm = 3, 96, False


@dataclass
class StepData:
    """One step's training nodes with their truth."""

    histories: list[str]
    targets: np.ndarray
    counts: np.ndarray
    truth: np.ndarray
    is_root: np.ndarray


class CachedFeaturizer:
    """Featurizes each distinct history once (designs are compared on identical features)."""

    def __init__(self, inner: Featurizer) -> None:
        self.inner = inner
        self.cache: dict[str, np.ndarray] = {}
        self.seconds = 0.0

    @property
    def dim(self) -> int:
        """The inner featurizer's dimension."""
        return self.inner.dim

    def featurize(self, histories: Sequence[str]) -> np.ndarray:
        """Features, computing only the histories not seen before."""
        new = sorted({h for h in histories if h not in self.cache})
        if new:
            start = time.perf_counter()
            rows = self.inner.featurize(new)
            self.seconds += time.perf_counter() - start
            self.cache.update(zip(new, rows, strict=True))
        return (
            np.stack([self.cache[h] for h in histories]) if histories else np.zeros((0, self.dim))
        )


def simulate(args: Args) -> list[StepData]:
    """random_tree steps on the simulated agent, with the true V of every node."""
    # the single-pass world its recorded figures were measured on (no question recurs)
    sim = SimArgs(steps=args.steps, seed=args.seed, pool_size=128, n_questions=4000)
    world = SimWorld(sim)
    allocator = make_allocator("random_tree")
    data = []
    for step in range(args.steps):
        executor = SimExecutor(
            world, step, np.random.default_rng((args.seed, step, 5)), sim.concentration
        )
        result = run_step(
            allocator,
            world.pool(step),
            execute=executor,
            budget=BudgetLimit(per_step=args.leaves_per_step),
            rng=np.random.default_rng((args.seed, step, 6)),
        )
        ex = training_examples(result.trees)
        histories, targets, counts = list(ex.histories), ex.targets, ex.n_leaves
        roots = {t.prompt_text: world.by_id[t.prompt_id] for t in result.trees}
        truth = np.array(
            [executor.root_p(roots[h]) if h in roots else executor.truth[h] for h in histories]
        )
        is_root = np.array([h in roots for h in histories])
        data.append(StepData(histories, targets, counts, truth, is_root))
    return data


def evaluate_predictor(make: Callable[[], MLPPredictor], data: list[StepData]) -> dict[str, float]:
    """Prequential scores of one design, averaged over the second half of the steps."""
    predictor = make()
    rows: list[dict[str, float]] = []
    fit_s = 0.0
    for step in data:
        p = predictor.predict(step.histories)
        row = {}
        for part, mask in (("root", step.is_root), ("prefix", ~step.is_root)):
            row[f"{part}_mse_truth"] = float(np.mean((p[mask] - step.truth[mask]) ** 2))
            report = calibration_report(p[mask], step.targets[mask], step.counts[mask])
            row[f"{part}_auc"] = report.auc
            row[f"{part}_brier"] = report.brier
        rows.append(row)
        start = time.perf_counter()
        predictor.update(step.histories, step.targets)
        fit_s += time.perf_counter() - start
    late = rows[len(rows) // 2 :]
    out = {k: float(np.nanmean([r[k] for r in late])) for k in rows[0]}
    out["fit_s_per_step"] = fit_s / len(data)
    return out


def main(args: Args) -> dict[str, Any]:
    """Simulate once, then score every design on the same nodes."""
    data = simulate(args)
    hashed = CachedFeaturizer(HashedNgramFeaturizer())
    head_only = CachedFeaturizer(HashedNgramFeaturizer(tail_words=0))
    designs: dict[str, Callable[[], MLPPredictor]] = {
        "hashed + MLP64 + MSE (default)": lambda: MLPPredictor(hashed, seed=args.seed),
        "hashed + logistic + MSE": lambda: MLPPredictor(hashed, hidden=0, lr=3e-2, seed=args.seed),
        "hashed + MLP64 + BCE": lambda: MLPPredictor(hashed, loss="bce", seed=args.seed),
        "hashed head only + MLP64": lambda: MLPPredictor(head_only, seed=args.seed),
        "hashed + MLP64, no familiarity floor": lambda: MLPPredictor(
            hashed, similar_at=1e-6, seed=args.seed
        ),
    }
    if args.minilm:
        from harness.rollout import MiniLMFeaturizer

        minilm = CachedFeaturizer(MiniLMFeaturizer())
        designs["MiniLM head+tail + MLP64"] = lambda: MLPPredictor(minilm, seed=args.seed)
        designs["MiniLM head+tail + logistic"] = lambda: MLPPredictor(
            minilm, hidden=0, lr=3e-2, seed=args.seed
        )
    results = {}
    for name, make in tqdm(
        designs.items(), desc="designs", disable=not args.progress, file=sys.stderr
    ):
        results[name] = evaluate_predictor(make, data)
    featurize_s = {"hashed": hashed.seconds, "hashed head only": head_only.seconds}
    if args.minilm:
        featurize_s["MiniLM"] = minilm.seconds  # type: ignore[possibly-undefined]  # same test
    n_histories = len({h for s in data for h in s.histories})
    return {
        "designs": results,
        "featurize_s_per_1k": {k: 1e3 * v / n_histories for k, v in featurize_s.items()},
        "n_nodes": sum(len(s.histories) for s in data),
        "meta": run_meta(),
    }


def print_table(result: dict[str, Any]) -> None:
    """One row per design (stderr)."""
    table = Table(title=f"predictor designs, {result['n_nodes']} simulated nodes, prequential")
    for col in ("design", "root MSE→truth", "root AUC", "prefix MSE→truth", "prefix AUC",
                "prefix Brier", "fit s/step"):  # fmt: skip
        table.add_column(col, justify="right")
    for name, r in result["designs"].items():
        table.add_row(
            name,
            f"{r['root_mse_truth']:.4f}",
            f"{r['root_auc']:.3f}",
            f"{r['prefix_mse_truth']:.4f}",
            f"{r['prefix_auc']:.3f}",
            f"{r['prefix_brier']:.4f}",
            f"{r['fit_s_per_step']:.2f}",
        )
    console = Console(stderr=True, width=150)
    console.print(table)
    console.print(f"featurize seconds per 1k histories: {result['featurize_s_per_1k']}")


if __name__ == "__main__":
    args = tyro.cli(Args)
    result = main(args)
    print_table(result)
    if args.json:
        print(json.dumps(result, sort_keys=True), flush=True)
