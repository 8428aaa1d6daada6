"""The rollout-allocation strategies, all behind `trace_alloc.base.Allocator` (docs/design.md §3).

Each strategy is a frozen dataclass: its fields are its configuration (tyro can build it), and
`ask` is a pure function of the view, the predictor and the generator. They are compared at
equal budget by the same driver, so a baseline is just another name in `ALLOCATORS`.

- `uniform` (GRPO): G rollouts for each of the first prompts of the pool.
- `dynamic_sampling` (DAPO): groups of G, drop all-0/all-1 groups, refill.
- `prompt_predictor` (PCL): G rollouts for the prompts whose predicted p is nearest 0.5.
- `random_tree` (Tree-GRPO): M chains per prompt, N random expansions per chain, L times.
- `entropy_tree` (ARPO/AT²PO): same shape, expanding the most uncertain next actions.
- `trace` (TRACE): Stage 1 exact root allocation, Stage 2 per-prompt prefix expansion.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np

from trace_alloc.base import Allocator, AllocPlan, AllocView, Predictor, RolloutRequest
from trace_alloc.errors import AllocError, UnknownNameError
from trace_alloc.solvers import (
    prefix_posterior,
    solve_prefixes,
    solve_roots,
    split_budget,
    v_prefix,
)
from trace_alloc.tree import RolloutTree, bare_leaves

__all__ = [
    "ALLOCATORS",
    "AllocatorName",
    "DynamicSampling",
    "EntropyTree",
    "PromptPredictor",
    "RandomTree",
    "Trace",
    "Uniform",
    "check_placement",
    "continuation_quota",
    "make_allocator",
]

AllocatorName = Literal[
    "uniform", "dynamic_sampling", "prompt_predictor", "random_tree", "entropy_tree", "trace"
]


# --- shared helpers ---


def _fresh(trees: Sequence[RolloutTree]) -> list[int]:
    """Indices of the prompts that have no rollout yet, in pool order."""
    return [i for i, tree in enumerate(trees) if len(tree.nodes) == 1]


def _active(trees: Sequence[RolloutTree]) -> list[int]:
    """Indices of the prompts that have at least one leaf."""
    return [i for i, tree in enumerate(trees) if len(tree.nodes) > 1]


def _group_sizes(leaves: int, group_size: int, *, exact: bool) -> list[int]:
    """Split a leaf budget into groups of `group_size`, never leaving a group of one.

    Exact (leaf currency): the sizes sum to `leaves` (a last group of the remainder, or the
    remainder added to the last group when it is 1). Estimated (token currency): whole groups,
    at least one, so that every wave makes progress.

    >>> _group_sizes(19, 8, exact=True), _group_sizes(17, 8, exact=True)
    ([8, 8, 3], [8, 9])
    >>> _group_sizes(5, 8, exact=False)
    [8]
    """
    if not exact:
        return [group_size] * max(1, round(leaves / group_size))
    n_groups, rest = divmod(leaves, group_size)
    sizes = [group_size] * n_groups
    if rest >= 2:
        sizes.append(rest)
    elif rest == 1 and sizes:
        sizes[-1] += 1
    return sizes


def _groups(
    order: Sequence[int], leaves: int, group_size: int, *, exact: bool
) -> list[RolloutRequest]:
    """One root request per prompt in `order`, sized by `_group_sizes`.

    Fewer if prompts run out: the rest of the budget is then carried to the next step.
    """
    sizes = _group_sizes(leaves, group_size, exact=exact)
    return [
        RolloutRequest(tree_index=i, node_id=0, n=n) for i, n in zip(order, sizes, strict=False)
    ]


def _need(predictor: Predictor | None, name: str) -> Predictor:
    if predictor is None:
        raise AllocError(f"allocator {name!r} needs a predictor; pass one to run_step")
    return predictor


def _check_group_size(group_size: int) -> None:
    if group_size < 2:
        raise ValueError(f"group_size={group_size}: a group needs 2 leaves to be mixed")


def _requests(
    tree_index: int,
    counts: Counter[int],
    p_flip: dict[int, float] | None = None,
    p_flip_raw: dict[int, float] | None = None,
) -> list[RolloutRequest]:
    p_flip, p_flip_raw = p_flip or {}, p_flip_raw or {}
    return [
        RolloutRequest(
            tree_index=tree_index,
            node_id=node,
            n=n,
            p_flip=p_flip.get(node),
            p_flip_raw=p_flip_raw.get(node),
        )
        for node, n in sorted(counts.items())
        if n > 0
    ]


def _with_leaves(trees: Sequence[RolloutTree]) -> list[int]:
    return [i for i, tree in enumerate(trees) if tree.n_leaves > 0]


# --- GRPO ---


@dataclass(frozen=True, kw_only=True)
class Uniform:
    """GRPO: G rollouts for each of the first prompts of the pool (the pool is in random order).

    In the leaf currency the last group takes the remainder, so the budget is spent exactly.
    """

    name: ClassVar[str] = "uniform"
    uses_predictor: ClassVar[bool] = False
    group_size: int = 8
    """G, rollouts per prompt."""

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """Groups of G for the next fresh prompts, as many as the budget buys."""
        requests = _groups(_fresh(view.trees), view.leaves_left, self.group_size, exact=view.exact)
        return AllocPlan(
            requests=tuple(requests), stage="roots", diagnostics={"n_prompts": len(requests)}
        )

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """Every prompt that got rollouts."""
        return _with_leaves(trees)


# --- DAPO ---


@dataclass(frozen=True, kw_only=True)
class DynamicSampling:
    """DAPO dynamic sampling: oversample groups, drop the unmixed ones, refill.

    Groups of G are generated in waves of `wave_groups` prompts; groups that are all 0 or all 1
    are dropped, until `batch_size` mixed groups are kept or the budget is spent. Dropped
    groups count against the budget (docs/design.md §1, equal cost).
    """

    name: ClassVar[str] = "dynamic_sampling"
    uses_predictor: ClassVar[bool] = False
    group_size: int = 8
    """G, rollouts per prompt."""
    batch_size: int | None = None
    """Mixed groups to collect; None: keep sampling until the budget is spent."""
    wave_groups: int | None = None
    """Prompts per generation wave (DAPO's generation batch); None: as many as the budget buys."""

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)
        if self.batch_size is not None and self.batch_size < 1:
            raise ValueError(f"batch_size={self.batch_size}: must be >= 1 or None")
        if self.wave_groups is not None and self.wave_groups < 1:
            raise ValueError(f"wave_groups={self.wave_groups}: must be >= 1 or None")

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """The next wave of groups, or nothing once the batch of mixed groups is full."""
        n_mixed = sum(tree.is_mixed for tree in view.trees)
        if self.batch_size is not None and n_mixed >= self.batch_size:
            return AllocPlan(stage="full", diagnostics={"n_mixed": n_mixed})
        order = _fresh(view.trees)
        leaves = view.leaves_left
        if self.wave_groups is not None and leaves > self.wave_groups * self.group_size:
            # budget is not binding in this wave: whole groups only, no remainder group
            leaves = self.wave_groups * self.group_size
        requests = _groups(order, leaves, self.group_size, exact=view.exact)
        return AllocPlan(
            requests=tuple(requests),
            stage="roots",
            diagnostics={"n_prompts": len(requests), "n_mixed": n_mixed},
        )

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """The mixed groups only (up to `batch_size`, in pool order)."""
        mixed = [i for i, tree in enumerate(trees) if tree.is_mixed]
        return mixed if self.batch_size is None else mixed[: self.batch_size]


