"""Calibration of success predictions: Brier score, AUC and a reliability curve.

Targets may be soft (V̂ of a node with n leaves below it): a node then counts as n outcomes, of
which n·V̂ are successes, so the scores equal those computed leaf by leaf.

`learn_from_step` is the per-step predictor routine every trainer shares: score the step's
nodes before learning them (held out, prequential), report roots and prefixes separately (a
pooled AUC is dominated by the prefixes, which are easy: the latest observation gives them
away), then update.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from trace_alloc.base import Predictor
from trace_alloc.tree import RolloutTree, training_examples

__all__ = ["CalibrationReport", "calibration_report", "learn_from_step"]


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrationReport:
    """How well predictions match outcomes."""

    n: float
    """Number of outcomes (Σ weights)."""
    brier: float
    """Mean squared error against the binary outcomes (0 is perfect, 0.25 is a coin)."""
    auc: float
    """P(a success is scored above a failure); NaN without both kinds."""
    base_rate: float
    """Share of successes: the Brier score of always predicting it is base_rate (1 − base_rate)."""
    bin_p: tuple[float, ...]
    """Reliability curve: mean prediction per non-empty bin."""
    bin_y: tuple[float, ...]
    """Reliability curve: success rate per non-empty bin."""
    bin_n: tuple[float, ...]
    """Reliability curve: outcomes per non-empty bin."""

    @property
    def brier_skill(self) -> float:
        """1 − Brier / Brier of the base rate: > 0 beats predicting the average."""
        reference = self.base_rate * (1.0 - self.base_rate)
        return 1.0 - self.brier / reference if reference > 0 else float("nan")

    def to_dict(self) -> dict[str, object]:
        """JSON-safe form (the trainer logs it under `predictor/...`)."""
        return {
            "n": self.n,
            "brier": self.brier,
            "brier_skill": self.brier_skill,
            "auc": self.auc,
            "base_rate": self.base_rate,
            "reliability": {"p": list(self.bin_p), "y": list(self.bin_y), "n": list(self.bin_n)},
        }


def calibration_report(
    p: np.ndarray, targets: np.ndarray, weights: np.ndarray | None = None, *, n_bins: int = 10
) -> CalibrationReport:
    """Brier score, AUC and reliability curve of predictions `p` against `targets`.

    Args:
        p: predicted success probabilities, shape `(n,)`.
        targets: outcomes or success rates in [0, 1], shape `(n,)`.
        weights: outcomes behind each target (e.g. leaves under a node); 1 each if None.
        n_bins: equal-width bins of the reliability curve.

    Returns:
        The report.

    >>> p, y, n = np.array([0.9, 0.2, 0.6]), np.array([1.0, 0.0, 0.5]), np.array([1, 1, 2])
    >>> r = calibration_report(p, y, n)
    >>> round(r.brier, 4), r.auc, r.n
    (0.1425, 0.875, 4.0)
    """
    p = np.clip(np.asarray(p, dtype=np.float64), 0.0, 1.0)
    y = np.asarray(targets, dtype=np.float64)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    if not (p.shape == y.shape == w.shape) or p.ndim != 1:
        raise ValueError(f"shapes differ: p {p.shape}, targets {y.shape}, weights {w.shape}")
    n = float(w.sum())
    if n <= 0:
        nan = float("nan")
        return CalibrationReport(
            n=0.0, brier=nan, auc=nan, base_rate=nan, bin_p=(), bin_y=(), bin_n=()
        )
    pos, neg = w * y, w * (1.0 - y)
    brier = float((pos * (1.0 - p) ** 2 + neg * p**2).sum() / n)
    bins = np.minimum((p * n_bins).astype(np.int64), n_bins - 1)
    bin_n = np.bincount(bins, weights=w, minlength=n_bins)
    keep = bin_n > 0
    bin_p = np.bincount(bins, weights=w * p, minlength=n_bins)[keep] / bin_n[keep]
    bin_y = np.bincount(bins, weights=pos, minlength=n_bins)[keep] / bin_n[keep]
    return CalibrationReport(
        n=n,
        brier=brier,
        auc=_weighted_auc(p, pos, neg),
        base_rate=float(pos.sum() / n),
        bin_p=tuple(bin_p.tolist()),
        bin_y=tuple(bin_y.tolist()),
        bin_n=tuple(bin_n[keep].tolist()),
    )


def _weighted_auc(score: np.ndarray, pos: np.ndarray, neg: np.ndarray) -> float:
    """Mann-Whitney AUC with weighted positives and negatives; ties count one half."""
    total_pos, total_neg = pos.sum(), neg.sum()
    if total_pos <= 0 or total_neg <= 0:
        return float("nan")
    unique, inverse = np.unique(score, return_inverse=True)
    pos_at = np.bincount(inverse, weights=pos, minlength=unique.size)
    neg_at = np.bincount(inverse, weights=neg, minlength=unique.size)
    neg_below = np.cumsum(neg_at) - neg_at
    wins = (pos_at * (neg_below + 0.5 * neg_at)).sum()
    return float(wins / (total_pos * total_neg))


def learn_from_step(predictor: Predictor, trees: Sequence[RolloutTree]) -> dict[str, float]:
    """Score the step's roots and prefixes, then train the predictor on them.

    The scores come first, so they measure prediction on nodes the predictor has not learned
    yet. Each node is weighted by its outcomes (`training_examples`: bare rollouts for a root,
    leaves for a prefix), both in the scores and in the update.

    Returns:
        `predictor/...` metrics: `brier`, `brier_skill`, `auc` and `base_rate` over every node;
        `auc_root`, `brier_root`, `auc_prefix`, `brier_prefix` per kind (NaN where a kind lacks
        a success or a failure); `n_nodes`, `n_roots`, `loss_after`. Empty without nodes.
    """
    ex = training_examples(trees)
    if not len(ex):
        return {}
    p = np.asarray(predictor.predict(ex.histories), dtype=np.float64)
    pooled = calibration_report(p, ex.targets, ex.n_leaves)
    root = calibration_report(p[ex.is_root], ex.targets[ex.is_root], ex.n_leaves[ex.is_root])
    prefix = ~ex.is_root
    pre = calibration_report(p[prefix], ex.targets[prefix], ex.n_leaves[prefix])
    fit = predictor.update(ex.histories, ex.targets, weights=ex.n_leaves, is_root=ex.is_root)
    return {
        "predictor/brier": pooled.brier,
        "predictor/brier_skill": pooled.brier_skill,
        "predictor/auc": pooled.auc,
        "predictor/base_rate": pooled.base_rate,
        "predictor/auc_root": root.auc,
        "predictor/brier_root": root.brier,
        "predictor/auc_prefix": pre.auc,
        "predictor/brier_prefix": pre.brier,
        "predictor/n_nodes": float(len(ex)),
        "predictor/n_roots": float(ex.is_root.sum()),
        "predictor/loss_after": float(fit.get("loss_after", float("nan"))),
    }
