"""The default success predictor Ṽψ: hashed n-grams into a small numpy MLP, trained online.

Design (measured in `benchmarks/research/predictor_design.py`; docs/decisions.md, "Predictor"):

- `HashedNgramFeaturizer` reads the *head* of a history (its first words: the question) and its
  *tail* (its last words: the latest turns) as word unigrams and bigrams, signed-hashed into a
  fixed number of dimensions (zlib.crc32, so features are the same in every process).
- `MLPPredictor` maps them through one ReLU layer to a sigmoid and is trained after each step
  with Adam on the squared error against V̂ (the paper's MSE), on the step's roots and prefixes.
- Cold start: the output layer starts at zero, so every prediction is `prior` until trained.
- Exploration floor: the predictor keeps a small memory of recent training rows; a history
  whose best cosine similarity to it is below `similar_at` is shrunk towards `prior` in
  proportion, so one unlike anything recently trained on is treated as uncertain (p → 0.5),
  not confidently easy or hard.
"""

from __future__ import annotations

import math
import re
import zlib
from collections.abc import Mapping, Sequence
from typing import Literal

import numpy as np
import scipy.sparse as sp

from trace_alloc.base import Featurizer
from trace_alloc.errors import AllocError

__all__ = ["ConstantPredictor", "HashedNgramFeaturizer", "MLPPredictor", "check_examples"]

_WORD = re.compile(r"\w+")