# --- PCL ---


@dataclass(frozen=True, kw_only=True)
class PromptPredictor:
    """PCL-like prompt selection: G rollouts for the prompts predicted nearest p = 0.5.

    Fresh prompts are ranked by |p − `target`| (0.5: the most uncertain), ties at random.
    """

    name: ClassVar[str] = "prompt_predictor"
    uses_predictor: ClassVar[bool] = True
    group_size: int = 8
    """G, rollouts per prompt."""
    target: float = 0.5
    """Predicted p to aim for."""

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)
        if not 0.0 <= self.target <= 1.0:
            raise ValueError(f"target={self.target}: must be in [0, 1]")

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """Groups of G for the fresh prompts ranked by |p − target|."""
        fresh = np.asarray(_fresh(view.trees), dtype=np.int64)
        if fresh.size == 0:
            return AllocPlan(stage="roots")
        p = _need(predictor, self.name).predict([view.trees[i].prompt_text for i in fresh])
        shuffle = rng.permutation(fresh.size)
        order = fresh[shuffle[np.argsort(np.abs(p[shuffle] - self.target), kind="stable")]]
        requests = _groups(order.tolist(), view.leaves_left, self.group_size, exact=view.exact)
        chosen = np.isin(fresh, [r.tree_index for r in requests])
        return AllocPlan(
            requests=tuple(requests),
            stage="roots",
            diagnostics={
                "n_prompts": len(requests),
                "mean_p_chosen": float(p[chosen].mean()) if chosen.any() else float("nan"),
            },
        )

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """Every prompt that got rollouts."""
        return _with_leaves(trees)


