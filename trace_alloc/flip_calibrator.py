"""Online Platt scaling of Stage 2's flip chances against the flips that happened.

Stage 2 predicts, for each prefix it continues, the chance that one continuation ends with
another outcome than every earlier leaf below that prefix (`Trace`'s 1 − q). That chance comes
from a posterior over the tree's own bare outcomes and the predictor (`prefix_posterior`), and
nothing ties it to how often continuations really flip. `FlipCalibrator` does: after each step
the trainer shows it the raw chances of the step's continuations and whether each flipped, and
it refits p = σ(a · logit(p_raw) + b) on a window of recent ones; the next step's allocator maps
its raw chances through it (`run_step(flip_calibration=...)`). So every calibrated chance is a
prediction made before its outcome was seen (prequential, like the predictor's own scores).

A Gaussian prior pulls (a, b) toward the identity (1, 0) with the weight of `prior_strength`
continuations: with no data the calibrator changes nothing, and a handful of flips moves it
little. The flip floor does not read the calibrated chance (docs/decisions.md, "Stage 2"): the
calibrator only ever sees prefixes above the floor, so below it, it would extrapolate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from trace_alloc.errors import AllocError

__all__ = ["FlipCalibrator"]

_EPS = 1e-4  # raw chances are clipped into (0, 1) before the logit


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(np.asarray(p, dtype=np.float64), _EPS, 1.0 - _EPS)
    logit: np.ndarray = np.log(p) - np.log1p(-p)
    return logit


@dataclass(slots=True)
class FlipCalibrator:
    """p = σ(a · logit(p_raw) + b), refitted on the last `window` observed continuations.

    >>> c = FlipCalibrator(prior_strength=1.0)
    >>> float(c(np.array([0.6]))[0])  # no data yet: the identity
    0.6
    >>> c.observe([0.6] * 200, [1] * 60 + [0] * 140)  # predicted 0.6, 30 % flipped
    >>> round(float(c(np.array([0.6]))[0]), 1)
    0.3
    """

    prior_strength: float = 20.0
    """How many continuations the identity map is worth (a Gaussian prior on a − 1 and b)."""
    window: int = 4096
    """The most recent continuations the fit uses (older ones are forgotten)."""
    a: float = 1.0
    b: float = 0.0
    _x: list[float] = field(default_factory=list)
    _y: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.prior_strength > 0 or self.window < 1:
            raise ValueError(
                f"prior_strength={self.prior_strength}, window={self.window}: need > 0 and >= 1"
            )

    @property
    def n_observed(self) -> int:
        """Continuations in the current window."""
        return len(self._y)

    def __call__(self, p_raw: np.ndarray) -> np.ndarray:
        """Calibrated flip chances for raw ones (any shape)."""
        z = self.a * _logit(p_raw) + self.b
        return np.asarray(1.0 / (1.0 + np.exp(-z)), dtype=np.float64)

    def observe(self, p_raw: Sequence[float], flipped: Sequence[int | bool]) -> None:
        """Add one step's continuations (raw chance, whether it flipped) and refit.

        Raises:
            AllocError: the lengths differ or a chance lies outside [0, 1].
        """
        x = np.asarray(p_raw, dtype=np.float64)
        y = np.asarray(flipped, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1:
            raise AllocError(f"flip calibration needs equal 1-d lists, got {x.shape}, {y.shape}")
        if np.any((x < 0) | (x > 1)) or np.any((y != 0) & (y != 1)):
            raise AllocError("flip calibration needs chances in [0, 1] and 0/1 outcomes")
        if not x.size:
            return
        self._x = (self._x + _logit(x).tolist())[-self.window :]
        self._y = (self._y + y.tolist())[-self.window :]
        self.a, self.b = self._fit()

    def _fit(self) -> tuple[float, float]:
        """Newton's method on the penalised log loss (convex: a few steps converge)."""
        x, y = np.asarray(self._x), np.asarray(self._y)
        features = np.stack([x, np.ones_like(x)], axis=1)
        prior = np.array([1.0, 0.0])
        theta = np.array([self.a, self.b])
        for _ in range(25):
            p = 1.0 / (1.0 + np.exp(-(features @ theta)))
            grad = features.T @ (p - y) + self.prior_strength * (theta - prior)
            hess = (features * (p * (1 - p))[:, None]).T @ features
            step = np.linalg.solve(hess + self.prior_strength * np.eye(2), grad)
            theta = theta - step
            if np.abs(step).max() < 1e-8:
                break
        return float(theta[0]), float(theta[1])

    def state_dict(self) -> dict[str, np.ndarray]:
        """The fit and its window, as arrays (saved beside the predictor's)."""
        return {
            "flip_calibrator.ab": np.array([self.a, self.b]),
            "flip_calibrator.logit": np.asarray(self._x, dtype=np.float64),
            "flip_calibrator.flipped": np.asarray(self._y, dtype=np.float64),
        }

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore `state_dict` output.

        A checkpoint written before the calibrator has no `flip_calibrator.*` arrays and leaves
        it fresh.
        """
        if "flip_calibrator.ab" not in state:
            return
        self.a, self.b = (float(v) for v in state["flip_calibrator.ab"])
        self._x = [float(v) for v in state["flip_calibrator.logit"]]
        self._y = [float(v) for v in state["flip_calibrator.flipped"]]
