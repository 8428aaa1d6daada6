"""Tree-aware group-relative advantages: one value per turn of each leaf's path (docs/design.md §1).

Every leaf is trained as its own root-to-leaf sequence. `tree_advantages` gives each of its turns
(segments) an advantage; `LeafAdvantage.to_tokens` spreads it over that turn's action tokens and
leaves the prompt and the observation tokens at zero, with a mask that says so.

Modes (docs/trace_alloc.md, "Advantages"), with z(r; S) = (r − mean_S) / (std_S + eps), the
population std over the leaf rewards of a leaf set S, and L(y) the leaves under node y:

- `grpo`: A_t = z(r; L(root)) on every turn: flat GRPO over the prompt's leaves.
- `tree_grpo`: A_t = z(r; L(root)) + mean over the branch points b above turn t (non-root
  ancestors with ≥ 2 children) of z(r; L(b)): Tree-GRPO's prompt group plus its intra-tree
  groups, where a turn only takes credit from the contrasts decided at or after it.
- `treerl`: A_t = [(V̂(n_t) − V̂(root)) + (V̂(n_t) − V̂(parent))] / √|L(n_t)| (TreeRL's global
  plus local advantage, scaled down for nodes shared by many leaves).

Leaves can be left out (`exclude`): they get no advantage, and every statistic above is taken as
if they had never been sampled (their rewards are in no mean or std, a node counts as a branch
point only with two children that still have leaves). The trainers leave out the episodes a
fault cut short, whose reward 0 says nothing about the policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Literal

import numpy as np

from trace_alloc.errors import UnknownNameError
from trace_alloc.tree import RolloutTree

__all__ = [
    "ADVANTAGE_MODES",
    "AdvantageMode",
    "LeafAdvantage",
    "TokenAdvantages",
    "tree_advantages",
]

AdvantageMode = Literal["grpo", "tree_grpo", "treerl"]
ADVANTAGE_MODES: tuple[str, ...] = ("grpo", "tree_grpo", "treerl")


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenAdvantages:
    """A leaf's full token sequence with its loss mask and per-token advantages."""

    token_ids: np.ndarray
    """Prompt, then each turn's action and observation tokens, shape `(T,)`."""
    action_mask: np.ndarray
    """True on policy-generated action tokens, shape `(T,)`."""
    advantages: np.ndarray
    """The turn's advantage on its action tokens, 0 elsewhere; shape `(T,)`."""
    logprobs: np.ndarray
    """Sampling log-probs on action tokens (0 elsewhere, or where the engine gave none)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LeafAdvantage:
    """Per-turn advantages of one leaf."""

    tree_index: int
    leaf_id: int
    node_ids: tuple[int, ...]
    """The turn nodes of the path, root excluded, root-to-leaf order."""
    advantages: np.ndarray
    """One advantage per turn, shape `(len(node_ids),)`."""

    @property
    def has_signal(self) -> bool:
        """Whether any turn's advantage is non-zero, i.e. the leaf carries a policy gradient.

        Both trainers train only on such leaves (docs/decisions.md, "One objective"); a group of
        equal rewards gives exactly zero (see `_moments`), so the test is exact.
        """
        return bool(np.any(self.advantages != 0.0))

    def to_tokens(self, tree: RolloutTree) -> TokenAdvantages:
        """Spread the turn advantages over the leaf's action tokens.

        >>> from trace_alloc.tree import Prompt, Rollout, Turn
        >>> tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q", token_ids=(1,)))
        >>> act = Turn(action_text="a", action_token_ids=(5, 6), observation_token_ids=(9,))
        >>> _ = tree.add_rollout(0, Rollout(turns=(act,), reward=1.0))
        >>> _ = tree.add_rollout(0, Rollout(turns=(act,), reward=0.0))
        >>> tok = tree_advantages([tree], "grpo")[0].to_tokens(tree)
        >>> tok.token_ids.tolist(), tok.action_mask.tolist(), tok.advantages.round(3).tolist()
        ([1, 5, 6, 9], [False, True, True, False], [0.0, 1.0, 1.0, 0.0])
        """
        by_node = dict(zip(self.node_ids, self.advantages.tolist(), strict=True))
        ids: list[int] = []
        mask: list[bool] = []
        adv: list[float] = []
        logp: list[float] = []
        for seg in tree.segments(self.leaf_id):
            n = len(seg.token_ids)
            ids += seg.token_ids
            mask += [seg.is_action] * n
            adv += [by_node[seg.node_id] if seg.is_action else 0.0] * n
            logp += list(seg.logprobs) if seg.is_action and seg.logprobs else [0.0] * n
        return TokenAdvantages(
            token_ids=np.asarray(ids, dtype=np.int64),
            action_mask=np.asarray(mask, dtype=bool),
            advantages=np.asarray(adv, dtype=np.float64),
            logprobs=np.asarray(logp, dtype=np.float64),
        )


def _moments(
    tree: RolloutTree, exclude: AbstractSet[int] = frozenset()
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per node: leaf count, mean and population std of the leaf rewards below it.

    Leaves in `exclude` are not counted.

    A node whose leaves all have the same reward (max == min, compared exactly) gets that
    reward as its mean and a std of exactly 0: summing floats would leave a residue (three
    leaves of 0.1 have a float mean of 0.10000000000000002), and every advantage built on it
    would come out near, not at, zero.
    """
    n = len(tree.nodes)
    count = np.zeros(n)
    total = np.zeros(n)
    square = np.zeros(n)
    low = np.full(n, np.inf)
    high = np.full(n, -np.inf)
    for node in reversed(tree.nodes):  # children have larger ids than their parent
        i = node.node_id
        if node.reward is not None and i not in exclude:
            count[i] += 1
            total[i] += node.reward
            square[i] += node.reward**2
            low[i] = min(low[i], node.reward)
            high[i] = max(high[i], node.reward)
        if node.parent_id is not None:
            count[node.parent_id] += count[i]
            total[node.parent_id] += total[i]
            square[node.parent_id] += square[i]
            low[node.parent_id] = min(low[node.parent_id], low[i])
            high[node.parent_id] = max(high[node.parent_id], high[i])
    safe = np.maximum(count, 1)
    equal = (count > 0) & (low == high)
    mean = np.where(equal, high, total / safe)
    std = np.where(equal, 0.0, np.sqrt(np.maximum(square / safe - mean**2, 0.0)))
    return count, mean, std


