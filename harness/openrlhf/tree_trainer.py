"""`TreePPOTrainer`: OpenRLHF's single-controller PPO trainer, fed with tree rollouts.

OpenRLHF 0.11.2 builds its `SamplesGenerator` in `PPOTrainer.__init__` and its
`RemoteExperienceMaker` in `BasePPOTrainer.__init__`, both inside the `@ray.remote` trainer
process, so the tree versions cannot be swapped in from outside. This trainer subclasses
`BasePPOTrainer` and keeps everything of it (the KL controller, `train_step`: actor and reference
forwards, replay buffers, `ppo_train` with OpenRLHF's `PolicyLoss`, the weight sync to vLLM,
logging and checkpoints); it only brings its own sample generator and experience maker, and its
own `fit` loop, which adds the tree metrics and saves the predictor with every checkpoint.
"""

from __future__ import annotations

from harness.training.openrlhf_compat import ensure_flash_attn

ensure_flash_attn()  # openrlhf.trainer.ppo_trainer imports openrlhf.models; see openrlhf_compat.py

import logging  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import ray  # noqa: E402
import torch  # noqa: E402
from openrlhf.trainer.ppo_trainer import (  # noqa: E402
    BasePPOTrainer,
    compute_eval_metrics,
    prepare_datasets,
)
from openrlhf.utils.utils import get_tokenizer  # noqa: E402

from harness.openrlhf.actor import tree_steps  # noqa: E402
from harness.openrlhf.config import TreeTrainConfig  # noqa: E402
from harness.openrlhf.experience_maker import TreeExperienceMaker  # noqa: E402
from harness.openrlhf.samples import TreeSamplesGenerator  # noqa: E402
from harness.training.metrics_log import MetricsLog  # noqa: E402
from harness.training.run_guard import FailureStreak, failure_cause  # noqa: E402

__all__ = ["TreePPOTrainer", "TreePPOTrainerBase"]

log = logging.getLogger(__name__)