# --- Tree-GRPO / TreePO and ARPO / AT²PO ---


@dataclass(frozen=True, kw_only=True)
class _TreeSearch:
    """Shared shape of the tree baselines (Tree-GRPO's m, n, l).

    M chains per prompt, then L expansion iterations of N continuations per chain, so a prompt
    costs M (1 + N L) leaves.
    """

    name: ClassVar[str] = ""
    uses_predictor: ClassVar[bool] = False
    roots_per_prompt: int = 2
    """M: independent chains from each prompt root (Tree-GRPO `ts_m=2`)."""
    expansions_per_iteration: int = 2
    """N: continuations per chain in each iteration (Tree-GRPO `ts_n=2`)."""
    iterations: int = 1
    """L: expansion iterations (Tree-GRPO `ts_l=1`)."""

    def __post_init__(self) -> None:
        if self.roots_per_prompt < 1 or self.expansions_per_iteration < 1 or self.iterations < 1:
            raise ValueError(
                f"{self!r}: roots_per_prompt, expansions_per_iteration and iterations must be >= 1"
            )

    @property
    def leaves_per_prompt(self) -> int:
        """M (1 + N L)."""
        return self.roots_per_prompt * (1 + self.expansions_per_iteration * self.iterations)

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """Roots first; then each wave is one expansion iteration over the active trees."""
        if not view.started:
            return self._roots(view)
        active = _active(view.trees)
        if not active:
            return AllocPlan(stage="expand")
        first_wave = min(node.wave for i in active for node in view.trees[i].nodes[1:])
        iterations_left = max(1, self.iterations - (view.wave - first_wave) + 1)
        n_expand = max(1, view.leaves_left // iterations_left)
        # even split over the trees, the odd continuations to random trees
        shares = split_budget(n_expand, np.ones(len(active)))[rng.permutation(len(active))]
        requests: list[RolloutRequest] = []
        for i, share in zip(active, shares, strict=True):
            if share > 0:
                requests += _requests(i, Counter(self._anchors(view.trees[i], int(share), rng)))
        return AllocPlan(
            requests=tuple(requests),
            stage="expand",
            diagnostics={"n_expansions": n_expand, "iterations_left": iterations_left},
        )

    def _roots(self, view: AllocView) -> AllocPlan:
        unit = self.leaves_per_prompt
        if view.exact:
            # the remainder of the budget goes to the expansions, so the total is exact
            n_prompts = view.leaves_left // unit or int(
                view.leaves_left >= max(2, self.roots_per_prompt)
            )
        else:
            n_prompts = max(1, round(view.leaves_left / unit))
        order = _fresh(view.trees)[:n_prompts]
        requests = tuple(
            RolloutRequest(tree_index=i, node_id=0, n=self.roots_per_prompt) for i in order
        )
        return AllocPlan(requests=requests, stage="roots", diagnostics={"n_prompts": len(requests)})

    def _anchors(self, tree: RolloutTree, k: int, rng: np.random.Generator) -> list[int]:
        raise NotImplementedError

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """Every prompt that got rollouts."""
        return _with_leaves(trees)


