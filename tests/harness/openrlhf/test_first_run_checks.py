"""What stops a first GPU run before it starts or while it logs: the launcher's refusals and
defaults, the flash-attn-free route, the policy's own environment, finite logs on fillers, the
schedule counted in tree steps, and the backend's generator in the tree state."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
import torch

from harness.errors import HarnessError
from harness.openrlhf.launcher import (
    check_openrlhf_args,
    parse_args,
    parse_openrlhf_args,
    ray_runtime_env,
)
from harness.training.openrlhf_compat import flash_attn_installed

ROOT = Path(__file__).resolve().parents[3]
WARM_START = ROOT / "harness" / "tiny_policy" / "warm_start"
REQUIRED = [
    *("--actor.model_name_or_path", str(WARM_START), "--data.prompt_dataset", "p.jsonl"),
    *("--vllm.num_engines", "1", "--rollout.max_new_tokens", "16"),
    *("--actor.num_gpus_per_node", "4", "--rollout.micro_batch_size", "2"),
    *("--train.batch_size", "8", "--train.micro_batch_size", "2"),
]


def refusal(*flags: str) -> str:
    with pytest.raises(HarnessError) as info:
        check_openrlhf_args(parse_openrlhf_args([*REQUIRED, *flags]))
    return str(info.value)


def test_adaptive_kl_is_refused_until_it_is_safe():
    assert "--algo.kl.target" in refusal("--algo.kl.init_coef", "0.01", "--algo.kl.target", "6")


def test_a_colocated_reference_must_have_the_actors_layout():
    message = refusal(
        *("--train.colocate_actor_ref", "--algo.kl.init_coef", "0.01"),
        *("--ref.num_gpus_per_node", "2"),
    )
    assert "--ref.num_nodes x --ref.num_gpus_per_node = 1 x 2, actor 1 x 4" in message
    same = ["--train.colocate_actor_ref", "--algo.kl.init_coef", "0.01"]
    check_openrlhf_args(parse_openrlhf_args([*REQUIRED, *same, "--ref.num_gpus_per_node", "4"]))
    # no reference model (KL 0), or not colocated: nothing to check
    kl_off = ["--train.colocate_actor_ref", "--algo.kl.init_coef", "0"]
    check_openrlhf_args(parse_openrlhf_args([*REQUIRED, *kl_off]))
    check_openrlhf_args(parse_openrlhf_args([*REQUIRED, "--algo.kl.init_coef", "0.01"]))


@pytest.mark.skipif(flash_attn_installed(), reason="flash-attn is installed here")
def test_without_flash_attn_sdpa_is_the_default_and_flash_kernels_are_refused():
    args = parse_openrlhf_args(REQUIRED)
    assert args.ds.attn_implementation == "sdpa"  # upstream's default would be flash_attention_2
    assert (
        parse_openrlhf_args([*REQUIRED, "--ds.attn_implementation", "eager"]).ds.attn_implementation
        == "eager"
    )
    assert "needs flash-attn" in refusal("--ds.attn_implementation", "flash_attention_2")
    assert "--ds.packing_samples" in refusal("--ds.packing_samples")


@pytest.mark.skipif(flash_attn_installed(), reason="flash-attn is installed here")
def test_every_ray_worker_gets_the_flash_attn_stand_in_first():
    import importlib

    env = ray_runtime_env({"NCCL_DEBUG": "INFO"})
    hook = env["worker_process_setup_hook"]
    module, _, name = hook.rpartition(".")
    assert callable(getattr(importlib.import_module(module), name))
    # a key the driver has is not named again: a job's runtime env that sets it would make
    # `ray.init` fail ("Failed to merge the Job's runtime env"); workers get it from there
    assert "NCCL_DEBUG" not in env["env_vars"]
    assert env["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"  # OpenRLHF's default otherwise


def test_the_launcher_plays_the_policys_protocol_by_default_and_a_flag_overrides(tmp_path):
    ours = ["--env.reward", "f1", "--env.max-turns", "3", "--check-only"]
    config, _ = parse_args([*ours, "--", *REQUIRED])
    recorded = json.loads((WARM_START / "tiny_policy.json").read_text())["config"]["env"]
    assert recorded == {
        "max_turns": 8,
        "top_k": 2,
        "max_doc_chars": 240,
        "prompt_template": "Question: {question}\n",
    }
    for key, value in recorded.items():
        expected = 3 if key == "max_turns" else value  # the flag overrides its field only
        assert getattr(config.env, key) == expected
    assert config.env.reward == "f1"  # what the policy does not record stays the user's
    plain, _ = parse_args(["--no-env-from-policy", "--check-only", "--", *REQUIRED])
    assert plain.env.max_turns == 4 and plain.env.top_k == 3  # SearchQAConfig's defaults
    other = [*REQUIRED[:1], str(tmp_path), *REQUIRED[2:]]
    hub, _ = parse_args(["--check-only", "--", *other])  # no protocol file: the flags' env
    assert hub.env.max_turns == 4
    with pytest.raises(HarnessError, match=r"policy_protocol\.json"):
        parse_args(["--env-from-policy", "--", *other])


def test_rehearse_steps_is_a_check_only_option():
    with pytest.raises(SystemExit):  # tyro's answer to the config's ValueError
        parse_args(["--rehearse-steps", "2", "--", *REQUIRED])


# --- finite logs on fillers --------------------------------------------------------------------


def test_filler_rows_of_the_per_sample_logs_get_the_real_mean():
    from openrlhf.models.utils import masked_mean

    from harness.openrlhf.experience_maker import fill_filler_means

    kl = torch.tensor([[0.2, 0.4, 0.0], [0.3, 0.3, 0.3], [0.5, 0.5, 0.5]])
    masks = [torch.tensor([[1, 1, 0], [0, 0, 0]]), torch.tensor([[1, 1, 1]])]
    batches = [
        NS(action_mask=masks[0], info={"kl": masked_mean(kl[:2], masks[0], dim=-1)}),
        NS(action_mask=masks[1], info={"kl": masked_mean(kl[2:], masks[1], dim=-1)}),
    ]
    assert math.isnan(batches[0].info["kl"][1])  # upstream's 0/0 on the filler row
    fill_filler_means(batches)
    rows = torch.cat([b.info["kl"] for b in batches])
    assert torch.isfinite(rows).all()
    assert rows.tolist() == pytest.approx([0.3, 0.4, 0.5])  # the filler gets (0.3 + 0.5) / 2
    assert float(rows.mean()) == pytest.approx(0.4)  # the logged mean is the real samples'


def _trainer(actor_cls, model):
    """OpenRLHF's `ActorPPOTrainer` (or ours) with what `training_step` reads, on CPU."""
    from openrlhf.models.loss import PolicyLoss

    trainer = object.__new__(actor_cls)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    trainer.actor = model
    trainer.actor_optim = optimizer
    trainer.actor_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0)
    trainer.actor_loss_fn = PolicyLoss()
    trainer.aux_loss = False
    trainer.ema_model = None
    trainer.args = NS(
        actor=NS(entropy_coef=None),
        algo=NS(kl=NS(use_loss=False)),
        train=NS(dynamic_batch_enable=False),
    )
    trainer.strategy = NS(
        ring_attn_group=None,
        backward=lambda loss, model, optimizer: loss.backward(),
        optimizer_step=lambda optimizer, model, scheduler, name: optimizer.step(),
        get_grad_norm=lambda model: 0.0,
    )
    return trainer


