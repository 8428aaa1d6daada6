"""The tree state (predictor, carry, generators) is written before every checkpoint OpenRLHF may
write at a step, its best ones included, so a resume from whichever one DeepSpeed's `latest`
tag names finds it."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest

from harness.openrlhf.tree_trainer import TreePPOTrainerBase


def fake_trainer(tmp_path, calls, *, save_steps, eval_steps):
    def save_logs_and_checkpoints(step, status, client_states):
        if step % save_steps == 0:
            calls.append(("checkpoint", f"global_step{step}"))

    def save_best_checkpoint(logs, step, client_states):
        calls.append(("checkpoint", f"best_global_step{step}"))  # a new best every time

    return NS(
        args=NS(
            ckpt=NS(save_steps=save_steps),
            eval=NS(steps=eval_steps, temperature=1.0, n_samples_per_prompt=1),
        ),
        eval_dataloader=[object()],
        generate_kwargs={},
        prompts_dataloader=NS(state_dict=dict),
        state_dir=lambda step: tmp_path / f"global_step{step}",
        samples_generator=NS(save_state=lambda path: calls.append(("state", path.name))),
        save_logs_and_checkpoints=save_logs_and_checkpoints,
        evaluate=lambda step, **kw: {"eval_pass1": 0.5},
        save_best_checkpoint=save_best_checkpoint,
    )


@pytest.mark.parametrize("step", [3, 6, 10])
def test_every_checkpoint_step_gets_the_tree_state_first(tmp_path, step):
    calls: list = []
    trainer = fake_trainer(tmp_path, calls, save_steps=10, eval_steps=3)
    TreePPOTrainerBase._save_and_evaluate(trainer, step, {}, 0, 0)
    written = [name for kind, name in calls if kind == "checkpoint"]
    assert written  # a regular or a best checkpoint at this step
    assert calls[0] == ("state", f"global_step{step}")  # before any of them


def test_steps_without_a_checkpoint_write_no_state(tmp_path):
    calls: list = []
    TreePPOTrainerBase._save_and_evaluate(
        fake_trainer(tmp_path, calls, save_steps=10, eval_steps=3), 4, {}, 0, 0
    )
    assert calls == []
