"""A policy backend of your own: what generates the rollouts of the policy being trained.

`train(config, backend=...)` takes anything that builds a `harness.policies.PolicyBackend` from
the model being trained and its tokenizer: a class whose constructor is `(model, tokenizer)`
fits. `MeteredBackend` wraps the default `TransformersBackend` and counts its calls and tokens,
the place to put a cache, a different sampler or a remote server of your own. It must keep
sampling the trained model's weights, or the updates are no longer on-policy.
docs/extending.md, "Adding a policy backend", walks through it.

Run from the repository root: `python -m examples.own_policy_backend` (2 steps on CPU).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from harness.policies import Completion, SamplingParams, TransformersBackend
from harness.training import BudgetConfig, EvalConfig, TrainConfig, train

WARM_START = Path(__file__).resolve().parents[1] / "harness" / "tiny_policy" / "warm_start"


class MeteredBackend:
    """`TransformersBackend` over the trained model, counting generate calls and tokens."""

    def __init__(self, model: Any, tokenizer: Any) -> None:
        self.inner = TransformersBackend(model, tokenizer)
        self.calls = 0
        self.tokens = 0

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once (the `PolicyBackend` protocol), and count."""
        completions = self.inner.generate(prefixes, sampling)
        self.calls += 1
        self.tokens += sum(c.n_tokens for c in completions)
        return completions


def main(run_dir: Path, *, steps: int = 2) -> MeteredBackend:
    """Train the warm start for `steps` steps through a `MeteredBackend`; returns it."""
    built: list[MeteredBackend] = []

    def backend(model: Any, tokenizer: Any) -> MeteredBackend:
        built.append(MeteredBackend(model, tokenizer))
        return built[-1]

    config = TrainConfig(
        run_dir=run_dir,
        policy=WARM_START,
        steps=steps,
        budget=BudgetConfig(per_step=8, pool_size=4),
        eval=EvalConfig(every=0),
        tensorboard=False,
        progress=False,
    )
    train(config, backend=backend)
    return built[0]


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as tmp:
        metered = main(Path(tmp) / "run")
    print(f"{metered.calls} generate calls, {metered.tokens} tokens generated")
