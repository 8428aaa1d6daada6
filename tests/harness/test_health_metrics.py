"""The step health metrics of issue 20: a step dominated by one flip in a big tree shows."""

from __future__ import annotations

import math

import pytest

from harness.training.metrics_log import advantage_metrics, tree_health
from trace_alloc import Rollout, RolloutTree, Turn, tree_advantages


def _tree(name: str, rewards: list[float]) -> RolloutTree:
    tree = RolloutTree(prompt_id=name, prompt_text=name)
    for r in rewards:
        tree.add_rollout(0, Rollout(turns=(Turn(action_text="a", action_token_ids=(1, 2)),),
                                    reward=r))  # fmt: skip
    return tree


def test_one_flip_in_a_big_tree_dominates_the_gradient_but_not_the_contrast_per_leaf():
    big = _tree("big", [1.0] + [0.0] * 27)  # one flip among 28 leaves
    group = _tree("group", [1.0] * 4 + [0.0] * 4)  # a GRPO group, half right
    trees = [big, group]
    leaves = tree_advantages(trees, "grpo")
    metrics = advantage_metrics(trees, leaves)
    # by hand: z = (r - mean) / std; the big tree's lone success has |z| = sqrt(27) = 5.196
    std = math.sqrt(27) / 28
    w_big = 2 * ((27 / 28) / std + 27 * (1 / 28) / std)  # 2 action tokens per leaf
    w_group = 2 * 8 * 1.0
    assert metrics["advantage/max_abs"] == pytest.approx(math.sqrt(27), rel=1e-4)  # std + eps
    assert metrics["advantage/top_tree_share"] == pytest.approx(w_big / (w_big + w_group), rel=1e-4)
    assert metrics["advantage/top_tree_share"] > 0.5
    expected_trees = (w_big + w_group) ** 2 / (w_big**2 + w_group**2)
    assert metrics["advantage/effective_trees"] == pytest.approx(expected_trees, rel=1e-4)

    health = tree_health(trees)
    var_big, var_group = (1 / 28) * (27 / 28), 0.25
    assert health["rollout/reward_var_per_leaf"] == pytest.approx(
        (28 * var_big + 8 * var_group) / 36
    )
    assert health["rollout/max_leaves_per_tree"] == 28
    assert math.isnan(health["rollout/flips_per_continuation"])  # no continuation this step
    # the big tree alone counts as much as the group for the effective ratio, but carries less
    # than half of its contrast per leaf
    assert tree_health([big])["rollout/reward_var_per_leaf"] < 0.5 * var_group


def test_flips_are_counted_against_the_outcome_the_anchor_agreed_on_before():
    tree = RolloutTree(prompt_id="q", prompt_text="q")
    turn = Turn(action_text="s", action_token_ids=(1,))
    tree.add_rollout(0, Rollout(turns=(turn, turn), reward=1.0))  # nodes 1-2
    tree.add_rollout(0, Rollout(turns=(turn, turn), reward=1.0))  # nodes 3-4
    tree.add_rollout(1, Rollout(turns=(turn,), reward=0.0), wave=1)  # flips
    tree.add_rollout(3, Rollout(turns=(turn, turn), reward=1.0), wave=1)  # repeats
    tree.add_rollout(0, Rollout(turns=(turn,), reward=0.0), wave=1)  # a root top-up: not counted
    assert tree_health([tree])["rollout/flips_per_continuation"] == 0.5


def test_no_signal_gives_nan_not_a_zero_division():
    flat = _tree("flat", [1.0] * 8)
    metrics = advantage_metrics([flat], [a for a in tree_advantages([flat], "grpo")
                                         if a.has_signal])  # fmt: skip
    assert all(math.isnan(v) for v in metrics.values())


def test_flip_calibration_scores_the_allocators_flip_chances_against_realised_flips():
    # a real Stage 2 wave through the driver: one settled tree (4 failures), one mixed (2/4),
    # a predictor blind to them (0.9 everywhere) and the floor off, so both trees get
    # continuations; the executor makes every continuation fail
    import numpy as np

    from harness.training.metrics_log import flip_calibration
    from trace_alloc import BudgetLimit, Prompt, Trace, run_step

    outcomes = {"settled": [0.0] * 4, "mixed": [1.0, 0.0, 1.0, 0.0]}
    turn = Turn(action_text=" t", action_token_ids=(1,))

    def execute(trees, requests):
        out = []
        for r in requests:
            tree = trees[r.tree_index]
            if r.node_id == 0:
                rewards = [outcomes[tree.prompt_id].pop() for _ in range(r.n)]
                out.append([Rollout(turns=(turn, turn), reward=x) for x in rewards])
            else:
                out.append([Rollout(turns=(turn,), reward=0.0) for _ in range(r.n)])
        return out

    class Blind:
        def predict(self, histories):
            return np.full(len(histories), 0.9)

    prompts = [Prompt(prompt_id=k, text=k) for k in outcomes]
    result = run_step(
        Trace(explore_frac=0.0, max_per_prompt=4, prefix_prior=None, min_flip_prob=0.0),
        prompts,
        execute=execute,
        budget=BudgetLimit(per_step=16),
        rng=np.random.default_rng(0),
        predictor=Blind(),
    )
    c = flip_calibration(result)
    assert c["stage2/continuations"] == 8 and len(c["stage2/p_flip"]) == 8
    assert c["stage2/settled_share"] == 0.5  # 4 of 8 went into the all-fail tree
    # a failure repeats a failure: the mixed tree's successful prefixes flipped (to 0)
    n_flips = sum(c["stage2/flipped"])
    assert c["stage2/flips"] == n_flips and 0 < n_flips < 8
    brier = np.mean(
        [(p - y) ** 2 for p, y in zip(c["stage2/p_flip"], c["stage2/flipped"], strict=True)]
    )
    assert c["stage2/flip_brier"] == pytest.approx(brier)
    settled = [(p, y) for p, y, s in zip(c["stage2/p_flip"], c["stage2/flipped"],
                                         c["stage2/settled"], strict=True) if s]  # fmt: skip
    assert settled == [(0.9, 0)] * 4  # blind: "90 % flippable", and none flipped
