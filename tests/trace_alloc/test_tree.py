"""Rollout trees: backed-up values, mixed anchors, spend, histories, segments, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_alloc import Prompt, Rollout, RolloutTree, TreeFormatError, Turn
from trace_alloc.tree import SCHEMA_VERSION, bare_leaves, forest_stats, training_examples


def turn(action: str, obs: str = "", n_tok: int = 2, tools: int = 0) -> Turn:
    return Turn(
        action_text=action,
        action_token_ids=tuple(range(n_tok)),
        action_logprobs=tuple([-0.5] * n_tok),
        observation_text=obs,
        observation_token_ids=(99,) * len(obs),
        n_tool_calls=tools,
    )


def hand_tree() -> RolloutTree:
    """root -> s1 -> {a (r=1), s2 -> a (r=0)}; root -> a (r=0)."""
    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q?", token_ids=(1, 2)))
    leaf1 = tree.add_rollout(0, Rollout(turns=(turn(" s1", " o1", tools=1), turn(" a1")), reward=1))
    assert leaf1 == 2
    tree.add_rollout(1, Rollout(turns=(turn(" s2", " o2", tools=1), turn(" a2")), reward=0))
    tree.add_rollout(0, Rollout(turns=(turn(" a3", n_tok=5),), reward=0))
    return tree


def test_values_mixed_and_spend_on_a_hand_tree():
    tree = hand_tree()
    # ids: 0 root, 1 s1, 2 a1 (1), 3 s2, 4 a2 (0), 5 a3 (0)
    assert tree.values().tolist() == pytest.approx([1 / 3, 0.5, 1.0, 0.0, 0.0, 0.0])
    assert tree.mixed().tolist() == [True, True, False, False, False, False]
    assert tree.leaves() == [2, 4, 5] and tree.n_leaves == 3 and tree.is_mixed
    spend = tree.spend()
    assert (spend.n_leaves, spend.n_tokens, spend.n_tool_calls) == (3, 2 * 4 + 5, 2)
    assert tree.history(3) == "Q? s1 o1 s2 o2"
    assert tree.path(4) == [0, 1, 3, 4]


def test_segments_mark_only_actions_and_concatenate_to_the_sequence():
    tree = hand_tree()
    segs = tree.segments(4)
    assert [s.is_action for s in segs] == [False, True, False, True, False, True]
    assert [s.node_id for s in segs] == [0, 1, 1, 3, 3, 4]
    assert segs[0].token_ids == (1, 2)
    with pytest.raises(TreeFormatError, match="not a leaf"):
        tree.segments(1)


def test_cannot_continue_from_a_leaf_or_a_missing_node():
    tree = hand_tree()
    with pytest.raises(TreeFormatError, match="is a leaf"):
        tree.add_rollout(2, Rollout(turns=(turn("x"),), reward=1))
    with pytest.raises(TreeFormatError, match="does not exist"):
        tree.add_rollout(42, Rollout(turns=(turn("x"),), reward=1))


def test_bad_values_are_rejected_with_typed_errors():
    with pytest.raises(TreeFormatError, match="reward"):
        Rollout(turns=(turn("a"),), reward=1.5)
    with pytest.raises(TreeFormatError, match="at least one turn"):
        Rollout(turns=(), reward=0)
    with pytest.raises(TreeFormatError, match="logprobs"):
        Turn(action_text="a", action_token_ids=(1, 2), action_logprobs=(0.0,))


def test_forest_stats_and_training_examples():
    tree = hand_tree()
    empty = RolloutTree.from_prompt(Prompt(prompt_id="e", text="E?"))
    stats = forest_stats([tree, empty])
    assert (stats.n_prompts, stats.n_active, stats.n_mixed) == (2, 1, 1)
    assert (stats.n_prefix_anchors, stats.n_mixed_prefix_anchors) == (2, 1)
    assert stats.effective_ratio == 1.0 and stats.n_mixed_anchors == 2
    ex = training_examples([tree, empty])
    assert ex.histories == ("Q?", "Q? s1 o1", "Q? s1 o1 s2 o2")
    # the root's target is its bare rollouts' (leaves 2 and 5: 1 and 0), not the continuation's
    assert ex.targets.tolist() == pytest.approx([0.5, 0.5, 0.0])
    assert ex.n_leaves.tolist() == [2, 2, 1]
    assert ex.is_root.tolist() == [True, False, False]
    assert bare_leaves(tree) == [2, 5]


def test_root_targets_ignore_continuations_aimed_at_flipping_the_outcome():
    """Stage 2 continues an all-fail tree where a success is likely: V̂(root) would be biased."""
    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q?"))
    for _ in range(4):  # four bare rollouts, all failures
        tree.add_rollout(0, Rollout(turns=(turn(" s", " o"), turn(" a")), reward=0))
    for anchor in (1, 3, 5, 7):  # one continuation per prefix, all successes
        tree.add_rollout(anchor, Rollout(turns=(turn(" b"),), reward=1))
    assert tree.values()[0] == 0.5  # the pooled root value the old target used
    ex = training_examples([tree])
    assert ex.targets[0] == 0.0 and ex.n_leaves[0] == 4 and ex.is_root[0]
    assert bare_leaves(tree) == [2, 4, 6, 8]


@st.composite
def trees(draw, rich: bool = True):
    """Random trees; `rich=False` skips the text fields (faster, for structure-only tests)."""
    text = st.text(max_size=10) if rich else st.just("")
    tree = RolloutTree.from_prompt(
        Prompt(
            prompt_id=draw(text),
            text=draw(text),
            token_ids=tuple(draw(st.lists(st.integers(0, 9), max_size=3))),
        )
    )
    for _ in range(draw(st.integers(0, 6))):
        anchors = [n.node_id for n in tree.nodes if not n.is_leaf]
        node = draw(st.sampled_from(anchors))
        turns = tuple(
            Turn(
                action_text=draw(text),
                action_token_ids=tuple(draw(st.lists(st.integers(0, 50_000), max_size=4))),
                observation_text=draw(text),
                observation_token_ids=tuple(draw(st.lists(st.integers(0, 9), max_size=3))),
                snapshot_id=draw(st.one_of(st.none(), text)),
                n_tool_calls=draw(st.integers(0, 2)),
                info={"k": draw(st.integers())} if rich else {},
            )
            for _ in range(draw(st.integers(1, 3)))
        )
        reward = draw(st.sampled_from([0.0, 1.0, 0.5]))
        tree.add_rollout(node, Rollout(turns=turns, reward=reward), wave=draw(st.integers(0, 3)))
    return tree


@given(tree=trees())
def test_trees_round_trip_through_json(tree):
    back = RolloutTree.from_json(tree.to_json())
    assert back == tree
    assert back.to_dict() == tree.to_dict()
    assert np.array_equal(back.values(), tree.values(), equal_nan=True)


def test_json_errors_name_the_problem():
    data = hand_tree().to_dict()
    with pytest.raises(TreeFormatError, match="schema_version"):
        RolloutTree.from_dict({**data, "schema_version": SCHEMA_VERSION + 1})
    bad = json.loads(json.dumps(data))
    bad["nodes"][3]["parent_id"] = 7
    with pytest.raises(TreeFormatError, match="parent_id"):
        RolloutTree.from_dict(bad)
    bad = json.loads(json.dumps(data))
    bad["nodes"][1]["reward"] = 1.0  # a node with children cannot be a leaf
    with pytest.raises(TreeFormatError, match="children"):
        RolloutTree.from_dict(bad)
    with pytest.raises(TreeFormatError, match="does not parse"):
        RolloutTree.from_json("{nope")
    with pytest.raises(TreeFormatError, match="object"):
        RolloutTree.from_json("[]")