def test_a_micro_batch_of_fillers_logs_finite_metrics(tmp_path):
    from openrlhf.models import Actor
    from openrlhf.trainer.ppo_utils.experience import Experience
    from openrlhf.trainer.ray.ppo_actor import ActorPPOTrainer
    from openrlhf.utils.loss_utils import _optimizer_step_loss_norm
    from openrlhf_fakes import convert, small_tree

    from harness.openrlhf.actor import TreeActorPPOTrainer
    from harness.openrlhf.experience import pad_to_multiple
    from harness.tiny_policy.model import ModelConfig, build_model, save_policy
    from harness.tiny_policy.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["where was the founder born? " * 20], vocab_size=300)
    model = build_model(ModelConfig(hidden_size=64, n_layers=1, head_dim=32), tokenizer)
    actor = Actor(str(save_policy(model, tokenizer, tmp_path)), attn_implementation="sdpa")
    _, exps = convert([small_tree()])
    padded = pad_to_multiple(exps, 6)  # 3 leaves, 3 fillers
    window = [
        Experience.concat_experiences(padded[:3], 0),
        Experience.concat_experiences(padded[3:], 0),
    ]
    for batch in window:
        batch.action_log_probs = torch.zeros_like(batch.advantages)
    norm = _optimizer_step_loss_norm([b.action_mask for b in window], None, 1, 1)
    fillers = window[1]
    upstream = _trainer(ActorPPOTrainer, actor).training_step(fillers, 0.0, 1, norm)
    assert upstream["num_action_tokens"] == 0
    assert math.isnan(upstream["metrics"]["ppo_kl"]) and math.isnan(
        upstream["metrics"]["ppo_clip_ratio"]
    )
    ours = _trainer(TreeActorPPOTrainer, actor).training_step(fillers, 0.0, 1, norm)
    for key, weight in ours["weights"].items():
        if weight == "token":
            assert torch.isfinite(torch.as_tensor(ours["metrics"][key])).all(), key
    # a micro-batch with actions keeps upstream's values
    real = _trainer(TreeActorPPOTrainer, actor).training_step(window[0], 0.0, 0, norm)
    assert real["num_action_tokens"] > 0 and math.isfinite(real["metrics"]["ppo_kl"])


