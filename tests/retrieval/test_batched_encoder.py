"""`BatchedEncoder`, the base of every query encoder: batches, unit norm, the `Encoder` face."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from retrieval.base import Encoder
from retrieval.encoder import BatchedEncoder, SentenceEncoder
from retrieval.errors import EncoderError
from retrieval.onnx_encoder import OnnxEncoder, pool
from retrieval.prebuilt import PooledEncoder


class LengthEncoder(BatchedEncoder):
    """Embeds a text as (len, 1, 0) and records the batches it was given."""

    def __init__(self, batch_size: int) -> None:
        super().__init__(name="lengths", fingerprint="f00d", dim=3, batch_size=batch_size)
        self.batches: list[list[str]] = []

    def _embed(self, batch: list[str]) -> np.ndarray:
        assert self._lock.locked()  # one call at a time
        self.batches.append(batch)
        return np.array([[len(t), 1.0, 0.0] for t in batch])


def test_every_query_encoder_extends_the_base():
    for cls in (SentenceEncoder, PooledEncoder, OnnxEncoder):
        assert issubclass(cls, BatchedEncoder)
        assert "encode" not in vars(cls) and "_embed" in vars(cls)  # only the batch is theirs


def test_texts_are_cut_into_batches_and_come_back_in_order_with_unit_norm():
    encoder = LengthEncoder(batch_size=2)
    texts = ["a", "bbb", "cc", "", "dddd"]
    out = encoder.encode(texts)
    assert encoder.batches == [["a", "bbb"], ["cc", ""], ["dddd"]]
    assert out.dtype == np.float32 and out.shape == (5, 3)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, rtol=1e-6)
    raw = np.array([[len(t), 1.0, 0.0] for t in texts])
    np.testing.assert_allclose(out, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-6)
    assert encoder.encode([]).shape == (0, 3)


def test_a_zero_vector_stays_zero_instead_of_nan():
    class Zero(LengthEncoder):
        def _embed(self, batch: list[str]) -> np.ndarray:
            return np.zeros((len(batch), 3))

    out = Zero(batch_size=4).encode(["x", "y"])
    assert np.all(out == 0) and not np.isnan(out).any()


def test_the_base_gives_the_encoder_protocols_properties():
    encoder = LengthEncoder(batch_size=8)
    assert isinstance(encoder, Encoder)
    assert (encoder.name, encoder.fingerprint, encoder.dim) == ("lengths", "f00d", 3)
    with pytest.raises(EncoderError, match="batch_size 0"):
        LengthEncoder(batch_size=0)


def test_concurrent_calls_are_serialised():
    encoder = LengthEncoder(batch_size=1)
    results: list[np.ndarray] = []
    threads = [
        threading.Thread(target=lambda: results.append(encoder.encode(["ab", "c"])))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results) == 4 and all(np.array_equal(r, results[0]) for r in results)


def test_pool_pools_and_leaves_the_norm_to_the_base():
    hidden = np.array([[[2.0, 0.0], [4.0, 2.0], [9.0, 9.0]]])  # (1, L=3, dim=2)
    mask = np.array([[1, 1, 0]])
    np.testing.assert_allclose(pool(hidden, mask, "mean"), [[3.0, 1.0]])
    np.testing.assert_allclose(pool(hidden, mask, "cls"), [[2.0, 0.0]])
