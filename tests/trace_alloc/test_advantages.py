"""Tree advantages against hand-computed trees, and their token mapping."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_tree import hand_tree, trees

from trace_alloc import UnknownNameError
from trace_alloc.advantages import tree_advantages

Z1 = (2 / 3) / np.sqrt(2 / 9)  # z of reward 1 among {1, 0, 0}
Z0 = -(1 / 3) / np.sqrt(2 / 9)


def by_leaf(mode):
    return {a.leaf_id: a.advantages.tolist() for a in tree_advantages([hand_tree()], mode, eps=0.0)}


def test_grpo_on_the_hand_tree():
    got = by_leaf("grpo")
    assert got[2] == pytest.approx([Z1, Z1])
    assert got[4] == pytest.approx([Z0, Z0, Z0])
    assert got[5] == pytest.approx([Z0])


def test_tree_grpo_on_the_hand_tree():
    # node 1 branches into leaf 2 (r=1) and the subtree of leaf 4 (r=0): z = ±1 there
    got = by_leaf("tree_grpo")
    assert got[2] == pytest.approx([Z1, Z1 + 1])
    assert got[4] == pytest.approx([Z0, Z0 - 1, Z0 - 1])
    assert got[5] == pytest.approx([Z0])


def test_treerl_on_the_hand_tree():
    # V: root 1/3, s1 1/2, a1 1, s2 0, a2 0, a3 0
    got = by_leaf("treerl")
    assert got[2] == pytest.approx([2 * (1 / 2 - 1 / 3) / np.sqrt(2), (1 - 1 / 3) + (1 - 1 / 2)])
    assert got[4] == pytest.approx([2 * (1 / 2 - 1 / 3) / np.sqrt(2), -1 / 3 - 1 / 2, -1 / 3])
    assert got[5] == pytest.approx([-2 / 3])


def test_unknown_mode_suggests_the_closest():
    with pytest.raises(UnknownNameError, match="Did you mean 'tree_grpo'"):
        tree_advantages([hand_tree()], "treegrpo")


@given(tree=trees(rich=False))
def test_advantages_live_on_action_tokens_only(tree):
    for mode in ("grpo", "tree_grpo", "treerl"):
        for adv in tree_advantages([tree], mode):
            assert adv.node_ids == tuple(tree.path(adv.leaf_id)[1:])
            tok = adv.to_tokens(tree)
            segments = tree.segments(adv.leaf_id)
            expected = [t for s in segments for t in s.token_ids]
            assert tok.token_ids.tolist() == expected
            assert np.all(tok.advantages[~tok.action_mask] == 0.0)
            assert np.all(np.isfinite(tok.advantages))
            assert not tok.action_mask[: len(tree.prompt_token_ids)].any()


@given(tree=trees(rich=False))
def test_a_tree_without_contrast_has_zero_advantages(tree):
    for node in tree.nodes:
        if node.reward is not None:
            node.reward = 1.0
    for mode in ("grpo", "tree_grpo", "treerl"):
        for adv in tree_advantages([tree], mode):
            assert np.allclose(adv.advantages, 0.0)


@given(tree=trees(rich=False), reward=st.sampled_from([0.1, 0.3, 0.7, 1 / 3]))
def test_equal_rewards_give_exactly_zero_advantages(tree, reward):
    # three leaves of 0.1 used to give about -1e-11 (a float mean of 0.10000000000000002), so
    # "no signal" leaves slipped through the trainers' `!= 0` filter
    for node in tree.nodes:
        if node.reward is not None:
            node.reward = reward
    for mode in ("grpo", "tree_grpo", "treerl"):
        for adv in tree_advantages([tree], mode):
            assert np.all(adv.advantages == 0.0)
            assert not adv.has_signal


def test_three_leaves_of_a_tenth_carry_no_signal():
    from trace_alloc.tree import Prompt, Rollout, RolloutTree, Turn

    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q"))
    turn = Turn(action_text="a", action_token_ids=(1,))
    for _ in range(3):
        tree.add_rollout(0, Rollout(turns=(turn,), reward=0.1))
    for mode in ("grpo", "tree_grpo", "treerl"):
        advantages = tree_advantages([tree], mode)
        assert [a.advantages.tolist() for a in advantages] == [[0.0]] * 3
        assert not any(a.has_signal for a in advantages)


def test_a_mixed_tree_has_signal():
    assert all(a.has_signal for a in tree_advantages([hand_tree()], "grpo"))


@given(tree=trees(rich=False))
def test_grpo_advantages_are_centred_over_the_prompt(tree):
    first_turn = [a.advantages[0] for a in tree_advantages([tree], "grpo")]
    if first_turn:
        assert np.mean(first_turn) == pytest.approx(0.0, abs=1e-6)


def test_trees_without_leaves_are_skipped():
    from trace_alloc import Prompt, RolloutTree

    empty = RolloutTree.from_prompt(Prompt(prompt_id="e", text="E"))
    advs = tree_advantages([empty, hand_tree()], "grpo")
    assert {a.tree_index for a in advs} == {1}


def _hand_tree_without_the_fork():
    """`hand_tree` as if its fork after s1 (leaf 4, r=0) had never been sampled."""
    from test_tree import turn

    from trace_alloc import Prompt, Rollout, RolloutTree

    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q?", token_ids=(1, 2)))
    tree.add_rollout(0, Rollout(turns=(turn(" s1", " o1", tools=1), turn(" a1")), reward=1))
    tree.add_rollout(0, Rollout(turns=(turn(" a3", n_tok=5),), reward=0))
    return tree


@pytest.mark.parametrize("mode", ["grpo", "tree_grpo", "treerl"])
def test_an_excluded_leaf_counts_as_never_sampled(mode):
    # leaf 4 (the fork after s1) is left out: the other leaves get exactly the advantages of
    # the tree without it, and node 1 is no longer a branch point (one child has leaves)
    full = tree_advantages([hand_tree()], mode, exclude=[{4}])
    pruned = tree_advantages([_hand_tree_without_the_fork()], mode)
    assert [a.leaf_id for a in full] == [2, 5]
    for kept, reference in zip(full, pruned, strict=True):
        assert kept.advantages.tolist() == pytest.approx(reference.advantages.tolist())
    # without the exclusion the reward-0 fork is trained against, and changes the others
    plain = tree_advantages([hand_tree()], mode)
    assert [a.leaf_id for a in plain] == [2, 4, 5] and plain[1].has_signal
    assert plain[0].advantages.tolist() != pytest.approx(full[0].advantages.tolist())


def test_excluding_every_leaf_skips_the_tree_and_sets_must_match_the_trees():
    assert tree_advantages([hand_tree()], "tree_grpo", exclude=[{2, 4, 5}]) == []
    with pytest.raises(ValueError, match="1 leaf sets for 2 trees"):
        tree_advantages([hand_tree(), hand_tree()], "grpo", exclude=[set()])
