"""A seeded random source whose draws are stable across Python and numpy versions.

`World.generate(seed)` promises a byte-identical world for a seed. Python guarantees only that
`random.Random(seed).random()` keeps its sequence across versions (the other methods'
algorithms may change), and numpy does not promise stable `Generator` streams, so every draw
here is derived from `random()` alone.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import TypeVar

__all__ = ["Dice"]

T = TypeVar("T")


class Dice:
    """Deterministic draws from one seed.

    >>> Dice(7).shuffled(range(6)) == Dice(7).shuffled(range(6))
    True
    >>> sorted(Dice(7).sample(range(6), 3)) != sorted(Dice(8).sample(range(6), 3))
    True
    """

    def __init__(self, seed: int) -> None:
        self._seed = seed
        self._rng = random.Random(seed)

    def spawn(self, label: str) -> Dice:
        """An independent stream for one part of a generator, stable when other parts change."""
        digest = hashlib.sha256(f"{self._seed}:{label}".encode()).digest()
        return Dice(int.from_bytes(digest[:8], "big"))

    def unit(self) -> float:
        """A float in [0, 1)."""
        return self._rng.random()

    def below(self, n: int) -> int:
        """An int in [0, n)."""
        if n < 1:
            raise ValueError(f"below({n}): n must be >= 1")
        return min(int(self._rng.random() * n), n - 1)

    def between(self, lo: int, hi: int) -> int:
        """An int in [lo, hi], both included."""
        return lo + self.below(hi - lo + 1)

    def chance(self, p: float) -> bool:
        """True with probability p."""
        return self._rng.random() < p

    def pick(self, items: Sequence[T]) -> T:
        """One item, uniformly."""
        return items[self.below(len(items))]

    def shuffled(self, items: Sequence[T]) -> list[T]:
        """A shuffled copy (Fisher-Yates)."""
        out = list(items)
        for i in range(len(out) - 1, 0, -1):
            j = self.below(i + 1)
            out[i], out[j] = out[j], out[i]
        return out

    def sample(self, items: Sequence[T], k: int) -> list[T]:
        """`k` distinct items (all of them if fewer), in random order."""
        return self.shuffled(items)[:k]