@dataclass(frozen=True, kw_only=True)
class RandomTree(_TreeSearch):
    """Tree-GRPO / TreePO: expand nodes drawn at random.

    Nodes are drawn uniformly, with replacement, from the root and every non-leaf turn
    (Tree-GRPO `get_expand_node(mode='random')`).
    """

    name: ClassVar[str] = "random_tree"

    def _anchors(self, tree: RolloutTree, k: int, rng: np.random.Generator) -> list[int]:
        candidates = [node.node_id for node in tree.nodes if not node.is_leaf]
        return [int(i) for i in rng.choice(candidates, size=k, replace=True)]


@dataclass(frozen=True, kw_only=True)
class EntropyTree(_TreeSearch):
    """ARPO / AT²PO-like: branch at the prefixes whose next action was the most uncertain.

    A prefix's score is the mean token negative log-likelihood of the actions taken from it
    (its children's), an entropy estimate from the sampling log-probs the engine records; each
    continuation already placed there (this wave or earlier) costs `penalty` (AT²PO's α), so
    the budget spreads over several uncertain turns. The root is not a candidate: branching
    happens after tool calls, as in ARPO.
    """

    name: ClassVar[str] = "entropy_tree"
    penalty: float = 0.5
    """Score subtracted per continuation already made from a prefix (nats)."""

    def _anchors(self, tree: RolloutTree, k: int, rng: np.random.Generator) -> list[int]:
        candidates = [n for n in tree.nodes[1:] if not n.is_leaf]
        if not candidates:
            return [0] * k  # a tree of one-turn chains: only the root can branch
        scores = np.empty(len(candidates))
        extra = np.empty(len(candidates))
        for j, node in enumerate(candidates):
            nll = []
            for c in node.children:
                turn = tree.nodes[c].turn
                assert turn is not None
                if not turn.action_logprobs and turn.action_token_ids:
                    raise AllocError(
                        f"entropy_tree needs action_logprobs; node {c} of tree "
                        f"{tree.prompt_id!r} has none (enable SamplingParams.logprobs)"
                    )
                nll.append(-float(np.mean(turn.action_logprobs)) if turn.action_logprobs else 0.0)
            scores[j] = float(np.mean(nll))
            extra[j] = len(node.children) - 1
        jitter = rng.random(len(candidates)) * 1e-9  # random tie-break
        picked = []
        for _ in range(k):
            j = int(np.argmax(scores - self.penalty * extra + jitter))
            picked.append(candidates[j].node_id)
            extra[j] += 1
        return picked


# --- TRACE ---


