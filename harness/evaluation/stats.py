"""Accuracy as a statistic: per-question means and bootstrap confidence intervals over questions.

An evaluation samples each question several times; the questions, not the samples, are the
independent units. So every interval here resamples *questions*: the per-question mean EM
(over its samples) is the unit, and a before/after comparison is paired on the question (the
same questions and the same sampling seed on both sides). Intervals are scipy's percentile
bootstrap of the mean.

>>> est = paired_difference({"a": 0.0, "b": 0.5, "c": 1.0}, {"a": 0.5, "b": 1.0, "c": 1.0})
>>> round(est.mean, 3), est.n
(0.333, 3)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Estimate", "bootstrap_mean", "paired_difference", "per_question_mean", "t_interval"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    """A mean over questions with its bootstrap confidence interval.

    Attributes:
        mean: The mean over questions.
        low: Lower end of the interval.
        high: Upper end of the interval.
        n: Questions.
        level: Confidence level of the interval.
    """

    mean: float
    low: float
    high: float
    n: int
    level: float = 0.95

    @property
    def half_width(self) -> float:
        """Half the interval's width."""
        return (self.high - self.low) / 2

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict."""
        return {"mean": self.mean, "low": self.low, "high": self.high, "n": self.n}

    def format(self, *, signed: bool = False, digits: int = 3) -> str:
        """`0.412 [0.371, 0.455]` (or `+0.120 [...]` with `signed`)."""
        sign = "+" if signed else ""
        return f"{self.mean:{sign}.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}]"


def per_question_mean(records: Iterable[Any], key: str = "em") -> dict[str, float]:
    """Mean of `key` over each question's samples, by `task_id`.

    Args:
        records: Episodes with `task_id` and the metric as attributes (e.g. `EpisodeRecord`).
        key: The metric's attribute name.
    """
    by_question: dict[str, list[float]] = defaultdict(list)
    for record in records:
        by_question[record.task_id].append(float(getattr(record, key)))
    return {q: float(np.mean(v)) for q, v in by_question.items()}


def bootstrap_mean(
    values: Iterable[float], *, level: float = 0.95, n_resamples: int = 10_000, seed: int = 0
) -> Estimate:
    """The mean of `values` (one per question) with a percentile bootstrap interval.

    Raises:
        ValueError: no values.
    """
    from scipy import stats

    data = np.asarray(list(values), dtype=float)
    if data.size == 0:
        raise ValueError("no values to estimate a mean from")
    mean = float(data.mean())
    if data.size == 1 or np.all(data == data[0]):  # no spread: the interval is the point
        return Estimate(mean=mean, low=mean, high=mean, n=int(data.size), level=level)
    result = stats.bootstrap(
        (data,),
        np.mean,
        confidence_level=level,
        n_resamples=n_resamples,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    interval = result.confidence_interval
    return Estimate(
        mean=mean, low=float(interval.low), high=float(interval.high), n=int(data.size), level=level
    )


def paired_difference(
    before: Mapping[str, float],
    after: Mapping[str, float],
    *,
    level: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> Estimate:
    """After minus before, paired on the question, with a bootstrap interval over questions.

    Raises:
        ValueError: the two sides do not cover the same questions.
    """
    if set(before) != set(after):
        missing = sorted(set(before) ^ set(after))[:3]
        raise ValueError(f"before and after cover different questions (e.g. {missing})")
    keys = sorted(before)
    return bootstrap_mean(
        [after[k] - before[k] for k in keys], level=level, n_resamples=n_resamples, seed=seed
    )


def t_interval(values: Iterable[float], *, level: float = 0.95) -> Estimate:
    """The mean of a few values (one per seed) with a Student t interval.

    For comparisons paired over seeds, where the seeds, not the questions, are the independent
    units and too few to bootstrap: pass the per-seed differences (`n` counts seeds).

    >>> est = t_interval([0.1, 0.2, 0.3])
    >>> round(est.mean, 3), round(est.low, 3), round(est.high, 3)
    (0.2, -0.048, 0.448)

    Raises:
        ValueError: fewer than two values (no spread to estimate).
    """
    from scipy import stats

    data = np.asarray(list(values), dtype=float)
    if data.size < 2:
        raise ValueError(f"a t interval needs at least two values, got {data.size}")
    mean = float(data.mean())
    half = float(stats.t.ppf((1 + level) / 2, data.size - 1)) * float(stats.sem(data))
    return Estimate(mean=mean, low=mean - half, high=mean + half, n=int(data.size), level=level)