def _n_live_children(tree: RolloutTree, count: np.ndarray, node: int) -> int:
    """Children of `node` with at least one counted leaf below them."""
    return sum(1 for child in tree.nodes[node].children if count[child] > 0)


def _z(reward: float, mean: np.ndarray, std: np.ndarray, node: int, eps: float) -> float:
    """The leaf reward standardised within the leaves under `node`."""
    return float((reward - mean[node]) / (std[node] + eps))


def tree_advantages(
    trees: Sequence[RolloutTree],
    mode: str = "tree_grpo",
    *,
    eps: float = 1e-6,
    exclude: Sequence[AbstractSet[int]] | None = None,
) -> list[LeafAdvantage]:
    """Per-turn advantages of every leaf of every tree (trees without leaves are skipped).

    Args:
        trees: one step's trees (one per prompt).
        mode: `grpo`, `tree_grpo` or `treerl` (module docstring).
        eps: added to the group std before dividing.
        exclude: per tree, the leaf ids to leave out: they get no `LeafAdvantage` and count in
            no group statistic (module docstring). None: every leaf counts.

    Returns:
        One `LeafAdvantage` per leaf that is not excluded, ordered by tree, then by leaf id.

    Raises:
        UnknownNameError: an unknown mode.
        ValueError: `exclude` does not have one set per tree.

    >>> from trace_alloc.tree import Prompt, Rollout, Turn
    >>> tree = RolloutTree.from_prompt(Prompt(prompt_id="q", text="Q"))
    >>> t = Turn(action_text="a", action_token_ids=(1,))
    >>> _ = tree.add_rollout(0, Rollout(turns=(t, t), reward=1.0))
    >>> _ = tree.add_rollout(1, Rollout(turns=(t,), reward=0.0))
    >>> _ = tree.add_rollout(0, Rollout(turns=(t,), reward=0.0))
    >>> [a.advantages.round(3).tolist() for a in tree_advantages([tree], "treerl")]
    [[0.236, 1.167], [0.236, -0.833], [-0.667]]
    """
    if mode not in ADVANTAGE_MODES:
        raise UnknownNameError("advantage mode", mode, ADVANTAGE_MODES)
    if exclude is not None and len(exclude) != len(trees):
        raise ValueError(f"exclude has {len(exclude)} leaf sets for {len(trees)} trees")
    out: list[LeafAdvantage] = []
    for index, tree in enumerate(trees):
        left_out = frozenset() if exclude is None else exclude[index]
        count, mean, std = _moments(tree, left_out)
        if count[0] == 0:
            continue
        for leaf in tree.leaves():
            if leaf in left_out:
                continue
            path = tree.path(leaf)
            reward = tree.nodes[leaf].reward
            assert reward is not None

            values = []
            for depth, node in enumerate(path[1:], start=1):
                if mode == "grpo":
                    values.append(_z(reward, mean, std, 0, eps))
                elif mode == "tree_grpo":
                    branches = [b for b in path[1:depth] if _n_live_children(tree, count, b) >= 2]
                    inner = (
                        float(np.mean([_z(reward, mean, std, b, eps) for b in branches]))
                        if branches
                        else 0.0
                    )
                    values.append(_z(reward, mean, std, 0, eps) + inner)
                else:  # treerl
                    parent = path[depth - 1]
                    gain = (mean[node] - mean[0]) + (mean[node] - mean[parent])
                    values.append(float(gain / np.sqrt(count[node])))
            out.append(
                LeafAdvantage(
                    tree_index=index,
                    leaf_id=leaf,
                    node_ids=tuple(path[1:]),
                    advantages=np.asarray(values, dtype=np.float64),
                )
            )
    return out
