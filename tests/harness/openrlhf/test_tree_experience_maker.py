"""`TreeExperienceMaker` keeps the tree advantages (where OpenRLHF's own maker would replace
them), adds the KL reward's returns-to-go when KL is in the reward, and OpenRLHF's `PolicyLoss`
turns them into gradients on the action tokens only."""

from __future__ import annotations

from types import SimpleNamespace as NS

import pytest
import torch

pytest.importorskip("openrlhf")

from openrlhf.models.loss import PolicyLoss
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.experience_maker import RemoteExperienceMaker
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf_fakes import convert, small_tree

from harness.errors import HarnessError
from harness.openrlhf.experience_maker import TreeExperienceMaker


def strategy(*, use_loss=False, estimator="group_norm", n_samples=3):
    args = NS(
        algo=NS(
            advantage=NS(estimator=estimator, gamma=1.0, no_std_norm=False),
            kl=NS(use_loss=use_loss),
        ),
        rollout=NS(n_samples_per_prompt=n_samples),
        reward=NS(clip_range=(-10, 10), overlong_buffer_len=None, stop_properly_penalty_coef=None),
    )
    return NS(args=args)


def micro_batch(kl=None):
    _, exps = convert([small_tree()])
    batch = Experience.concat_experiences(exps, pad_token_id=0)
    batch.index = [0, 1, 2]
    batch.kl = torch.zeros_like(batch.advantages) if kl is None else kl
    return batch


def maker(cls=TreeExperienceMaker, kl_coef=0.0, **kw):
    return cls(None, None, None, None, FixedKLController(kl_coef), strategy(**kw), None)


def test_tree_advantages_pass_through_and_returns_equal_them():
    batch = micro_batch()
    tree_adv = batch.advantages.clone()
    [out] = maker().compute_advantages_and_returns([batch])
    assert torch.equal(out.advantages, tree_adv)
    assert torch.equal(out.returns, tree_adv)
    assert out.kl is None
    assert out.info["return"].tolist() == [1.0, 0.0, 0.0]


def test_openrlhfs_own_maker_would_overwrite_them():
    batch = micro_batch()
    tree_adv = batch.advantages.clone()
    [out] = maker(RemoteExperienceMaker).compute_advantages_and_returns([batch])
    # group_norm puts one value per sequence on every action token: the per-turn contrast of
    # the fork (turn 1 vs turn 2 of the first leaf) is gone
    assert not torch.allclose(out.advantages, tree_adv)
    first = out.advantages[0][batch.action_mask[0].bool()]
    assert torch.allclose(first, first[0].expand_as(first))


def test_kl_in_the_reward_adds_its_returns_to_go_on_action_tokens():
    kl = torch.rand(3, 9)
    batch = micro_batch(kl=kl)
    mask = batch.action_mask.float()
    tree_adv = batch.advantages.clone()
    beta = 0.1
    [out] = maker(kl_coef=beta).compute_advantages_and_returns([batch])
    penalty = -beta * kl * mask
    to_go = penalty.flip(-1).cumsum(-1).flip(-1) * mask  # sum of penalties from t on
    assert torch.allclose(out.advantages, tree_adv + to_go, atol=1e-6)
    assert torch.all(out.advantages[mask == 0] == 0)
    assert torch.allclose(out.info["return"], batch.rewards + penalty.sum(-1))


def test_kl_as_a_loss_leaves_the_advantages_alone():
    batch = micro_batch(kl=torch.rand(3, 9))
    tree_adv = batch.advantages.clone()
    [out] = maker(kl_coef=0.1, use_loss=True).compute_advantages_and_returns([batch])
    assert torch.equal(out.advantages, tree_adv)


def test_samples_without_advantages_are_refused():
    batch = micro_batch()
    batch.advantages = None
    with pytest.raises(HarnessError, match="TreeSamplesGenerator"):
        maker().compute_advantages_and_returns([batch])


def test_policy_loss_gradient_follows_the_tree_advantage_per_token():
    batch = micro_batch()
    [out] = maker().compute_advantages_and_returns([batch])
    old = torch.randn(3, 9)
    log_probs = old.clone().requires_grad_(True)  # ratio 1: inside the clip range
    loss, *_ = PolicyLoss()(log_probs, old, out.advantages, action_mask=out.action_mask)
    loss.backward()
    n_tokens = out.action_mask.sum()
    # d(-A_t r_t)/d log p_t = -A_t at r = 1, averaged over the action tokens
    expected = -out.advantages * out.action_mask / n_tokens
    assert torch.allclose(log_probs.grad, expected, atol=1e-6)
    assert torch.all(log_probs.grad[out.action_mask == 0] == 0)


def test_policy_loss_through_a_real_actor_moves_only_through_action_tokens(tmp_path):
    from openrlhf.models import Actor

    from harness.tiny_policy.model import ModelConfig, build_model, save_policy
    from harness.tiny_policy.tokenizer import train_tokenizer

    tokenizer = train_tokenizer(["where was the founder born? " * 20], vocab_size=300)
    model = build_model(ModelConfig(hidden_size=64, n_layers=1, head_dim=32), tokenizer)
    actor = Actor(str(save_policy(model, tokenizer, tmp_path)), attn_implementation="sdpa")
    batch = micro_batch()
    [out] = maker().compute_advantages_and_returns([batch])
    log_probs = actor(out.sequences, out.action_mask, attention_mask=out.attention_mask)
    assert log_probs.shape == out.action_mask.shape
    loss, *_ = PolicyLoss()(
        log_probs, log_probs.detach(), out.advantages, action_mask=out.action_mask
    )
    loss.backward()
    grads = [p.grad for p in actor.parameters() if p.grad is not None]
    assert grads and any(torch.count_nonzero(g) for g in grads)
    # fillers (zero advantages) give no policy gradient at all
    actor.zero_grad()
    log_probs = actor(out.sequences, out.action_mask, attention_mask=out.attention_mask)
    loss, *_ = PolicyLoss()(
        log_probs, log_probs.detach(), torch.zeros_like(out.advantages), action_mask=out.action_mask
    )
    loss.backward()
    assert all(torch.count_nonzero(p.grad) == 0 for p in actor.parameters() if p.grad is not None)
