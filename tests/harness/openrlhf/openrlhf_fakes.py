"""Fakes and builders shared by the OpenRLHF-integration tests (not a test module)."""

from __future__ import annotations

from harness.openrlhf.experience import experiences_from_leaves
from trace_alloc import Prompt, Rollout, RolloutTree, Turn, tree_advantages

PROMPT = (1, 2, 3)


def turn(actions, observations=(), logprobs=None, finish="stop"):
    return Turn(
        action_text="a",
        action_token_ids=tuple(actions),
        action_logprobs=tuple(-0.1 * (i + 1) for i in range(len(actions)))
        if logprobs is None
        else tuple(logprobs),
        observation_token_ids=tuple(observations),
        info={"finish_reason": finish},
    )


def small_tree() -> RolloutTree:
    """Root rollout (search, answer) rewarded 1, a fork after the search rewarded 0, and a
    second root rollout rewarded 0."""
    tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q?", token_ids=PROMPT))
    tree.add_rollout(
        0, Rollout(turns=(turn((10, 11), (20, 21, 22)), turn((12, 13))), reward=1.0)
    )  # nodes 1, 2
    tree.add_rollout(1, Rollout(turns=(turn((14,), finish="length"),), reward=0.0))  # node 3
    tree.add_rollout(0, Rollout(turns=(turn((15, 16)),), reward=0.0))  # node 4
    return tree


def convert(trees, mode="tree_grpo", max_len=64):
    leaves = tree_advantages(trees, mode)
    exps = experiences_from_leaves(
        trees,
        leaves,
        max_len=max_len,
        prompts=[f"p{i}" for i in range(len(trees))],
        labels=[f"l{i}" for i in range(len(trees))],
    )
    return leaves, exps
