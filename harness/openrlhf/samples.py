"""`TreeSamplesGenerator`: OpenRLHF's sample generator, running trace-rl's tree-rollout engine.

OpenRLHF 0.11.2's `SamplesGenerator.generate_samples` sends each prompt to one vLLM engine for
`--rollout.n_samples_per_prompt` independent agent runs. A TRACE step is different: the allocator
decides, wave by wave, how many rollouts each prompt of the pool gets and at which turn prefixes
the trees fork (docs/design.md §1), so the number of leaves per prompt varies. So this subclass
replaces generation with one call to `harness.training.tree_step.TreeStep.run`, the step the CPU
trainer runs too (rollouts, predictor and flip calibrator, tree advantages, the leaves with
signal), whose policy is `RayEnginesBackend` over the same Ray vLLM engines OpenRLHF created and
keeps in sync; after the step it:

1. turns every leaf with signal into an `Experience` with its advantages already in place
   (`harness.openrlhf.experience`), for `TreeExperienceMaker` to keep;
2. pads the count to a multiple of the training batch with short zero-weight fillers (action
   mask 0), because OpenRLHF splits a step's samples evenly over its data-parallel ranks.
   Fillers count in none of OpenRLHF's loss normalisers, so the objective is the CPU trainer's
   (docs/decisions.md, "One objective").

The prompt dataset's label column (`--data.label_key`) holds each question's `QATask` JSON
(`scripts/prepare_hotpotqa.py` writes it); the environment builds its own Search-R1 prompt from
the task, so OpenRLHF's prompt string is only kept to group evaluation results.
"""

from __future__ import annotations

from harness.training.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf's trainer modules import openrlhf.models; see openrlhf_compat.py

import contextlib  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.trainer.ppo_utils.experience import Experience  # noqa: E402
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator  # noqa: E402

from envs import QATask, TaskSet  # noqa: E402
from harness.errors import EngineTimeoutError, HarnessError  # noqa: E402
from harness.openrlhf.config import TreeTrainConfig  # noqa: E402
from harness.openrlhf.experience import (  # noqa: E402
    actor_ranks,
    batch_unit,
    experience_from_tokens,
    experiences_from_leaves,
    pad_to_multiple,
    spread_over_ranks,
    token_advantages_of_episode,
)
from harness.policies.base import PolicyBackend, SamplingParams  # noqa: E402
from harness.policies.openrlhf_ray import RayEnginesBackend  # noqa: E402
from harness.rollout.engine import TreeRolloutEngine  # noqa: E402
from harness.rollout.episodes import EpisodeCodec, run_episodes  # noqa: E402
from harness.training.checkpoint import write_dir_atomic  # noqa: E402
from harness.training.run_guard import check_retriever  # noqa: E402
from harness.training.tree_step import TreeStep, allocator_rng  # noqa: E402  (the step the CPU trainer runs)
from retrieval.indexes import make_retriever  # noqa: E402
from trace_alloc import Allocator, BudgetLimit, StepResult  # noqa: E402
from trace_alloc.budget import Spend  # noqa: E402

__all__ = ["STATE_SCHEMA_VERSION", "ChatTemplateCodec", "TreeSamplesGenerator"]

log = logging.getLogger(__name__)

STATE_SCHEMA_VERSION = 1
"""Version of `state.json` written by `TreeSamplesGenerator.save_state`."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChatTemplateCodec(EpisodeCodec):
    """An `EpisodeCodec` whose prompt is the user turn of the tokenizer's chat template.

    For chat models (Qwen3-8B): the prompt becomes `<|im_start|>user ... <|im_start|>assistant`,
    and actions and observations then continue the assistant turn as plain text (Search-R1).
    Used when OpenRLHF's `--data.apply_chat_template` is given.
    """

    def encode_prompt(self, prompt: str) -> list[int]:
        """Token ids of the chat-formatted prompt, ready for the assistant's first action."""
        text = self.tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
        return self.encode_text(str(text))


