"""An allocator of your own, trained against from Python and from the command line.

`EvenRoots` spreads a step's leaves evenly over the pool's prompts in one wave of fresh rollouts
(GRPO with groups as equal as the budget allows), and keeps for training only the prompts whose
leaves disagree. It implements `trace_alloc.Allocator`: a `name`, whether it reads the
predictor, `ask` (the next wave, given an `AllocView` of the forest and the budget left) and
`train_indices`. docs/extending.md, "Adding an allocator", walks through it.

Run from the repository root: `python -m examples.own_allocator` (2 steps of the shipped warm
start on CPU), or the same from the command line:

    tracerl train --allocator examples.own_allocator:EvenRoots \\
        --allocator-kwargs '{"max_per_prompt": 4}' --steps 2 --run-dir runs/even_roots
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from harness.training import BudgetConfig, EvalConfig, TrainConfig, train
from trace_alloc import AllocPlan, AllocView, Predictor, RolloutRequest, RolloutTree

WARM_START = Path(__file__).resolve().parents[1] / "harness" / "tiny_policy" / "warm_start"


@dataclass(frozen=True)
class EvenRoots:
    """One wave of fresh rollouts, the budget shared as evenly as it divides over the pool."""

    name: ClassVar[str] = "even_roots"
    uses_predictor: ClassVar[bool] = False
    max_per_prompt: int = 8
    """No prompt gets more rollouts than this; the rest of the budget is left unspent."""

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """All of the step's leaves in the first wave; nothing after it."""
        if view.started:  # one wave only: an empty plan ends the step
            return AllocPlan()
        n_prompts = len(view.trees)
        share, extra = divmod(view.leaves_left, n_prompts)
        requests = []
        for i in range(n_prompts):
            n = min(share + (1 if i < extra else 0), self.max_per_prompt)
            if n > 0:
                requests.append(RolloutRequest(tree_index=i, node_id=0, n=n))
        return AllocPlan(requests=tuple(requests), stage="roots", diagnostics={"share": share})

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """The prompts whose leaves disagree: the only ones with a group-relative signal."""
        return [i for i, t in enumerate(trees) if len({t.nodes[j].reward for j in t.leaves()}) > 1]


def main(run_dir: Path, *, steps: int = 2) -> dict[str, float]:
    """Train the warm start for `steps` steps with `EvenRoots`; returns the last step's metrics."""
    config = TrainConfig(
        run_dir=run_dir,
        policy=WARM_START,
        steps=steps,
        budget=BudgetConfig(per_step=8, pool_size=4),
        eval=EvalConfig(every=0),
        tensorboard=False,
        progress=False,
    )
    summary = train(config, allocator=EvenRoots(max_per_prompt=4))
    return summary.final


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        final = main(Path(tmp) / "run")
    leaves, reward = final["budget/leaves"], final["rollout/reward"]
    print(f"step {final['step']}: {leaves} leaves, reward {reward:.3f}")