class TreePPOTrainerBase(BasePPOTrainer):
    """The trainer's code; `TreePPOTrainer` is this class as a Ray actor.

    Args:
        pretrain: The policy's model path (for the tokenizer).
        strategy: OpenRLHF's `DeepspeedStrategy`; `strategy.args` are OpenRLHF's flags.
        actor_model_group: OpenRLHF's `RayActorGroup` of `PolicyModelActor`s.
        critic_model_group: None (tree advantages need no critic).
        reward_model_group: None (the environment gives the reward).
        reference_model_group: The reference model's group, or None when `--algo.kl.init_coef 0`.
        vllm_engines: OpenRLHF's `RolloutRayActor` handles.
        config: trace-rl's flags.
        generate_kwargs: What OpenRLHF's `PPOTrainer` takes as generation kwargs (kept for
            evaluation: `temperature`, `n_samples_per_prompt`).
    """

    def __init__(
        self,
        pretrain: str,
        strategy: Any,
        actor_model_group: Any,
        critic_model_group: Any,
        reward_model_group: Any,
        reference_model_group: Any,
        vllm_engines: list[Any],
        *,
        config: TreeTrainConfig,
        **generate_kwargs: Any,
    ) -> None:
        args = strategy.args
        if args.eval.steps == -1:
            args.eval.steps = math.inf  # as PPOTrainer: never evaluate
        if args.ckpt.save_steps == -1:
            args.ckpt.save_steps = math.inf  # never save
        tokenizer = get_tokenizer(
            pretrain, None, "left", strategy, use_fast=not args.data.disable_fast_tokenizer
        )
        self.prompts_dataloader, self.eval_dataloader, _ = prepare_datasets(strategy, tokenizer)
        self.max_steps = tree_steps(
            len(self.prompts_dataloader.dataset), args.rollout.batch_size, args.train.num_episodes
        )
        self.generate_kwargs = generate_kwargs
        self.config = config
        self.samples_generator = TreeSamplesGenerator(
            strategy,
            self.prompts_dataloader,
            self.eval_dataloader,
            tokenizer,
            vllm_engines,
            config=config,
        )
        super().__init__(
            strategy,
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            vllm_engines,
            tokenizer,
        )
        self.experience_maker = TreeExperienceMaker(
            actor_model_group,
            critic_model_group,
            reward_model_group,
            reference_model_group,
            self.kl_ctl,
            strategy,
            tokenizer,
        )
        config.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics: MetricsLog | None = None  # opened by fit, which knows whether it resumes

    def get_max_steps(self) -> int:
        """Scheduler length, in tree steps, in either budget currency.

        The policy actor advances its schedule once per tree step (`harness.openrlhf.actor`).
        """
        return self.max_steps

    def state_dir(self, global_step: int) -> Path:
        """Where the tree state (predictor, carry, generators) of a checkpoint lives."""
        return self.config.run_dir / "checkpoints" / f"global_step{global_step}"

    def fit(self, global_step: int = 0) -> int:
        """Train until the prompt dataset has been used `--train.num_episodes` times.

        Resumes from OpenRLHF's latest checkpoint with `--ckpt.load_enable`, together with the
        tree state saved beside it.

        Returns:
            The last global step.
        """
        args = self.args
        states = self.init_checkpoint_states()
        self.restore_best_checkpoint_state(states)
        start_episode = states["episode"]
        if states["global_step"] > 0:
            global_step = states["global_step"]
        consumed = states["total_consumed_prompts"]
        if global_step:
            self.broadcast_to_vllm()
            if states["data_loader_state_dict"]:
                self.prompts_dataloader.load_state_dict(states["data_loader_state_dict"])
            self.samples_generator.load_state(self.state_dir(global_step))
        # TensorBoard and wandb go through OpenRLHF's loggers; this writes metrics.jsonl, cut
        # back to the checkpoint's step on resume so no step is logged twice
        self.metrics = MetricsLog(
            self.config.run_dir, tensorboard=False, resume_step=global_step or None
        )
        if self.config.update_norm:  # the actors copy their share of the weights every step
            ray.get(
                self.actor_model_group.async_run_method(
                    method_name="measure_update_norm", enabled=True
                )
            )
        log.info(
            "tree PPO: %d prompts per step, %s budget %d per step, %d max optimizer steps",
            args.rollout.batch_size,
            self.samples_generator.tree_step.budget.currency,
            self.samples_generator.tree_step.budget.per_step,
            self.max_steps,
        )
        streak = FailureStreak(self.config.abort)
        for episode in range(start_episode, args.train.num_episodes):
            while True:
                start = time.time()
                samples, _, n_prompts, exhausted = self.samples_generator.generate_samples(
                    **self.generate_kwargs
                )
                generation_s = time.time() - start
                consumed += n_prompts
                status: dict[str, Any] = {}
                if samples:
                    global_step, status = self._train_on(samples, global_step, generation_s)
                    status["episode"] = float(episode)
                    self._log(global_step, status)
                    self._save_and_evaluate(global_step, status, episode, consumed)
                elif n_prompts:
                    log.warning("a step kept no leaf (%d prompts): nothing to train on", n_prompts)
                    # logged all the same, so a run training on nothing shows it; the step
                    # counts, as the schedule counts tree steps, trained or not
                    global_step += 1
                    status = {**self.samples_generator.last_metrics, "episode": float(episode)}
                    status["timing/generation"] = generation_s
                    self._log(global_step, status)
                    ray.get(self.actor_model_group.async_run_method(method_name="advance_schedule"))
                if status:
                    retriever = self.samples_generator.env.retriever
                    streak.observe(global_step, status, cause=failure_cause(retriever))
                if exhausted:
                    break
        for tracker in (self.wandb_logger, self.tensorboard_logger, self.metrics):
            if tracker:
                tracker.close()
        return global_step

    def _train_on(
        self, samples: list[Any], global_step: int, generation_s: float
    ) -> tuple[int, dict[str, Any]]:
        status, global_step = self.train_step(samples, global_step)
        status.update(self.samples_generator.last_metrics)
        status["timing/generation"] = generation_s
        status["timing/step_total"] = sum(v for k, v in status.items() if k.startswith("timing/"))
        # the names `tracerl plot` draws (harness.training.metrics_log.PANELS)
        status["perf/step_s"] = status["timing/step_total"]
        if "policy_loss" in status:
            status["loss/policy"] = status["policy_loss"]
        return global_step, status

    def _log(self, global_step: int, status: dict[str, Any]) -> None:
        """Append the step's numbers to `metrics.jsonl` and say the headline ones.

        Lists of numbers (Stage 2's per-continuation flip chances) go to the file too.
        """
        assert self.metrics is not None  # fit opened it
        numbers: dict[str, Any] = {}
        for k, v in status.items():
            if isinstance(v, int | float):
                numbers[k] = float(v)
            elif isinstance(v, list | tuple) and all(isinstance(x, int | float) for x in v):
                numbers[k] = list(v)
        self.metrics.write(global_step, numbers)
        log.info(
            "step %d: effective ratio %.3f, leaves %d, reward %.3f",
            global_step,
            status.get("rollout/effective_ratio", float("nan")),
            int(status.get("budget/leaves", 0)),
            status.get("rollout/reward", float("nan")),
        )

    def _save_and_evaluate(
        self, global_step: int, status: dict[str, Any], episode: int, consumed: int
    ) -> None:
        args = self.args
        client_states = {
            "episode": episode,
            "global_step": global_step,
            "total_consumed_prompts": consumed,
            "data_loader_state_dict": self.prompts_dataloader.state_dict(),
        }
        evaluating = global_step % args.eval.steps == 0 and bool(self.eval_dataloader)
        # The tree state goes first, atomically, for every step at which OpenRLHF may write a
        # checkpoint: its regular ones (save_steps) and its best ones (after an evaluation),
        # which move DeepSpeed's `latest` tag too. Resume then finds the state of whichever
        # checkpoint it loads, keyed by the global step both tags record.
        if global_step % args.ckpt.save_steps == 0 or evaluating:
            self.samples_generator.save_state(self.state_dir(global_step))
        self.save_logs_and_checkpoints(global_step, status, client_states)
        if evaluating:
            kwargs = dict(self.generate_kwargs)
            kwargs["temperature"] = args.eval.temperature
            kwargs["n_samples_per_prompt"] = args.eval.n_samples_per_prompt
            logs = self.evaluate(global_step, **kwargs)
            self.save_best_checkpoint(logs, global_step, client_states)

    @torch.no_grad()
    def evaluate(self, global_step: int, **generate_kwargs: Any) -> dict[str, float]:
        """pass@1 and pass@n of independent episodes on the evaluation dataset."""
        samples = self.samples_generator.generate_eval_samples(**generate_kwargs)
        logs = compute_eval_metrics(
            self.eval_dataloader, samples, generate_kwargs["n_samples_per_prompt"]
        )
        for tracker in (self.wandb_logger, self.tensorboard_logger):
            if tracker:
                tracker.log_eval(global_step, logs)
        log.info("evaluation at step %d: %s", global_step, logs)
        return logs


TreePPOTrainer = ray.remote(TreePPOTrainerBase)
"""`TreePPOTrainerBase` as a Ray actor: the single controller of a run."""