@dataclass(frozen=True, kw_only=True)
class Trace:
    """TRACE (arXiv 2606.11119): Stage 1 global root allocation, Stage 2 local prefix expansion.

    Stage 1 spends M = ⌈L / (1 + N)⌉ of the step's L leaves on roots: m_i ∈ {0} ∪ [min, cap]
    (min = 2 by default) maximising Σ 1 − v_i^m − (1 − v_i)^m (exact DP), with `explore_frac`
    of M reserved as floors of `min_per_prompt` rollouts on random prompts. Stage 2 gives each
    active prompt its own share ∝ m_i of the rest (exactly m_i N in the leaf currency, at most
    m_i N in the token currency: `continuation_quota`) and places it on that prompt's unmixed,
    non-leaf turn prefixes, maximising Σ 1 − q^K with q = r V + (1 − r)(1 − V) the chance that
    one continuation repeats the observed outcome r. V conditions the predictor's Ṽ(H) on the
    tree's own bare outcomes of this step (`prefix_posterior`), so the prefixes of a prompt
    whose bare rollouts all agree are predicted to repeat them. A prefix whose flip chance
    1 − q is under `min_flip_prob` gets nothing, and budget never moves between trees: a prompt
    with no prefix left to expand returns its share to Stage-1 roots (`check_placement`
    enforces it). The floor reads the raw chance; placement and the logged `p_flip` use the
    calibrated one when the view carries a calibration (`FlipCalibrator`). Later waves (token
    currency) repeat Stage 2 on the grown trees.
    `stage1`/`stage2 = "uniform"` are the ablation switches.
    """

    name: ClassVar[str] = "trace"
    uses_predictor: ClassVar[bool] = True
    max_per_prompt: int = 16
    """Cap on m_i, so that one prompt cannot take the whole root budget."""
    min_per_prompt: int = 4
    """Smallest non-zero m_i (lowered to the root budget when that is smaller): 4 keeps the
    paper's density of >= 4 bare rollouts per opened prompt; 2 opens prompts with a pair, which
    buys more mixed prompts when the predictor is sharp and fewer when it is not (docs/decisions.md,
    "Root solver")."""
    continuations_per_rollout: int = 1
    """N: Stage-2 continuations per bare rollout (Σ K = m_i N per prompt); 0 turns Stage 2 off."""
    stage1: Literal["active", "uniform"] = "active"
    """`uniform`: G rollouts for the first prompts of the pool instead of the solver."""
    stage2: Literal["active", "uniform"] = "active"
    """`uniform`: spread each prompt's continuations evenly over its prefixes."""
    group_size: int = 8
    """G for `stage1="uniform"`."""
    explore_frac: float = 0.05
    """Share of the root budget given as `min_per_prompt`-rollout floors to random pool prompts,
    so that the predictor keeps seeing prompts it would filter out (docs/decisions.md,
    "Root solver")."""
    p_clip: float = 0.01
    """Predictions are clipped to [p_clip, 1 − p_clip]: no prompt or prefix is ever certain."""
    prefer_unmixed: bool = False
    """False (the paper's rule): each active tree gets its own m_i N continuations, on its own
    prefixes, and a tree with none to expand returns its share to Stage-1 roots. True pools
    the whole Stage-2 budget into the trees whose bare rollouts all agree, which buys about
    one flip per step inside one large tree (kept only to reproduce the old default;
    docs/decisions.md, "Stage 2")."""
    min_flip_prob: float = 0.2
    """Flip floor: a prefix whose predicted flip probability 1 − q is below this gets no
    continuation, and a tree left with none returns its share to Stage-1 roots, so N falls to 0
    where prefixes cannot flip (0: off; `stage2="active"` only). 0.2 with `prefix_prior` 1
    closes every tree whose 4 or more bare rollouts agree (their prefixes' 1 − q is at most
    (1 − p_clip)/5) and keeps mixed ones (docs/decisions.md, "Stage 2")."""
    prefix_prior: float | None = 1.0
    """k: how many bare rollouts the predictor's Ṽ(H) is worth in a prefix's posterior
    V = (k Ṽ(H) + s_i)/(k + m_i), with s_i successes among the tree's m_i bare rollouts
    (`prefix_posterior`). 0 is the tree's own success rate alone; None is Ṽ(H) alone, the
    prefix predictor blind to its own tree (the behaviour before the posterior)."""

    def __post_init__(self) -> None:
        _check_group_size(self.group_size)
        if not 2 <= self.min_per_prompt <= self.max_per_prompt:
            raise ValueError(
                f"min_per_prompt={self.min_per_prompt}, max_per_prompt={self.max_per_prompt}: "
                "need 2 <= min_per_prompt <= max_per_prompt (a group needs 2 leaves to be mixed)"
            )
        if self.stage1 == "uniform" and self.group_size > self.max_per_prompt:
            raise ValueError(
                f"group_size={self.group_size} exceeds max_per_prompt={self.max_per_prompt}"
            )
        if self.continuations_per_rollout < 0:
            raise ValueError(
                f"continuations_per_rollout={self.continuations_per_rollout}: must be >= 0"
            )
        if not 0.0 <= self.explore_frac <= 1.0:
            raise ValueError(f"explore_frac={self.explore_frac}: must be in [0, 1]")
        if not 0.0 <= self.p_clip < 0.5:
            raise ValueError(f"p_clip={self.p_clip}: must be in [0, 0.5)")
        if not 0.0 <= self.min_flip_prob <= 0.5:
            raise ValueError(f"min_flip_prob={self.min_flip_prob}: must be in [0, 0.5]")
        if self.prefix_prior is not None and not 0.0 <= self.prefix_prior < math.inf:
            raise ValueError(f"prefix_prior={self.prefix_prior}: must be >= 0 and finite")
        if self.stage1 not in ("active", "uniform") or self.stage2 not in ("active", "uniform"):
            raise ValueError(
                f"stage1={self.stage1!r}, stage2={self.stage2!r}: each is 'active' or 'uniform'"
            )

    def ask(
        self, view: AllocView, *, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        """Stage 1 on the first wave, Stage 2 on every later one."""
        if not view.started:
            return self._stage1(view, predictor, rng)
        return self._stage2(view, predictor, rng)

    def train_indices(self, trees: Sequence[RolloutTree]) -> list[int]:
        """Every prompt that got rollouts (filtered prompts have none)."""
        return _with_leaves(trees)

    def _clip(self, p: np.ndarray) -> np.ndarray:
        return np.clip(p, self.p_clip, 1.0 - self.p_clip)

    # --- Stage 1: global root allocation ---

    def _stage1(
        self, view: AllocView, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        n_roots = -(-view.leaves_left // (1 + self.continuations_per_rollout))
        # a small budget still opens one prompt
        n_roots = max(n_roots, min(self.min_per_prompt, view.leaves_left))
        # a budget below the minimum still opens one prompt, with all of it
        lo = max(2, min(self.min_per_prompt, n_roots))
        if self.stage1 == "uniform":
            groups = _groups(range(len(view.trees)), n_roots, self.group_size, exact=view.exact)
            return AllocPlan(
                requests=tuple(groups), stage="roots", diagnostics={"n_prompts": len(groups)}
            )
        p = self._clip(_need(predictor, self.name).predict([t.prompt_text for t in view.trees]))
        floor = np.zeros(len(view.trees), dtype=np.int64)
        # rounded up, so that a small pool still explores (⌊0.05 · 24 / 2⌋ was 0)
        n_explore = min(math.ceil(self.explore_frac * n_roots / lo), n_roots // lo, len(view.trees))
        floor[rng.choice(len(view.trees), size=n_explore, replace=False)] = lo
        solution = solve_roots(
            p, n_roots, max_per_prompt=self.max_per_prompt, min_per_prompt=lo, floor=floor
        )
        requests = tuple(
            RolloutRequest(tree_index=i, node_id=0, n=int(m))
            for i, m in enumerate(solution.m)
            if m > 0
        )
        return AllocPlan(
            requests=requests,
            stage="roots",
            diagnostics={
                "n_prompts": len(requests),
                "n_explore": n_explore,
                "expected_mixed": solution.value,
                "mean_p_pool": float(p.mean()) if p.size else float("nan"),
            },
        )

    # --- Stage 2: local prefix expansion ---

    def _stage2(
        self, view: AllocView, predictor: Predictor | None, rng: np.random.Generator
    ) -> AllocPlan:
        eligible = self._eligible(view.trees, predictor)
        if self.continuations_per_rollout == 0 or (self.prefer_unmixed and not eligible):
            return self._top_up_roots(view, predictor, view.leaves_left)
        if self.prefer_unmixed:
            trees = list(eligible)
            unmixed = [i for i in trees if not view.trees[i].is_mixed]
            trees = unmixed or trees
            m = np.array([len(view.trees[i].root.children) for i in trees], dtype=np.float64)
            shares = dict(zip(trees, split_budget(view.leaves_left, m).tolist(), strict=True))
        else:
            quota = continuation_quota(view.trees, self.continuations_per_rollout, view.leaves_left)
            shares = {i: int(quota[i]) for i in eligible if quota[i] > 0}
        requests: list[RolloutRequest] = []
        expected_flips = 0.0
        for i, share in shares.items():
            nodes, q_raw = eligible[i]
            q = q_raw if view.flip_calibration is None else 1.0 - view.flip_calibration(1.0 - q_raw)
            if self.stage2 == "uniform":
                k = np.full(len(nodes), share // len(nodes))
                k[rng.choice(len(nodes), size=int(share % len(nodes)), replace=False)] += 1
            else:
                k = solve_prefixes(q, share)
                expected_flips += float(v_prefix(q, k).sum())
            # q is NaN where no predictor scored the prefix (uniform placement without one)
            p_flip = {n: 1.0 - float(x) for n, x in zip(nodes, q, strict=True) if x == x}
            p_raw = {n: 1.0 - float(x) for n, x in zip(nodes, q_raw, strict=True) if x == x}
            counts = Counter(dict(zip(nodes, k.tolist(), strict=True)))
            requests += _requests(i, counts, p_flip, p_raw)
        placed = sum(r.n for r in requests)
        if not self.prefer_unmixed:
            check_placement(view.trees, requests, self.continuations_per_rollout)
        # the shares of trees with no prefix to expand go back to Stage 1, never to other trees
        top_up = self._top_up_roots(view, predictor, view.leaves_left - placed)
        return AllocPlan(
            requests=(*requests, *top_up.requests),
            stage="prefixes",
            diagnostics={
                "n_prompts": len(shares),
                "n_eligible": sum(len(e[0]) for e in eligible.values()),
                "expected_flips": expected_flips,
                "n_top_up_roots": top_up.n_leaves,
            },
        )

    def _eligible(
        self, trees: Sequence[RolloutTree], predictor: Predictor | None
    ) -> dict[int, tuple[list[int], np.ndarray]]:
        """Per active tree with any, its expandable prefixes and their repeat probabilities q.

        A prefix is expandable when it is a non-leaf turn whose leaves all agree (outcome r);
        q = r V + (1 − r)(1 − V) is the chance that one continuation repeats r (docs/design.md
        §1), with V the predictor's Ṽ(H) conditioned on the tree's bare outcomes
        (`prefix_prior`). `stage2="uniform"` places without q, but q is still computed when a
        predictor is given (the flip logs score random placement too); without one it is NaN.
        With `stage2="active"`, prefixes whose flip probability 1 − q is below `min_flip_prob`
        are dropped (the flip floor).
        """
        found: dict[int, tuple[list[int], np.ndarray]] = {}
        for i in _active(trees):
            count, _, low, high = trees[i].leaf_stats()
            nodes = [
                n.node_id
                for n in trees[i].nodes[1:]
                if not n.is_leaf and count[n.node_id] > 0 and low[n.node_id] == high[n.node_id]
            ]
            if nodes:
                found[i] = (nodes, low[nodes])
        if not found or (self.stage2 == "uniform" and predictor is None):
            return {i: (nodes, np.full(len(nodes), np.nan)) for i, (nodes, _) in found.items()}
        histories = [trees[i].history(n) for i, (nodes, _) in found.items() for n in nodes]
        v_hat = self._clip(_need(predictor, self.name).predict(histories))
        out: dict[int, tuple[list[int], np.ndarray]] = {}
        start = 0
        for i, (nodes, r) in found.items():
            v = v_hat[start : start + len(nodes)]
            start += len(nodes)
            if self.prefix_prior is not None:
                bare = [trees[i].nodes[leaf].reward or 0.0 for leaf in bare_leaves(trees[i])]
                v = self._clip(prefix_posterior(v, sum(bare), len(bare), self.prefix_prior))
            q = r * v + (1.0 - r) * (1.0 - v)
            keep = (
                1.0 - q >= self.min_flip_prob
                if self.stage2 == "active"
                else np.ones(len(q), dtype=bool)
            )
            if keep.any():
                out[i] = ([n for n, k in zip(nodes, keep, strict=True) if k], q[keep])
        return out

    def _top_up_roots(self, view: AllocView, predictor: Predictor | None, leaves: int) -> AllocPlan:
        """Spend `leaves` on roots: the budget that no tree's own prefixes can take.

        That is all of it with N = 0 or one-turn episodes, and the share of any tree whose
        prefixes are all mixed or under the flip floor. Stage 1 is solved again with the
        rollouts already made as floors.
        """
        if leaves <= 0:
            return AllocPlan(stage="roots")
        current = np.array([len(t.root.children) for t in view.trees], dtype=np.int64)
        if self.stage1 == "uniform":
            order = _fresh(view.trees)
            groups = _groups(order, leaves, self.group_size, exact=view.exact)
            return AllocPlan(requests=tuple(groups), stage="roots")
        p = self._clip(_need(predictor, self.name).predict([t.prompt_text for t in view.trees]))
        floor = np.minimum(current, self.max_per_prompt)
        # a small Stage-1 budget may have opened prompts below min_per_prompt (with 2)
        lo = int(min(self.min_per_prompt, *floor[floor > 0])) if (floor > 0).any() else 0
        solution = solve_roots(
            p,
            int(floor.sum()) + leaves,
            max_per_prompt=self.max_per_prompt,
            min_per_prompt=max(2, lo or self.min_per_prompt),
            floor=floor,
        )
        extra = solution.m - floor
        requests = tuple(
            RolloutRequest(tree_index=i, node_id=0, n=int(n)) for i, n in enumerate(extra) if n > 0
        )
        return AllocPlan(
            requests=requests, stage="roots", diagnostics={"expected_mixed": solution.value}
        )


def continuation_quota(trees: Sequence[RolloutTree], n: int, leaves_left: int) -> np.ndarray:
    """Continuations each tree may still take this step: its own share, never another's.

    The step's continuation budget (those already made plus `leaves_left`) is split ∝ m_i, the
    tree's bare rollouts, and capped at m_i N; what a tree already holds is subtracted. In the
    leaf currency this is exactly m_i N per tree; in the token currency, where continuations
    cost fewer tokens than roots, the cap keeps the shape and the rest goes to roots.

    Args:
        trees: The step's trees.
        n: N, continuations per bare rollout.
        leaves_left: Leaves left this step (exact, or the token currency's estimate).

    Returns:
        Continuations per tree, shape `(len(trees),)`, each >= 0.

    >>> from trace_alloc.tree import Rollout, Turn
    >>> t = RolloutTree(prompt_id="a", prompt_text="A?")
    >>> for _ in range(3):
    ...     _ = t.add_rollout(0, Rollout(turns=(Turn(action_text="s", action_token_ids=(1,)),
    ...                                         Turn(action_text="a", action_token_ids=(2,))),
    ...                                  reward=1.0))
    >>> empty = RolloutTree(prompt_id="b", prompt_text="B?")
    >>> continuation_quota([t, empty], 2, 10).tolist()
    [6, 0]
    """
    m = np.array([len(t.root.children) for t in trees], dtype=np.int64)
    made = np.array([t.n_leaves for t in trees], dtype=np.int64) - m
    share = split_budget(int(made.sum()) + leaves_left, m.astype(np.float64))
    quota: np.ndarray = np.maximum(np.minimum(share, m * n) - made, 0)
    return quota


def check_placement(
    trees: Sequence[RolloutTree], requests: Sequence[RolloutRequest], n: int
) -> None:
    """The placement invariant: tree i never holds more than m_i N continuation leaves.

    Raises:
        AllocError: a plan would break it (a bug in the allocator, never the user's input).
    """
    planned = Counter[int]()
    for r in requests:
        if r.node_id != 0:
            planned[r.tree_index] += r.n
    for i, k in planned.items():
        m = len(trees[i].root.children)
        made = trees[i].n_leaves - m
        if made + k > m * n:
            raise AllocError(
                f"placement invariant broken: tree {i} would hold {made + k} continuations "
                f"for m={m} bare rollouts and N={n} (cap {m * n})"
            )


ALLOCATORS: dict[str, type[Allocator]] = {
    "uniform": Uniform,
    "dynamic_sampling": DynamicSampling,
    "prompt_predictor": PromptPredictor,
    "random_tree": RandomTree,
    "entropy_tree": EntropyTree,
    "trace": Trace,
}
"""Every allocator by name."""


def make_allocator(name: str, **config: Any) -> Allocator:
    """Build an allocator by name with its config fields as keyword arguments.

    Raises:
        UnknownNameError: `name` is not in `ALLOCATORS` (the message suggests the closest).

    >>> make_allocator("uniform", group_size=4)
    Uniform(group_size=4)
    >>> make_allocator("tarce")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    trace_alloc.errors.UnknownNameError: unknown allocator 'tarce'. Did you mean 'trace'? ...
    """
    if name not in ALLOCATORS:
        raise UnknownNameError("allocator", name, ALLOCATORS)
    return ALLOCATORS[name](**config)
