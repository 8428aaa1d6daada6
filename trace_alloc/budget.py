"""Budget in three currencies: leaves, generated tokens, tool calls (docs/design.md §1).

A run limits one currency, `leaves` or `tokens`, and meters all three. Generated tokens count
only the action tokens a policy produced: a fork reuses its prefix, so prefix tokens are never
counted twice, and observation tokens come from the environment, not the policy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["BudgetLimit", "Currency", "Spend"]

Currency = Literal["leaves", "tokens"]
"""The currency a run's budget is limited in; tool calls are metered but never the limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Spend:
    """Budget spent, in all three currencies.

    >>> Spend(n_leaves=2, n_tokens=10) + Spend(n_leaves=1, n_tokens=5, n_tool_calls=1)
    Spend(n_leaves=3, n_tokens=15, n_tool_calls=1)
    """

    n_leaves: int = 0
    n_tokens: int = 0
    n_tool_calls: int = 0

    def __add__(self, other: Spend) -> Spend:
        return Spend(
            n_leaves=self.n_leaves + other.n_leaves,
            n_tokens=self.n_tokens + other.n_tokens,
            n_tool_calls=self.n_tool_calls + other.n_tool_calls,
        )

    def __sub__(self, other: Spend) -> Spend:
        return Spend(
            n_leaves=self.n_leaves - other.n_leaves,
            n_tokens=self.n_tokens - other.n_tokens,
            n_tool_calls=self.n_tool_calls - other.n_tool_calls,
        )

    def amount(self, currency: Currency) -> int:
        """The spend in one currency.

        >>> Spend(n_leaves=3, n_tokens=40).amount("tokens")
        40
        """
        return self.n_leaves if currency == "leaves" else self.n_tokens

    def to_dict(self) -> dict[str, int]:
        """The three counts under the metric keys the trainer logs (`budget/...`)."""
        return {"leaves": self.n_leaves, "tokens": self.n_tokens, "tool_calls": self.n_tool_calls}


@dataclass(frozen=True, slots=True, kw_only=True)
class BudgetLimit:
    """The per-step budget of a run, in its limiting currency.

    Leaves are exact: an allocator is held to the leaf count of every wave. Tokens are not known
    before a rollout ends, so the driver stops issuing once the limit is reached and carries
    the difference (debt or credit) into the next step: the total over a run then differs from
    `n_steps * per_step` by at most the last step's carry (docs/trace_alloc.md, "Budget").
    """

    currency: Currency = "leaves"
    """`leaves` (trajectories) or `tokens` (generated tokens, reused prefixes excluded)."""
    per_step: int = 512
    """Budget of one training step, in `currency`."""
    max_waves: int = 64
    """Safety bound on the allocator's waves per step (the trainers set 16: docs/decisions.md,
    "One tree step")."""

    def __post_init__(self) -> None:
        if self.currency not in ("leaves", "tokens"):
            raise ValueError(f"currency={self.currency!r}: must be 'leaves' or 'tokens'")
        if self.per_step < 1:
            raise ValueError(f"per_step={self.per_step}: a step needs a positive budget")
        if self.max_waves < 1:
            raise ValueError(f"max_waves={self.max_waves}: a step needs at least one wave")

    @property
    def exact(self) -> bool:
        """Whether every wave's cost is known before it runs (leaves are; tokens are not)."""
        return self.currency == "leaves"

    def leaves_left(self, remaining: float, tokens_per_leaf: float) -> int:
        """Remaining budget expressed in leaves: exact for leaves, an estimate for tokens.

        The token estimate rounds up, so a wave is never empty while budget is left; the
        overshoot of the last wave becomes the next step's debt.

        >>> BudgetLimit(currency="leaves").leaves_left(7, 300.0)
        7
        >>> BudgetLimit(currency="tokens").leaves_left(1000, 300.0)
        4
        """
        if remaining <= 0:
            return 0
        if self.exact:
            return int(remaining)
        return math.ceil(remaining / max(tokens_per_leaf, 1.0))