class TreeSamplesGenerator(SamplesGenerator):
    """Generates one training step's samples with tree rollouts instead of independent groups.

    Args:
        strategy: OpenRLHF's `DeepspeedStrategy` (its `args` are OpenRLHF's parsed flags).
        prompts_dataloader: OpenRLHF's prompt dataloader (`prepare_datasets`).
        eval_dataloader: The evaluation dataloader, or None.
        tokenizer: The policy's tokenizer.
        vllm_engines: OpenRLHF's `RolloutRayActor` handles.
        config: trace-rl's flags.
        backend: The policy the tree engine samples from; None (the training run): a
            `RayEnginesBackend` over `vllm_engines`. `harness.openrlhf.rehearsal` passes a
            `TransformersBackend` to play the same steps without Ray or vLLM.
        allocator: An allocator of your own (the `trace_alloc.Allocator` protocol); None: the
            one `config.allocator` or `config.alloc` names (docs/extending.md).

    Raises:
        HarnessError: a label that is not a task's JSON, or settings that cannot work.
    """

    def __init__(
        self,
        strategy: Any,
        prompts_dataloader: Any,
        eval_dataloader: Any,
        tokenizer: Any,
        vllm_engines: list[Any],
        *,
        config: TreeTrainConfig,
        backend: PolicyBackend | None = None,
        allocator: Allocator | None = None,
    ) -> None:
        super().__init__(strategy, prompts_dataloader, eval_dataloader, tokenizer, vllm_engines)
        args = self.args
        if args.rollout.max_new_tokens is None:
            raise HarnessError(
                "--rollout.max_new_tokens is required: it is the per-turn token cap of an action"
            )
        self.config = config
        self.backend = backend or RayEnginesBackend(
            self.vllm_engines,
            eos_text=tokenizer.eos_token,
            seed=config.seed,
            seeded=config.seeded_requests,
            timeout_s=config.engine_timeout_s,
        )
        loaders = [prompts_dataloader] + ([eval_dataloader] if eval_dataloader else [])
        self._tasks_by_label: dict[str, QATask] = {}
        tasks = TaskSet(self._tasks_from_labels(loaders))
        retriever = make_retriever(config.retriever)
        check_retriever(retriever)  # from the trainer's node: where the envs run
        self.env = config.env.make_env(tasks, retriever)
        codec_cls = ChatTemplateCodec if args.data.apply_chat_template else EpisodeCodec
        self.codec = codec_cls(tokenizer)
        self.sampling = SamplingParams(
            max_new_tokens=args.rollout.max_new_tokens,
            temperature=args.rollout.temperature,
            top_p=args.rollout.top_p,
        )
        per_step = (
            args.rollout.batch_size * args.rollout.n_samples_per_prompt
            if config.budget.currency == "leaves"
            else config.budget.per_step
        )
        assert per_step is not None  # TreeBudgetConfig checks it
        self.tree_step = TreeStep(
            engine=TreeRolloutEngine(
                self.backend,
                self.env,
                self.codec,
                sampling=self.sampling,
                max_total_tokens=args.data.max_len,
                seed=config.seed,
            ),
            allocator=allocator or config.build_allocator(config.alloc),
            budget=BudgetLimit(
                currency=config.budget.currency,
                per_step=per_step,
                max_waves=config.budget.max_waves,
            ),
            predictor=config.predictor.build(seed=config.seed),
            flip_calibrator=config.predictor.build_flip_calibrator(),
            advantage=config.loss.advantage,
            rng=allocator_rng(config.seed),
            tokens_per_leaf=float(args.rollout.max_new_tokens),  # first-wave guess (tokens)
        )
        """The allocator, budget, predictor and flip calibrator with their state between steps:
        the step the CPU trainer runs too."""
        self.eval_rng = np.random.default_rng([config.seed, 2])  # evaluation never shifts training
        self.unit = batch_unit(args)
        self.last_metrics: dict[str, Any] = {}
        """Tree metrics of the last `generate_samples` (effective ratio, budget, predictor)."""
        self.last_step: StepResult | None = None
        self._dataloader_iter: Iterator[Any] | None = None
        log.info(
            "tree rollouts: allocator %s, %s budget %d per step, %s advantages, %d tasks, "
            "samples padded to a multiple of %d",
            type(self.tree_step.allocator).__name__,
            config.budget.currency,
            per_step,
            config.loss.advantage,
            len(tasks),
            self.unit,
        )

    # --- OpenRLHF's interface ---

    @torch.no_grad()
    def generate_samples(self, **generate_kwargs: Any) -> tuple[list[Experience], None, int, bool]:
        """Run one tree step on the next `--rollout.batch_size` prompts.

        Returns:
            `(experiences, None, prompts_consumed, exhausted)`, as OpenRLHF's `generate_samples`
            (the second item, a dynamic-filtering pass rate, does not apply: the allocator's
            `train_indices` does the filtering). Experiences are empty when the step kept no
            leaf.
        """
        if self._dataloader_iter is None:
            self._dataloader_iter = iter(self.prompts_dataloader)
        prompts, labels, exhausted = _draw(self._dataloader_iter, self.args.rollout.batch_size)
        if exhausted:
            self._dataloader_iter = None
        if not prompts:
            return [], None, 0, True
        with self._engines_awake():
            experiences = self.run_tree_step(prompts, labels)
        return experiences, None, len(prompts), exhausted

    @torch.no_grad()
    def generate_eval_samples(self, **generate_kwargs: Any) -> list[Experience]:
        """Play `n_samples_per_prompt` independent episodes per evaluation question.

        The experiences come in consecutive groups of `n_samples_per_prompt` per prompt, as
        OpenRLHF's `compute_eval_metrics` expects, with `temperature` from the kwargs.
        """
        n = int(generate_kwargs.get("n_samples_per_prompt", 1))
        sampling = dataclasses.replace(
            self.sampling, temperature=float(generate_kwargs.get("temperature", 1.0))
        )
        with self._engines_awake():
            return self._eval_episodes(iter(self.eval_dataloader), n, sampling)

    def _eval_episodes(
        self, iterator: Iterator[Any], n: int, sampling: SamplingParams
    ) -> list[Experience]:
        out: list[Experience] = []
        while True:
            prompts, labels, exhausted = _draw(iterator, self.args.rollout.batch_size)
            if prompts:
                tasks = [self._task(label) for label in labels]
                episodes = run_episodes(
                    self.backend,
                    self.env,
                    [t.task_id for t in tasks for _ in range(n)],
                    self.codec,
                    sampling=sampling,
                    seed=int(self.eval_rng.integers(2**31)),
                    max_total_tokens=self.args.data.max_len,
                )
                for i, episode in enumerate(episodes):
                    out.append(
                        experience_from_tokens(
                            token_advantages_of_episode(
                                episode.token_ids, episode.action_mask, episode.logprobs
                            ),
                            reward=episode.reward,
                            max_len=self.args.data.max_len,
                            prompt=prompts[i // n],
                            label=labels[i // n],
                            n_turns=episode.n_turns,
                        )
                    )
            if exhausted or not prompts:
                return out

    @contextlib.contextmanager
    def _engines_awake(self) -> Iterator[None]:
        """Wake sleeping vLLM engines for generation and put them back after, as OpenRLHF does.

        Each call waits at most `--engine-timeout-s`. When the step fails (most often an engine
        that did not answer), the engines are left awake: the run stops anyway, and a `sleep`
        sent to a hung engine would never return (OpenRLHF's `batch_vllm_engine_call` has no
        timeout), so the controller would hang instead of raising.

        Raises:
            EngineTimeoutError: an engine did not answer `wake_up` or `sleep` in time.
        """
        if not self.args.vllm.enable_sleep:
            yield
            return
        self._call_engines("wake_up")
        try:
            yield
        except BaseException:
            log.warning("the step failed: vLLM engines left awake (not put back to sleep)")
            raise
        self._call_engines("sleep")

    def _call_engines(self, method: str) -> None:
        """`method.remote()` on every engine, waiting at most `engine_timeout_s`."""
        refs = [getattr(engine, method).remote() for engine in self.vllm_engines]
        timeout_s = self.config.engine_timeout_s
        try:
            ray.get(refs, timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as err:
            for ref in refs:
                ray.cancel(ref)
            raise EngineTimeoutError(
                f"vLLM engines did not answer `{method}` within {timeout_s} s; is an engine "
                "hung? (--engine-timeout-s)"
            ) from err

    # --- the tree step ---

    def run_tree_step(self, prompts: Sequence[str], labels: Sequence[str]) -> list[Experience]:
        """Tree rollouts on these prompts, predictor update, advantages, experiences.

        Args:
            prompts: OpenRLHF's prompt strings (kept in the experiences).
            labels: Each prompt's task JSON.

        Returns:
            One experience per kept leaf, then fillers up to a multiple of `unit`.
        """
        tasks = [self._task(label) for label in labels]
        first: dict[str, int] = {}
        for i, task in enumerate(tasks):
            first.setdefault(task.task_id, i)  # a question drawn twice is played once
        if isinstance(self.backend, RayEnginesBackend):
            self.backend.reset_routing()  # OpenRLHF reset the engines' prefix caches at the sync
        out = self.tree_step.run(list(first))
        kept = out.kept
        experiences = experiences_from_leaves(
            kept,
            out.leaves,
            max_len=self.args.data.max_len,
            prompts=[prompts[first[t.prompt_id]] for t in kept],
            labels=[labels[first[t.prompt_id]] for t in kept],
        )
        # the real leaves shared out over the ranks, each rank's fillers after its leaves
        padded = spread_over_ranks(
            pad_to_multiple(experiences, self.unit), len(experiences), actor_ranks(self.args)
        )
        self.last_step = out.result
        self.last_metrics = dict(out.metrics)
        self.last_metrics["rollout/n_train_leaves"] = float(len(experiences))
        self.last_metrics["rollout/n_fillers"] = float(len(padded) - len(experiences))
        return padded

    # --- state for checkpoints ---

    def save_state(self, directory: Path) -> None:
        """Write the predictor (`predictor.npz`) and the step state (`state.json`), atomically.

        A process killed while writing leaves the previous state of `directory` (or none).
        """
        step = self.tree_step
        state = {
            "schema_version": STATE_SCHEMA_VERSION,
            "carry": step.carry,
            "tokens_per_leaf": step.tokens_per_leaf,
            "rng": step.rng.bit_generator.state,
            "engine_rng": step.engine.rng_state(),
            "spent": dataclasses.asdict(step.spent),
        }
        if isinstance(self.backend, RayEnginesBackend):  # --seeded-requests draws from it
            state["backend_rng"] = self.backend.rng_state()

        def write(tmp: Path) -> None:
            arrays: dict[str, Any] = step.predictor_state()
            np.savez(tmp / "predictor.npz", **arrays)
            (tmp / "state.json").write_text(json.dumps(state, indent=1))

        write_dir_atomic(directory, write)

    def load_state(self, directory: Path) -> None:
        """Restore `save_state` output.

        Raises:
            HarnessError: missing files or another schema version.
        """
        try:
            state = json.loads((directory / "state.json").read_text())
            with np.load(directory / "predictor.npz", allow_pickle=False) as arrays:
                predictor_state = {name: arrays[name] for name in arrays.files}
        except (OSError, ValueError) as err:
            raise HarnessError(
                f"cannot resume the tree state from {directory}: {err}. It is written next to "
                "every OpenRLHF checkpoint (--ckpt.save_steps); resume with the same --run-dir."
            ) from err
        if state.get("schema_version") != STATE_SCHEMA_VERSION:
            raise HarnessError(
                f"{directory / 'state.json'} has schema_version {state.get('schema_version')!r}, "
                f"this trace-rl reads {STATE_SCHEMA_VERSION}"
            )
        step = self.tree_step
        step.load_predictor_state(predictor_state)
        step.carry = float(state["carry"])
        step.tokens_per_leaf = float(state["tokens_per_leaf"])
        step.rng.bit_generator.state = state["rng"]
        step.engine.set_rng_state(state["engine_rng"])
        step.spent = Spend(**state["spent"])
        if isinstance(self.backend, RayEnginesBackend):
            if "backend_rng" in state:
                self.backend.set_rng_state(state["backend_rng"])
            else:  # written before the backend's generator was saved
                log.warning(
                    "%s has no backend_rng: seeded requests will not resume exactly", directory
                )

    # --- tasks ---

    def _tasks_from_labels(self, loaders: Sequence[Any]) -> list[QATask]:
        by_id: dict[str, QATask] = {}
        for loader in loaders:
            for label in loader.dataset.labels:
                task = self._task(label)
                seen = by_id.setdefault(task.task_id, task)
                if seen != task:
                    raise HarnessError(
                        f"task id {task.task_id!r} names two different tasks in the prompt "
                        "datasets; give every question a unique id"
                    )
        if not by_id:
            raise HarnessError("the prompt dataset is empty")
        return list(by_id.values())

    def _task(self, label: Any) -> QATask:
        key = label if isinstance(label, str) else json.dumps(label, sort_keys=True)
        task = self._tasks_by_label.get(key)
        if task is None:
            try:
                record = json.loads(label) if isinstance(label, str) else dict(label)
                task = QATask.from_json(record)
            except (TypeError, ValueError, KeyError) as err:
                raise HarnessError(
                    f"label {str(label)[:120]!r} is not a task's JSON ({err!r}). The column "
                    "named by --data.label_key must hold QATask.to_json() (see "
                    "scripts/prepare_hotpotqa.py)."
                ) from err
            self._tasks_by_label[key] = task
        return task


def _draw(iterator: Iterator[Any], n: int) -> tuple[list[str], list[Any], bool]:
    """Up to `n` (prompt, label) pairs from an OpenRLHF prompt dataloader, and exhaustion."""
    prompts: list[str] = []
    labels: list[Any] = []
    while len(prompts) < n:
        try:
            _, batch_prompts, batch_labels, _ = next(iterator)
        except StopIteration:
            return prompts, labels, True
        room = n - len(prompts)
        prompts += list(batch_prompts[:room])
        labels += list(batch_labels[:room])
    return prompts, labels, False
