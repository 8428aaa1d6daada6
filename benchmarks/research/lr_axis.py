"""A learning-rate axis for comparisons: each method at its own best rate, chosen on validation.

A comparison at one shared learning rate favours whichever method that rate happens to suit
(a method that takes fewer optimizer steps, or steps of another direction, may want another
rate). So every method is trained at several multipliers of the base rate, and each method's
multiplier is chosen on a validation set of unseen worlds that no test set shares
(`check_disjoint`), by its mean validation EM over seeds (`best_multiplier`); the test tables
then compare each method at its chosen rate, and `curve_table` shows the validation curve
behind each choice. Test results never enter the choice.

Used by `benchmarks.research.experiment` (`--lr-multipliers`) and the stream experiment.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping, Sequence

import numpy as np

__all__ = ["best_multiplier", "check_disjoint", "curve_table"]


def best_multiplier(validation_em: Mapping[float, Sequence[float]]) -> float:
    """The multiplier whose mean validation EM over seeds is highest.

    Ties (means equal to 1e-12) go to the multiplier closest to 1 on a log scale (the base
    rate, then the smaller of a pair such as ½ and 2: the more cautious step).

    Args:
        validation_em: Multiplier -> validation EM of each seed trained at it.

    Returns:
        The chosen multiplier.

    Raises:
        ValueError: no multiplier, a multiplier with no seed, or a non-finite EM.

    >>> best_multiplier({0.5: [0.40, 0.44], 1.0: [0.41, 0.41], 2.0: [0.30, 0.50]})
    0.5
    >>> best_multiplier({0.5: [0.4], 1.0: [0.4], 2.0: [0.4]})
    1.0
    >>> best_multiplier({0.5: [0.4], 2.0: [0.4]})
    0.5
    """
    if not validation_em:
        raise ValueError("best_multiplier: no learning-rate multiplier to choose from")
    means: dict[float, float] = {}
    for multiplier, ems in validation_em.items():
        values = [float(v) for v in ems]
        if multiplier <= 0 or not values or not all(math.isfinite(v) for v in values):
            raise ValueError(
                f"best_multiplier: multiplier {multiplier} needs a positive value and at least "
                f"one finite validation EM (got {values})"
            )
        means[float(multiplier)] = float(np.mean(values))
    top = max(means.values())
    tied = [m for m, mean in means.items() if top - mean <= 1e-12]
    return min(tied, key=lambda m: (abs(math.log(m)), m))


def curve_table(
    validation_em: Mapping[str, Mapping[float, Sequence[float]]],
    *,
    chosen: Mapping[str, float] | None = None,
    scale: float = 100.0,
    digits: int = 1,
) -> str:
    """The validation curve as a markdown table: one row per method, one column per multiplier.

    Each cell is the mean validation EM over seeds (× `scale`), with the seed count where the
    seeds differ across cells; the chosen multiplier of each method is in bold. `chosen`
    defaults to `best_multiplier` of each row.

    >>> print(curve_table({"grpo": {1.0: [0.5, 0.7], 0.5: [0.3]}, "trace": {1.0: [0.4]}}))
    | method | lr ×0.5 | lr ×1 | chosen |
    |---|---|---|---|
    | grpo | 30.0 (n=1) | **60.0** (n=2) | ×1 |
    | trace | – | **40.0** (n=1) | ×1 |
    """
    multipliers = sorted({float(m) for row in validation_em.values() for m in row})
    counts = {len(ems) for row in validation_em.values() for ems in row.values()}
    lines = [
        "| method | " + " | ".join(f"lr ×{m:g}" for m in multipliers) + " | chosen |",
        "|---" * (len(multipliers) + 2) + "|",
    ]
    for method, row in validation_em.items():
        pick = (chosen or {}).get(method, best_multiplier(row) if row else math.nan)
        cells = []
        for m in multipliers:
            ems = row.get(m)
            if not ems:
                cells.append("–")
                continue
            text = f"{float(np.mean(ems)) * scale:.{digits}f}"
            text = f"**{text}**" if m == pick else text
            cells.append(text + (f" (n={len(ems)})" if len(counts) > 1 else ""))
        lines.append(f"| {method} | " + " | ".join(cells) + f" | ×{pick:g} |")
    return "\n".join(lines)


def check_disjoint(
    validation: Iterable[Hashable], others: Mapping[str, Iterable[Hashable]], *, what: str
) -> None:
    """Refuse a validation set that shares an item (a world seed, a question) with another set.

    Args:
        validation: The validation set's items.
        others: Name -> the items of a set the validation set must miss (test sets, training).
        what: Names the validation set's items in the error, e.g. `--validation-world-seed`.

    Raises:
        ValueError: one line naming `what`, the other set and the shared items.

    >>> check_disjoint([7], {"test world": [2026]}, what="--validation-world-seed")
    >>> check_disjoint([7, 8], {"test world": [8]}, what="--seed")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: --seed: the validation set shares [8] with the test world; ...
    """
    own = set(validation)
    for name, items in others.items():
        shared = sorted(own & set(items), key=str)
        if shared:
            shown = shared[:5] + (["..."] if len(shared) > 5 else [])
            raise ValueError(
                f"{what}: the validation set shares {shown} with the {name}; pick a validation "
                "set disjoint from it"
            )
