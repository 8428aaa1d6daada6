"""Leaves of rollout trees become OpenRLHF `Experience`s laid out like OpenRLHF's own multi-turn
samples (shift by one), with the tree advantages on the action tokens and zero elsewhere."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

pytest.importorskip("openrlhf")

from openrlhf.trainer.ppo_utils.experience import (
    Experience,
    make_experience_batch,
    remove_padding_in_sequences,
    split_experience_batch,
)
from openrlhf_fakes import PROMPT, convert, small_tree, turn

from harness.openrlhf.experience import (
    FILLER_TOKENS,
    INFO_KEYS,
    experiences_from_leaves,
    pad_to_multiple,
)
from trace_alloc import Prompt, Rollout, RolloutTree, tree_advantages


def test_a_leaf_is_its_root_to_leaf_sequence_with_observations_masked():
    tree = small_tree()
    leaves, exps = convert([tree])
    assert [leaf.leaf_id for leaf in leaves] == [2, 3, 4]
    first = exps[0]
    assert first.sequences.tolist() == [[1, 2, 3, 10, 11, 20, 21, 22, 12, 13]]
    assert first.attention_mask.tolist() == [[1] * 10]
    # token j+1 is an action: 10, 11 (positions 3, 4) and 12, 13 (positions 8, 9)
    assert first.action_mask.tolist() == [[0, 0, 1, 1, 0, 0, 0, 1, 1]]
    assert first.action_mask.shape == (1, first.sequences.shape[1] - 1)
    assert first.rewards.tolist() == [1.0] and first.scores.tolist() == [1.0]
    assert first.response_length.tolist() == [4]  # generated tokens, not the first-to-last span
    assert first.truncated.tolist() == [False]
    assert first.prompts == ["p0"] and first.labels == ["l0"]
    assert set(first.info) == set(INFO_KEYS)
    assert first.info["tree/n_turns"].tolist() == [2.0]


def test_advantages_are_the_turn_advantages_shifted_like_the_mask():
    tree = small_tree()
    leaves, exps = convert([tree])
    adv_turn1, adv_turn2 = leaves[0].advantages.tolist()
    assert adv_turn1 != adv_turn2  # the fork after turn 1 gives turn 2 its own contrast
    expected = [0, 0, adv_turn1, adv_turn1, 0, 0, 0, adv_turn2, adv_turn2]
    assert exps[0].advantages[0].tolist() == pytest.approx(expected, abs=1e-6)
    for leaf, exp in zip(leaves, exps, strict=True):
        assert exp.advantages.dtype == torch.float32
        assert torch.all(exp.advantages[exp.action_mask == 0] == 0)
        tokens = leaf.to_tokens(tree)
        assert exp.advantages[0].numpy() == pytest.approx(tokens.advantages[1:], abs=1e-6)


def test_rollout_log_probs_line_up_with_the_action_tokens():
    tree = small_tree()
    _, exps = convert([tree])
    lp = exps[0].rollout_log_probs[0].tolist()
    assert lp == pytest.approx([0, 0, -0.1, -0.2, 0, 0, 0, -0.1, -0.2])


def test_length_finish_marks_the_leaf_truncated_and_missing_logprobs_give_none():
    tree = small_tree()
    _, exps = convert([tree])
    assert exps[1].truncated.tolist() == [True]
    bare = RolloutTree.from_prompt(Prompt(prompt_id="b", text="B?", token_ids=PROMPT))
    bare.add_rollout(0, Rollout(turns=(turn((7, 8), logprobs=()),), reward=1.0))
    bare.add_rollout(0, Rollout(turns=(turn((9,), logprobs=()),), reward=0.0))
    _, exps = convert([bare])
    assert all(e.rollout_log_probs is None for e in exps)


def test_max_len_cuts_every_field_and_flags_the_clip():
    tree = small_tree()
    _, full = convert([tree])
    _, cut = convert([tree], max_len=6)
    assert cut[0].sequences.tolist() == [full[0].sequences[0, :6].tolist()]
    assert cut[0].action_mask.tolist() == [full[0].action_mask[0, :5].tolist()]
    assert cut[0].advantages.tolist() == [full[0].advantages[0, :5].tolist()]
    assert cut[0].info["response_clip_ratio"].tolist() == [1.0]
    assert full[0].info["response_clip_ratio"].tolist() == [0.0]


def test_leaves_keep_their_tree_prompt_label_and_reward():
    a, b = small_tree(), small_tree()
    b.prompt_id = "other"
    _, exps = convert([a, b])
    assert len(exps) == 6
    assert [e.prompts[0] for e in exps] == ["p0"] * 3 + ["p1"] * 3
    assert [e.rewards.item() for e in exps] == [1.0, 0.0, 0.0] * 2


def test_experiences_survive_openrlhf_batching_and_the_replay_buffer_path():
    tree = small_tree()
    _, exps = convert([tree])
    batch = Experience.concat_experiences(exps, pad_token_id=0)
    assert batch.advantages.shape == batch.action_mask.shape == (3, 9)
    items = remove_padding_in_sequences(split_experience_batch(batch))
    for original, item in zip(exps, items, strict=True):
        assert torch.equal(item.sequences, original.sequences[0])
        assert torch.equal(item.advantages, original.advantages[0])
        assert torch.equal(item.action_mask, original.action_mask[0])
    again = make_experience_batch(items)
    assert torch.equal(again.advantages, batch.advantages)


def test_padding_adds_short_zero_advantage_fillers_to_a_multiple():
    _, exps = convert([small_tree()])
    padded = pad_to_multiple(exps, 8)
    assert len(padded) == 8 and padded[:3] == exps
    filler = padded[3]
    # short: the first FILLER_TOKENS tokens of the shortest leaf, not a copy of a whole leaf
    shortest = min(exps, key=lambda e: e.sequences.shape[-1])
    assert filler.sequences.shape == (1, FILLER_TOKENS)
    assert torch.equal(filler.sequences, shortest.sequences[:, :FILLER_TOKENS])
    assert filler.action_mask.shape == filler.advantages.shape == (1, FILLER_TOKENS - 1)
    assert filler.total_length.tolist() == [float(FILLER_TOKENS)]
    assert int(filler.response_length) == 0 and not bool(filler.truncated)
    # fillers and leaves of any length still go through OpenRLHF's batching
    batch = Experience.concat_experiences(padded, pad_token_id=0)
    assert batch.sequences.shape[0] == 8
    assert torch.count_nonzero(filler.advantages) == 0
    assert torch.count_nonzero(filler.action_mask) == 0  # weightless, not just zero-advantage
    assert filler.info["filler"].tolist() == [1.0]
    assert exps[0].info["filler"].tolist() == [0.0]  # the source is untouched
    assert torch.count_nonzero(exps[0].advantages) > 0
    assert pad_to_multiple(exps, 3) == exps
    assert pad_to_multiple([], 8) == []
    with pytest.raises(ValueError):
        pad_to_multiple(exps, 0)


def _step_loss_and_grads(experiences, token_level_loss):
    """OpenRLHF 0.11.2's loss of one optimizer step over these experiences, and its gradients,
    with its own normalisers (`_optimizer_step_loss_norm`, the non-dynamic path)."""
    from openrlhf.models.loss import PolicyLoss
    from openrlhf.utils.loss_utils import _optimizer_step_loss_norm

    norm = _optimizer_step_loss_norm([e.action_mask for e in experiences], None, 1, 1)
    loss_fn = PolicyLoss(token_level_loss=token_level_loss)
    total, grads = 0.0, []
    for e in experiences:
        logp = torch.full(e.advantages.shape, -1.0, requires_grad=True)  # (1, T - 1)
        loss, *_ = loss_fn(logp, torch.full_like(logp, -1.1), e.advantages, e.action_mask, **norm)
        loss.backward()
        total += loss.item()
        grads.append(logp.grad)
    return total, grads


@pytest.mark.parametrize("token_level_loss", [True, False])
def test_fillers_change_neither_the_loss_nor_the_gradient_of_a_step(token_level_loss):
    # the step size must not depend on how many fillers (or, upstream, how many zero-advantage
    # leaves) a step has: the allocators differ exactly in that share
    _, exps = convert([small_tree()])
    plain, plain_grads = _step_loss_and_grads(exps, token_level_loss)
    padded, padded_grads = _step_loss_and_grads(pad_to_multiple(exps, 8), token_level_loss)
    assert padded == pytest.approx(plain, rel=1e-6)
    for a, b in zip(plain_grads, padded_grads, strict=False):
        torch.testing.assert_close(a, b)
    assert all(torch.count_nonzero(g) == 0 for g in padded_grads[len(exps) :])


def test_mismatched_prompts_are_refused():
    tree = small_tree()
    leaves = tree_advantages([tree], "grpo")
    with pytest.raises(ValueError, match="1 trees but 2 prompts"):
        experiences_from_leaves([tree], leaves, max_len=8, prompts=["a", "b"], labels=["a"])


@st.composite
def random_trees(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    tree = RolloutTree.from_prompt(Prompt(prompt_id="r", text="R?", token_ids=(1, 2)))
    for _ in range(draw(st.integers(1, 6))):
        anchors = [n.node_id for n in tree.nodes if not n.is_leaf]
        anchor = int(rng.choice(anchors))
        turns = tuple(
            turn(
                rng.integers(5, 50, size=int(rng.integers(1, 4))).tolist(),
                rng.integers(50, 90, size=int(rng.integers(0, 3))).tolist(),
            )
            for _ in range(int(rng.integers(1, 4)))
        )
        tree.add_rollout(anchor, Rollout(turns=turns, reward=float(rng.integers(0, 2))))
    return tree, draw(st.sampled_from(["grpo", "tree_grpo", "treerl"])), draw(st.integers(2, 30))


@given(random_trees())
def test_advantages_are_zero_wherever_the_loss_mask_is(case):
    tree, mode, max_len = case
    leaves, exps = convert([tree], mode=mode, max_len=max_len)
    assert len(exps) == tree.n_leaves
    for leaf, exp in zip(leaves, exps, strict=True):
        tokens = leaf.to_tokens(tree)
        assert exp.sequences[0].tolist() == tokens.token_ids[:max_len].tolist()
        assert exp.action_mask[0].tolist() == tokens.action_mask[1:max_len].astype(int).tolist()
        assert torch.all(exp.advantages[exp.action_mask == 0] == 0)
        assert exp.advantages[0].numpy() == pytest.approx(tokens.advantages[1:max_len], abs=1e-5)