def test_a_tree_step_trains_at_one_learning_rate_then_the_schedule_advances():
    from harness.openrlhf.actor import one_schedule_step

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))
    engine = NS(lr_scheduler=scheduler)

    def optimizer_step():  # what DeepSpeed's engine.step() does with its scheduler
        if engine.lr_scheduler is not None:
            engine.lr_scheduler.step()

    seen = []
    for n_optimizer_steps in (3, 1, 5):  # tree steps train on different numbers of windows
        with one_schedule_step(engine):
            for _ in range(n_optimizer_steps):
                seen.append(optimizer.param_groups[0]["lr"])
                optimizer_step()
    assert seen == [1.0] * 3 + [0.5] + [1 / 3] * 5
    assert scheduler.last_epoch == 3 and engine.lr_scheduler is scheduler


def test_the_schedule_length_is_the_number_of_tree_steps():
    from harness.openrlhf.actor import tree_steps

    assert tree_steps(24, 8, 1) == 3  # the smoke: 24 prompts, 8 per step
    assert tree_steps(1000, 256, 2) == 8  # a last, partial batch is a step too


# --- the backend's generator in the tree state -------------------------------------------------


def test_seeded_requests_resume_exactly(tmp_path):
    from transformers import AutoTokenizer

    from envs import QATask
    from harness.openrlhf.config import TreeTrainConfig
    from harness.openrlhf.rehearsal import PromptList
    from harness.openrlhf.samples import TreeSamplesGenerator
    from harness.policies.openrlhf_ray import RayEnginesBackend
    from retrieval.base import Document
    from retrieval.bm25 import BM25Retriever

    BM25Retriever.build([Document(doc_id="d", title="A", text="Ann Vole was born in Lyon.")]).save(
        tmp_path / "index"
    )
    task = QATask(task_id="t", question="Where was Ann Vole born?", golden_answers=("Lyon",))
    args = parse_openrlhf_args(REQUIRED)
    tokenizer = AutoTokenizer.from_pretrained(WARM_START)
    config = TreeTrainConfig(retriever=str(tmp_path / "index"), seeded_requests=True)

    def generator():
        backend = RayEnginesBackend([object()], seed=config.seed, seeded=True)
        loader = PromptList(["Who?"], [json.dumps(task.to_json())])
        return TreeSamplesGenerator(
            NS(args=args), loader, None, tokenizer, [], config=config, backend=backend
        )

    a, b = generator(), generator()
    fresh = a.backend.rng_state()
    a.backend.set_rng_state([3, [*fresh[1][:-1], 17], None])  # as if it had drawn seeds
    a.save_state(tmp_path / "state")
    b.load_state(tmp_path / "state")
    assert b.backend.rng_state() == a.backend.rng_state() != fresh
    with pytest.raises(HarnessError, match="generator state"):
        b.backend.set_rng_state([1, 2])


def test_the_rollout_trainer_log_prob_gap_is_logged_per_sample_and_finite_on_fillers():
    from harness.openrlhf.experience_maker import add_rollout_logprob_gap, fill_filler_means

    trainer = torch.tensor([[-1.0, -2.0, -3.0], [-1.0, -1.0, -1.0]])  # (B, A)
    rollout = torch.tensor([[-1.2, -2.0, -9.0], [0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [0, 0, 0]])  # the second row is a filler
    batch = NS(action_log_probs=trainer, rollout_log_probs=rollout, action_mask=mask, info={})
    add_rollout_logprob_gap([batch])
    fill_filler_means([batch])
    # (0.2 + 0) / 2 on the real row (the masked-out token's gap of 6 counts nothing); the
    # filler row takes the real mean, so the step's logged mean is the real samples'
    assert batch.info["rollout_logprob_gap"].tolist() == pytest.approx([0.1, 0.1])


def test_a_warm_up_never_gives_the_first_tree_step_learning_rate_zero():
    from harness.openrlhf.actor import skip_zero_learning_rate

    def warmup(steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, s / steps))

    scheduler = warmup(10)
    assert scheduler.get_last_lr() == [0.0]  # HF's and this warm-up start at 0
    skip_zero_learning_rate(scheduler)
    assert scheduler.get_last_lr() == pytest.approx([1e-4])
    skip_zero_learning_rate(scheduler)  # past 0 (no warm-up, or resumed): unchanged
    assert scheduler.get_last_lr() == pytest.approx([1e-4])


def test_real_leaves_are_shared_over_the_ranks_before_the_fillers():
    from harness.openrlhf.experience import spread_over_ranks

    padded = [f"leaf{i}" for i in range(5)] + ["filler"] * 11  # 16 samples, 4 ranks of 4
    spread = spread_over_ranks(padded, 5, 4)
    chunks = [spread[r * 4 : (r + 1) * 4] for r in range(4)]
    assert all(chunk[0].startswith("leaf") for chunk in chunks)  # no rank is idle
    assert sorted(spread) == sorted(padded)  # the same samples, reordered
    assert chunks[0] == ["leaf0", "leaf4", "filler", "filler"]
    with pytest.raises(ValueError, match="equal chunks"):
        spread_over_ranks(padded, 5, 3)
