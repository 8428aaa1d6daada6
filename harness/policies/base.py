"""The policy-backend contract: token prefixes in, completions with log-probs out.

The tree-rollout engine and the benchmark agents talk to a model only through `PolicyBackend`.
A backend is token-in/token-out, as OpenRLHF's `RolloutRayActor.generate` is: the engine appends
observations as token deltas, so nothing is re-tokenised and forks share exact prefixes.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from harness.errors import BackendUnavailable

__all__ = [
    "BackendUnavailable",
    "Completion",
    "ConcurrentPolicyBackend",
    "PolicyBackend",
    "SamplingParams",
]

STOP_STRINGS: tuple[str, ...] = ("</search>", "</answer>")
"""An action ends at the first of these (docs/design.md §2)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    """How to sample one continuation per prefix."""

    max_new_tokens: int = 128
    """Cap per turn; an action longer than this is cut and ends with finish_reason="length"."""
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """0 disables top-k."""
    stop: tuple[str, ...] = STOP_STRINGS
    """Generation stops right after the first of these strings (it is kept in the output)."""
    seed: int | None = None
    """Seeds the backend's sampler for this call, where the backend supports it."""
    logprobs: bool = True
    """Return the log-probability of each sampled token under the sampling distribution."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature}: must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p}: must be in (0, 1]")


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion:
    """One generated continuation of one prefix."""

    token_ids: tuple[int, ...]
    """Generated tokens only (the prefix is not repeated), up to and including the stop."""
    text: str
    """The decoded `token_ids`."""
    logprobs: tuple[float, ...] = ()
    """Per generated token, same length as `token_ids` (empty if not requested)."""
    finish_reason: Literal["stop", "length", "eos"]
    """stop: a stop string ended it; length: max_new_tokens; eos: the model's end token."""

    @property
    def n_tokens(self) -> int:
        """Number of generated tokens."""
        return len(self.token_ids)


@runtime_checkable
class PolicyBackend(Protocol):
    """Anything that continues token prefixes.

    `generate` is batched first: one completion per prefix, in order. Implementations must honour
    `SamplingParams.stop`, cutting the output right after the first stop string.
    """

    def generate(
        self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Completion]:
        """Continue each prefix once."""
        ...


@runtime_checkable
class ConcurrentPolicyBackend(PolicyBackend, Protocol):
    """A backend whose requests run concurrently and can be collected as each one finishes.

    The tree-rollout engine then plays every episode at its own pace: an episode whose action
    came back is stepped and sent its next turn while slower actions are still being generated
    (no lockstep per turn). OpenRLHF's Ray engines allow it (`RayEnginesBackend`): vLLM batches
    whatever requests are in flight.
    """

    timeout_s: float | None
    """How long `wait` may go without any request finishing (None: no limit)."""

    def submit(self, prefixes: Sequence[Sequence[int]], sampling: SamplingParams) -> list[Hashable]:
        """Start continuing each prefix once; returns one handle per prefix, in order."""
        ...

    def wait(self, handles: Sequence[Hashable]) -> list[tuple[Hashable, Completion]]:
        """Block until at least one of `handles` has finished; return every finished one.

        Raises:
            EngineTimeoutError: nothing finished within `timeout_s` (the rest are cancelled).
        """
        ...
