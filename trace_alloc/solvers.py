"""The two TRACE budget problems and their exact solvers (docs/design.md §1; docs/trace_alloc.md).

Stage 1 (roots): choose m_i ∈ {0} ∪ [2, cap] with Σ m_i = M maximising Σ V_root(v_i, m_i),
V_root(v, m) = 1 − v^m − (1 − v)^m. V_root(·, 1) = 0, so the objective is not concave at the
start and plain marginal-gain greedy is not exact (docs/decisions.md, "Root solver"); a dynamic
program over the budget is, and costs O(B · cap · M) vectorised array operations.

Stage 2 (prefixes): choose K_n ≥ 0 with Σ K_n = budget maximising Σ 1 − q_n^K_n. The marginal
gain of the (k+1)-th continuation, q^k (1 − q), is non-increasing in k, so taking the `budget`
largest gains over all (node, k) pairs is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trace_alloc.errors import AllocError

__all__ = [
    "RootSolution",
    "prefix_gain",
    "prefix_posterior",
    "root_gain",
    "solve_prefixes",
    "solve_roots",
    "split_budget",
    "v_prefix",
    "v_root",
]


def v_root(p: np.ndarray | float, m: np.ndarray | int) -> np.ndarray:
    """Probability that m rollouts at success probability p are mixed: 1 − p^m − (1 − p)^m.

    Zero for m ∈ {0, 1}: one rollout can never be mixed.

    >>> float(v_root(0.5, 2)), float(v_root(0.5, 3)), float(v_root(0.3, 1)), float(v_root(0.3, 0))
    (0.5, 0.75, 0.0, 0.0)
    """
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(m)
    value = 1.0 - p**m - (1.0 - p) ** m
    return np.where(m >= 2, value, 0.0)


def root_gain(p: np.ndarray | float, m: np.ndarray | int) -> np.ndarray:
    """Marginal value V_root(p, m+1) − V_root(p, m) = p^m (1 − p) + (1 − p)^m p, for m ≥ 1.

    For m = 0 the next single rollout is worth nothing; opening a prompt costs two rollouts
    and is worth V_root(p, 2) = 2 p (1 − p).

    >>> float(root_gain(0.5, 2)), float(root_gain(0.5, 0))
    (0.25, 0.0)
    """
    p = np.asarray(p, dtype=np.float64)
    m = np.asarray(m)
    gain = p**m * (1.0 - p) + (1.0 - p) ** m * p
    return np.where(m >= 1, gain, 0.0)


def v_prefix(q: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """Probability that at least one of k continuations flips an outcome repeated w.p. q.

    >>> float(v_prefix(0.75, 2))
    0.4375
    """
    flips: np.ndarray = 1.0 - np.asarray(q, dtype=np.float64) ** np.asarray(k)
    return flips


def prefix_posterior(
    v_hat: np.ndarray, successes: float, n_bare: int, prior_strength: float
) -> np.ndarray:
    """A prefix's success probability given what its own tree's bare rollouts showed this step.

    V = (k V̂(H) + s) / (k + m): the predictor's V̂(H) counts as k pseudo-rollouts beside the s
    successes of the tree's m bare rollouts (a Beta posterior whose prior mean is V̂). Where a
    prompt's bare rollouts all agree, every prefix is pulled toward that outcome, so a settled
    tree's continuations are predicted to repeat it; where they disagree, toward the tree's
    success rate. k = 0 is the tree's own rate alone; a large k is the predictor alone.

    >>> prefix_posterior(np.array([0.8, 0.2]), successes=0, n_bare=4, prior_strength=1.0).tolist()
    [0.16, 0.04]
    >>> prefix_posterior(np.array([0.5]), successes=2, n_bare=4, prior_strength=0.0).tolist()
    [0.5]
    """
    if prior_strength < 0 or prior_strength + n_bare <= 0:
        raise ValueError(
            f"prior_strength={prior_strength}, n_bare={n_bare}: need k >= 0 and k + m > 0"
        )
    v = np.asarray(v_hat, dtype=np.float64)
    posterior: np.ndarray = (prior_strength * v + successes) / (prior_strength + n_bare)
    return posterior


def prefix_gain(q: np.ndarray | float, k: np.ndarray | int) -> np.ndarray:
    """Marginal value of the (k+1)-th continuation: q^k (1 − q).

    >>> float(prefix_gain(0.75, 0)), float(prefix_gain(0.75, 1))
    (0.25, 0.1875)
    """
    q = np.asarray(q, dtype=np.float64)
    gain: np.ndarray = q ** np.asarray(k) * (1.0 - q)
    return gain


@dataclass(frozen=True, slots=True, kw_only=True)
class RootSolution:
    """Stage-1 allocation: rollouts per prompt and the expected number of mixed prompts."""

    m: np.ndarray
    """Rollouts per prompt, shape `(B,)`, each 0 or in [max(min_per_prompt, floor), cap]."""
    value: float
    """Σ V_root(v_i, m_i): expected number of mixed prompts."""

    @property
    def n_rollouts(self) -> int:
        """Σ m_i."""
        return int(self.m.sum())


def solve_roots(
    p: np.ndarray,
    budget: int,
    *,
    max_per_prompt: int,
    min_per_prompt: int = 2,
    floor: np.ndarray | None = None,
) -> RootSolution:
    """Exact Stage-1 allocation by dynamic programming over the budget.

    Spends the whole budget when some allocation can (then maximises value); otherwise the
    largest spend below it. m_i = 1 is never chosen.

    Args:
        p: predicted success probability per prompt, shape `(B,)`.
        budget: root rollouts M to spend.
        max_per_prompt: cap on each m_i (≥ 2).
        min_per_prompt: smallest non-zero m_i (≥ 2; 2 is the paper's "open with two").
        floor: optional per-prompt minimum (0, or in [min_per_prompt, cap]: an exploration
            floor); shape `(B,)`.

    Returns:
        The allocation and its value.

    Raises:
        AllocError: invalid arguments, or floors that alone exceed the budget.

    >>> solve_roots(np.array([0.5, 0.1, 0.99]), 5, max_per_prompt=4).m.tolist()
    [3, 2, 0]
    """
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    n = p.shape[0]
    if not 2 <= min_per_prompt <= max_per_prompt:
        raise AllocError(
            f"need 2 <= min_per_prompt ({min_per_prompt}) <= max_per_prompt ({max_per_prompt}):"
            " a group needs 2 rollouts to be mixed"
        )
    if budget < 0:
        raise AllocError(f"budget={budget}: must be >= 0")
    lo = np.zeros(n, dtype=np.int64) if floor is None else np.asarray(floor, dtype=np.int64)
    bad = (lo < 0) | ((lo > 0) & (lo < min_per_prompt)) | (lo > max_per_prompt)
    if lo.shape != (n,) or np.any(bad):
        raise AllocError(
            f"floor must be 0 or in [{min_per_prompt}, {max_per_prompt}] per prompt; got {lo}"
        )
    if lo.sum() > budget:
        raise AllocError(f"floors need {int(lo.sum())} rollouts but the budget is {budget}")
    budget = min(budget, n * max_per_prompt)
    choices = np.arange(min_per_prompt, max_per_prompt + 1)
    dp = np.full(budget + 1, -np.inf)
    dp[0] = 0.0
    picked = np.zeros((n, budget + 1), dtype=np.int16)
    for i in range(n):
        values = v_root(p[i], choices)  # (cap - 1,)
        new = dp.copy() if lo[i] == 0 else np.full(budget + 1, -np.inf)
        best = np.zeros(budget + 1, dtype=np.int16)
        for m, value in zip(choices, values, strict=True):
            if m < lo[i] or m > budget:
                continue
            candidate = dp[:-m] + value  # (budget + 1 - m,)
            better = candidate > new[m:]
            new[m:] = np.where(better, candidate, new[m:])
            best[m:] = np.where(better, m, best[m:])
        dp = new
        picked[i] = best
    reachable = np.flatnonzero(np.isfinite(dp))
    spend = int(reachable.max())
    m_out = np.zeros(n, dtype=np.int64)
    b = spend
    for i in range(n - 1, -1, -1):
        m_out[i] = picked[i, b]
        b -= m_out[i]
    assert b == 0
    return RootSolution(m=m_out, value=float(dp[spend]))


def solve_prefixes(q: np.ndarray, budget: int, *, max_per_node: int | None = None) -> np.ndarray:
    """Exact Stage-2 allocation of continuations to prefixes: max Σ 1 − q_n^K_n, Σ K_n = budget.

    Takes the `budget` largest marginal gains q^k (1 − q) over all (node, k); ties go to the
    lower node index, then the lower k.

    Args:
        q: per eligible prefix, the probability that one continuation repeats the observed
            outcome, shape `(n_nodes,)`.
        budget: continuations to place.
        max_per_node: optional cap on each K_n.

    Returns:
        K per node, shape `(n_nodes,)`, summing to min(budget, n_nodes · cap).

    >>> solve_prefixes(np.array([0.9, 0.5, 0.2]), 4).tolist()
    [0, 2, 2]
    """
    q = np.clip(np.asarray(q, dtype=np.float64), 0.0, 1.0)
    n = q.shape[0]
    if budget < 0:
        raise AllocError(f"budget={budget}: must be >= 0")
    if max_per_node is not None and max_per_node < 1:
        raise AllocError(f"max_per_node={max_per_node}: must be >= 1")
    depth = budget if max_per_node is None else min(budget, max_per_node)
    if n == 0 or depth == 0:
        return np.zeros(n, dtype=np.int64)
    gains = prefix_gain(q[:, None], np.arange(depth)[None, :])  # (n, depth)
    order = np.lexsort(
        (np.tile(np.arange(depth), n), np.repeat(np.arange(n), depth), -gains.ravel())
    )
    chosen = order[:budget] // depth
    return np.bincount(chosen, minlength=n).astype(np.int64)


def split_budget(total: int, weights: np.ndarray) -> np.ndarray:
    """Integer shares of `total` proportional to non-negative `weights` (largest remainder).

    Ties in the remainder go to the lower index. All-zero weights get nothing.

    >>> split_budget(10, np.array([3, 1, 0, 2])).tolist()
    [5, 2, 0, 3]
    """
    w = np.asarray(weights, dtype=np.float64)
    if np.any(w < 0) or total < 0:
        raise AllocError(f"split_budget needs total >= 0 and weights >= 0, got {total}, {w}")
    if w.sum() <= 0:
        return np.zeros(w.shape[0], dtype=np.int64)
    exact = total * w / w.sum()
    shares = np.floor(exact).astype(np.int64)
    left = total - int(shares.sum())
    order = np.lexsort((np.arange(w.shape[0]), -(exact - shares)))
    shares[order[:left]] += 1
    return np.asarray(shares)