class HashedNgramFeaturizer:
    """Signed hashed word n-grams of a history's head (question) and tail (latest turns).

    >>> f = HashedNgramFeaturizer(dim=64)
    >>> x = f.featurize(["Who wrote it?", "Who wrote it? <search>x</search>"])
    >>> x.shape, x.dtype.name, bool(np.allclose(np.linalg.norm(x, axis=1), 1.0))
    ((2, 64), 'float32', True)
    """

    def __init__(
        self, dim: int = 4096, *, head_words: int = 48, tail_words: int = 96, ngrams: int = 2
    ) -> None:
        """Configure the featurizer.

        Args:
            dim: number of hashed features.
            head_words: leading words read as the question.
            tail_words: trailing words read as the latest turns.
            ngrams: longest word n-gram.
        """
        if dim < 8 or head_words < 1 or tail_words < 0 or ngrams < 1:
            raise ValueError(
                f"HashedNgramFeaturizer(dim={dim}, head_words={head_words}, "
                f"tail_words={tail_words}, ngrams={ngrams}): dim >= 8, head_words >= 1, "
                "tail_words >= 0, ngrams >= 1"
            )
        self._dim = dim
        self.head_words = head_words
        self.tail_words = tail_words
        self.ngrams = ngrams

    @property
    def dim(self) -> int:
        """Length of each feature vector."""
        return self._dim

    def featurize(self, histories: Sequence[str]) -> np.ndarray:
        """L2-normalised features, shape `(len(histories), dim)`, float32."""
        out = np.zeros((len(histories), self._dim), dtype=np.float32)
        for start in range(0, len(histories), _CHUNK):
            chunk = histories[start : start + _CHUNK]
            out[start : start + len(chunk)] = self._featurize_chunk(chunk)
        return out

    def _featurize_chunk(self, histories: Sequence[str]) -> np.ndarray:
        word_hash: dict[str, int] = {}  # per call: each distinct word is hashed once
        pieces: list[np.ndarray] = []  # word ids of each (row, namespace) segment
        seg_row: list[int] = []
        seg_space: list[int] = []
        n_words = np.zeros(len(histories), dtype=np.int64)
        for row, text in enumerate(histories):
            words = _WORD.findall(text.lower())
            n_words[row] = len(words)
            ids = np.fromiter(
                (
                    word_hash.get(w) or word_hash.setdefault(w, zlib.crc32(w.encode()) + 1)
                    for w in words
                ),
                dtype=np.uint64,
                count=len(words),
            )
            pieces.append(ids[: self.head_words])
            seg_row.append(row)
            seg_space.append(0)
            if self.tail_words and len(words) > self.head_words:
                pieces.append(ids[-self.tail_words :])
                seg_row.append(row)
                seg_space.append(1)
        lengths = np.array([p.size for p in pieces], dtype=np.int64)
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.uint64)
        segment = np.repeat(np.arange(lengths.size), lengths)
        row_of = np.repeat(np.asarray(seg_row, dtype=np.int64), lengths)
        salt_of = _SALT[np.repeat(np.asarray(seg_space, dtype=np.int64), lengths)]
        keys, rows = [], []
        for n in range(1, self.ngrams + 1):
            m = ids.size - n + 1
            if m <= 0:
                break
            key = ids[:m].copy()
            for j in range(1, n):
                key = key * _PRIME + ids[j : j + m]  # wraps mod 2^64 on purpose
            valid = segment[:m] == segment[n - 1 : n - 1 + m]  # n-grams never span segments
            keys.append((key ^ salt_of[:m] ^ np.uint64(n))[valid])
            rows.append(row_of[:m][valid])
        # coarse length: how far into the episode the history is
        keys.append(np.log2(1 + n_words).astype(np.uint64) + _SALT[2])
        rows.append(np.arange(len(histories)))
        mixed = _mix(np.concatenate(keys))
        sign = np.where(mixed & np.uint64(1), 1.0, -1.0)  # signed hashing: collisions cancel
        bucket = ((mixed >> np.uint64(1)) % np.uint64(self._dim)).astype(np.int64)
        flat, inverse = np.unique(np.concatenate(rows) * self._dim + bucket, return_inverse=True)
        counts = np.bincount(inverse, weights=sign)  # one entry per non-zero cell
        values = np.sign(counts) * np.log1p(np.abs(counts))
        row_norm = np.sqrt(
            np.bincount(flat // self._dim, weights=values**2, minlength=len(histories))
        )
        out = np.zeros((len(histories), self._dim), dtype=np.float32)
        out.flat[flat] = values / np.maximum(row_norm[flat // self._dim], 1e-12)
        return out


_CHUNK = 512  # rows per vectorised block: bounds the (rows, dim) temporaries
_PRIME = np.uint64(0x100000001B3)
_SALT = np.array([0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9], dtype=np.uint64)


def _mix(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads every key bit over the bucket and sign bits."""
    z = keys.astype(np.uint64)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class MLPPredictor:
    """Ṽψ: a one-hidden-layer MLP (or logistic regression) over injected features.

    Implements `trace_alloc.base.Predictor`. All state is in numpy arrays (`state_dict`).
    """

    def __init__(
        self,
        featurizer: Featurizer,
        *,
        hidden: int = 64,
        loss: Literal["mse", "bce"] = "mse",
        lr: float = 3e-3,
        epochs: int = 4,
        batch_size: int = 128,
        weight_decay: float = 1e-4,
        prior: float = 0.5,
        memory_size: int = 256,
        similar_at: float = 0.5,
        seed: int = 0,
    ) -> None:
        """Build an untrained predictor.

        Args:
            featurizer: turns histories into vectors (e.g. `HashedNgramFeaturizer`).
            hidden: hidden units; 0 gives logistic regression.
            loss: `mse` against V̂ through the sigmoid (the paper), or `bce` with soft targets.
            lr: Adam step size.
            epochs: passes over each update's examples.
            batch_size: minibatch size.
            weight_decay: L2 penalty on the weights.
            prior: prediction before training and for histories far from the training data.
            memory_size: recent training rows kept to measure how familiar a history is.
            similar_at: cosine similarity to the memory at which a history counts as familiar
                (no shrinking); below it the prediction moves towards `prior` linearly.
            seed: seeds the predictor's own generator (initialisation and shuffling).
        """
        if hidden < 0 or lr <= 0 or epochs < 1 or batch_size < 1 or not 0 < prior < 1:
            raise ValueError(
                f"MLPPredictor(hidden={hidden}, lr={lr}, epochs={epochs}, batch_size={batch_size},"
                f" prior={prior}): need hidden >= 0, lr > 0, epochs >= 1, batch_size >= 1, "
                "0 < prior < 1"
            )
        if loss not in ("mse", "bce"):
            raise ValueError(f"loss={loss!r}: 'mse' or 'bce'")
        if memory_size < 1 or not 0 < similar_at <= 1:
            raise ValueError(f"memory_size={memory_size} >= 1, 0 < similar_at={similar_at} <= 1")
        self.featurizer = featurizer
        self.hidden = hidden
        self.loss = loss
        self.lr = lr
        self.epochs = epochs
        self.batch_size = batch_size
        self.weight_decay = weight_decay
        self.prior = prior
        self.similar_at = similar_at
        self._rng = np.random.default_rng(seed)
        d = featurizer.dim
        params: dict[str, np.ndarray] = {}
        if hidden:
            # ‖x‖ = 1, so x W1 has the variance of one weight: unit scale keeps ReLUs alive
            params["w1"] = self._rng.normal(0.0, 1.0, (d, hidden)).astype(np.float32)
            params["b1"] = np.zeros(hidden, dtype=np.float32)
        params["w2"] = np.zeros(hidden or d, dtype=np.float32)  # output = prior until trained
        params["b2"] = np.array([math.log(prior / (1 - prior))], dtype=np.float32)
        self._params = params
        self._m = {k: np.zeros_like(v) for k, v in params.items()}
        self._v = {k: np.zeros_like(v) for k, v in params.items()}
        self._t = 0
        self._memory = np.zeros((memory_size, d), dtype=np.float32)  # recent training rows
        self._memory_used = 0
        self._memory_next = 0
        self._n_updates = 0

    # --- Predictor protocol ---

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """Success probabilities, shrunk towards `prior` for unfamiliar histories."""
        if not histories:
            return np.zeros(0)
        x = _sparse(self.featurizer.featurize(histories))
        p = self._forward(x)[0]
        c = self.familiarity(x)
        return np.asarray(c * p + (1.0 - c) * self.prior, dtype=np.float64)

    def update(
        self,
        histories: Sequence[str],
        targets: np.ndarray,
        *,
        weights: np.ndarray | None = None,
        is_root: np.ndarray | None = None,
    ) -> dict[str, float]:
        """Adam on the weighted squared error (or soft cross-entropy) against V̂.

        Args:
            histories: node histories.
            targets: V̂ in [0, 1] per history.
            weights: outcomes behind each target (its leaf count; 1 each if None): a root
                backed by 8 leaves pulls 8 times as hard as a prefix with one.
            is_root: accepted for the `Predictor` protocol; this model treats roots and
                prefixes alike (`MemoryPredictor` uses it).

        Returns:
            `loss_before`, `loss_after` (the weighted training objective on these examples,
            unshrunk model), `n` and `familiarity` (mean, before this update).

        Raises:
            AllocError: lengths differ, a target is outside [0, 1] or a weight is negative.
        """
        y, w = check_examples(histories, targets, weights)
        if not histories:
            return {"n": 0.0}
        x = _sparse(self.featurizer.featurize(histories))
        familiarity = float(self.familiarity(x).mean())
        before = self._objective(x, y, w)
        n = len(histories)
        for _ in range(self.epochs):
            order = self._rng.permutation(n)
            for start in range(0, n, self.batch_size):
                idx = order[start : start + self.batch_size]
                self._step(x[idx], y[idx], w[idx])
        self._remember(x)
        self._n_updates += 1
        return {
            "n": float(n),
            "loss_before": before,
            "loss_after": self._objective(x, y, w),
            "familiarity": familiarity,
        }

    def state_dict(self) -> dict[str, np.ndarray]:
        """Weights, Adam moments, the familiarity memory and generator state, as arrays."""
        state = {f"param.{k}": v.copy() for k, v in self._params.items()}
        state |= {f"adam_m.{k}": v.copy() for k, v in self._m.items()}
        state |= {f"adam_v.{k}": v.copy() for k, v in self._v.items()}
        state["adam_t"] = np.array([self._t], dtype=np.int64)
        state["memory"] = self._memory.copy()
        state["memory_cursor"] = np.array([self._memory_used, self._memory_next], dtype=np.int64)
        state["n_updates"] = np.array([self._n_updates], dtype=np.int64)
        state["rng"] = _rng_to_array(self._rng)
        return state

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore `state_dict` output of a predictor built with the same configuration.

        Raises:
            AllocError: a missing key or a shape that does not match this configuration.
        """
        expected = self.state_dict()
        missing = sorted(set(expected) - set(state))
        if missing:
            raise AllocError(f"predictor state lacks {missing}; was it saved by MLPPredictor?")
        for key, value in expected.items():
            if key == "rng" and np.shape(state[key]) == (4,):
                continue  # written before the generator's buffered half-word was saved
            if np.shape(state[key]) != value.shape:
                raise AllocError(
                    f"predictor state {key!r} has shape {np.shape(state[key])}, this predictor "
                    f"needs {value.shape} (different featurizer dim or hidden size?)"
                )
        for k in self._params:
            self._params[k] = np.asarray(state[f"param.{k}"], dtype=np.float32).copy()
            self._m[k] = np.asarray(state[f"adam_m.{k}"], dtype=np.float32).copy()
            self._v[k] = np.asarray(state[f"adam_v.{k}"], dtype=np.float32).copy()
        self._t = int(state["adam_t"][0])
        self._memory = np.asarray(state["memory"], dtype=np.float32).copy()
        self._memory_used, self._memory_next = (int(v) for v in state["memory_cursor"])
        self._n_updates = int(state["n_updates"][0])
        self._rng = _rng_from_array(np.asarray(state["rng"]))

    # --- internals ---

    def familiarity(self, x: sp.csr_array) -> np.ndarray:
        """How familiar each feature row is, in [0, 1].

        Its best cosine similarity to the memory of recent training rows, divided by
        `similar_at` and capped at 1: 0 before any training (the cold start) and for a history
        unlike anything recent.
        """
        if self._memory_used == 0:
            return np.zeros(x.shape[0])
        best = np.asarray((x @ self._memory[: self._memory_used].T).max(axis=1)).ravel()
        return np.clip(best / self.similar_at, 0.0, 1.0)

    def _remember(self, x: sp.csr_array) -> None:
        """Overwrite the oldest memory slots with up to half a memory of this update's rows."""
        size = self._memory.shape[0]
        take = self._rng.permutation(x.shape[0])[: max(1, size // 2)]
        slots = (self._memory_next + np.arange(take.size)) % size
        self._memory[slots] = x[take].toarray()
        self._memory_next = int((self._memory_next + take.size) % size)
        self._memory_used = min(size, self._memory_used + take.size)

    def _forward(self, x: sp.csr_array) -> tuple[np.ndarray, np.ndarray | None]:
        params = self._params
        # (n, hidden), or the features themselves for logistic regression
        h = np.maximum(x @ params["w1"] + params["b1"], 0.0) if self.hidden else x
        logit = h @ params["w2"] + params["b2"][0]  # (n,)
        return 1.0 / (1.0 + np.exp(-np.clip(logit, -30, 30))), (h if self.hidden else None)

    def _objective(self, x: sp.csr_array, y: np.ndarray, w: np.ndarray) -> float:
        p = self._forward(x)[0]
        if self.loss == "mse":
            per_row = (p - y) ** 2
        else:
            p = np.clip(p, 1e-7, 1 - 1e-7)
            per_row = -(y * np.log(p) + (1 - y) * np.log(1 - p))
        return float(np.average(per_row, weights=w)) if w.sum() > 0 else 0.0

    def _step(self, x: sp.csr_array, y: np.ndarray, w: np.ndarray) -> None:
        params = self._params
        p, h = self._forward(x)
        # d loss / d logit: MSE through the sigmoid, or soft cross-entropy
        g = 2.0 * (p - y) * p * (1.0 - p) if self.loss == "mse" else p - y  # (n,)
        g = (g * w / max(float(w.sum()), 1e-12)).astype(np.float32)  # the weighted mean's
        grads: dict[str, np.ndarray] = {"b2": np.array([g.sum()], dtype=np.float32)}
        if h is None:
            grads["w2"] = x.T @ g
        else:
            grads["w2"] = h.T @ g
            gh = np.outer(g, params["w2"]) * (h > 0)  # (n, hidden)
            grads["w1"] = x.T @ gh
            grads["b1"] = gh.sum(axis=0)
        self._t += 1
        b1, b2, eps = 0.9, 0.999, 1e-8
        for k, grad in grads.items():
            if k in ("w1", "w2"):
                grad = grad + self.weight_decay * params[k]
            self._m[k] = b1 * self._m[k] + (1 - b1) * grad
            self._v[k] = b2 * self._v[k] + (1 - b2) * grad * grad
            m_hat = self._m[k] / (1 - b1**self._t)
            v_hat = self._v[k] / (1 - b2**self._t)
            params[k] = params[k] - self.lr * m_hat / (np.sqrt(v_hat) + eps)


class ConstantPredictor:
    """A `Predictor` that always says `p` and learns nothing (the predictor-off ablation).

    >>> ConstantPredictor(0.3).predict(["Question: a", "Question: b"])
    array([0.3, 0.3])
    """

    def __init__(self, p: float) -> None:
        self.p = p

    def predict(self, histories: Sequence[str]) -> np.ndarray:
        """`p` for every history."""
        return np.full(len(histories), self.p)

    def update(
        self, histories: Sequence[str], targets: np.ndarray, **_: np.ndarray | None
    ) -> dict[str, float]:
        """Nothing to learn."""
        return {"n": float(len(histories))}

    def state_dict(self) -> dict[str, np.ndarray]:
        """Its constant."""
        return {"p": np.array([self.p])}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore the constant."""
        self.p = float(state["p"][0])


def check_examples(
    histories: Sequence[str], targets: np.ndarray, weights: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray]:
    """Targets and weights as float arrays, checked against the histories.

    Raises:
        AllocError: lengths differ, a target is outside [0, 1] or a weight is negative.
    """
    y = np.asarray(targets, dtype=np.float32)
    w = np.ones(len(histories)) if weights is None else np.asarray(weights, dtype=np.float64)
    if y.shape != (len(histories),) or np.any((y < 0) | (y > 1)) or not np.all(np.isfinite(y)):
        raise AllocError(
            f"update needs one target in [0, 1] per history; got {len(histories)} histories "
            f"and targets of shape {y.shape}"
        )
    if w.shape != y.shape or np.any(w < 0) or not np.all(np.isfinite(w)):
        raise AllocError(
            f"update needs one finite weight >= 0 per history; got weights of shape {w.shape}"
        )
    return y, w


def _sparse(x: np.ndarray) -> sp.csr_array:
    """Hashed n-gram rows are nearly all zeros, so sparse products are far cheaper (scipy's)."""
    return sp.csr_array(np.asarray(x, dtype=np.float32))


def _rng_to_array(rng: np.random.Generator) -> np.ndarray:
    """PCG64 state as six uint64 words: state hi/lo, increment hi/lo, and the buffered half-word.

    The buffer matters: a bounded draw below 2**32 (`permutation` of a short list) takes 32 bits
    at a time and keeps the other half of a 64-bit output for the next one. Dropping it made a
    resumed predictor shuffle its minibatches differently about every other resume.
    """
    s = rng.bit_generator.state
    if s["bit_generator"] != "PCG64":
        raise AllocError(f"cannot save a {s['bit_generator']} generator")
    mask = (1 << 64) - 1
    st, inc = s["state"]["state"], s["state"]["inc"]
    words = [st >> 64, st & mask, inc >> 64, inc & mask, s["has_uint32"], s["uinteger"]]
    return np.array(words, dtype=np.uint64)


def _rng_from_array(words: np.ndarray) -> np.random.Generator:
    """Undo `_rng_to_array` (four words, from an older checkpoint, restore an empty buffer)."""
    w = [int(v) for v in words] + [0, 0][: 6 - len(words)]
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = {
        "bit_generator": "PCG64",
        "state": {"state": (w[0] << 64) | w[1], "inc": (w[2] << 64) | w[3]},
        "has_uint32": w[4],
        "uinteger": w[5],
    }
    return rng
