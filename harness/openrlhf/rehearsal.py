"""Rehearse a GPU run's tree steps on this machine, with the transformers backend.

`tracerl train --backend openrlhf --check-only --rehearse-steps N ...` parses every flag as a
real run would, then plays N tree steps with exactly those settings (the policy, the prompt
file, the retriever, the environment, the allocator, the budget, the per-action and per-episode
token caps, the sampling temperature) through the same `TreeSamplesGenerator.run_tree_step` the
GPU trainer runs, only with a `TransformersBackend` on CPU (or one GPU) in place of the vLLM
engines. No Ray actor, vLLM engine or DeepSpeed rank is started.

It answers the question a first GPU run cannot afford to answer by failing: do these settings
give leaves with a training signal? (A policy run in an environment it was not trained for gets
none, and then nothing trains.) What it cannot show is anything about the GPU stack itself.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from harness.errors import HarnessError
from harness.openrlhf.config import TreeTrainConfig

__all__ = ["PromptList", "RehearsedStep", "read_prompt_file", "rehearse", "tree_step_generator"]


class PromptList:
    """An in-memory stand-in for OpenRLHF's prompt dataloader (`prepare_datasets`).

    Iterating yields OpenRLHF's one-prompt batches, `(datasource, [prompt], [label], [None])`;
    `dataset.labels` is every label, as `PromptDataset` has it.
    """

    def __init__(self, prompts: Sequence[str], labels: Sequence[Any]) -> None:
        if len(prompts) != len(labels):
            raise ValueError(f"{len(prompts)} prompts but {len(labels)} labels")
        self.prompts = list(prompts)
        self.labels = list(labels)
        self.dataset = self

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[tuple[str, list[str], list[Any], list[None]]]:
        for prompt, label in zip(self.prompts, self.labels, strict=True):
            yield "rehearsal", [prompt], [label], [None]


def read_prompt_file(args: Any) -> PromptList:
    """The prompts and labels of `--data.prompt_dataset` (a local JSON-lines file), in order.

    Reads `--data.input_key` and `--data.label_key`, at most `--data.max_samples` rows.

    Raises:
        HarnessError: the dataset is not a local `.jsonl` file, or a row lacks a key.
    """
    path = Path(str(args.data.prompt_dataset))
    if not path.is_file():
        raise HarnessError(
            f"--data.prompt_dataset {path}: a rehearsal reads a local JSON-lines file "
            "(scripts/prepare_hotpotqa.py and `tracerl smoke-data` write one)"
        )
    prompts: list[Any] = []
    labels: list[Any] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if len(prompts) >= args.data.max_samples:
                break
            if not line.strip():
                continue
            row = json.loads(line)
            try:
                prompts.append(str(row[args.data.input_key]))
                labels.append(row[args.data.label_key])
            except KeyError as err:
                raise HarnessError(f"{path}:{number} has no column {err}") from err
    return PromptList(prompts, labels)


def tree_step_generator(
    config: TreeTrainConfig,
    args: Any,
    prompts: PromptList,
    *,
    device: str = "cpu",
    dtype: str = "float32",
) -> Any:
    """A `TreeSamplesGenerator` for these flags whose policy is a `TransformersBackend`.

    Args:
        config: trace-rl's flags.
        args: OpenRLHF's parsed flags (`launcher.parse_args`).
        prompts: The prompts the steps draw from.
        device: Where the policy runs.
        dtype: The policy's weights' dtype.
    """
    from transformers import AutoTokenizer

    from harness.openrlhf.samples import TreeSamplesGenerator
    from harness.policies import TransformersBackend

    model_dir = args.actor.model_name_or_path
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    backend = TransformersBackend(
        model_dir, tokenizer, device=device, dtype=dtype, seed=config.seed
    )
    return TreeSamplesGenerator(
        SimpleNamespace(args=args),
        prompts,
        None,
        tokenizer,
        [],
        config=config,
        backend=backend,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RehearsedStep:
    """What one rehearsed tree step produced."""

    step: int
    n_prompts: int
    n_leaves: int
    """Leaves the allocator spent the budget on."""
    n_signal: int
    """Leaves with a non-zero advantage: what the trainer would train on."""
    n_fillers: int
    n_failed_excluded: int
    reward: float
    """Mean leaf reward."""
    seconds: float

    def line(self) -> str:
        """One line for the terminal."""
        return (
            f"rehearsal step {self.step}: {self.n_prompts} prompts, {self.n_leaves} leaves, "
            f"{self.n_signal} with signal, {self.n_fillers} fillers, "
            f"{self.n_failed_excluded} failed excluded, reward {self.reward:.3f} "
            f"({self.seconds:.1f} s)"
        )


def rehearse(
    config: TreeTrainConfig, args: Any, *, steps: int, device: str = "cpu"
) -> list[RehearsedStep]:
    """Play `steps` tree steps with these flags (module docstring), fewer if the prompts run out.

    Raises:
        HarnessError: see `read_prompt_file`; settings `TreeSamplesGenerator` refuses.
    """
    prompts = read_prompt_file(args)
    generator = tree_step_generator(config, args, prompts, device=device)
    batch = args.rollout.batch_size
    out = []
    for step in range(steps):
        chunk = slice(step * batch, (step + 1) * batch)
        if not prompts.prompts[chunk]:
            break
        start = time.perf_counter()
        experiences = generator.run_tree_step(prompts.prompts[chunk], prompts.labels[chunk])
        metrics = generator.last_metrics
        out.append(
            RehearsedStep(
                step=step + 1,
                n_prompts=len(prompts.prompts[chunk]),
                n_leaves=int(metrics["budget/leaves"]),
                n_signal=int(metrics["rollout/n_train_leaves"]),
                n_fillers=len(experiences) - int(metrics["rollout/n_train_leaves"]),
                n_failed_excluded=int(metrics["rollout/failed_leaves_excluded"]),
                reward=float(metrics["rollout/reward"]),
                seconds=time.perf_counter() - start,
            )
        )
    return out
